package balance

import (
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// picks counts the endpoints n Picks return, by host.
func picks(p *Picker, n int) map[string]int {
	seen := map[string]int{}
	for range n {
		seen[p.Pick().Host]++
	}
	return seen
}

// probeAfter checks, in a synctest bubble, that p passes dead over until
// d has passed, and then hands it out once.
func probeAfter(t *testing.T, p *Picker, dead netip.AddrPort, d time.Duration) {
	t.Helper()
	time.Sleep(d - time.Millisecond)
	if got := picks(p, 30); got[dead.String()] != 0 {
		t.Fatalf("%v before %v passed, want it passed over", got, d)
	}
	time.Sleep(time.Millisecond)
	if got := picks(p, 30); got[dead.String()] != 1 {
		t.Fatalf("%v after %v, want one probe", got, d)
	}
}

// TestEjection: an endpoint whose connect failed is passed over, the
// others sharing its turns; when its ejection ends it gets one connection
// (the probe) and nothing more until the probe settles; each failed probe
// doubles the ejection up to the maximum, and a connect that succeeds ends
// it. Connects that started before the ejection and fail after it settle
// nothing.
func TestEjection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := NewHealth(time.Second, 4*time.Second, nil)
		p := New(&snapshot.Backend{Endpoints: endpoints(3)}, h, nil)
		dead := p.ready[1].Endpoint.Addr
		if got := picks(p, 30); got[dead.String()] != 10 {
			t.Fatalf("before any failure: %v, want 10 each", got)
		}
		if d := h.Failed(dead, time.Now(), time.Now()); d != time.Second {
			t.Fatalf("first ejection %v, want 1s", d)
		}
		if d := h.Failed(dead, time.Now(), time.Now()); d != 0 {
			t.Errorf("a connect that started before the ejection ejected it again for %v", d)
		}
		if got := picks(p, 30); got[dead.String()] != 0 || got["10.0.0.1:80"] != 15 || got["10.0.0.3:80"] != 15 {
			t.Fatalf("ejected: %v, want the other two 15 each", got)
		}
		if n := h.Ejected(time.Now()); n != 1 {
			t.Errorf("Ejected = %d, want 1", n)
		}
		cur := time.Second
		for _, want := range []time.Duration{2 * time.Second, 4 * time.Second, 4 * time.Second} {
			probeAfter(t, p, dead, cur)
			if d := h.Failed(dead, time.Now(), time.Now()); d != want {
				t.Fatalf("failed probe: ejected for %v, want %v", d, want)
			}
			cur = want
		}
		time.Sleep(cur)
		if got := picks(p, 3); got[dead.String()] != 1 {
			t.Fatalf("after the last ejection: %v, want one probe", got)
		}
		h.OK(dead)
		if got := picks(p, 30); got[dead.String()] != 10 {
			t.Errorf("after a connect succeeded: %v, want 10 each", got)
		}
		if n := h.Ejected(time.Now()); n != 0 {
			t.Errorf("Ejected = %d, want 0", n)
		}
		if d := h.Failed(dead, time.Now(), time.Now()); d != time.Second {
			t.Errorf("a failure after recovery ejected for %v, want 1s again", d)
		}
	})
}

// TestStaleFailure: a connect that started before its endpoint's ejection
// ended (picked before the ejection, or dialed on by net/http after its
// request left) and fails after it settles nothing, whether the probe is
// out yet or not: the probe's own outcome does. Before, it counted as the
// probe's failure: the endpoint was ejected again for twice as long, and
// the probe's failure then counted for nothing.
func TestStaleFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := NewHealth(time.Second, 4*time.Second, nil)
		p := New(&snapshot.Backend{Endpoints: endpoints(2)}, h, nil)
		dead := p.ready[0].Endpoint.Addr
		slow := time.Now()
		time.Sleep(time.Millisecond)
		if d := h.Failed(dead, time.Now(), time.Now()); d != time.Second {
			t.Fatalf("first ejection %v, want 1s", d)
		}
		time.Sleep(time.Second)
		if d := h.Failed(dead, slow, time.Now()); d != 0 {
			t.Fatalf("a connect started before the ejection, failed after it ended, ejected for %v", d)
		}
		if got := picks(p, 10); got[dead.String()] != 1 {
			t.Fatalf("ejection over: %v, want one probe", got)
		}
		probe := time.Now()
		time.Sleep(time.Millisecond)
		if d := h.Failed(dead, slow, time.Now()); d != 0 {
			t.Fatalf("a connect started before the ejection, failed while the probe was out, ejected for %v", d)
		}
		if d := h.Failed(dead, probe, time.Now()); d != 2*time.Second {
			t.Fatalf("the probe failed: ejected for %v, want 2s", d)
		}
	})
}

