package proxy

import (
	"testing"
	"time"
)

// RelayedH2 is how many relayed HTTP/2 connections p holds to ask to go
// away, for tests outside the package.
func RelayedH2(p *Proxy) int { return p.h2.Len() }

// Held is how many connections p holds to reset should Shutdown force,
// and how many clients it counts open connections of.
func Held(p *Proxy) (conns, clients int) {
	p.mu.Lock()
	conns = len(p.conns)
	p.mu.Unlock()
	p.clients.mu.Lock()
	defer p.clients.mu.Unlock()
	return conns, len(p.clients.n)
}

// SetWorkerIdle makes the accept workers of the proxies made until t ends
// wait d for another connection, so that a test which counts goroutines
// need not wait out the 10 s of each.
func SetWorkerIdle(t testing.TB, d time.Duration) {
	old := workerIdle
	workerIdle = d
	t.Cleanup(func() { workerIdle = old })
}
