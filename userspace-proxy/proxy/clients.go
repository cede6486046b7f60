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

// clientKey is a client as the limit counts it: its pod when the listener
// knows it (in-pod mode), else its address (node-IP mode, where each pod
// has its own).
type clientKey struct {
	pod  snapshot.ObjectRef
	addr netip.Addr
}

func keyOf(c Client) clientKey {
	if c.Pod != nil {
		return clientKey{pod: *c.Pod}
	}
	return clientKey{addr: c.Addr.Addr()}
}

func (k clientKey) String() string {
	if k.pod != (snapshot.ObjectRef{}) {
		return k.pod.String()
	}
	return k.addr.String()
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