// TestFailureBeforeSuccess: a connect that started before one that ended
// its endpoint's ejection, and fails after it, settles nothing: the
// success proved the endpoint up. One started after the success counts,
// and a snapshot without the endpoint forgets the success. Before, the
// ejection ended was forgotten, and the stale failure ejected the endpoint
// afresh.
func TestFailureBeforeSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := NewHealth(time.Second, 4*time.Second, nil)
		p := New(&snapshot.Backend{Endpoints: endpoints(2)}, h, nil)
		dead := p.ready[0].Endpoint.Addr
		slow := time.Now()
		time.Sleep(time.Millisecond)
		h.Failed(dead, time.Now(), time.Now())
		time.Sleep(time.Second)
		if got := picks(p, 10); got[dead.String()] != 1 {
			t.Fatalf("ejection over: %v, want one probe", got)
		}
		h.OK(dead)
		time.Sleep(time.Millisecond)
		if d := h.Failed(dead, slow, time.Now()); d != 0 {
			t.Fatalf("a connect started before the probe succeeded, failed after it, ejected for %v", d)
		}
		if got := picks(p, 10); got[dead.String()] != 5 {
			t.Fatalf("after the probe succeeded and a stale failure: %v, want 5 each", got)
		}
		if d := h.Failed(dead, time.Now(), time.Now()); d != time.Second {
			t.Fatalf("a connect started after the success failed: ejected for %v, want 1s", d)
		}
		h.OK(dead)
		h.Retain(func(ep netip.AddrPort) bool { return ep != dead })
		if h.mu.Lock(); len(h.up) != 0 {
			t.Errorf("the success is still remembered after the snapshot dropped its endpoint: %v", h.up)
		}
		h.mu.Unlock()
	})
}

// TestFailureBeforeSuccessNotEjected: a connect that started before one
// that reached its endpoint, and fails after it, ejects nothing when the
// endpoint was not ejected either — with no endpoint ejected, or another.
// Before, only a success that ended an ejection was remembered, and the
// stale failure ejected an endpoint the success had just shown up.
func TestFailureBeforeSuccessNotEjected(t *testing.T) {
	for _, other := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			h := NewHealth(time.Second, time.Second, nil)
			p := New(&snapshot.Backend{Endpoints: endpoints(3)}, h, nil)
			up := p.ready[0].Endpoint.Addr
			if other {
				h.Failed(p.ready[2].Endpoint.Addr, time.Now(), time.Now())
			}
			slow := time.Now()
			time.Sleep(time.Millisecond)
			h.OK(up)
			time.Sleep(time.Millisecond)
			if d := h.Failed(up, slow, time.Now()); d != 0 {
				t.Fatalf("another ejected %v: a connect started before a success, failed after it, ejected for %v", other, d)
			}
			if got, want := picks(p, 30), map[bool]int{false: 10, true: 15}[other]; got[up.String()] != want {
				t.Errorf("another ejected %v: %v, want the endpoint picked %d times in 30", other, got, want)
			}
		})
	}
}

