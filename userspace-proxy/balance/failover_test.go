package balance

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestFailover: after tries to endpoints none ejects, each way of picking
// hands out one not tried while there is one — whatever turn, load or pin
// would have named a tried one — and a tried one only when every endpoint
// was.
func TestFailover(t *testing.T) {
	eps := endpoints(3)
	a, b, c := eps[0].Addr, eps[1].Addr, eps[2].Addr
	client := ClientKey{Addr: netip.MustParseAddr("192.0.2.1")}
	for _, tc := range []struct {
		name  string
		tried Tried
		// pick picks from p, whose next turn, least loaded endpoint and
		// client pin are a.
		pick func(p *Picker, tried Tried) *Choice
		want []netip.AddrPort // any of
		// pins: the client is pinned where the pick went.
		pins bool
	}{
		{"turns", Tried{a}, func(p *Picker, t Tried) *Choice { return p.Untried(t, p.Pick) }, []netip.AddrPort{b, c}, false},
		{"turns, two tried", Tried{a, b}, func(p *Picker, t Tried) *Choice { return p.Untried(t, p.Pick) }, []netip.AddrPort{c}, false},
		{"turns, all tried", Tried{a, b, c}, func(p *Picker, t Tried) *Choice { return p.Untried(t, p.Pick) }, []netip.AddrPort{a, b, c}, false},
		{"fewest", Tried{a}, func(p *Picker, t Tried) *Choice { return p.FewestUntried(loadOn(a), t) }, []netip.AddrPort{b, c}, false},
		{"fewest, all tried", Tried{a, b, c}, func(p *Picker, t Tried) *Choice { return p.FewestUntried(loadOn(a), t) }, []netip.AddrPort{a, b, c}, false},
		{"client pinned", Tried{a}, func(p *Picker, t Tried) *Choice { return p.FailoverClient(client, t) }, []netip.AddrPort{b, c}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := New(&snapshot.Backend{Endpoints: eps}, NewHealth(time.Minute, time.Minute, nil), CarryAffinity(nil, 60))
			p.affinity.set(client, a, time.Now())
			p.next[0].Store(uint32(len(eps) - 1)) // the next turn is a
			got := tc.pick(p, tc.tried)
			if got == nil || !slices.Contains(tc.want, got.Endpoint.Addr) {
				t.Fatalf("after %v: picked %v, want one of %v", tc.tried, got, tc.want)
			}
			if again := p.PickClient(client); tc.pins && again.Endpoint.Addr != got.Endpoint.Addr {
				t.Errorf("the client's next pick: %v, want %v, where its failover went", again.Endpoint.Addr, got.Endpoint.Addr)
			}
		})
	}
}

// loadOn is a load under which every endpoint but least carries one
// connection.
func loadOn(least netip.AddrPort) func(netip.AddrPort) int {
	return func(ep netip.AddrPort) int {
		if ep == least {
			return 0
		}
		return 1
	}
}

func TestTriedAddOnce(t *testing.T) {
	var tried Tried
	a := netip.MustParseAddrPort("10.0.0.1:80")
	tried.Add(a)
	tried.Add(a)
	if len(tried) != 1 {
		t.Errorf("tried = %v after adding one endpoint twice, want it once", tried)
	}
}
