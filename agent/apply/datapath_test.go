package apply

import (
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/internal/sandbox"
)

type proxyNop struct{}

func (proxyNop) Update(*snapshot.Snapshot) {}

// TestMapsFollowSnapshots applies a sequence of Snapshots to the real
// datapath and enrolments (pods in network namespaces of their own) and
// compares the maps with each: a Service deleted or moved to another
// address, a pod opted out, and a pod deleted and recreated under its
// name and address leave nothing behind.
func TestMapsFollowSnapshots(t *testing.T) {
	// 10.235.0.0/16 belongs to this test alone in this repository.
	sandbox.ClaimAddrs(t, netip.MustParsePrefix("10.235.0.0/16"))
	dp, err := datapath.Open(datapath.Config{BPFFS: sandbox.TempBPFFS(t), Cgroup: sandbox.NewCgroup(t).Path}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dp.Uninstall(); err != nil {
			t.Errorf("uninstall the datapath: %v", err)
		}
	})
	nodeProxy := datapath.Proxy{NetNSCookie: 1, V4: netip.MustParseAddrPort("10.235.255.1:15001")}
	en, err := enrol.New(enrol.Config{NodeProxy: nodeProxy}, dp, nil, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { en.Close() })
	a, err := New(Config{}, nil, proxyNop{}, dp, en, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	// podNS makes a pod's network namespace holding ip.
	podNS := func(ip string) (*sandbox.NetNS, uint64) {
		ns := sandbox.NewNetNS(t)
		ns.AddAddr(t, "lo", netip.PrefixFrom(netip.MustParseAddr(ip), 32))
		cookie, err := ns.Cookie()
		if err != nil {
			t.Fatal(err)
		}
		return ns, cookie
	}
	podA := pod{name: "a", ip: "10.235.0.1", enrolled: true}
	podB := pod{name: "b", ip: "10.235.0.2", enrolled: true}
	oldA, cookieA := podNS(podA.ip)
	_, cookieB := podNS(podB.ip)

	check := func(s *snapshot.Snapshot, enrolled ...uint64) {
		t.Helper()
		if err := a.apply(s); err != nil {
			t.Fatalf("apply snapshot %d: %v", s.Version, err)
		}
		got, err := dp.Services()
		if err != nil {
			t.Fatal(err)
		}
		want := datapath.ServicesFromSnapshot(s)
		for i := range want {
			want[i].Of = snapshot.ObjectRef{} // the map does not hold it
		}
		byAddr := func(x, y datapath.Service) int { return x.Addr.Compare(y.Addr) }
		slices.SortFunc(got, byAddr)
		slices.SortFunc(want, byAddr)
		if !slices.Equal(got, want) {
			t.Errorf("snapshot %d: services map %v, want %v", s.Version, got, want)
		}
		gotEn, err := dp.Enrolments()
		if err != nil {
			t.Fatal(err)
		}
		wantEn := map[uint64]datapath.Proxy{}
		for _, c := range enrolled {
			wantEn[c] = nodeProxy
		}
		if !maps.Equal(gotEn, wantEn) {
			t.Errorf("snapshot %d: enrolments %v, want %v", s.Version, gotEn, wantEn)
		}
	}

	check(build(t, 1, []svc{web, db}, []pod{podA, podB}), cookieA, cookieB)
	// db is deleted, web's address changes, api is new; b opts out.
	movedWeb := svc{name: "web", vip: "10.96.0.9"}
	check(build(t, 2, []svc{movedWeb, api}, []pod{podA, {name: "b", ip: podB.ip}}), cookieA)
	// a is deleted and recreated under its name, with its address, in a
	// new sandbox (a new UID): the old sandbox lost the address.
	if err := oldA.Do(func() error {
		l, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrDel(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(podA.ip).To4(), Mask: net.CIDRMask(32, 32)}})
	}); err != nil {
		t.Fatal(err)
	}
	_, cookieA2 := podNS(podA.ip)
	newA := podA
	newA.uid = "a-uid-2"
	check(build(t, 3, []svc{movedWeb, api, db}, []pod{newA, podB}), cookieA2, cookieB)
	check(build(t, 4, nil, nil))
}