// TestBack: Health tells when an ejected endpoint may take connections
// again — its ejection over, a probe that Standby found out handed back
// (its request took a connection already open, its caller left during
// the connect, or the connect failed for want of this node), or a connect
// to it that succeeded — and at no other time.
// A probe handed back told nothing before: what stood by for the
// endpoint waited for an unrelated event.
func TestBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var backs atomic.Int32
		h := NewHealth(time.Second, time.Second, func() { backs.Add(1) })
		eps := endpoints(2)
		eps[1].Fallback = snapshot.FallbackFar
		p := New(&snapshot.Backend{Endpoints: eps}, h, nil)
		h.Failed(eps[0].Addr, time.Now(), time.Now())
		time.Sleep(time.Second - time.Nanosecond)
		synctest.Wait()
		if n := backs.Load(); n != 0 {
			t.Fatalf("ejected: told %d times, want none", n)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if n := backs.Load(); n != 1 {
			t.Fatalf("ejection over: told %d times, want once", n)
		}
		for i, handBack := range []func(*Choice){h.Reused, h.Canceled, h.FailedHere} {
			for _, standby := range []bool{false, true} {
				c := p.Pick()
				if c.Endpoint != eps[0] {
					t.Fatalf("probe %d not handed out: picked %s", i, c.Host)
				}
				if standby {
					if got, _ := p.Standby(time.Now()); len(got) != 0 {
						t.Fatalf("probe %d out: standby %v, want none", i, got)
					}
				}
				handBack(c)
				handBack(c)           // no probe out now
				handBack(&p.ready[1]) // never ejected
			}
			synctest.Wait()
			if n := backs.Load(); n != int32(i+2) {
				t.Fatalf("probe %d handed back, once unawaited, once awaited: told %d times in all, want %d", i, n, i+2)
			}
		}
		h.OK(eps[1].Addr) // never ejected
		h.OK(eps[0].Addr)
		synctest.Wait()
		if n := backs.Load(); n != 5 {
			t.Errorf("after connects to a healthy endpoint and the one ejected: told %d times in all, want 5", n)
		}
	})
}

// TestBackAfterLostProbe: a probe that a Picker's Standby found out, and
// that is never settled nor handed back (lost), tells when it expires, once
// however often Standby asked; one nobody awaited does not. Before, an
// expired probe told nothing: what stood by for the endpoint waited for an
// unrelated event.
func TestBackAfterLostProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var backs atomic.Int32
		h := NewHealth(time.Second, time.Second, func() { backs.Add(1) })
		eps := endpoints(2)
		eps[1].Fallback = snapshot.FallbackFar
		p := New(&snapshot.Backend{Endpoints: eps}, h, nil)
		h.Failed(eps[0].Addr, time.Now(), time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		for _, standby := range []bool{false, true} {
			if c := p.Pick(); c.Endpoint != eps[0] {
				t.Fatalf("probe not handed out: picked %s", c.Host)
			}
			if standby {
				p.Standby(time.Now())
				p.Standby(time.Now())
			}
			time.Sleep(probeWait)
			synctest.Wait()
		}
		if n := backs.Load(); n != 2 {
			t.Errorf("ejection over, then a probe lost unawaited and one lost awaited: told %d times, want twice", n)
		}
	})
}

// TestStaleHandBack: a hand-back returns the probe its pick took, once,
// and no other: not one handed out since the one handed back or lost
// before, nor one out while a client pinned to the endpoint (who holds
// none) reuses a connection. Before, a hand-back named the endpoint: such
// a stale one let a second probe out, another connect to an endpoint that
// may be dead.
func TestStaleHandBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := NewHealth(time.Second, time.Second, nil)
		p := New(&snapshot.Backend{Endpoints: endpoints(2), ClientIPAffinitySeconds: 3600}, h, CarryAffinity(nil, 3600))
		client := ClientOf(noPods, netip.MustParseAddrPort("10.1.0.1:40000"), nil)
		dead := p.PickClient(client).Endpoint.Addr
		h.Failed(dead, time.Now(), time.Now())
		time.Sleep(time.Second)
		// probe picks until the probe of dead is handed out.
		probe := func(why string) *Choice {
			t.Helper()
			for range p.Len() {
				if c := p.Pick(); c.Endpoint.Addr == dead {
					return c
				}
			}
			t.Fatalf("%s: no probe handed out", why)
			return nil
		}
		outOnly := func(why string) {
			t.Helper()
			if got := picks(p, 10); got[dead.String()] != 0 {
				t.Fatalf("%s: %v, want the endpoint passed over while its probe is out", why, got)
			}
		}
		first := probe("ejection over")
		h.Canceled(first)
		second := probe("first probe handed back")
		for _, handBack := range []func(*Choice){h.Reused, h.Canceled, h.FailedHere} {
			handBack(first)
			outOnly("the first probe handed back again")
			handBack(p.PickClient(client)) // rides along the probe
			outOnly("the pinned client's connection told")
		}
		time.Sleep(probeWait) // the second probe is lost
		third := probe("second probe lost")
		h.Canceled(second)
		outOnly("the lost probe handed back")
		h.Canceled(third)
		probe("third probe handed back")
	})
}

