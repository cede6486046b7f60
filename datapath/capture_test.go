package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/datapath/mark"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/userspace-proxy/origdst"
)

func TestNodeIPMode(t *testing.T) {
	tp := newTopology(t)
	d := tp.openCapturing(t, Service{Addr: vip4}, Service{Addr: vip6})
	proxy := startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4, tp.nodeProxy().V6},
		map[netip.AddrPort]netip.AddrPort{vip4: tp.server4, vip6: tp.server6})

	for _, vip := range []netip.AddrPort{vip4, vip6} {
		t.Run(family(vip), func(t *testing.T) {
			// The proxy's upstream leaves the node netns, which is not enrolled.
			redirectOnce(t, tp, d, proxy, vip, SkippedNotEnrolled)
		})
	}
}

// redirectOnce connects from the pod to vip and checks the whole redirect:
// the app reaches the server through the proxy, the proxy reads vip as the
// original destination, the app's getpeername shows vip, the counters show
// one redirect plus one upstreamDecision (the proxy's own connect), and no
// handoff is left behind.
func redirectOnce(t *testing.T, tp *topology, d *Datapath, proxy *testProxy, vip netip.AddrPort, upstreamDecision Decision) {
	t.Helper()
	delta := counterDelta(t, d)
	v, err := dialAndGreet(tp.pod, vip, nil)
	wantRedirected(t, v, err, vip)
	if got := proxy.next(t); got.err != nil || got.orig != vip {
		t.Errorf("proxy read original destination %v, %v; want %s", got.orig, got.err, vip)
	}
	want := map[Decision]uint64{Redirected: 1, upstreamDecision: 1}
	if got := delta(); !equalMaps(got, want) {
		t.Errorf("counters grew by %v, want %v", got, want)
	}
	wantNoHandoffs(t, d)
}

func TestInPodMode(t *testing.T) {
	tp := newTopology(t)
	d := tp.open(t)
	// The server's own addresses are captured too: the proxy, dialing them
	// with its mark from the agent's netns, is not sent back to itself.
	if err := d.SetServices([]Service{{Addr: vip4}, {Addr: vip6}, {Addr: tp.server4}, {Addr: tp.server6}}); err != nil {
		t.Fatal(err)
	}
	inPod := Proxy{
		NetNSCookie: tp.podCookie,
		V4:          netip.MustParseAddrPort("127.0.0.1:15001"),
		V6:          netip.MustParseAddrPort("[::1]:15001"),
	}
	if err := d.Enrol(tp.podCookie, inPod); err != nil {
		t.Fatal(err)
	}
	// In-pod mode puts only the listeners in the pod: the proxy dials from
	// the agent's netns (userspace-proxy/dial).
	proxy := startProxy(t, tp.pod, tp.node, []netip.AddrPort{inPod.V4, inPod.V6},
		map[netip.AddrPort]netip.AddrPort{vip4: tp.server4, vip6: tp.server6})

	for _, vip := range []netip.AddrPort{vip4, vip6} {
		t.Run(family(vip), func(t *testing.T) {
			// The proxy's upstream leaves the node netns, which is not enrolled.
			redirectOnce(t, tp, d, proxy, vip, SkippedNotEnrolled)
		})
	}

	t.Run("loopback elsewhere refused", func(t *testing.T) {
		bad := inPod
		bad.NetNSCookie = tp.nodeCookie
		if err := d.Enrol(tp.podCookie, bad); !errors.Is(err, ErrLoopbackElsewhere) {
			t.Errorf("Enrol(loopback proxy in another netns) = %v, want ErrLoopbackElsewhere", err)
		}
	})
}

// TestHostNetworkCapture: the agent's own netns enrolled, as when a
// hostNetwork pod is captured. The proxy's upstreams leave that netns for
// captured addresses: only its mark keeps them from looping.
func TestHostNetworkCapture(t *testing.T) {
	tp := newTopology(t)
	d := tp.openCapturing(t, Service{Addr: vip4}, Service{Addr: vip6}, Service{Addr: tp.server4}, Service{Addr: tp.server6})
	if err := d.Enrol(tp.nodeCookie, tp.nodeProxy()); err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4, tp.nodeProxy().V6},
		map[netip.AddrPort]netip.AddrPort{vip4: tp.server4, vip6: tp.server6})
	for _, vip := range []netip.AddrPort{vip4, vip6} {
		t.Run(family(vip), func(t *testing.T) {
			redirectOnce(t, tp, d, proxy, vip, SkippedMarked)
		})
	}
}

