package h2drain

import (
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstreamtls"
)

// Registry holds the proxy's relayed HTTP/2 connections by backend, with
// the endpoint each reached, and asks them to go away when the endpoints
// change.
type Registry struct {
	spread  time.Duration
	asked   func(snapshot.BackendRef, Reason)
	recheck func()
	panics  *contain.Reporter

	mu    sync.Mutex
	conns map[snapshot.BackendRef]map[*Conn]*entry
	// staying counts the connections not leaving, by backend and endpoint.
	staying map[snapshot.BackendRef]map[netip.AddrPort]int
	// closing is GoAwayAll's reason once called: a connection added
	// afterwards (its dial was under way) is asked at once.
	closing Reason
}

type entry struct {
	ep netip.AddrPort
	// held is its TLS, which a change of the backend's settings must
	// keep (Endpoints.TLS).
	held upstreamtls.Held
	// leaving is set once the connection is asked to go away (or will
	// be, by timer); it no longer counts toward its endpoint's share.
	leaving bool
	// timer is a GoAway to come (a rebalancing, a move back), and
	// expiry the one due when its TLS trust ends; both stopped if the
	// connection ends first.
	timer, expiry *time.Timer
	// backDue is when its preferred_back GoAway is due: until then, no
	// other connection moves back to untried endpoints (Endpoints.Untried).
	backDue time.Time
}

// NewRegistry returns an empty Registry that spreads the GOAWAYs of a
// rebalancing or a move back from fallback endpoints over spread and calls
// asked (which must not block) for each GOAWAY written to a connection: not
// for one whose connection ended before (Conn.GoAway).
// recheck, unless nil, is called on a goroutine of its own twice the spread
// after a connection was asked back to untried endpoints
// (Endpoints.Untried), for the caller to Update again: should that
// connection's app not connect again (idle), the update moves another,
// rather than leave the others on standby endpoints until an unrelated one.
// Panics in its goroutines go to panics.
func NewRegistry(spread time.Duration, asked func(snapshot.BackendRef, Reason), recheck func(), panics *contain.Reporter) *Registry {
	return &Registry{spread: spread, asked: asked, recheck: recheck, panics: panics, conns: make(map[snapshot.BackendRef]map[*Conn]*entry),
		staying: make(map[snapshot.BackendRef]map[netip.AddrPort]int)}
}

// Load returns, for backend ref, how many of its connections each
// endpoint holds and keeps (balance.Picker.PickFewest's load).
func (r *Registry) Load(ref snapshot.BackendRef) func(netip.AddrPort) int {
	return func(ep netip.AddrPort) int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.staying[ref][ep]
	}
}

// Len is how many connections r holds.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.conns {
		n += len(m)
	}
	return n
}

// Add registers c, relayed to endpoint ep of backend ref over TLS held
// (the zero Held: cleartext). c is asked to go away when the certificate
// chain its handshake verified expires (held.Until): its streams would
// go on reaching a backend no new handshake accepts.
func (r *Registry) Add(ref snapshot.BackendRef, ep netip.AddrPort, c *Conn, held upstreamtls.Held) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.conns[ref]
	if m == nil {
		m = make(map[*Conn]*entry)
		r.conns[ref] = m
		r.staying[ref] = make(map[netip.AddrPort]int)
	}
	e := &entry{ep: ep, held: held}
	m[c] = e
	r.staying[ref][ep]++
	if r.closing != "" {
		r.leave(ref, e)
		go r.ask(ref, c, r.closing)
		return
	}
	r.expireAt(ref, c, e)
}

// expireAt arms e's expiry for when its TLS trust ends, if it does.
func (r *Registry) expireAt(ref snapshot.BackendRef, c *Conn, e *entry) {
	if until := e.held.Until(); !until.IsZero() {
		e.expiry = time.AfterFunc(time.Until(until), func() { r.expire(ref, c) })
	}
}

// rekey reports whether e's TLS stays under the backend's new settings
// (upstreamtls.Keeper.Keep), and holds it under them, its expiry
// moved to where their trust in it ends.
func (r *Registry) rekey(ref snapshot.BackendRef, c *Conn, e *entry, k *upstreamtls.Keeper) bool {
	h, err := k.Keep(e.held)
	if err != nil {
		return false
	}
	e.held = h
	if e.expiry != nil {
		e.expiry.Stop()
	}
	r.expireAt(ref, c, e)
	return true
}

// expire asks c to go away, if still registered: its TLS trust ended.
func (r *Registry) expire(ref snapshot.BackendRef, c *Conn) {
	r.mu.Lock()
	e := r.conns[ref][c]
	if e != nil {
		r.leave(ref, e)
	}
	r.mu.Unlock()
	if e != nil {
		r.ask(ref, c, ReasonExpired)
	}
}

// Remove forgets c (its relay ended).
func (r *Registry) Remove(ref snapshot.BackendRef, c *Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.conns[ref]
	e := m[c]
	if e == nil {
		return
	}
	for _, tm := range []*time.Timer{e.timer, e.expiry} {
		if tm != nil {
			tm.Stop()
		}
	}
	r.leave(ref, e)
	delete(m, c)
	if len(m) == 0 {
		delete(r.conns, ref)
		delete(r.staying, ref)
	}
}

// leave marks e leaving: it no longer counts toward its endpoint's share.
func (r *Registry) leave(ref snapshot.BackendRef, e *entry) {
	if !e.leaving {
		e.leaving = true
		r.staying[ref][e.ep]--
	}
}