// TestProbeUnsettled: a probe handed out but never settled nor handed back
// (lost: its caller connected nothing and told nothing) frees the endpoint
// for another after probeWait.
func TestProbeUnsettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := NewHealth(time.Second, time.Second, nil)
		p := New(&snapshot.Backend{Endpoints: endpoints(2)}, h, nil)
		dead := p.ready[0].Endpoint.Addr
		h.Failed(dead, time.Now(), time.Now())
		time.Sleep(time.Second)
		if got := picks(p, 10); got[dead.String()] != 1 {
			t.Fatalf("%v, want one probe", got)
		}
		probeAfter(t, p, dead, probeWait)
	})
}

// TestAllEjected: when every ready endpoint is ejected, the Picker ignores
// ejections, and a session stays where it is.
func TestAllEjected(t *testing.T) {
	h := NewHealth(time.Minute, time.Minute, nil)
	sp := &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "s"}
	b := &snapshot.Backend{Endpoints: endpoints(2), SessionPersistence: sp}
	p := New(b, h, nil)
	now := time.Now()
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	first, _, _ := p.PickRequest(r, ClientKey{}, now, sp)
	hdr := http.Header{}
	p.SetSession(hdr, r, first, now, sp)
	r.Header.Set("s", hdr.Get("s"))

	h.Failed(first.Endpoint.Addr, now, now)
	if !p.ejected(first, now) {
		t.Fatal("the session's endpoint ejected beside a healthy one is not passed over")
	}
	if c, pinned, set := p.PickRequest(r, ClientKey{}, now, sp); c == first || pinned || !set {
		t.Errorf("session on an ejected endpoint went to %s (pinned %v, new %v), want the other, as a new session", c.Host, pinned, set)
	}
	for _, c := range p.ready {
		h.Failed(c.Endpoint.Addr, now, now)
	}
	if got := picks(p, 10); len(got) != 2 || got[first.Host] != 5 {
		t.Errorf("every endpoint ejected: %v, want both in turn", got)
	}
	if c, pinned, set := p.PickRequest(r, ClientKey{}, now, sp); c != first || !pinned || set {
		t.Errorf("every endpoint ejected: session went to %s (pinned %v, new %v), want it kept", c.Host, pinned, set)
	}
}

// TestAllEjectedEveryTier: when every endpoint of every tier is passed
// over, picks take turns over them all, the fallback ones too, as Envoy
// balances over every priority level's hosts when all are in panic; a
// pinned client and PickFewest do likewise. Before, the preferred ones
// alone took turns: with the node's zone down, its requests never met the
// other zones' endpoints that served again until their ejections ran out.
func TestAllEjectedEveryTier(t *testing.T) {
	h := NewHealth(time.Minute, time.Minute, nil)
	eps := endpoints(4)
	eps[1].Fallback, eps[2].Fallback, eps[3].Fallback = snapshot.FallbackZone, snapshot.FallbackFar, snapshot.FallbackFar
	p := New(&snapshot.Backend{Endpoints: eps, ClientIPAffinitySeconds: 3600}, h, CarryAffinity(nil, 3600))
	now := time.Now()
	for _, ep := range eps {
		h.Failed(ep.Addr, now, now)
	}
	var order []netip.AddrPort
	for range 2 * len(eps) {
		order = append(order, p.Pick().Endpoint.Addr)
	}
	for i, a := range order {
		if a != order[i%len(eps)] || i < len(eps) && slices.Contains(order[:i], a) {
			t.Fatalf("every endpoint ejected: picks %v, want each of the %d in turn", order, len(eps))
		}
	}
	if got := fewest(p, 8); len(got) != len(eps) {
		t.Errorf("every endpoint ejected: fewest %v, want each of the %d", got, len(eps))
	}
	client := ClientOf(noPods, netip.MustParseAddrPort("10.1.0.1:40000"), nil)
	seen := map[netip.AddrPort]bool{}
	for range len(eps) {
		seen[p.PickClient(client).Endpoint.Addr] = true
	}
	if len(seen) != len(eps) {
		t.Errorf("every endpoint ejected: a pinned client's picks %v, want each of the %d", seen, len(eps))
	}
}

