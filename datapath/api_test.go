package datapath

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/sandbox"
)

// openBare opens a Datapath on a throwaway cgroup and bpffs, for tests of
// the Go API on real maps.
func openBare(t *testing.T) *Datapath {
	t.Helper()
	d, err := Open(Config{BPFFS: sandbox.TempBPFFS(t), Cgroup: sandbox.NewCgroup(t).Path}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Uninstall() })
	return d
}

func snap(t *testing.T, frontends ...snapshot.Frontend) *snapshot.Snapshot {
	t.Helper()
	var backends []snapshot.Backend
	for i := range frontends {
		ref := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "ns", Name: frontends[i].Service.Name, Port: frontends[i].Port}
		frontends[i].Backend = ref
		backends = append(backends, snapshot.Backend{Ref: ref})
	}
	s, err := snapshot.New(1, frontends, backends, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func sortedServices(t *testing.T, d *Datapath) []Service {
	t.Helper()
	got, err := d.Services()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b Service) int { return a.Addr.Compare(b.Addr) })
	return got
}

func TestApply(t *testing.T) {
	d := openBare(t)
	a4, a6 := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00:96::1")
	b4 := netip.MustParseAddr("10.96.0.2")
	first := snap(t,
		snapshot.Frontend{Service: snapshot.ObjectRef{Namespace: "ns", Name: "a"}, Port: 443,
			Addresses: []netip.Addr{a4, a6}, FailurePolicy: snapshot.FailClosed},
		snapshot.Frontend{Service: snapshot.ObjectRef{Namespace: "ns", Name: "b"}, Port: 80,
			Addresses: []netip.Addr{b4}, FailurePolicy: snapshot.FailOpen},
		// An unset policy is read as fail-closed.
		snapshot.Frontend{Service: snapshot.ObjectRef{Namespace: "ns", Name: "c"}, Port: 8080,
			Addresses: []netip.Addr{netip.AddrFrom16(b4.As16())}},
	)
	if err := d.Apply(first); err != nil {
		t.Fatal(err)
	}
	want := []Service{
		{Addr: netip.AddrPortFrom(a4, 443)},
		{Addr: netip.AddrPortFrom(b4, 80), FailOpen: true},
		{Addr: netip.AddrPortFrom(b4, 8080)},
		{Addr: netip.AddrPortFrom(a6, 443)},
	}
	if got := sortedServices(t, d); !slices.Equal(got, want) {
		t.Errorf("after first Apply: services %v, want %v", got, want)
	}

	// b's policy flips, a loses its IPv6 address, c goes away.
	second := snap(t,
		snapshot.Frontend{Service: snapshot.ObjectRef{Namespace: "ns", Name: "a"}, Port: 443,
			Addresses: []netip.Addr{a4}, FailurePolicy: snapshot.FailClosed},
		snapshot.Frontend{Service: snapshot.ObjectRef{Namespace: "ns", Name: "b"}, Port: 80,
			Addresses: []netip.Addr{b4}, FailurePolicy: snapshot.FailClosed},
	)
	if err := d.Apply(second); err != nil {
		t.Fatal(err)
	}
	want = []Service{{Addr: netip.AddrPortFrom(a4, 443)}, {Addr: netip.AddrPortFrom(b4, 80)}}
	if got := sortedServices(t, d); !slices.Equal(got, want) {
		t.Errorf("after second Apply: services %v, want %v", got, want)
	}

	if err := d.Apply(snapshot.Empty()); err != nil {
		t.Fatal(err)
	}
	if got := sortedServices(t, d); len(got) != 0 {
		t.Errorf("after empty Apply: services %v, want none", got)
	}
}

