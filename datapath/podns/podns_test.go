package podns_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sockmesh/sockmesh/datapath/podns"
	"github.com/sockmesh/sockmesh/internal/leakcheck"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/syncbuf"
)

// TestFindByIP scans the machine's namespaces: it claims its addresses
// (sandbox.ClaimAddrs), which a run from another checkout gives out too.
func TestFindByIP(t *testing.T) {
	sandbox.ClaimAddrs(t, netip.MustParsePrefix("10.202.0.0/16"), netip.MustParsePrefix("fd00:202::/32"))
	a, b := sandbox.NewNetNS(t), sandbox.NewNetNS(t)
	ipA, ipB := netip.MustParseAddr("10.202.0.1"), netip.MustParseAddr("fd00:202::2")
	sandbox.NewVeth(t, a, b, []netip.Prefix{netip.PrefixFrom(ipA, 24)}, []netip.Prefix{netip.PrefixFrom(ipB, 64)})

	for _, tc := range []struct {
		ip   netip.Addr
		want *sandbox.NetNS
	}{{ipA, a}, {ipB, b}, {netip.AddrFrom16(ipA.As16()), a}} {
		got, err := podns.FindByIP(tc.ip)
		if err != nil {
			t.Errorf("FindByIP(%s): %v", tc.ip, err)
			continue
		}
		gotIno, _ := got.Inode()
		wantIno, _ := tc.want.Inode()
		if gotIno != wantIno {
			t.Errorf("FindByIP(%s) = netns %d (%s), want %d (%s)", tc.ip, gotIno, got.Path(), wantIno, tc.want.Name)
		}
		got.Close()
	}
	if _, err := podns.FindByIP(netip.MustParseAddr("10.202.0.99")); !errors.Is(err, podns.ErrNotFound) {
		t.Errorf("FindByIP(unknown) = %v, want ErrNotFound", err)
	}
	// Every netns has its own 127.0.0.1.
	if _, err := podns.FindByIP(netip.MustParseAddr("127.0.0.1")); !errors.Is(err, podns.ErrAmbiguous) {
		t.Errorf("FindByIP(127.0.0.1) = %v, want ErrAmbiguous", err)
	}
}