// TestPickConcurrent: picks made at once never go to an ejected endpoint,
// nor to a fallback one, while a preferred one takes connections. Before,
// concurrent picks took turns between the turns of one, which then met the
// ejected endpoint twice and concluded that every preferred endpoint was
// ejected: about one pick in ten of eight goroutines went to the ejected
// endpoint, or to the fallback one (it takes two CPUs to interleave them).
func TestPickConcurrent(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		eps := endpoints(3)
		eps[2].Fallback = snapshot.FallbackZone
		if !fallback {
			eps = eps[:2]
		}
		h := NewHealth(time.Hour, time.Hour, nil)
		p := New(&snapshot.Backend{Endpoints: eps}, h, nil)
		h.Failed(eps[0].Addr, time.Now(), time.Now())
		var wrong atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 20000 {
					if p.Pick().Endpoint.Addr != eps[1].Addr {
						wrong.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if n := wrong.Load(); n != 0 {
			t.Errorf("fallback endpoint %v: %d of %d concurrent picks went elsewhere than to the one healthy preferred endpoint", fallback, n, 8*20000)
		}
	}
}

// TestPickFewestProbeTaken: a pick by load whose endpoint's probe a
// concurrent pick takes between its look and its admit goes to another
// preferred endpoint, not to a fallback one. Before, it passed on to the
// next tier: with a probe going back and forth, a few hundred of eight
// goroutines' picks went to another zone beside a healthy preferred
// endpoint.
func TestPickFewestProbeTaken(t *testing.T) {
	eps := endpoints(3)
	eps[2].Fallback = snapshot.FallbackZone
	h := NewHealth(time.Second, time.Second, nil)
	p := New(&snapshot.Backend{Endpoints: eps}, h, nil)
	ended := time.Now().Add(-2 * time.Second)
	h.Failed(eps[0].Addr, ended, ended) // its ejection is over: its probe is due
	load := func(ep netip.AddrPort) int {
		if ep != eps[0].Addr {
			return 5
		}
		// The concurrent pick, between the look (this) and the admit.
		if ok, probe := h.admit(ep, time.Now()); !ok || probe == 0 {
			t.Fatalf("the probe of %v was not due", ep)
		}
		return 0
	}
	if c := p.PickFewest(load); c.Endpoint.Addr != eps[1].Addr {
		t.Errorf("picked %v, want the healthy preferred %v", c.Endpoint.Addr, eps[1].Addr)
	}
}

// TestProbeOutPassedOver pins what picks do while another pick's probe
// of an endpoint whose ejection is over is out: they pass it over — the
// others of its tier take its turns, and only when its tier has no other
// that takes, the next tier takes them (Pick, PickFewest) — until a
// connect settles the probe. Sent there beside the probe, they would all
// meet a pod that may still be gone (a whole connect timeout each, the
// stampede the probe is for); Pick cannot wait for the probe (it must not
// block, and the probe may take that connect timeout). Only pinned
// clients and sessions ride along (TestPinnedRidesAlongProbe).
func TestProbeOutPassedOver(t *testing.T) {
	eps := endpoints(3)
	eps[2].Fallback = snapshot.FallbackZone
	zone, other, far := eps[0].Addr.String(), eps[1].Addr.String(), eps[2].Addr.String()
	h := NewHealth(time.Second, time.Minute, nil)
	p := New(&snapshot.Backend{Endpoints: eps}, h, nil)
	ended := time.Now().Add(-2 * time.Second)
	h.Failed(eps[0].Addr, ended, ended) // its ejection is over: its probe is due
	probe := p.Pick()
	for probe.Endpoint.Addr != eps[0].Addr {
		probe = p.Pick()
	}
	if !probe.Probing() {
		t.Fatalf("the first pick of %s after its ejection holds no probe", zone)
	}
	if got, few := picks(p, 10), fewest(p, 10); got[other] != 10 || few[other] != 10 {
		t.Errorf("probe of %s out: picks %v, fewest %v; want the other preferred endpoint only", zone, got, few)
	}
	h.Failed(eps[1].Addr, time.Now(), time.Now()) // the other preferred endpoint ejected
	if got, few := picks(p, 10), fewest(p, 10); got[far] != 10 || few[far] != 10 {
		t.Errorf("probe of %s out, %s ejected: picks %v, fewest %v; want the fallback endpoint only", zone, other, got, few)
	}
	h.OK(eps[0].Addr) // the probe's connect reached it
	if got, few := picks(p, 10), fewest(p, 10); got[zone] != 10 || few[zone] != 10 {
		t.Errorf("probe of %s settled: picks %v, fewest %v; want it only", zone, got, few)
	}
	h.Failed(eps[2].Addr, time.Now(), time.Now())
	h.Failed(eps[0].Addr, time.Now(), time.Now())
	if got := picks(p, 9); got[zone] != 3 || got[other] != 3 || got[far] != 3 {
		t.Errorf("every endpoint ejected: picks %v, want all three in turn", got)
	}
}

// TestRetain: an endpoint the snapshot no longer has as ready is forgotten,
// so it starts afresh when it turns ready again.
func TestRetain(t *testing.T) {
	h := NewHealth(time.Minute, time.Minute, nil)
	a, b := netip.MustParseAddrPort("10.0.0.1:80"), netip.MustParseAddrPort("10.0.0.2:80")
	now := time.Now()
	h.Failed(a, now, now)
	h.Failed(b, now, now)
	h.Retain(func(ep netip.AddrPort) bool { return ep == b })
	if h.passedOver(a, now) || !h.passedOver(b, now) || h.Ejected(now) != 1 {
		t.Errorf("after Retain(b): a passed over %v, b %v; want only b", h.passedOver(a, now), h.passedOver(b, now))
	}
}

// TestFailedGone: a failed connect to an endpoint the snapshot no longer
// has as ready (one a request on an older snapshot made) ejects nothing.
// Before, it made an ejection that stayed until the next snapshot, one per
// endpoint gone under a steady snapshot.
func TestFailedGone(t *testing.T) {
	h := NewHealth(time.Minute, time.Minute, nil)
	gone := netip.MustParseAddrPort("10.0.0.1:80")
	h.Retain(func(ep netip.AddrPort) bool { return ep != gone })
	now := time.Now()
	if d := h.Failed(gone, now, now); d != 0 || h.Any() {
		t.Errorf("failed connect to an endpoint gone from the snapshot: ejected for %v, Any %v; want nothing kept", d, h.Any())
	}
}

// BenchmarkPick: what a request pays the Picker, with a Health that has
// nothing ejected (every request's case) and with one endpoint of eight
// ejected.
func BenchmarkPick(b *testing.B) {
	for _, ejected := range []bool{false, true} {
		b.Run(map[bool]string{false: "none-ejected", true: "one-ejected"}[ejected], func(b *testing.B) {
			h := NewHealth(time.Hour, time.Hour, nil)
			p := New(&snapshot.Backend{Endpoints: endpoints(8)}, h, nil)
			if ejected {
				h.Failed(p.ready[3].Endpoint.Addr, time.Now(), time.Now())
			}
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p.Pick()
				}
			})
		})
	}
}

