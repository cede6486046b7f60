package balance

import (
	"net/http"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestClientIPAffinity: under sessionAffinity ClientIP each client keeps
// its endpoint while it comes back within the timeout, across snapshots
// (CarryAffinity), and moves when the timeout passes or its endpoint is
// ejected; clients in in-pod mode are told apart by pod.
func TestClientIPAffinity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &snapshot.Backend{Endpoints: endpoints(3), ClientIPAffinitySeconds: 10}
		h := NewHealth(time.Minute, time.Minute, nil)
		aff := CarryAffinity(nil, b.ClientIPAffinitySeconds)
		p := New(b, h, aff)
		a := ClientOf(noPods, netip.MustParseAddrPort("10.1.0.1:40000"), nil)
		c := ClientOf(noPods, netip.MustParseAddrPort("10.1.0.2:40000"), nil)
		podA := ClientOf(noPods, netip.MustParseAddrPort("127.0.0.1:40000"), &snapshot.ObjectRef{Namespace: "a", Name: "one"})
		podB := ClientOf(noPods, netip.MustParseAddrPort("127.0.0.1:40001"), &snapshot.ObjectRef{Namespace: "a", Name: "two"})
		sticks := func(p *Picker, k ClientKey, want *Choice) {
			t.Helper()
			for range 5 {
				if got := p.PickClient(k); got.Endpoint.Addr != want.Endpoint.Addr {
					t.Fatalf("%v went to %s, want %s", k, got.Host, want.Host)
				}
				time.Sleep(9 * time.Second) // within the timeout each time
			}
		}
		first := p.PickClient(a)
		sticks(p, a, first)
		other := p.PickClient(c)
		if other.Endpoint.Addr == first.Endpoint.Addr {
			t.Fatalf("a second client went to the first's endpoint %s: round robin should move on", other.Host)
		}
		if p.PickClient(podA).Endpoint.Addr == p.PickClient(podB).Endpoint.Addr {
			t.Error("two pods behind loopback share an endpoint: told apart by address")
		}

		// A new snapshot's Picker keeps the pins.
		p = New(b, h, CarryAffinity(aff, b.ClientIPAffinitySeconds))
		sticks(p, a, first)
		if CarryAffinity(aff, 20) == aff || CarryAffinity(aff, 0) != nil {
			t.Error("a changed timeout kept the pins, or no affinity made one")
		}

		// Ejected: the client moves, and stays on its new endpoint.
		h.Failed(first.Endpoint.Addr, time.Now(), time.Now())
		moved := p.PickClient(a)
		if moved.Endpoint.Addr == first.Endpoint.Addr {
			t.Fatal("a client stayed on its ejected endpoint")
		}
		sticks(p, a, moved)

		// Silent for the timeout: the pin is gone, and round robin decides.
		time.Sleep(10 * time.Second)
		if _, ok := aff.lookup(a, time.Now()); ok {
			t.Error("a pin outlived the timeout")
		}
		if p.PickClient(ClientKey{}) == nil {
			t.Error("a client without a key got nothing")
		}
	})
}

// TestClientIPAffinityFallback: a client pinned to a fallback endpoint is
// pinned to one of a nearer level as soon as that takes connections — the
// zone's once it is back, the node's once it is — and, while the nearer
// ones are only due a probe, only the client that takes the probe moves. A
// session on a fallback endpoint stays there (its state may live there).
func TestClientIPAffinityFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		eps := endpoints(3)
		eps[1].Fallback, eps[2].Fallback = snapshot.FallbackZone, snapshot.FallbackFar
		h := NewHealth(time.Minute, time.Minute, nil)
		p := New(&snapshot.Backend{Endpoints: eps, ClientIPAffinitySeconds: 3600}, h, CarryAffinity(nil, 3600))
		a := ClientOf(noPods, netip.MustParseAddrPort("10.1.0.1:40000"), nil)
		b := ClientOf(noPods, netip.MustParseAddrPort("10.1.0.2:40000"), nil)
		now := time.Now()
		h.Failed(eps[0].Addr, now, now)
		h.Failed(eps[1].Addr, now, now)
		for _, k := range []ClientKey{a, b} {
			if got := p.PickClient(k); got.Endpoint.Addr != eps[2].Addr {
				t.Fatalf("node and zone ejected: %v went to %s, want the other zone's", k, got.Host)
			}
		}
		h.OK(eps[1].Addr)
		for _, k := range []ClientKey{a, b} {
			if got := p.PickClient(k); got.Endpoint.Addr != eps[1].Addr {
				t.Errorf("the zone's endpoint back: %v went to %s, want it", k, got.Host)
			}
		}
		time.Sleep(time.Minute) // the node's ejection over: a probe is due
		if got := p.PickClient(a); got.Endpoint.Addr != eps[0].Addr {
			t.Errorf("the node's endpoint due a probe: a went to %s, want it", got.Host)
		}
		if got := p.PickClient(b); got.Endpoint.Addr != eps[1].Addr {
			t.Errorf("the node's probe out: b went to %s, want the zone's", got.Host)
		}
		h.OK(eps[0].Addr)
		for _, k := range []ClientKey{a, b} {
			if got := p.PickClient(k); got.Endpoint.Addr != eps[0].Addr {
				t.Errorf("the node's endpoint serving: %v went to %s, want it", k, got.Host)
			}
		}

		sp := &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "s"}
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		hdr := http.Header{}
		p.SetSession(hdr, r, &p.ready[2], now, sp)
		r.Header.Set("s", hdr.Get("s"))
		if c, pinned, _ := p.PickRequest(r, a, now, sp); c.Endpoint.Addr != eps[2].Addr || !pinned {
			t.Errorf("a session on the other zone's endpoint went to %s (pinned %v), want it", c.Host, pinned)
		}
	})
}

