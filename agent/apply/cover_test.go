package apply

import (
	"net/netip"
	"testing"
)

func TestCover(t *testing.T) {
	dbAt1 := svc{name: "db", vip: "10.96.0.1"} // web's address, given to db
	for _, tc := range []struct {
		name       string
		served     []svc
		servedPods []pod
		next       []svc
		nextPods   []pod
		// want maps an address to the Service the cover serves there.
		want map[string]string
		// wantPods maps an address to the pod the cover names.
		wantPods map[string]string
	}{{
		name:   "a Service reuses a deleted one's address",
		served: []svc{web, db},
		next:   []svc{dbAt1},
		want:   map[string]string{"10.96.0.1:80": "db"},
	}, {
		name:       "a pod opted out stays enrolled until the enrolments drop it",
		servedPods: []pod{client, batch},
		nextPods:   []pod{client, {name: "batch", ip: "10.0.0.6"}},
		wantPods:   map[string]string{"10.0.0.5": "client", "10.0.0.6": "batch"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			served, next := build(t, 1, tc.served, tc.servedPods), build(t, 2, tc.next, tc.nextPods)
			c, err := cover(served, next)
			if err != nil {
				t.Fatal(err)
			}
			if c == next || c.Version != 1 {
				t.Errorf("cover = snapshot %d (next: %v), want a copy with version 1", c.Version, c == next)
			}
			for ap, name := range tc.want {
				if fe, ok := c.Frontend(netip.MustParseAddrPort(ap)); !ok || fe.Service.Name != name {
					t.Errorf("Frontend(%s) = %v, %v; want %s", ap, fe, ok, name)
				}
			}
			for ip, name := range tc.wantPods {
				if w, ok := c.Workload(netip.MustParseAddr(ip)); !ok || w.Pod.Name != name {
					t.Errorf("Workload(%s) = %v, %v; want %s", ip, w, ok, name)
				}
			}
			if len(c.Workloads) != len(next.Workloads) {
				t.Errorf("cover holds %d workloads, want %d: one entry per pod", len(c.Workloads), len(next.Workloads))
			}
		})
	}
}

// TestCoverDropsNothing: when next drops nothing, cover is next itself,
// so the proxy gets it once and nothing is copied.
func TestCoverDropsNothing(t *testing.T) {
	served := build(t, 1, []svc{web}, []pod{client})
	next := build(t, 2, []svc{webTLS, api}, []pod{client, batch})
	if c, err := cover(served, next); err != nil || c != next {
		t.Errorf("cover = %v, %v; want next itself", c, err)
	}
}