// TestPickFewest: PickFewest takes the endpoint with the least load,
// takes turns among equals, passes over ejected ones, and when all are
// ejected picks as Pick does.
func TestPickFewest(t *testing.T) {
	h := NewHealth(time.Minute, time.Minute, nil)
	p := New(&snapshot.Backend{Endpoints: endpoints(3)}, h, nil)
	load := map[netip.AddrPort]int{}
	of := func(a netip.AddrPort) int { return load[a] }
	eps := p.Addrs()
	load[eps[0]], load[eps[1]], load[eps[2]] = 2, 0, 1
	if c := p.PickFewest(of); c.Endpoint.Addr != eps[1] {
		t.Errorf("loads 2, 0, 1: picked %s, want the second", c.Host)
	}
	// Each pick adds to the load it chose by: the loads even out.
	for range 6 {
		load[p.PickFewest(of).Endpoint.Addr]++
	}
	if load[eps[0]] != 3 || load[eps[1]] != 3 || load[eps[2]] != 3 {
		t.Errorf("after six more: %v, want 3 each", load)
	}
	loaded := func(n int) map[netip.AddrPort]int {
		seen := map[netip.AddrPort]int{}
		for range n {
			seen[p.PickFewest(of).Endpoint.Addr]++
		}
		return seen
	}
	if seen := loaded(6); len(seen) != 3 {
		t.Errorf("equal loads: picked %v, want all three in turn", seen)
	}
	h.Failed(eps[1], time.Now(), time.Now())
	load[eps[1]] = 0
	if seen := loaded(6); seen[eps[1]] != 0 {
		t.Errorf("picked %v, the ejected endpoint among them", seen)
	}
	h.Failed(eps[0], time.Now(), time.Now())
	h.Failed(eps[2], time.Now(), time.Now())
	if seen := loaded(6); len(seen) != 3 {
		t.Errorf("every endpoint ejected: picked %v, want all three in turn", seen)
	}
}

