package datapath

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/datapath/mark"
	"github.com/sockmesh/sockmesh/datapath/takeover"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/origdst"
)

// The test topology: a "node" netns (standing in for the host's root netns,
// which tests never touch; the agent's, where its proxy dials from) and a
// "pod" netns joined by a veth pair, the test
// process moved into a throwaway cgroup where the programs attach, and a
// private bpffs.
var (
	nodeIP4 = netip.MustParseAddr("10.200.0.1")
	podIP4  = netip.MustParseAddr("10.200.0.2")
	nodeIP6 = netip.MustParseAddr("fd00:200::1")
	podIP6  = netip.MustParseAddr("fd00:200::2")
	// Service addresses that exist nowhere: only a redirect can reach them.
	vip4 = netip.MustParseAddrPort("10.96.0.10:80")
	vip6 = netip.MustParseAddrPort("[fd00:96::10]:80")
)

const (
	serverPort = 8080
	proxyPort  = 15001
	// ioTimeout only keeps a broken test from hanging; no result depends on it.
	ioTimeout = 10 * time.Second
)

type topology struct {
	node, pod *sandbox.NetNS
	cg        *sandbox.Cgroup
	cfg       Config
	podCookie uint64
	// nodeCookie is the cookie of the node netns: node-IP mode's proxy netns.
	nodeCookie uint64
	server4    netip.AddrPort
	server6    netip.AddrPort
}

func newTopology(t *testing.T) *topology {
	t.Helper()
	tp := &topology{
		node:    sandbox.NewNetNS(t),
		pod:     sandbox.NewNetNS(t),
		cg:      sandbox.NewCgroup(t),
		server4: netip.AddrPortFrom(nodeIP4, serverPort),
		server6: netip.AddrPortFrom(nodeIP6, serverPort),
	}
	sandbox.NewVeth(t, tp.node, tp.pod,
		[]netip.Prefix{netip.PrefixFrom(nodeIP4, 24), netip.PrefixFrom(nodeIP6, 64)},
		[]netip.Prefix{netip.PrefixFrom(podIP4, 24), netip.PrefixFrom(podIP6, 64)})
	tp.pod.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), nodeIP4)
	tp.pod.AddRoute(t, netip.MustParsePrefix("::/0"), nodeIP6)
	tp.cg.Enter(t)
	tp.cfg = Config{BPFFS: sandbox.TempBPFFS(t), Cgroup: tp.cg.Path}
	var err error
	if tp.podCookie, err = tp.pod.Cookie(); err != nil {
		t.Fatal(err)
	}
	if tp.nodeCookie, err = tp.node.Cookie(); err != nil {
		t.Fatal(err)
	}
	startServer(t, tp.node, tp.server4)
	startServer(t, tp.node, tp.server6)
	return tp
}

// open loads the datapath for the topology from the node netns, as the
// agent does from its own: the test proxies dial from there, so that is
// the netns whose marked sockets connect skips. It is uninstalled when t
// ends.
func (tp *topology) open(t *testing.T) *Datapath {
	t.Helper()
	return openAt(t, tp.cfg, tp.node)
}

// openCapturing loads the datapath and captures svcs for the pod, whose
// proxy listens on the node's addresses (nodeProxy).
func (tp *topology) openCapturing(t *testing.T, svcs ...Service) *Datapath {
	t.Helper()
	d := tp.open(t)
	if err := d.SetServices(svcs); err != nil {
		t.Fatal(err)
	}
	if err := d.Enrol(tp.podCookie, tp.nodeProxy()); err != nil {
		t.Fatal(err)
	}
	return d
}

// nodeProxy is the node-IP mode enrolment: listeners on the node's addresses.
func (tp *topology) nodeProxy() Proxy {
	return Proxy{
		NetNSCookie: tp.nodeCookie,
		V4:          netip.AddrPortFrom(nodeIP4, proxyPort),
		V6:          netip.AddrPortFrom(nodeIP6, proxyPort),
	}
}

// startServer runs the "real" backend: it greets every connection with
// "server\n" and then echoes.
func startServer(t *testing.T, ns *sandbox.NetNS, addr netip.AddrPort) {
	t.Helper()
	ln, err := ns.Listen(context.Background(), nil, "tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	tcpserve.Serve(t, ln, func(c net.Conn) {
		io.WriteString(c, "server\n")
		io.Copy(c, c)
	})
}

// accepted is what the test proxy learned about one accepted connection.
type accepted struct {
	orig netip.AddrPort
	err  error
}

// testProxy is a minimal transparent proxy: for each accepted connection it
// reads the original destination, reports it to the client as
// "proxy <orig>\n", dials the backend from dialNS with the proxy mark, and
// relays. A connection without original destination gets "noorig\n" and is
// closed, as the real proxy must do.
type testProxy struct {
	got chan accepted
}

func startProxy(t *testing.T, listenNS, dialNS *sandbox.NetNS, addrs []netip.AddrPort, backends map[netip.AddrPort]netip.AddrPort) *testProxy {
	t.Helper()
	p := &testProxy{got: make(chan accepted, 64)}
	dialer := &net.Dialer{Control: mark.Control, Timeout: ioTimeout}
	for _, a := range addrs {
		tcpserve.Serve(t, listenProxy(t, listenNS, a), func(c net.Conn) {
			orig, err := origdst.Get(c.(*net.TCPConn))
			p.got <- accepted{orig, err}
			if err != nil {
				io.WriteString(c, "noorig\n")
				return
			}
			fmt.Fprintf(c, "proxy %s\n", orig)
			backend, ok := backends[orig]
			if !ok {
				backend = orig
			}
			up, err := dialNS.Dial(dialer, "tcp", backend.String())
			if err != nil {
				fmt.Fprintf(c, "dial %s: %v\n", backend, err)
				return
			}
			defer up.Close()
			go func() {
				io.Copy(up, c)
				up.(*net.TCPConn).CloseWrite()
			}()
			io.Copy(c, up)
		})
	}
	return p
}