func TestSetServicesRejectsBadInput(t *testing.T) {
	d := openBare(t)
	if err := d.SetServices([]Service{{Addr: netip.MustParseAddrPort("10.96.0.1:80")}}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []netip.AddrPort{{}, netip.MustParseAddrPort("10.96.0.1:0")} {
		if err := d.SetServices([]Service{{Addr: bad}}); err == nil {
			t.Errorf("SetServices(%v) succeeded", bad)
		}
	}
	// One address in two Services: leaving one out would take the other's.
	shared := netip.MustParseAddrPort("10.96.0.2:80")
	if err := d.SetServices([]Service{{Addr: shared, Of: snapshot.ObjectRef{Namespace: "ns", Name: "a"}},
		{Addr: shared, Of: snapshot.ObjectRef{Namespace: "ns", Name: "b"}}}); err == nil {
		t.Errorf("SetServices with %v in two Services succeeded", shared)
	}
	// A rejected call changes nothing.
	if got := sortedServices(t, d); len(got) != 1 {
		t.Errorf("services after rejected calls: %v, want the one set before", got)
	}
}

func TestEnrol(t *testing.T) {
	d := openBare(t)
	const pod, node = 11, 22
	good := Proxy{NetNSCookie: node, V4: netip.MustParseAddrPort("10.0.0.1:15001"), V6: netip.MustParseAddrPort("[fd00::1]:15001")}
	bad := []struct {
		name  string
		p     Proxy
		error string
	}{
		{"no cookie", Proxy{V4: good.V4}, "cookie is 0"},
		{"no address", Proxy{NetNSCookie: node}, "no address"},
		{"port 0", Proxy{NetNSCookie: node, V4: netip.MustParseAddrPort("10.0.0.1:0")}, "invalid proxy address"},
		{"unspecified", Proxy{NetNSCookie: node, V4: netip.MustParseAddrPort("0.0.0.0:1")}, "invalid proxy address"},
		{"ipv6 as V4", Proxy{NetNSCookie: node, V4: good.V6}, "not IPv4"},
		{"ipv4 as V6", Proxy{NetNSCookie: node, V6: good.V4}, "not IPv6"},
		{"mapped as V6", Proxy{NetNSCookie: node, V6: netip.MustParseAddrPort("[::ffff:10.0.0.1]:1")}, "not IPv6"},
		{"loopback elsewhere", Proxy{NetNSCookie: node, V4: netip.MustParseAddrPort("127.0.0.1:15001")}, ErrLoopbackElsewhere.Error()},
	}
	for _, tc := range bad {
		if err := d.Enrol(pod, tc.p); err == nil || !strings.Contains(err.Error(), tc.error) {
			t.Errorf("Enrol(%s) = %v, want an error containing %q", tc.name, err, tc.error)
		}
	}
	inPod := Proxy{NetNSCookie: pod, V4: netip.MustParseAddrPort("127.0.0.1:15001"), V6: netip.MustParseAddrPort("[::1]:15001")}
	mapped := Proxy{NetNSCookie: node, V4: netip.MustParseAddrPort("[::ffff:10.0.0.1]:15001")}
	if err := d.SetEnrolments(map[uint64]Proxy{pod: inPod, 33: good, 44: mapped}); err != nil {
		t.Fatal(err)
	}
	unmapped := Proxy{NetNSCookie: node, V4: netip.MustParseAddrPort("10.0.0.1:15001")}
	got, err := d.Enrolments()
	if err != nil {
		t.Fatal(err)
	}
	if want := map[uint64]Proxy{pod: inPod, 33: good, 44: unmapped}; !equalMaps(got, want) {
		t.Errorf("Enrolments() = %v, want %v", got, want)
	}
	if err := d.SetEnrolments(map[uint64]Proxy{33: good}); err != nil {
		t.Fatal(err)
	}
	if err := d.Unenrol(33); err != nil {
		t.Fatal(err)
	}
	if err := d.Unenrol(33); err != nil {
		t.Errorf("Unenrol(not enrolled) = %v, want nil", err)
	}
	if got, err := d.Enrolments(); err != nil || len(got) != 0 {
		t.Errorf("Enrolments() after unenrolling all = %v, %v", got, err)
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := Config{Cgroup: "/x"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BPFFS != "/sys/fs/bpf" || cfg.ProxyMark == 0 || cfg.HeartbeatMaxAge != DefaultHeartbeatMaxAge {
		t.Errorf("defaults = %+v", cfg)
	}
	if _, err := (Config{Cgroup: "/x", HeartbeatMaxAge: -1}).withDefaults(); err == nil {
		t.Error("negative HeartbeatMaxAge accepted")
	}
}

// TestIncompatiblePins: a pinned map this build cannot use makes Open fail
// with ebpf.ErrMapIncompatible (the operator uninstalls first), and never
// replaces the pin silently.
func TestIncompatiblePins(t *testing.T) {
	cfg := Config{BPFFS: sandbox.TempBPFFS(t), Cgroup: sandbox.NewCgroup(t).Path}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "sm_services", Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := os.MkdirAll(cfg.pinDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(filepath.Join(cfg.pinDir(), "sm_services")); err != nil {
		t.Fatal(err)
	}
	d, err := Open(cfg, nil, nil)
	if err == nil {
		d.Uninstall()
		t.Fatal("Open with an incompatible pinned map succeeded")
	}
	if !errors.Is(err, ebpf.ErrMapIncompatible) {
		t.Errorf("Open error = %v, want ErrMapIncompatible", err)
	}
	if err := Uninstall(cfg); err != nil {
		t.Fatal(err)
	}
	d, err = Open(cfg, nil, nil)
	if err != nil {
		t.Fatalf("Open after Uninstall: %v", err)
	}
	d.Uninstall()
}

// TestSetServicesAtCapacity: with the services map full, a snapshot that
// replaces one Service by another (as many as before) applies: the one
// removed makes room for the one added, which must be captured.
func TestSetServicesAtCapacity(t *testing.T) {
	d := openBare(t)
	n := int(d.objs.SmServices.MaxEntries())
	svcs := make([]Service, n)
	for i := range svcs {
		svcs[i] = Service{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), 80)}
	}
	if err := d.SetServices(svcs); err != nil {
		t.Fatal(err)
	}
	added := Service{Addr: netip.MustParseAddrPort("10.97.0.1:443")}
	svcs[0] = added
	if err := d.SetServices(svcs); err != nil {
		t.Fatalf("replace one service in a full map: %v", err)
	}
	got, err := d.Services()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n || !slices.Contains(got, added) {
		t.Errorf("services: %d, %v among them: %v; want %d with it", len(got), added, slices.Contains(got, added), n)
	}
}

// TestSetEnrolmentsAtCapacity: with the enrolment map full, a pod gone and
// another started apply: the one gone makes room for the new one, which
// must be captured.
func TestSetEnrolmentsAtCapacity(t *testing.T) {
	d := openBare(t)
	p := Proxy{NetNSCookie: 1, V4: netip.MustParseAddrPort("10.0.0.1:15001")}
	n := uint64(d.objs.SmNetns.MaxEntries())
	want := make(map[uint64]Proxy, n)
	for ns := range n {
		want[100+ns] = p
	}
	if err := d.SetEnrolments(want); err != nil {
		t.Fatal(err)
	}
	delete(want, 100)
	want[100+n] = p
	if err := d.SetEnrolments(want); err != nil {
		t.Fatalf("replace one enrolment in a full map: %v", err)
	}
	got, err := d.Enrolments()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got[100+n]; len(got) != int(n) || !ok {
		t.Errorf("enrolments: %d, netns %d among them: %v; want %d with it", len(got), 100+n, ok, n)
	}
}

// TestSetServicesWholeOrNone: past the services map's capacity, each
// Kubernetes Service is captured for all its addresses (both families,
// every port) or for none, those the map held whole stay, and the error
// names the Services left out. A Service captured for its IPv4 address
// and not its IPv6 one sends the IPv6 connections plaintext, not failed
// closed.
func TestSetServicesWholeOrNone(t *testing.T) {
	d, err := Open(Config{BPFFS: sandbox.TempBPFFS(t), Cgroup: sandbox.NewCgroup(t).Path, servicesMaxEntries: 4}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Uninstall() })
	svc := func(name string, port uint16, addrs ...string) snapshot.Frontend {
		f := snapshot.Frontend{Service: snapshot.ObjectRef{Namespace: "ns", Name: name}, Port: port}
		for _, a := range addrs {
			f.Addresses = append(f.Addresses, netip.MustParseAddr(a))
		}
		return f
	}
	a := svc("a", 443, "10.96.0.1", "fd00:96::1")
	b := svc("b", 80, "10.96.0.2")
	c := svc("c", 443, "10.96.0.3", "fd00:96::3")
	first := svc("0-first", 443, "10.96.0.4", "fd00:96::4") // listed before a and b
	a8443 := svc("a", 8443, "10.96.0.1", "fd00:96::1")
	addrsOf := func(fs ...snapshot.Frontend) []Service {
		var out []Service
		for _, f := range fs {
			for _, a := range f.Addresses {
				out = append(out, Service{Addr: netip.AddrPortFrom(a, f.Port)})
			}
		}
		slices.SortFunc(out, func(a, b Service) int { return a.Addr.Compare(b.Addr) })
		return out
	}
	for _, step := range []struct {
		name      string
		frontends []snapshot.Frontend
		want      []snapshot.Frontend // captured
		left      []string            // named by the error
	}{
		{"a and b fit", []snapshot.Frontend{a, b}, []snapshot.Frontend{a, b}, nil},
		{"c, dual-stack, has one free entry", []snapshot.Frontend{a, b, c}, []snapshot.Frontend{a, b}, []string{"ns/c"}},
		{"the map's Services stay before one listed first", []snapshot.Frontend{first, a, b}, []snapshot.Frontend{a, b}, []string{"ns/0-first"}},
		{"b gone: c fits", []snapshot.Frontend{a, c}, []snapshot.Frontend{a, c}, nil},
		{"a's new port does not fit: none of a stays", []snapshot.Frontend{a, a8443, c}, []snapshot.Frontend{c}, []string{"ns/a"}},
	} {
		err := d.Apply(snap(t, step.frontends...))
		if step.left == nil && err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if step.left != nil {
			var full *servicesFullError
			if !errors.As(err, &full) || !slices.Equal(full.left, step.left) || !errors.Is(err, ErrServicesLeftOut) {
				t.Errorf("%s: error %v, want one naming %v left out", step.name, err, step.left)
			}
		}
		if got, want := sortedServices(t, d), addrsOf(step.want...); !slices.Equal(got, want) {
			t.Errorf("%s: services map %v, want %v", step.name, got, want)
		}
	}
}