// TestMappedIPv4 covers IPv4 carried by AF_INET6 sockets on both ends: an
// app dialling ::ffff:a.b.c.d (as Java and dual-stack apps do; connect4 never
// runs for it), and a proxy listening on a dual-stack [::] socket, whose
// accepted IPv4 connections have mapped addresses.
func TestMappedIPv4(t *testing.T) {
	tp := newTopology(t)
	d := tp.open(t)
	if err := d.SetServices([]Service{{Addr: vip4}}); err != nil {
		t.Fatal(err)
	}
	backends := map[netip.AddrPort]netip.AddrPort{vip4: tp.server4}
	v4only := startProxy(t, tp.node, tp.node, []netip.AddrPort{netip.AddrPortFrom(nodeIP4, proxyPort)}, backends)
	dual := startProxy(t, tp.node, tp.node, []netip.AddrPort{netip.MustParseAddrPort("[::]:15002")}, backends)
	mapped := netip.AddrPortFrom(netip.AddrFrom16(vip4.Addr().As16()), vip4.Port())

	for _, listener := range []struct {
		name  string
		port  uint16
		proxy *testProxy
	}{{"ipv4 listener", proxyPort, v4only}, {"dual-stack listener", 15002, dual}} {
		for _, app := range []struct {
			name string
			dial func() (net.Conn, error)
			peer netip.AddrPort
		}{
			{"AF_INET app", func() (net.Conn, error) { return tp.pod.Dial(&net.Dialer{Timeout: ioTimeout}, "tcp", vip4.String()) }, vip4},
			{"AF_INET6 app", func() (net.Conn, error) { return dialMapped(tp.pod, mapped) }, mapped},
		} {
			t.Run(listener.name+"/"+app.name, func(t *testing.T) {
				if err := d.Enrol(tp.podCookie, Proxy{NetNSCookie: tp.nodeCookie, V4: netip.AddrPortFrom(nodeIP4, listener.port)}); err != nil {
					t.Fatal(err)
				}
				c, err := app.dial()
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				v, err := greet(c)
				if err != nil {
					t.Fatal(err)
				}
				if want := []string{"proxy " + vip4.String(), "server"}; strings.Join(v.greeting, "|") != strings.Join(want, "|") {
					t.Errorf("greeting = %q, want %q", v.greeting, want)
				}
				if v.peer != app.peer {
					t.Errorf("getpeername = %s, want %s", v.peer, app.peer)
				}
				if got := listener.proxy.next(t); got.orig != vip4 {
					t.Errorf("proxy read original destination %v, %v; want %s", got.orig, got.err, vip4)
				}
			})
		}
	}
}

// dialMapped connects an AF_INET6 socket inside ns to a mapped address (Go's
// dialer would use AF_INET for it).
func dialMapped(ns *sandbox.NetNS, dst netip.AddrPort) (net.Conn, error) {
	return socketIn(ns, unix.AF_INET6, unix.SOCK_STREAM, func(fd int) error {
		return unix.Connect(fd, &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()})
	})
}

