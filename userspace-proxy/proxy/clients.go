package proxy

import (
	"net/netip"
	"sync"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/logthrottle"
)

// The node's one proxy serves every pod: without a bound, one app that
// opens connections without end (a leak, a retry storm) takes the
// descriptors and memory every other pod's connections need. Each client
// may have Config.MaxConnsPerClient connections open; past it, its new
// ones are reset at once, counted and logged, and other clients are
// served as before.

// clientKey is what a connection counts against (limitKey).
type clientKey struct {
	pod snapshot.ObjectRef
	// addr is the source address no enrolled pod holds alone.
	addr netip.Addr
	// hostNetwork is the node's network namespace.
	hostNetwork bool
}

// limitKey is the client a connection of c counts against, as s knows
// the node's pods. On a node listener that is the enrolled pod holding
// the source address, so that a dual-stack pod's IPv4 and IPv6
// connections share one count. Host-network pods connect from the node's
// addresses, in one network namespace where no connection tells its pod:
// they are one client, whichever family, as one pod with two addresses
// is. An address s gives to no enrolled pod counts on its own.
func limitKey(s *snapshot.Snapshot, c Client) clientKey {
	switch ip := c.Addr.Addr().Unmap(); {
	case c.Pod != nil:
		return clientKey{pod: *c.Pod}
	case s.HostNetwork(ip):
		return clientKey{hostNetwork: true}
	default:
		if w, ok := s.Workload(ip); ok {
			return clientKey{pod: w.Pod}
		}
		return clientKey{addr: ip}
	}
}

func (k clientKey) String() string {
	switch {
	case k.hostNetwork:
		return "host network"
	case k.addr.IsValid():
		return k.addr.String()
	}
	return k.pod.String()
}

// clientConns counts each client's open connections.
type clientConns struct {
	max int // 0: no limit
	mu  sync.Mutex
	n   map[clientKey]int
	// log throttles the "over its limit" lines per client.
	log *logthrottle.Throttle[clientKey]
}

func newClientConns(max int, logEvery time.Duration) *clientConns {
	return &clientConns{max: max, n: make(map[clientKey]int), log: logthrottle.New[clientKey](logEvery)}
}

// enter counts a new connection of k, or reports false when k is at its
// limit.
func (cc *clientConns) enter(k clientKey) bool {
	if cc.max <= 0 {
		return true
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.n[k] >= cc.max {
		return false
	}
	cc.n[k]++
	return true
}

// leave uncounts a connection enter counted.
func (cc *clientConns) leave(k clientKey) {
	if cc.max <= 0 {
		return
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.n[k]--; cc.n[k] <= 0 {
		delete(cc.n, k)
	}
}