// Endpoints is what a new snapshot says of one backend's endpoints.
type Endpoints struct {
	// Addrs are the endpoints handed out now.
	Addrs []netip.AddrPort
	// Standby are those of Addrs that take no connection now: fallback
	// endpoints, while a preferred one takes them (balance.Picker.Standby).
	// They count toward no share, and their connections move back.
	Standby []netip.AddrPort
	// Untried is set when the preferred endpoints that put Standby on
	// standby are only due a probe, their ejection over: one connection
	// moves back, whose connect tries them, and the others once one
	// succeeded (then the update comes again, Untried unset), or one
	// by one, should none connect (NewRegistry's recheck).
	Untried bool
	// Gained is set when one of Addrs not on Standby took no connection
	// before (it was not handed out, or on standby).
	Gained bool
	// Sticky is set when clients come back to their endpoint
	// (sessionAffinity ClientIP): moving them would not spread them. Those
	// on Standby move back all the same: their clients are pinned back to
	// a preferred endpoint (balance.Picker.PickClient).
	Sticky bool
	// Changed is set when the backend's protocol or TLS settings changed,
	// or it fails closed now: every connection moves but those TLS keeps.
	Changed bool
	// TLS, when Changed, is the new settings under which a connection's
	// TLS may stay (upstreamtls.Keeper.Keep): trust that only widened
	// (a CA added beside the old one) moves no connection. nil: none stays
	// (the protocol changed, the backend fails closed or is cleartext).
	TLS *upstreamtls.Origination
}

// Update asks connections to go away after a snapshot change (or an
// endpoint's ejection ended), for each backend of, given its reference,
// returns Endpoints for (false: gone from the snapshot, its connections
// left to finish): at once those whose endpoint is no longer handed out,
// and, when the backend's settings changed, those they do not keep
// (Endpoints.TLS); those on standby endpoints; or, unless clients come
// back to theirs (Sticky), when it gained endpoints, those beyond their
// endpoint's share of the backend's connections (ceil(connections /
// endpoints), those on standby left out) — these each at a random moment
// within the spread, so that their clients do not all connect and
// hand-shake again at once. Dialed again with Load's counts
// (balance.Picker.PickFewest), they go to the endpoints below their share.
func (r *Registry) Update(of func(snapshot.BackendRef) (Endpoints, bool)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for ref, m := range r.conns {
		eps, ok := of(ref)
		if !ok {
			continue
		}
		handed := make(map[netip.AddrPort][]*Conn, len(eps.Addrs))
		for _, a := range eps.Addrs {
			handed[a] = nil
		}
		standby := make(map[netip.AddrPort]bool, len(eps.Standby))
		for _, a := range eps.Standby {
			standby[a] = true
		}
		// One asked back whose GOAWAY is still to come is the one that
		// tries untried endpoints: updates meanwhile (any snapshot, any
		// ejection ending on the node) move no other.
		var keep *upstreamtls.Keeper // one for the backend's connections
		if eps.Changed {
			keep = eps.TLS.Keeper()
		}
		staying, movedBack := 0, false
		for _, e := range m {
			movedBack = movedBack || now.Before(e.backDue)
		}
		for c, e := range m {
			if e.leaving {
				continue
			}
			if _, ok := handed[e.ep]; !ok {
				r.leave(ref, e)
				go r.ask(ref, c, ReasonEndpointGone)
				continue
			}
			if eps.Changed && !r.rekey(ref, c, e, keep) {
				// At once, not spread: the settings it was verified
				// with were withdrawn (a CA rotated out, a policy
				// turned invalid), and its streams until the GOAWAY
				// would reach the backend under them.
				r.leave(ref, e)
				go r.ask(ref, c, ReasonPolicyChanged)
				continue
			}
			if !standby[e.ep] {
				handed[e.ep] = append(handed[e.ep], c)
				staying++
			} else if !(eps.Untried && movedBack) {
				r.askWithin(ref, c, e, ReasonPreferredBack)
				movedBack = true
				if eps.Untried && r.recheck != nil {
					time.AfterFunc(2*r.spread, r.runRecheck)
				}
			}
		}
		taking := len(eps.Addrs) - len(standby)
		if !eps.Gained || eps.Sticky || taking == 0 {
			continue
		}
		share := (staying + taking - 1) / taking
		for _, cs := range handed {
			for _, c := range cs[min(share, len(cs)):] {
				r.askWithin(ref, c, m[c], ReasonRebalance)
			}
		}
	}
}

// GoAwayAll asks every connection to go away, and those added later at
// once (the proxy shuts down).
func (r *Registry) GoAwayAll(why Reason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closing = why
	for ref, m := range r.conns {
		for c, e := range m {
			r.leave(ref, e)
			go r.ask(ref, c, why)
		}
	}
}

// askWithin marks c leaving and asks it to go away at a random moment
// within the spread.
func (r *Registry) askWithin(ref snapshot.BackendRef, c *Conn, e *entry, why Reason) {
	r.leave(ref, e)
	d := rand.N(r.spread + 1)
	if why == ReasonPreferredBack {
		e.backDue = time.Now().Add(d)
	}
	e.timer = time.AfterFunc(d, func() { r.ask(ref, c, why) })
}

// runRecheck calls recheck, in the goroutine of its timer.
func (r *Registry) runRecheck() {
	var err error
	defer r.panics.Recover("h2 recheck", &err, nil)
	r.recheck()
}

// ask asks c to go away; it runs in a goroutine of its own, as the write
// may wait for an app that is not reading. Its relay may end meanwhile
// (Remove): the GOAWAY counts once written (Conn.GoAway).
func (r *Registry) ask(ref snapshot.BackendRef, c *Conn, why Reason) {
	var err error
	defer r.panics.Recover("h2 goaway", &err, func() { sockio.Reset(c) })
	c.GoAway(why, func() { r.asked(ref, why) })
}