func TestCookie(t *testing.T) {
	a, b := sandbox.NewNetNS(t), sandbox.NewNetNS(t)
	again, err := podns.Open(a.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	ca, err1 := a.Cookie()
	ca2, err2 := again.Cookie()
	cb, err3 := b.Cookie()
	if err := errors.Join(err1, err2, err3); err != nil {
		t.Fatal(err)
	}
	if ca != ca2 {
		t.Errorf("same netns opened twice: cookies %d and %d differ", ca, ca2)
	}
	if ca == cb || ca == 0 {
		t.Errorf("cookies %d and %d: want two different, non-zero ones", ca, cb)
	}
}

// TestCurrentCookie: the process's own netns outside Do, the entered one
// inside.
func TestCurrentCookie(t *testing.T) {
	ns := sandbox.NewNetNS(t)
	self, err := podns.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	wantSelf, err1 := self.Cookie()
	wantNS, err2 := ns.Cookie()
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if got, err := podns.CurrentCookie(); err != nil || got != wantSelf {
		t.Errorf("CurrentCookie() = %d, %v; want the process's netns %d", got, err, wantSelf)
	}
	var inside uint64
	if err := ns.Do(func() (err error) {
		inside, err = podns.CurrentCookie()
		return err
	}); err != nil || inside != wantNS {
		t.Errorf("CurrentCookie() inside Do = %d, %v; want the entered netns %d", inside, err, wantNS)
	}
}

func TestListen(t *testing.T) {
	ns := sandbox.NewNetNS(t)
	ln, err := ns.Listen(context.Background(), nil, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := ns.Dial(nil, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial the in-netns listener from inside: %v", err)
	}
	c.Close()
}

func TestOpenRejectsOtherFiles(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "not-a-netns")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if ns, err := podns.Open(f.Name()); err == nil {
		ns.Close()
		t.Error("Open(regular file) succeeded")
	}
	if _, err := podns.Open("/nonexistent/netns"); err == nil {
		t.Error("Open(missing path) succeeded")
	}
}

// TestDefaultRouteAddrs: a node gets an address per family it has a
// default route in — both on a dual-stack node, whose proxy must listen in
// each — and none for a family without one.
func TestDefaultRouteAddrs(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.219.0.2/24"), netip.MustParsePrefix("fd00:219::2/64")
	gw4, gw6 := netip.MustParseAddr("10.219.0.1"), netip.MustParseAddr("fd00:219::1")
	for _, tc := range []struct {
		name   string
		routes []netip.Addr // default routes via these gateways
		want   []netip.Addr
	}{
		{"dual-stack", []netip.Addr{gw6, gw4}, []netip.Addr{v4.Addr(), v6.Addr()}},
		{"IPv4 only", []netip.Addr{gw4}, []netip.Addr{v4.Addr()}},
		{"IPv6 only", []netip.Addr{gw6}, []netip.Addr{v6.Addr()}},
		{"no default route", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, router := sandbox.NewNetNS(t), sandbox.NewNetNS(t)
			// Both families' addresses, whatever the routes: a family
			// without a default route has no node address to offer.
			sandbox.NewVeth(t, node, router, []netip.Prefix{v4, v6},
				[]netip.Prefix{netip.PrefixFrom(gw4, 24), netip.PrefixFrom(gw6, 64)})
			for _, gw := range tc.routes {
				def := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
				if gw.Is6() {
					def = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
				}
				node.AddRoute(t, def, gw)
			}
			got, err := node.DefaultRouteAddrs()
			if tc.want == nil {
				if err == nil {
					t.Errorf("DefaultRouteAddrs() = %v, want an error", got)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("DefaultRouteAddrs() = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestAddrsLeaveOutIPVS: a namespace's addresses leave out those on
// kube-ipvs0, the dummy interface where kube-proxy's IPVS mode puts every
// ClusterIP: they are Services', and an ExternalHostname answer that is
// one is refused as a Service's, not as the node's.
func TestAddrsLeaveOutIPVS(t *testing.T) {
	node, peer := sandbox.NewNetNS(t), sandbox.NewNetNS(t)
	own := netip.MustParsePrefix("10.218.0.2/24")
	sandbox.NewVeth(t, node, peer, []netip.Prefix{own}, []netip.Prefix{netip.MustParsePrefix("10.218.0.1/24")})
	clusterIP := netip.MustParseAddr("10.96.7.7")
	// kube-proxy's is a dummy; a bridge will do, the name is what counts.
	node.AddBridge(t, "kube-ipvs0")
	node.AddAddr(t, "kube-ipvs0", netip.PrefixFrom(clusterIP, 32))
	got, err := node.Addrs()
	if err != nil || !slices.Contains(got, own.Addr()) || slices.Contains(got, clusterIP) {
		t.Errorf("Addrs() = %v, %v; want %s and not kube-ipvs0's %s", got, err, own.Addr(), clusterIP)
	}
}

// TestAddrWatch: the watch follows the namespace's global addresses in
// both families, on every interface (lo's too, not its loopback ones), as
// they come and go, on a new interface too; it leaves kube-ipvs0's out as
// Addrs does, and its subscription ends with Run.
func TestAddrWatch(t *testing.T) {
	leakcheck.Register(t, "/datapath/podns/", "/vishvananda/netlink")
	node, peer := sandbox.NewNetNS(t), sandbox.NewNetNS(t)
	own := netip.MustParsePrefix("10.217.0.2/24")
	sandbox.NewVeth(t, node, peer, []netip.Prefix{own}, []netip.Prefix{netip.MustParsePrefix("10.217.0.1/24")})
	onLo := netip.MustParsePrefix("10.217.1.2/24")
	node.AddAddr(t, "lo", onLo)
	w, err := node.WatchAddrs(t.Context(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := w.Addrs(), []netip.Addr{own.Addr(), onLo.Addr()}; !slices.Equal(got, want) {
		t.Fatalf("Addrs() = %v before Run, want %v", got, want)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	br, later := sandbox.Name(), netip.MustParsePrefix("fd00:217::9/64")
	clusterIP := netip.MustParseAddr("10.96.217.7")
	node.AddBridge(t, "kube-ipvs0")
	node.AddBridge(t, br)
	node.AddAddr(t, "kube-ipvs0", netip.PrefixFrom(clusterIP, 32))
	node.AddAddr(t, br, later)
	waitAddrs(w, func(a []netip.Addr) bool { return slices.Contains(a, later.Addr()) })
	if got := w.Addrs(); slices.Contains(got, clusterIP) {
		t.Errorf("Addrs() = %v, want kube-ipvs0's %s left out", got, clusterIP)
	}
	node.DelLink(t, br)
	waitAddrs(w, func(a []netip.Addr) bool { return !slices.Contains(a, later.Addr()) })

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run() = %v, want nil when ctx ends", err)
	}
}

// waitAddrs waits for w's addresses to satisfy ok.
func waitAddrs(w *podns.AddrWatch, ok func([]netip.Addr) bool) {
	for !ok(w.Addrs()) {
		<-w.Changed()
	}
}

// TestAddrWatchResubscribes: when the kernel drops the watch's
// subscription (a burst of address changes overran its socket: ENOBUFS),
// the watch subscribes again, catches up with what it missed, and sees
// the addresses added afterwards. Its warning counts the addresses it
// keeps and names the first few (it listed all 2048).
func TestAddrWatchResubscribes(t *testing.T) {
	leakcheck.Register(t, "/datapath/podns/", "/vishvananda/netlink")
	node := sandbox.NewNetNS(t)
	br, addr := bridgeWithAddrs(t, node)
	w, logs := runWatch(t, node)

	// Changing an address's lifetimes tells the subscribers each time,
	// and leaves the list as it is (a dump under way is not interrupted).
	const most = 1 << 20
	n := 0
	onBridge(t, node, br, func(l netlink.Link) error {
		a := addr(0)
		for ; n < most && !strings.Contains(logs.String(), "node address watch failed"); n++ {
			a.ValidLft, a.PreferedLft = 3600+n%2, 3600
			if err := netlink.AddrReplace(l, a); err != nil {
				return err
			}
		}
		return nil
	})
	if n == most {
		t.Fatalf("%d address changes and the subscription still stands; log:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), syscall.ENOBUFS.Error()) {
		t.Fatalf("the subscription ended for another reason than an overrun; log:\n%s", logs.String())
	}
	if warning := logs.String(); !strings.Contains(warning, fmt.Sprintf("addrs=%d", many)) || strings.Contains(warning, addr(many-1).IP.String()) {
		t.Errorf("the warning names other than a count and the first addresses:\n%.2000s", warning)
	}
	// Added after the subscription ended: seen by the read after the
	// watch subscribed again, and the next by that subscription.
	for _, p := range []netip.Prefix{netip.MustParsePrefix("10.216.255.1/32"), netip.MustParsePrefix("10.216.255.2/32")} {
		node.AddAddr(t, br, p)
		waitAddrs(w, func(a []netip.Addr) bool { return slices.Contains(a, p.Addr()) })
	}
}

// TestAddrWatchChurn: addresses added and removed faster than the watch
// reads the list, each read interrupted by the next change, are no failure
// of the watch: it reads again after them, without a warning, and ends
// with the addresses that stay. Five reads interrupted in a row failed it
// (a warning, and a second with the addresses of before).
func TestAddrWatchChurn(t *testing.T) {
	leakcheck.Register(t, "/datapath/podns/", "/vishvananda/netlink")
	node := sandbox.NewNetNS(t)
	br, addr := bridgeWithAddrs(t, node)
	w, logs := runWatch(t, node)

	const rereads = 3
	stopped := churn(t, node, br, addr, func() bool { return strings.Count(logs.String(), reread) >= rereads || interruptedFailure(logs) != "" })
	if line := interruptedFailure(logs); line != "" {
		t.Errorf("reads interrupted by the changes failed the watch: %.500s", line)
	} else if !stopped {
		t.Fatalf("%d address changes and no read of the watch interrupted", 2*churnMost)
	}
	last := netip.MustParsePrefix("10.216.255.3/32")
	node.AddAddr(t, br, last)
	want := []netip.Addr{last.Addr()}
	for i := range many {
		want = append(want, netip.AddrFrom4([4]byte(addr(i).IP.To4())))
	}
	slices.SortFunc(want, netip.Addr.Compare)
	waitAddrs(w, func(a []netip.Addr) bool { return slices.Equal(a, want) })
}

// TestWatchAddrsChurn: WatchAddrs, the agent's first read of the node's
// addresses, called while addresses are added and removed faster than it
// reads them, returns the namespace's addresses and no error: it reads
// again after a read the changes interrupted, as Run does. Five reads
// interrupted in a row failed it, and with it the agent's start.
func TestWatchAddrsChurn(t *testing.T) {
	leakcheck.Register(t, "/datapath/podns/", "/vishvananda/netlink")
	node := sandbox.NewNetNS(t)
	br, addr := bridgeWithAddrs(t, node)
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	const rereads, most = 10, 10000
	calls, churnEnded, done := 0, atomic.Bool{}, make(chan struct{})
	go func() { // until it ends, changes come faster than reads
		defer close(done)
		for ; calls < most && !churnEnded.Load() && strings.Count(logs.String(), reread) < rereads; calls++ {
			w, err := node.WatchAddrs(t.Context(), log)
			if err != nil {
				t.Errorf("WatchAddrs() under churn: %v", err)
				return
			}
			if missing, other := addrsOff(w.Addrs(), addr); missing != 0 || len(other) != 0 {
				t.Errorf("WatchAddrs() under churn: %d of its addresses missing, and %v", missing, other)
			}
		}
	}()
	churn(t, node, br, addr, func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	churnEnded.Store(true)
	<-done
	if n := strings.Count(logs.String(), reread); !t.Failed() && n < rereads {
		t.Fatalf("%d reads of %d calls interrupted under churn, want %d", n, calls, rereads)
	}
}

// addrsOff compares got, the addresses of bridgeWithAddrs's namespace
// while churn runs, with addr(0) to addr(many-1): missing counts those
// not in got, other lists got's that are none of them nor churn's.
func addrsOff(got []netip.Addr, addr func(int) *netlink.Addr) (missing int, other []netip.Addr) {
	ours := map[netip.Addr]int{}
	for i := range many + churned {
		ours[netip.AddrFrom4([4]byte(addr(i).IP.To4()))] = i
	}
	seen := 0
	for _, a := range got {
		switch i, ok := ours[a]; {
		case !ok:
			other = append(other, a)
		case i < many:
			seen++
		}
	}
	return many - seen, other
}

// churned is how many addresses churn adds and removes in turn: addr(many)
// to addr(many+churned-1).
const churned = 16

// churnMost bounds churn's changes.
const churnMost = 1 << 20

// churn adds and removes addresses on br in node, each as soon as the last
// change is done, until done reports true (it reports true then) or after
// churnMost (false). Each change interrupts a read of the namespace's
// addresses under way, when it falls between two rounds of its dump.
func churn(t *testing.T, node *sandbox.NetNS, br string, addr func(int) *netlink.Addr, done func() bool) bool {
	t.Helper()
	n := 0
	onBridge(t, node, br, func(l netlink.Link) error {
		for ; n < churnMost && !done(); n++ {
			a := addr(many + n%churned)
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
			if err := netlink.AddrDel(l, a); err != nil {
				return err
			}
		}
		return nil
	})
	return n < churnMost
}

// runWatch starts a watch of node's addresses, logging at Debug, and ends
// it when t ends.
func runWatch(t *testing.T, node *sandbox.NetNS) (*podns.AddrWatch, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	w, err := node.WatchAddrs(t.Context(), slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v, want nil when ctx ends", err)
		}
	})
	return w, logs
}

// reread is what the watch logs when changes interrupted its read.
const reread = "changed while read"

// interruptedFailure is the warning in logs of a watch failed by an
// interrupted read, or "". An overrun (ENOBUFS) may end the subscription
// under churn too: that failure is TestAddrWatchResubscribes's, tolerated
// by TestAddrWatchChurn.
func interruptedFailure(logs *syncbuf.Buffer) string {
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "node address watch failed") && strings.Contains(line, netlink.ErrDumpInterrupted.Error()) {
			return line
		}
	}
	return ""
}

// many is how many addresses bridgeWithAddrs gives its bridge: enough that
// the kernel dumps them in several rounds, so that a change between two
// rounds interrupts a read, and that each read is slow.
const many = 2048

// bridgeWithAddrs adds a bridge to node with the addresses addr(0) to
// addr(many-1); addr(i) is 10.216.<i/256>.<i%256>/32.
func bridgeWithAddrs(t *testing.T, node *sandbox.NetNS) (string, func(int) *netlink.Addr) {
	t.Helper()
	br := sandbox.Name()
	node.AddBridge(t, br)
	addr := func(i int) *netlink.Addr {
		return &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 216, byte(i>>8), byte(i)), Mask: net.CIDRMask(32, 32)}}
	}
	onBridge(t, node, br, func(l netlink.Link) error {
		for i := range many {
			if err := netlink.AddrAdd(l, addr(i)); err != nil {
				return err
			}
		}
		return nil
	})
	return br, addr
}

// onBridge runs f with the link br of node, inside node.
func onBridge(t *testing.T, node *sandbox.NetNS, br string, f func(netlink.Link) error) {
	t.Helper()
	if err := node.Do(func() error {
		l, err := netlink.LinkByName(br)
		if err != nil {
			return err
		}
		return f(l)
	}); err != nil {
		t.Fatal(err)
	}
}