// TestFallback: endpoints topology hints left to other zones take nothing
// while a preferred one is not ejected; once every preferred one is, they
// take the connections in turn (Pick, PickFewest) and the sessions of the
// ejected ones, and are on standby no longer (Standby); when they too are
// ejected, all take turns (TestAllEjectedEveryTier). With no preferred
// endpoint ready, they are all there is.
func TestFallback(t *testing.T) {
	h := NewHealth(time.Minute, time.Minute, nil)
	sp := &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "s"}
	eps := endpoints(5)
	eps[3].Fallback, eps[4].Fallback = snapshot.FallbackFar, snapshot.FallbackFar
	p := New(&snapshot.Backend{Endpoints: eps, SessionPersistence: sp}, h, nil)
	// only reports whether seen holds the endpoints of eps at is, each n
	// times, and nothing else.
	only := func(seen map[string]int, n int, is ...int) bool {
		for _, i := range is {
			if seen[eps[i].Addr.String()] != n {
				return false
			}
		}
		return len(seen) == len(is)
	}
	if got := picks(p, 6); !only(got, 2, 0, 1, 2) {
		t.Errorf("preferred endpoints healthy: picks %v, want them only, in turn", got)
	}
	now := time.Now()
	h.Failed(eps[0].Addr, now, now)
	h.Failed(eps[1].Addr, now, now)
	if got, few := picks(p, 4), fewest(p, 4); !only(got, 4, 2) || !only(few, 4, 2) {
		t.Errorf("two preferred endpoints ejected: picks %v, fewest %v; want the third only", got, few)
	}
	if got, untried := p.Standby(now); !slices.Equal(got, []netip.AddrPort{eps[3].Addr, eps[4].Addr}) || untried {
		t.Errorf("a preferred endpoint not ejected: standby %v (untried %v), want the fallback ones", got, untried)
	}
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	hdr := http.Header{}
	p.SetSession(hdr, r, &p.ready[2], now, sp)
	r.Header.Set("s", hdr.Get("s"))
	h.Failed(eps[2].Addr, now, now)
	if got, few := picks(p, 4), fewest(p, 4); !only(got, 2, 3, 4) || !only(few, 2, 3, 4) {
		t.Errorf("every preferred endpoint ejected: picks %v, fewest %v; want the fallback ones in turn", got, few)
	}
	if got, _ := p.Standby(now); got != nil {
		t.Errorf("every preferred endpoint ejected: standby %v, want none", got)
	}
	if got, untried := p.Standby(now.Add(time.Minute)); len(got) != 2 || !untried {
		t.Errorf("every preferred endpoint's ejection over: standby %v (untried %v), want the fallback ones, untried", got, untried)
	}
	if c, pinned, set := p.PickRequest(r, ClientKey{}, now, sp); c.Endpoint.Fallback == 0 || pinned || !set {
		t.Errorf("session on an ejected endpoint went to %s (pinned %v, new %v), want a fallback one, as a new session", c.Host, pinned, set)
	}
	h.Failed(eps[3].Addr, now, now)
	h.Failed(eps[4].Addr, now, now)
	if got := picks(p, 10); !only(got, 2, 0, 1, 2, 3, 4) {
		t.Errorf("every endpoint ejected: picks %v, want all five in turn", got)
	}
	eps[0].Ready, eps[1].Ready, eps[2].Ready = false, false, false
	p = New(&snapshot.Backend{Endpoints: eps}, nil, nil)
	standby, _ := p.Standby(now)
	if got := picks(p, 4); !only(got, 2, 3, 4) || standby != nil {
		t.Errorf("no preferred endpoint ready: picks %v, standby %v; want the fallback ones in turn, none on standby", got, standby)
	}
}