func TestPassThrough(t *testing.T) {
	tp := newTopology(t)
	d := tp.open(t)
	// The server's real IPv4 address is captured: a redirected connection
	// shows the proxy's greeting first, an untouched one only the server's.
	if err := d.SetServices([]Service{{Addr: tp.server4}}); err != nil {
		t.Fatal(err)
	}
	if err := d.Enrol(tp.podCookie, tp.nodeProxy()); err != nil {
		t.Fatal(err)
	}
	startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4}, nil)

	t.Run("enrolled and captured", func(t *testing.T) {
		v, err := dialAndGreet(tp.pod, tp.server4, nil)
		wantRedirected(t, v, err, tp.server4)
	})
	t.Run("netns not enrolled", func(t *testing.T) {
		other := sandbox.NewNetNS(t)
		otherIP, otherGW := netip.MustParseAddr("10.201.0.2"), netip.MustParseAddr("10.201.0.1")
		sandbox.NewVeth(t, tp.node, other,
			[]netip.Prefix{netip.PrefixFrom(otherGW, 24)}, []netip.Prefix{netip.PrefixFrom(otherIP, 24)})
		other.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), otherGW)
		delta := counterDelta(t, d)
		v, err := dialAndGreet(other, tp.server4, nil)
		wantDirect(t, v, err, tp.server4)
		if got := delta(); got[SkippedNotEnrolled] != 1 || got[Redirected] != 0 {
			t.Errorf("counters grew by %v, want 1 skipped_not_enrolled", got)
		}
	})
	t.Run("address not captured", func(t *testing.T) {
		delta := counterDelta(t, d)
		v, err := dialAndGreet(tp.pod, tp.server6, nil)
		wantDirect(t, v, err, tp.server6)
		if got := delta(); got[SkippedNoService] != 1 || got[Redirected] != 0 {
			t.Errorf("counters grew by %v, want 1 skipped_no_service", got)
		}
	})
	t.Run("proxy mark in a pod", func(t *testing.T) {
		// A pod may set any mark (CAP_NET_RAW is enough since Linux
		// 5.17): the proxy's, outside the netns the proxy dials from,
		// is no reason to pass the pod's connection through.
		delta := counterDelta(t, d)
		v, err := dialAndGreet(tp.pod, tp.server4, &net.Dialer{Control: mark.Control, Timeout: ioTimeout})
		wantRedirected(t, v, err, tp.server4)
		// The second connect: the proxy's own, from the node netns.
		want := map[Decision]uint64{Redirected: 1, SkippedNotEnrolled: 1}
		if got := delta(); !equalMaps(got, want) {
			t.Errorf("counters grew by %v, want %v", got, want)
		}
	})
	t.Run("another mark", func(t *testing.T) {
		// The whole mark is compared: a socket sharing some of our bits
		// is an application's and stays captured.
		other := &net.Dialer{Control: mark.ControlWith(mark.Proxy | 0x4000), Timeout: ioTimeout}
		v, err := dialAndGreet(tp.pod, tp.server4, other)
		wantRedirected(t, v, err, tp.server4)
	})
	t.Run("udp untouched", func(t *testing.T) {
		delta := counterDelta(t, d)
		c, err := tp.pod.Dial(nil, "udp", tp.server4.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if peer := c.RemoteAddr().(*net.UDPAddr).AddrPort(); peer != tp.server4 {
			t.Errorf("UDP socket connected to %s, want %s", peer, tp.server4)
		}
		if got := delta(); len(got) != 0 {
			t.Errorf("counters grew by %v on a UDP connect, want nothing counted", got)
		}
	})
}

