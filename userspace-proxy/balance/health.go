package balance

import (
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Health remembers, for the whole proxy, the endpoints whose last connect
// failed for want of the endpoint (refused, unreachable, no answer in
// time, a TLS handshake it broke off). Pickers pass over such an endpoint
// for a while — it is ejected — so that once one request has found a pod
// gone, the requests after it do not try it too; a pod gone with its node
// would otherwise cost every request sent its way a whole connect timeout
// before the next endpoint is tried, until the EndpointSlice says so,
// which takes tens of seconds.
//
// When its ejection ends, an endpoint gets one connection at a time (a
// probe) until a connect settles it, Pickers passing it over meanwhile
// but for pinned clients and sessions (Picker.Pick says why): a failed
// one started after the ejection ended ejects it again for twice as long,
// up to Max; one that reaches it ends the ejection. A failed one started before a connect
// that reached the endpoint (ejected or not) settles nothing. The pick
// that takes a probe carries its number (Choice) to where its
// connection's outcome is known: a connection that tells nothing of the
// endpoint hands that probe back, and no other. An endpoint no longer
// ready in the snapshot is forgotten (Retain), so a pod that restarts and
// turns ready again starts afresh, and a failed connect to one (a request
// on an older snapshot made it) ejects nothing. When every ready endpoint
// of a backend is ejected, its Picker ignores the ejections, and its
// tiers (Picker.Pick): requests then find out for themselves rather than
// fail in the proxy.
//
// Health is safe for concurrent use; a Picker reads no more than one
// atomic counter of it while no endpoint is ejected.
type Health struct {
	base, max time.Duration
	back      func()
	n         atomic.Int32 // len(eps)
	mu        sync.Mutex
	eps       map[netip.AddrPort]*ejection
	probes    uint64 // probes handed out, the last one's number (Choice.probe)
	// up holds when a connect last reached each endpoint the last Retain
	// kept, ejected or not: a connect started before it that fails after
	// tells nothing the success did not.
	up map[netip.AddrPort]time.Time
	// ready is the last Retain's: endpoints no Picker hands out are not
	// ejected, as Retain would forget them only at the next snapshot.
	ready func(netip.AddrPort) bool
}

type ejection struct {
	until time.Time // passed over until then
	probe time.Time // when the current probe was handed out; zero if none
	// held numbers the current probe (0 if none): a hand-back returns the
	// probe it names only, so that one of another (handed back or lost
	// before) or of none (a pick that took none) lets no second out.
	held  uint64
	fails int // connects failed in a row, one per ejection
	// awaited is set when a Picker's Standby found the endpoint passed
	// over only while its probe was out: a probe handed back tells it
	// (back), as does its expiry, should it be lost.
	awaited bool
}

// probeWait is how long a probe handed out may go unsettled before another
// is: longer than a connect may take (dial.Config's timeout, 5 s). A probe
// whose connect tells nothing of the endpoint is handed back (Reused,
// Canceled, FailedHere): this is for one lost, whose expiry tells what
// awaited it (state).
const probeWait = 15 * time.Second

// NewHealth returns a Health that ejects an endpoint for base after its
// first failed connect, doubling with each failed probe up to max. back,
// unless nil, is called on a goroutine of its own whenever an ejected
// endpoint may take connections again: its ejection ends or a probe a
// Picker's Standby waited for is handed back or expires (a probe is due),
// or a connect to it succeeds.
func NewHealth(base, max time.Duration, back func()) *Health {
	return &Health{base: base, max: max, back: back, eps: make(map[netip.AddrPort]*ejection), up: make(map[netip.AddrPort]time.Time)}
}

// Failed records that a connect to ep, started at start, failed at now
// for want of the endpoint. It returns how long ep is now ejected, or 0
// when the connect started before ep's ejection ended: it tells nothing
// the ejection does not (a slow connect picked before it, net/http's dial
// on after its request left), and counted, it would eject ep again in its
// probe's place — for twice as long — while the probe's own outcome went
// uncounted. Likewise when it started before a connect that reached ep
// (OK): that one proved ep up since; and when the last Retain did not
// keep ep.
func (h *Health) Failed(ep netip.AddrPort, start, now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.eps[ep]
	switch {
	case e == nil:
		if start.Before(h.up[ep]) || h.ready != nil && !h.ready(ep) {
			return 0
		}
		e = &ejection{}
		h.eps[ep] = e
		h.n.Store(int32(len(h.eps)))
	case start.Before(e.until):
		return 0
	}
	e.fails++
	d := h.base
	for i := 1; i < e.fails && d < h.max; i++ {
		d *= 2
	}
	d = min(d, h.max)
	e.until, e.probe, e.held, e.awaited = now.Add(d), time.Time{}, 0, false
	if h.back != nil {
		time.AfterFunc(d, h.back)
	}
	return d
}

// OK records a connect to ep that reached it — it succeeded, or the
// endpoint answered and failed it (a TLS handshake it refused with an
// alert, a certificate that failed verification): its ejection, if any,
// ends, and a connect started before that which fails later counts for
// nothing (Failed), whether ep was ejected or not.
func (h *Health) OK(ep netip.AddrPort) {
	now := time.Now()
	h.mu.Lock()
	ended := h.forget(ep)
	if h.ready == nil || h.ready(ep) {
		h.up[ep] = now // until Retain forgets ep
	}
	h.mu.Unlock()
	if ended && h.back != nil {
		go h.back()
	}
}

// Reused records that the connection for c, picked, was taken already
// open (an idle pooled one, an HTTP/2 one with room for a stream) rather
// than connected: it tells nothing of the endpoint's connects, so a probe
// c holds is handed back (handBack). Held, it left the endpoint one
// request per probeWait for as long as its pooled connections lived.
func (h *Health) Reused(c *Choice) { h.handBack(c) }

// Canceled records that the connection for c, picked, was given up
// because its caller left (its context ended) while it connected, or
// waited for one of the endpoint's connections to come free, or before
// either: it tells nothing of the endpoint, so a probe c holds is handed
// back (handBack).
func (h *Health) Canceled(c *Choice) { h.handBack(c) }

// FailedHere records that the connect for c, picked, failed for want of
// this node (no source address or port left, out of file descriptors, a
// local refusal): it tells nothing of the endpoint, so a probe c holds is
// handed back (handBack).
func (h *Health) FailedHere(c *Choice) { h.handBack(c) }

// handBack hands the probe c holds back, if it is still out, for the next
// connection to take, and calls back when the probe was awaited: what
// waited for the endpoint to take connections (relayed HTTP/2 connections
// on fallback endpoints) would otherwise wait for an unrelated event.
// Unawaited (requests that reuse connections hand probes back one after
// another), it calls nothing. A probe is handed back once: a connection's
// outcome may be told twice (net/http's Transport dials on after the
// RoundTrip that asked has returned, without it), and a probe handed out
// since is another's.
func (h *Health) handBack(c *Choice) {
	if c.probe == 0 {
		return // the pick took no probe; h may be nil
	}
	h.mu.Lock()
	awaited := false
	if e := h.eps[c.Endpoint.Addr]; e != nil && e.held == c.probe {
		awaited = e.awaited
		e.probe, e.held, e.awaited = time.Time{}, 0, false
	}
	h.mu.Unlock()
	if awaited && h.back != nil {
		go h.back()
	}
}

// forget drops ep's ejection, reporting whether it had one.
func (h *Health) forget(ep netip.AddrPort) bool {
	if _, ok := h.eps[ep]; !ok {
		return false
	}
	delete(h.eps, ep)
	h.n.Store(int32(len(h.eps)))
	return true
}

// Retain forgets the endpoints for which ready is false: those the
// snapshot no longer has as ready, whose next turn to ready is a new start.
// Until the next call, Failed ejects none of them; ready is called with
// Health locked only.
func (h *Health) Retain(ready func(netip.AddrPort) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ready = ready
	for ep := range h.eps {
		if !ready(ep) {
			h.forget(ep)
		}
	}
	maps.DeleteFunc(h.up, func(ep netip.AddrPort, _ time.Time) bool { return !ready(ep) })
}

// Ejected is the number of endpoints passed over at now.
func (h *Health) Ejected(now time.Time) int {
	if h.n.Load() == 0 {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, e := range h.eps {
		if e.passedOver(now) {
			n++
		}
	}
	return n
}

// Any reports whether an endpoint may be ejected: false lets a Picker skip
// the rest.
func (h *Health) Any() bool { return h != nil && h.n.Load() > 0 }

// admit reports whether ep may take a connection at now, handing out the
// probe when its ejection has ended: probe numbers it, 0 when ep is not
// ejected.
func (h *Health) admit(ep netip.AddrPort, now time.Time) (ok bool, probe uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.eps[ep]
	if e == nil {
		return true, 0
	}
	if e.passedOver(now) {
		return false, 0
	}
	h.probes++
	e.probe, e.held = now, h.probes
	return true, h.probes
}

// state reports whether ep may take a connection at now (its ejection
// over, its probe not out) and, if so, whether only as a probe: no
// connect to it has succeeded since it was ejected. A probe out is
// awaited then (handBack).
func (h *Health) state(ep netip.AddrPort, now time.Time) (takes, probe bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.eps[ep]
	if e == nil {
		return true, false
	}
	takes = !e.passedOver(now)
	if !takes && !now.Before(e.until) && !e.awaited {
		e.awaited = true
		if h.back != nil {
			// Should the probe be lost (never settled nor handed back),
			// what awaits it would otherwise wait for an unrelated event.
			time.AfterFunc(e.probe.Add(probeWait).Sub(now), h.back)
		}
	}
	return takes, true
}

// passedOver reports whether ep is ejected at now, or its probe is out.
func (h *Health) passedOver(ep netip.AddrPort, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.eps[ep]
	return e != nil && e.passedOver(now)
}

// ejected reports whether ep's ejection lasts at now, its probe out or
// not: what moves a client or session pinned to ep (Picker.PickClient,
// PickRequest). A probe out does not: the endpoint was let back in, and
// their connections are judged as the probe's are.
func (h *Health) ejected(ep netip.AddrPort, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.eps[ep]
	return e != nil && now.Before(e.until)
}

func (e *ejection) passedOver(now time.Time) bool {
	return now.Before(e.until) || !e.probe.IsZero() && now.Sub(e.probe) < probeWait
}