// TestFallbackLevels: fallback endpoints of this node's zone take the
// connections while every preferred one is ejected, those of other zones
// only once they are too (Pick, PickFewest); each level is on standby
// while one before it takes connections. With no preferred endpoint ready,
// the zone's come first.
func TestFallbackLevels(t *testing.T) {
	h := NewHealth(time.Minute, time.Minute, nil)
	eps := endpoints(4)
	eps[1].Fallback, eps[2].Fallback, eps[3].Fallback = snapshot.FallbackZone, snapshot.FallbackZone, snapshot.FallbackFar
	p := New(&snapshot.Backend{Endpoints: eps}, h, nil)
	addrs := func(is ...int) []netip.AddrPort {
		var a []netip.AddrPort
		for _, i := range is {
			a = append(a, eps[i].Addr)
		}
		return a
	}
	only := func(seen map[string]int, is ...int) bool {
		for _, i := range is {
			if seen[eps[i].Addr.String()] == 0 {
				return false
			}
		}
		return len(seen) == len(is)
	}
	now := time.Now()
	if got, few, standby := picks(p, 4), fewest(p, 4), onStandby(p, now); !only(got, 0) || !only(few, 0) || !slices.Equal(standby, addrs(1, 2, 3)) {
		t.Errorf("preferred endpoint healthy: picks %v, fewest %v, standby %v; want it only, the others on standby", got, few, standby)
	}
	h.Failed(eps[0].Addr, now, now)
	if got, few, standby := picks(p, 4), fewest(p, 4), onStandby(p, now); !only(got, 1, 2) || !only(few, 1, 2) || !slices.Equal(standby, addrs(3)) {
		t.Errorf("preferred endpoint ejected: picks %v, fewest %v, standby %v; want the zone's, the other zone's on standby", got, few, standby)
	}
	h.Failed(eps[1].Addr, now, now)
	h.Failed(eps[2].Addr, now, now)
	if got, few, standby := picks(p, 4), fewest(p, 4), onStandby(p, now); !only(got, 3) || !only(few, 3) || standby != nil {
		t.Errorf("the zone's endpoints ejected: picks %v, fewest %v, standby %v; want the other zone's, none on standby", got, few, standby)
	}
	eps[0].Ready = false
	p = New(&snapshot.Backend{Endpoints: eps}, nil, nil)
	if got, standby := picks(p, 4), onStandby(p, now); !only(got, 1, 2) || !slices.Equal(standby, addrs(3)) {
		t.Errorf("no preferred endpoint ready: picks %v, standby %v; want the zone's, the other zone's on standby", got, standby)
	}
}

// onStandby is p's Standby endpoints at now.
func onStandby(p *Picker, now time.Time) []netip.AddrPort {
	s, _ := p.Standby(now)
	return s
}

// fewest counts the endpoints n PickFewest calls return, every endpoint
// carrying no load.
func fewest(p *Picker, n int) map[string]int {
	seen := map[string]int{}
	for range n {
		seen[p.PickFewest(func(netip.AddrPort) int { return 0 }).Host]++
	}
	return seen
}