func TestFailurePolicy(t *testing.T) {
	tp := newTopology(t)
	d := tp.open(t)
	// No proxy listens: the proxy is gone. The servers are up, so a
	// connection that is not redirected reaches them.
	closed, open := tp.server4, tp.server6
	if err := d.SetServices([]Service{{Addr: closed}, {Addr: open, FailOpen: true}, {Addr: vip6}}); err != nil {
		t.Fatal(err)
	}
	if err := d.Enrol(tp.podCookie, tp.nodeProxy()); err != nil {
		t.Fatal(err)
	}
	dial := func(addr netip.AddrPort) (visit, error) { return dialAndGreet(tp.pod, addr, nil) }
	// A pod's socket wearing the proxy's mark is refused all the same.
	dialMarked := func(addr netip.AddrPort) (visit, error) {
		return dialAndGreet(tp.pod, addr, &net.Dialer{Control: mark.Control, Timeout: ioTimeout})
	}

	t.Run("never beaten", func(t *testing.T) {
		delta := counterDelta(t, d)
		_, err := dial(closed)
		wantRefused(t, err)
		_, err = dialMarked(closed)
		wantRefused(t, err)
		v, err := dial(open)
		wantDirect(t, v, err, open)
		want := map[Decision]uint64{Redirected: 2, SkippedProxyStale: 1}
		if got := delta(); !equalMaps(got, want) {
			t.Errorf("counters grew by %v, want %v", got, want)
		}
	})
	t.Run("fresh heartbeat", func(t *testing.T) {
		if err := d.Heartbeat(); err != nil {
			t.Fatal(err)
		}
		_, err := dial(closed)
		wantRefused(t, err)
		_, err = dial(open)
		wantRefused(t, err)
	})
	t.Run("stale heartbeat", func(t *testing.T) {
		setHeartbeatAge(t, d, 2*DefaultHeartbeatMaxAge)
		_, err := dial(closed)
		wantRefused(t, err)
		v, err := dial(open)
		wantDirect(t, v, err, open)
	})
	t.Run("no listener in the family", func(t *testing.T) {
		if err := d.Heartbeat(); err != nil {
			t.Fatal(err)
		}
		v4only := tp.nodeProxy()
		v4only.V6 = netip.AddrPort{}
		if err := d.Enrol(tp.podCookie, v4only); err != nil {
			t.Fatal(err)
		}
		delta := counterDelta(t, d)
		v, err := dial(open) // fail-open: passes
		wantDirect(t, v, err, open)
		_, err = dial(vip6) // fail-closed: connect() fails
		if !errors.Is(err, unix.EPERM) {
			t.Errorf("dial fail-closed service without IPv6 proxy = %v, want EPERM", err)
		}
		_, err = dialMarked(vip6)
		if !errors.Is(err, unix.EPERM) {
			t.Errorf("dial fail-closed service without IPv6 proxy, with the proxy's mark = %v, want EPERM", err)
		}
		want := map[Decision]uint64{SkippedNoProxy: 1, DeniedNoProxy: 2}
		if got := delta(); !equalMaps(got, want) {
			t.Errorf("counters grew by %v, want %v", got, want)
		}
	})
	// Every refused redirect dropped its handoff when its socket closed.
	wantNoHandoffs(t, d)
}

// setHeartbeatAge writes a heartbeat as old as age, standing in for a proxy
// that stopped beating that long ago (no sleeping in tests).
func setHeartbeatAge(t *testing.T, d *Datapath, age interface{ Nanoseconds() int64 }) {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	key, then := uint32(0), uint64(ts.Nano()-age.Nanoseconds())
	if err := d.objs.SmHeartbeat.Put(&key, &then); err != nil {
		t.Fatal(err)
	}
}