// TestPinnedRidesAlongProbe: a client pinned (ClientIP) and a session
// whose endpoint's ejection is over keep it while another request's probe
// of it is out: only an ejection moves them. Before, they moved to another
// endpoint for as long as the probe was out (up to probeWait), though the
// endpoint had just been let back in.
func TestPinnedRidesAlongProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := NewHealth(time.Minute, time.Minute, nil)
		p := New(&snapshot.Backend{Endpoints: endpoints(2), ClientIPAffinitySeconds: 3600}, h, CarryAffinity(nil, 3600))
		a := ClientOf(noPods, netip.MustParseAddrPort("10.1.0.1:40000"), nil)
		home := p.PickClient(a)
		sp := &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "s"}
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		hdr := http.Header{}
		p.SetSession(hdr, r, home, time.Now(), sp)
		r.Header.Set("s", hdr.Get("s"))

		h.Failed(home.Endpoint.Addr, time.Now(), time.Now())
		time.Sleep(time.Minute) // the ejection over
		for p.Pick().Endpoint != home.Endpoint {
		} // another request takes the probe
		if got := p.PickClient(a); got != home {
			t.Errorf("probe out: the pinned client went to %s, want its endpoint %s", got.Host, home.Host)
		}
		if c, pinned, _ := p.PickRequest(r, ClientKey{}, time.Now(), sp); c != home || !pinned {
			t.Errorf("probe out: the session went to %s (pinned %v), want its endpoint %s", c.Host, pinned, home.Host)
		}
		h.Failed(home.Endpoint.Addr, time.Now(), time.Now()) // the probe failed: ejected again
		if got := p.PickClient(a); got == home {
			t.Errorf("ejected: the pinned client went to it, %s", got.Host)
		}
	})
}

// noPods is a snapshot that names no pod at any address.
var noPods = &snapshot.Snapshot{}

// TestDualStackPodOneClient: in node-IP mode a pod connecting over IPv4
// and over IPv6 is one client, pinned to one endpoint, as the snapshot
// names the pod at both addresses; an address no pod holds is its own.
func TestDualStackPodOneClient(t *testing.T) {
	pod := snapshot.ObjectRef{Namespace: "a", Name: "dual"}
	s, err := snapshot.New(1, nil, nil, []snapshot.Workload{{
		Pod: pod, Enrolled: true,
		IPs: []netip.Addr{netip.MustParseAddr("10.1.0.7"), netip.MustParseAddr("fd00::7")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	v4 := ClientOf(s, netip.MustParseAddrPort("10.1.0.7:40000"), nil)
	v6 := ClientOf(s, netip.MustParseAddrPort("[fd00::7]:40000"), nil)
	if v4 != v6 || v4.Pod != pod {
		t.Fatalf("the pod's IPv4 and IPv6 connections are %v and %v, want one client %v", v4, v6, pod)
	}
	b := &snapshot.Backend{Endpoints: endpoints(3), ClientIPAffinitySeconds: 10}
	p := New(b, NewHealth(time.Minute, time.Minute, nil), CarryAffinity(nil, b.ClientIPAffinitySeconds))
	first := p.PickClient(v4)
	for range 5 {
		if got := p.PickClient(v6); got.Endpoint.Addr != first.Endpoint.Addr {
			t.Fatalf("the pod's IPv6 connection went to %s, its IPv4 one to %s", got.Host, first.Host)
		}
	}
	if other := ClientOf(s, netip.MustParseAddrPort("10.1.0.8:40000"), nil); other.Addr != netip.MustParseAddr("10.1.0.8") {
		t.Fatalf("an address no pod holds is %v, want keyed by its address", other)
	}
}
