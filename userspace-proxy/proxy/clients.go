package proxy

import (
	"sync"
	"time"

	"github.com/sockmesh/sockmesh/internal/logthrottle"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
)

// The node's one proxy serves every pod: without a bound, one app that
// opens connections without end (a leak, a retry storm) takes the
// descriptors and memory every other pod's connections need. Each client
// may have Config.MaxConnsPerClient connections open; past it, its new
// ones are reset at once, counted and logged, and other clients are
// served as before.

// clientConns counts each client's open connections.
type clientConns struct {
	max int // 0: no limit
	mu  sync.Mutex
	n   map[balance.ClientKey]int
	// log throttles the "over its limit" lines per client.
	log *logthrottle.Throttle[balance.ClientKey]
}

func newClientConns(max int, logEvery time.Duration) *clientConns {
	return &clientConns{max: max, n: make(map[balance.ClientKey]int), log: logthrottle.New[balance.ClientKey](logEvery)}
}

// enter counts a new connection of k, or reports false when k is at its
// limit.
func (cc *clientConns) enter(k balance.ClientKey) bool {
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
func (cc *clientConns) leave(k balance.ClientKey) {
	if cc.max <= 0 {
		return
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.n[k]--; cc.n[k] <= 0 {
		delete(cc.n, k)
	}
}