// TestGetsockopt checks that only SO_ORIGINAL_DST on a redirected, accepted
// socket is answered, and every other getsockopt keeps the kernel's answer.
func TestGetsockopt(t *testing.T) {
	tp := newTopology(t)
	tp.openCapturing(t, Service{Addr: vip4})
	ln := listenProxy(t, tp.node, tp.nodeProxy().V4)
	defer ln.Close()
	accept := func(dst netip.AddrPort) (client, server *net.TCPConn) {
		t.Helper()
		c, err := tp.pod.Dial(&net.Dialer{Timeout: ioTimeout}, "tcp", dst.String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		return c.(*net.TCPConn), s.(*net.TCPConn)
	}

	client, redirected := accept(vip4)
	if got, err := origdst.Get(redirected); err != nil || got != vip4 {
		t.Errorf("origdst.Get(redirected) = %v, %v; want %s", got, err, vip4)
	}
	checks := []struct {
		name       string
		level, opt int
		want       error // nil: the kernel's own answer must succeed
	}{
		{"SO_TYPE", unix.SOL_SOCKET, unix.SO_TYPE, nil},
		{"TCP_NODELAY", unix.SOL_TCP, unix.TCP_NODELAY, nil},
		{"IP_TOS", unix.SOL_IP, unix.IP_TOS, nil},
		{"option 80 at SOL_SOCKET", unix.SOL_SOCKET, 80, unix.ENOPROTOOPT},
		{"option 80 at SOL_TCP", unix.SOL_TCP, 80, unix.ENOPROTOOPT},
	}
	for _, c := range checks {
		if got := getsockoptErr(t, redirected, c.level, c.opt); !errors.Is(got, c.want) && got != c.want {
			t.Errorf("getsockopt(%s) on redirected socket = %v, want %v", c.name, got, c.want)
		}
	}
	// The family must match: an IPv4 destination is not answered at SOL_IPV6.
	if err := getsockoptErr(t, redirected, unix.SOL_IPV6, 80); err == nil {
		t.Error("getsockopt(SOL_IPV6, IP6T_SO_ORIGINAL_DST) on an IPv4 redirect succeeded")
	}
	// The application's own socket carries an original destination too, but
	// only the proxy's accepted socket answers.
	if got, err := origdst.Get(client); !errors.Is(err, origdst.ErrNotRedirected) {
		t.Errorf("origdst.Get(app socket) = %v, %v; want ErrNotRedirected", got, err)
	}
	// A connection that dialled the proxy listener itself was not redirected.
	_, direct := accept(tp.nodeProxy().V4)
	if got, err := origdst.Get(direct); !errors.Is(err, origdst.ErrNotRedirected) {
		t.Errorf("origdst.Get(direct) = %v, %v; want ErrNotRedirected", got, err)
	}
}

// TestOrigDstOutsideTheCgroup: the proxy's listener was made outside
// Config.Cgroup (a --cgroup that holds the pods but not the agent), so no
// sockops or getsockopt program runs for the sockets it accepts. OrigDst
// must still find a redirected connection's original destination, and
// none for a connection that dialled the listener itself.
func TestOrigDstOutsideTheCgroup(t *testing.T) {
	tp := newTopology(t)
	pods := sandbox.NewCgroup(t)
	tp.cfg.Cgroup = pods.Path
	d := tp.openCapturing(t, Service{Addr: vip4}, Service{Addr: vip6})
	lns := make(map[netip.AddrPort]net.Listener)
	for _, a := range []netip.AddrPort{tp.nodeProxy().V4, tp.nodeProxy().V6} {
		ln := listenProxy(t, tp.node, a)
		defer ln.Close()
		lns[a] = ln
	}
	pods.Enter(t) // the application's sockets
	accept := func(dst, proxy netip.AddrPort) *net.TCPConn {
		t.Helper()
		c, err := tp.pod.Dial(&net.Dialer{Timeout: ioTimeout}, "tcp", dst.String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := lns[proxy].Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		return s.(*net.TCPConn)
	}

	for vip, proxy := range map[netip.AddrPort]netip.AddrPort{vip4: tp.nodeProxy().V4, vip6: tp.nodeProxy().V6} {
		redirected := accept(vip, proxy)
		if _, err := origdst.Get(redirected); !errors.Is(err, origdst.ErrNotRedirected) {
			t.Fatalf("getsockopt answered (%v): a getsockopt program runs for the listener's cgroup, the test cannot tell", err)
		}
		for range 2 { // the answer stays the socket's
			if got, err := d.OrigDst(redirected); err != nil || got != vip {
				t.Errorf("OrigDst(redirected) = %v, %v; want %s", got, err, vip)
			}
		}
		if got, err := d.OrigDst(accept(proxy, proxy)); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("OrigDst(direct to %s) = %v, %v; want ErrKeyNotExist", proxy, got, err)
		}
	}
	wantNoHandoffs(t, d)
}

func getsockoptErr(t *testing.T, c *net.TCPConn, level, opt int) error {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var sockErr error
	rc.Control(func(fd uintptr) {
		_, sockErr = unix.GetsockoptString(int(fd), level, opt)
	})
	return sockErr
}

// TestRestart restarts the loader as real processes: capture outlives the
// process that loaded it, and a new loader adopts the pins instead of
// attaching twice.
func TestRestart(t *testing.T) {
	tp := newTopology(t)
	proxy := startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4},
		map[netip.AddrPort]netip.AddrPort{vip4: tp.server4})
	job := loaderJob{Config: tp.cfg, Cookie: tp.podCookie, Proxy: tp.nodeProxy(), Services: []Service{{Addr: vip4}}}

	runLoader(t, job)
	// The loader has exited; nothing in this process holds the programs.
	v, err := dialAndGreet(tp.pod, vip4, nil)
	wantRedirected(t, v, err, vip4)
	proxy.next(t)
	firstLinks := pinnedLinkIDs(t, tp.cfg)

	runLoader(t, job)
	d := tp.open(t) // a third loader, in this process
	if got := pinnedLinkIDs(t, tp.cfg); !equalMaps(got, firstLinks) {
		t.Errorf("links after restarts = %v, want the first loader's %v (adopted, not re-attached)", got, firstLinks)
	}
	for _, h := range hooks {
		res, err := queryAttached(tp.cfg.Cgroup, h.attach, 0)
		if err != nil {
			t.Fatal(err)
		}
		info, err := h.prog(&d.objs).Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		if len(res) != 1 || res[0] != id {
			t.Errorf("%s: attached programs %v, want exactly this loader's %d", h.name, res, id)
		}
	}
	enrolled, err := d.Enrolments()
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := enrolled[tp.podCookie]; !ok || p != tp.nodeProxy() {
		t.Errorf("enrolments after restart = %v, want the pod's", enrolled)
	}
	v, err = dialAndGreet(tp.pod, vip4, nil)
	wantRedirected(t, v, err, vip4)
}

