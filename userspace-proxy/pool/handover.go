package pool

import "net/netip"

// HandOver hands p's place to to, the pool of the backend's new settings,
// which hands out nothing yet: it moves there the idle connections keep
// accepts, idle there since they were here, and closes the others; and
// what p holds — its connections in use and the slots it dials in, now
// and until it gets them back — counts against to's MaxOpen and each
// client's share as to's own do, freeing to's slots as it comes back.
// Counted apart, a pod held its share in each pool while the change
// lasted — its event streams and long polls on the old settings, as many
// again on the new — and the endpoint twice MaxOpen. Gets p serves after
// (requests under way on the old settings) wait only by p's own bounds:
// what they hold may take to's past them until it comes back.
func (p *Pool) HandOver(to *Pool, keep func(*Conn) bool) {
	for _, c := range p.takeIdle() {
		if !keep(c) {
			p.drop(c, DropSettingsChanged)
			continue
		}
		p.release(c)
		to.mu.Lock()
		ep := to.endpoint(c.ep.addr)
		ep.open++
		c.ep = ep
		to.park(c)
		to.mu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, ep := range p.eps {
		for client, n := range ep.held {
			to.inherit(addr, client, n)
		}
	}
	p.heir = to
}

// inherit counts n more (or, -1, one fewer) of the connections a pool p
// took the place of holds for client at addr: each open and held by
// client as p's own are, one given back freeing a slot, which a waiter of
// p may take.
func (p *Pool) inherit(addr netip.AddrPort, client Client, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ep := p.endpoint(addr)
	if n < 0 {
		p.unhold(ep, client)
		p.free(ep)
		return
	}
	ep.open += n
	for range n {
		p.hold(ep, client)
	}
}
