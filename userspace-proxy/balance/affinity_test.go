package balance

import (
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
		a := ClientOf(netip.MustParseAddrPort("10.1.0.1:40000"), nil)
		c := ClientOf(netip.MustParseAddrPort("10.1.0.2:40000"), nil)
		podA := ClientOf(netip.MustParseAddrPort("127.0.0.1:40000"), &snapshot.ObjectRef{Namespace: "a", Name: "one"})
		podB := ClientOf(netip.MustParseAddrPort("127.0.0.1:40001"), &snapshot.ObjectRef{Namespace: "a", Name: "two"})
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
		h.Failed(first.Endpoint.Addr, time.Now())
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