func pinnedLinkIDs(t *testing.T, cfg Config) map[string]link.ID {
	t.Helper()
	out := make(map[string]link.ID)
	for _, h := range hooks {
		l, err := link.LoadPinnedLink(filepath.Join(cfg.pinDir(), "links", h.name), nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[h.name] = info.ID
	}
	return out
}

func equalMaps[K, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// queryAttached lists the programs attached at cgroup for one attach type.
func queryAttached(cgroup string, attach ebpf.AttachType, flags uint32) ([]ebpf.ProgramID, error) {
	f, err := os.Open(cgroup)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: attach, QueryFlags: flags})
	if err != nil {
		return nil, err
	}
	var ids []ebpf.ProgramID
	for _, p := range res.Programs {
		ids = append(ids, p.ID)
	}
	return ids, nil
}

func TestUninstall(t *testing.T) {
	tp := newTopology(t)
	d, err := Open(tp.cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetServices([]Service{{Addr: tp.server4}}); err != nil {
		t.Fatal(err)
	}
	if err := d.Enrol(tp.podCookie, tp.nodeProxy()); err != nil {
		t.Fatal(err)
	}
	startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4}, nil)
	v, err := dialAndGreet(tp.pod, tp.server4, nil)
	wantRedirected(t, v, err, tp.server4)

	if err := d.Uninstall(); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	if _, err := os.Stat(tp.cfg.pinDir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory after uninstall: %v, want it gone", err)
	}
	for _, h := range hooks {
		if ids, err := queryAttached(tp.cfg.Cgroup, h.attach, 0); err != nil || len(ids) != 0 {
			t.Errorf("%s after uninstall: programs %v, %v; want none", h.name, ids, err)
		}
	}
	v, err = dialAndGreet(tp.pod, tp.server4, nil)
	wantDirect(t, v, err, tp.server4)
	if err := Uninstall(tp.cfg); err != nil {
		t.Errorf("second uninstall: %v", err)
	}
}

func TestMetrics(t *testing.T) {
	tp := newTopology(t)
	d, reg := openRegistered(t, tp)
	if err := d.SetServices([]Service{{Addr: tp.server4}}); err != nil {
		t.Fatal(err)
	}
	// Not enrolled: one skipped_not_enrolled.
	v, err := dialAndGreet(tp.pod, tp.server4, nil)
	wantDirect(t, v, err, tp.server4)

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, mf := range families {
		if mf.GetName() != "sockmesh_datapath_redirects_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			label := m.GetLabel()[0].GetValue()
			for _, dec := range Decisions() {
				if dec.String() == label {
					seen++
					if got := m.GetCounter().GetValue(); got != float64(counts[dec]) {
						t.Errorf("metric decision=%s = %v, want %d", label, got, counts[dec])
					}
				}
			}
		}
	}
	if seen != len(Decisions()) {
		t.Errorf("metric has %d decisions, want %d", seen, len(Decisions()))
	}
	if counts[SkippedNotEnrolled] == 0 {
		t.Error("skipped_not_enrolled is 0 after an unenrolled connect")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if families, _ := reg.Gather(); len(families) != 0 {
		t.Errorf("metrics still registered after Close: %d families", len(families))
	}
}