// listenProxy listens on addr in ns as the agent's proxy does: plain TCP,
// where Go's default is Multipath TCP (an MPTCP client falls back to TCP).
func listenProxy(t *testing.T, ns *sandbox.NetNS, addr netip.AddrPort) net.Listener {
	t.Helper()
	ln, err := ns.Listen(context.Background(), takeover.ListenConfig(nil), "tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// next returns what the proxy saw for its next accepted connection.
func (p *testProxy) next(t *testing.T) accepted {
	t.Helper()
	select {
	case a := <-p.got:
		return a
	case <-time.After(ioTimeout):
		t.Fatal("proxy accepted nothing")
		return accepted{}
	}
}

// visit is what a client saw on one connection.
type visit struct {
	greeting []string       // "proxy <orig>" and/or "server"
	peer     netip.AddrPort // getpeername(2) on the client's socket
}

// dialAndGreet connects from ns to addr, reads the greeting lines up to and
// including "server", checks that the echo works, and reports what it saw.
func dialAndGreet(ns *sandbox.NetNS, addr netip.AddrPort, d *net.Dialer) (visit, error) {
	if d == nil {
		d = &net.Dialer{Timeout: ioTimeout}
	}
	c, err := ns.Dial(d, "tcp", addr.String())
	if err != nil {
		return visit{}, err
	}
	defer c.Close()
	return greet(c)
}

func greet(c net.Conn) (visit, error) {
	c.SetDeadline(time.Now().Add(ioTimeout))
	var v visit
	var err error
	if v.peer, err = peerName(c); err != nil {
		return v, err
	}
	r := bufio.NewReader(c)
	for len(v.greeting) < 3 {
		line, err := r.ReadString('\n')
		if err != nil {
			return v, fmt.Errorf("read greeting after %q: %w", v.greeting, err)
		}
		line = strings.TrimSuffix(line, "\n")
		v.greeting = append(v.greeting, line)
		if line == "server" {
			break
		}
		if !strings.HasPrefix(line, "proxy ") {
			return v, fmt.Errorf("unexpected greeting %q", v.greeting)
		}
	}
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return v, err
	}
	if echo, err := r.ReadString('\n'); err != nil || echo != "ping\n" {
		return v, fmt.Errorf("echo: got %q, %v", echo, err)
	}
	return v, nil
}

// peerName calls getpeername(2) itself: net.Conn.RemoteAddr is cached from
// the dial and would not show what the application sees later.
func peerName(c net.Conn) (netip.AddrPort, error) {
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var (
		sa    unix.Sockaddr
		saErr error
	)
	if err := rc.Control(func(fd uintptr) { sa, saErr = unix.Getpeername(int(fd)) }); err != nil {
		return netip.AddrPort{}, err
	}
	if saErr != nil {
		return netip.AddrPort{}, saErr
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("unexpected peer address %T", sa)
}

// wantRedirected checks a visit went through the proxy, which recovered
// orig, and that the application's getpeername still shows orig.
func wantRedirected(t *testing.T, v visit, err error, orig netip.AddrPort) {
	t.Helper()
	if err != nil {
		t.Fatalf("redirected connection to %s failed: %v", orig, err)
	}
	want := []string{"proxy " + orig.String(), "server"}
	if strings.Join(v.greeting, "|") != strings.Join(want, "|") {
		t.Errorf("greeting = %q, want %q", v.greeting, want)
	}
	if v.peer != orig {
		t.Errorf("getpeername = %s, want the Service address %s", v.peer, orig)
	}
}

// wantDirect checks a visit reached the server without the proxy.
func wantDirect(t *testing.T, v visit, err error, addr netip.AddrPort) {
	t.Helper()
	if err != nil {
		t.Fatalf("direct connection to %s failed: %v", addr, err)
	}
	if len(v.greeting) != 1 || v.greeting[0] != "server" {
		t.Errorf("greeting = %q, want [server] (no proxy)", v.greeting)
	}
	if v.peer != addr {
		t.Errorf("getpeername = %s, want %s", v.peer, addr)
	}
}

func wantRefused(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("dial error = %v, want connection refused", err)
	}
}

// counterDelta returns a function reporting how much each counter grew.
func counterDelta(t *testing.T, d *Datapath) func() map[Decision]uint64 {
	t.Helper()
	before, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return func() map[Decision]uint64 {
		t.Helper()
		after, err := d.Counters()
		if err != nil {
			t.Fatal(err)
		}
		delta := make(map[Decision]uint64)
		for k, v := range after {
			if v != before[k] {
				delta[k] = v - before[k]
			}
		}
		return delta
	}
}

// wantNoHandoffs checks that no original destination waits in the handoff
// map: each was taken by the proxy's accepted socket, or dropped when the
// application's socket closed without reaching the proxy.
func wantNoHandoffs(t *testing.T, d *Datapath) {
	t.Helper()
	var (
		k sockmeshSmHandoffKey
		v sockmeshSmOrigDst
		n int
	)
	it := d.objs.SmHandoff.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d handoffs left in the map, want 0", n)
	}
}