// TestMetricsReadApart: the decision counters cannot be read (here their
// map's descriptor is closed); the acceleration counters are exported all
// the same.
func TestMetricsReadApart(t *testing.T) {
	tp := newTopology(t)
	d, reg := openRegistered(t, tp)
	if err := d.objs.SmCounters.Close(); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err == nil {
		t.Error("Gather() succeeded with the decision counters unreadable")
	}
	var events int
	for _, mf := range families {
		if mf.GetName() == "sockmesh_datapath_accel_sockets_total" {
			events = len(mf.GetMetric())
		}
	}
	if events != 5 {
		t.Errorf("sockmesh_datapath_accel_sockets_total has %d events, want 5", events)
	}
}

func family(ap netip.AddrPort) string {
	if ap.Addr().Is4() {
		return "ipv4"
	}
	return "ipv6"
}

// TestMPTCP: an application's Multipath TCP socket (Go's dialer with
// GODEBUG=multipathtcp=1, or IPPROTO_MPTCP) connects through a TCP subflow,
// the socket our connect programs see; its getpeername asks the MPTCP socket,
// which must show the Service address too.
func TestMPTCP(t *testing.T) {
	tp := newTopology(t)
	d := tp.openCapturing(t, Service{Addr: vip4}, Service{Addr: vip6})
	proxy := startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4, tp.nodeProxy().V6},
		map[netip.AddrPort]netip.AddrPort{vip4: tp.server4, vip6: tp.server6})
	dialer := &net.Dialer{Timeout: ioTimeout}
	dialer.SetMultipathTCP(true)

	for _, vip := range []netip.AddrPort{vip4, vip6} {
		t.Run(family(vip), func(t *testing.T) {
			c, err := tp.pod.Dial(dialer, "tcp", vip.String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if proto := socketProtocol(t, c); proto != unix.IPPROTO_MPTCP {
				t.Fatalf("the app's socket has protocol %d, want IPPROTO_MPTCP", proto)
			}
			v, err := greet(c)
			wantRedirected(t, v, err, vip)
			if got := proxy.next(t); got.err != nil || got.orig != vip {
				t.Errorf("proxy read original destination %v, %v; want %s", got.orig, got.err, vip)
			}
		})
	}
	wantNoHandoffs(t, d)
}

// socketProtocol is c's SO_PROTOCOL.
func socketProtocol(t *testing.T, c net.Conn) int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var (
		proto int
		gerr  error
	)
	if err := rc.Control(func(fd uintptr) {
		proto, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL)
	}); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return proto
}

// TestReconnectForgetsOriginalDestination: a socket whose redirected
// connect() failed (no proxy listens) may connect() again, elsewhere; that
// connection is not redirected, and getpeername shows where it went — not
// the Service of the first connect(), which the socket's storage kept.
func TestReconnectForgetsOriginalDestination(t *testing.T) {
	tp := newTopology(t)
	d := tp.openCapturing(t, Service{Addr: vip4})
	var peer netip.AddrPort
	err := tp.pod.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, sockaddr4(vip4)); !errors.Is(err, unix.ECONNREFUSED) {
			return fmt.Errorf("connect to the Service, no proxy listening: %v, want refused", err)
		}
		if err := unix.Connect(fd, sockaddr4(tp.server4)); err != nil {
			return fmt.Errorf("connect again, to %s: %w", tp.server4, err)
		}
		sa, err := unix.Getpeername(fd)
		if err != nil {
			return err
		}
		in4 := sa.(*unix.SockaddrInet4)
		peer = netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if peer != tp.server4 {
		t.Errorf("getpeername after connecting again = %s, want %s", peer, tp.server4)
	}
	wantNoHandoffs(t, d)
}

// openRegistered opens tp's datapath with its metrics on a registry of its
// own, uninstalled when t ends.
func openRegistered(t *testing.T, tp *topology) (*Datapath, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	d, err := Open(tp.cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Uninstall() })
	return d, reg
}
