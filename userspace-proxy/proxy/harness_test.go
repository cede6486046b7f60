package proxy_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/leakcheck"
	"github.com/sockmesh/sockmesh/internal/metricsum"
	"github.com/sockmesh/sockmesh/internal/syncbuf"
	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/httpproxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstreamtls"
)

// TestMain runs the tests with GODEBUG=http2xconnect=1: net/http
// reads it once at init, and WebSocket over HTTP/2 (RFC 8441) needs it, as
// the agent's DaemonSet sets it.
func TestMain(m *testing.M) { testenv.MainWithGODEBUG(m, "http2xconnect=1") }

// pkiSet is the test's certificate world: a CA the backends use, another CA
// nobody trusts, and leaves.
type pkiSet struct {
	ca, other        *pki.CA
	server, otherSrv *pki.Leaf // server: DNS echo.test + URI spiffe://test/ns/b/sa/echo
	client           *pki.Leaf
	otherClient      *pki.Leaf // a client certificate other issued
}

const (
	sniName  = "echo.test"
	spiffeID = "spiffe://cluster.local/ns/b/sa/echo"
)

func newPKI(t testing.TB) *pkiSet {
	t.Helper()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	var s pkiSet
	var err error
	s.ca, err = pki.NewCA("sockmesh test ca")
	must(err)
	s.other, err = pki.NewCA("untrusted ca")
	must(err)
	s.server, err = s.ca.Issue(pki.LeafOptions{CommonName: "echo", DNSNames: []string{sniName}, URIs: []string{spiffeID}})
	must(err)
	s.otherSrv, err = s.other.Issue(pki.LeafOptions{CommonName: "impostor", DNSNames: []string{sniName}})
	must(err)
	s.client, err = s.ca.Issue(pki.LeafOptions{CommonName: "sockmesh-proxy", URIs: []string{"spiffe://cluster.local/ns/sockmesh/sa/proxy"}, Client: true})
	must(err)
	s.otherClient, err = s.other.Issue(pki.LeafOptions{CommonName: "sockmesh-proxy", Client: true})
	must(err)
	return &s
}

// backend is a running echo server.
type backend struct {
	addr netip.AddrPort
	srv  *echo.Server
}

// startEcho runs an echo server on 127.0.0.1:0; tlsCfg nil means cleartext.
func startEcho(t testing.TB, pod string, tlsCfg *tls.Config) *backend {
	t.Helper()
	return startEchoWith(t, echo.Config{Pod: pod, TLS: tlsCfg})
}

// startEchoWith runs an echo server of namespace "b" configured by cfg.
func startEchoWith(t testing.TB, cfg echo.Config) *backend {
	t.Helper()
	return startEchoOn(t, "127.0.0.1:0", cfg)
}

// startEchoOn is startEchoWith listening on addr.
func startEchoOn(t testing.TB, addr string, cfg echo.Config) *backend {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Namespace = "b"
	s := echo.New(cfg)
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return &backend{addr: l.Addr().(*net.TCPAddr).AddrPort(), srv: s}
}

// startTCPEcho runs a raw echo (TLS when tlsCfg is set).
func startTCPEcho(t testing.TB, tlsCfg *tls.Config) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	addr := l.Addr().(*net.TCPAddr).AddrPort()
	if tlsCfg != nil {
		l = tls.NewListener(l, tlsCfg)
	}
	go echo.ServeTCPEcho(l)
	return addr
}

// listenLocal listens on 127.0.0.1:0 and closes at cleanup.
func listenLocal(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// serveTCP serves connections on 127.0.0.1:0 until cleanup, each in a
// goroutine of its own, over TLS when tlsCfg is set, and closes each when
// handle returns.
func serveTCP(t testing.TB, tlsCfg *tls.Config, handle func(net.Conn)) netip.AddrPort {
	t.Helper()
	l := listenLocal(t)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				if tlsCfg != nil {
					c = tls.Server(c, tlsCfg)
				}
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).AddrPort()
}

// closedPort returns an address that refuses connections until a test
// listens on it: a socket bound to it, not listening, holds the port until
// t ends. A port freed at once (listen, then close) could be the next
// listener's port picked by the kernel, which the proxy, keeping
// ejections by address, would then pass over (TestZoneFallback met it).
// With SO_REUSEADDR on both, a listener bound to the address explicitly
// (net.Listen sets it) shares the port with a socket that does not
// listen, while the kernel's pick of a free port avoids it.
func closedPort(t testing.TB) netip.AddrPort {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	in := sa.(*syscall.SockaddrInet4)
	return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port))
}

func serverTLS(leaf *pki.Leaf) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{leaf.TLS}}
}

// service is one captured Service port of a test snapshot.
type service struct {
	name    string
	vip     netip.AddrPort
	backend snapshot.Backend // Ref is filled in
}

func endpoints(addrs ...netip.AddrPort) []snapshot.Endpoint {
	eps := make([]snapshot.Endpoint, len(addrs))
	for i, a := range addrs {
		eps[i] = snapshot.Endpoint{Addr: a, Ready: true, Serving: true}
	}
	return eps
}

// replaced is a rollout's endpoints once its new pod is ready: old
// terminating (serving on), next ready.
func replaced(old, next netip.AddrPort) []snapshot.Endpoint {
	return []snapshot.Endpoint{{Addr: old, Serving: true, Terminating: true}, {Addr: next, Ready: true, Serving: true}}
}

func buildSnapshot(t testing.TB, version uint64, svcs ...service) *snapshot.Snapshot {
	t.Helper()
	var fes []snapshot.Frontend
	var bes []snapshot.Backend
	for _, s := range svcs {
		ref := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: s.name, Port: s.vip.Port()}
		be := s.backend
		be.Ref = ref
		fes = append(fes, snapshot.Frontend{
			Service: snapshot.ObjectRef{Namespace: "b", Name: s.name}, Port: s.vip.Port(),
			Addresses: []netip.Addr{s.vip.Addr()}, FailurePolicy: snapshot.FailClosed, Backend: ref,
		})
		bes = append(bes, be)
	}
	snap, err := snapshot.New(version, fes, bes, []snapshot.Workload{{
		Pod: snapshot.ObjectRef{Namespace: "a", Name: "client"}, IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Enrolled: true,
	}})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// env is a proxy under test fed by a real TCP listener: each accepted
// connection is handed to ServeConn with the original destination the
// dialing side registered for it (what origdst would return).
type env struct {
	t    testing.TB
	pki  *pkiSet
	p    *proxy.Proxy
	reg  *prometheus.Registry
	ln   net.Listener
	ln6  net.Listener // [::1], with envOptions.ipv6
	logs *syncbuf.Buffer
	mu   sync.Mutex
	dsts map[string]chan redirected
}

// redirected is what the accept loop learns of a client connection: its
// original destination and, in in-pod mode, its pod.
type redirected struct {
	dst netip.AddrPort
	pod *snapshot.ObjectRef
}

type envOptions struct {
	http1TLS    proxy.HTTP1TLSPath
	systemRoots bool // the "system" pool trusts the test CA
	// dialer, when set, wraps the proxy's direct dialer.
	dialer func(dial.Dialer) dial.Dialer
	// maxConnsPerClient is Config.MaxConnsPerClient.
	maxConnsPerClient int
	// sniffTimeout is Config.SniffTimeout (0: 2 s).
	sniffTimeout time.Duration
	// dialTimeout bounds the proxy's connects (0: dial.Config's 5 s).
	dialTimeout time.Duration
	// ejectFor is upstream.Config.EjectFor, and EjectMax (0: 1 s and 30 s).
	ejectFor time.Duration
	// handshakeTimeout is upstream.Config.HandshakeTimeout (0: 10 s).
	handshakeTimeout time.Duration
	// upstreamPingAfter is upstream.Config.H2PingAfter and H2PingTimeout
	// (0: 5 min and 15 s).
	upstreamPingAfter time.Duration
	// maxConnsPerEndpoint is upstream.Config.MaxConnsPerEndpoint (0: 1024).
	maxConnsPerEndpoint int
	// rebalanceSpread is Config.RebalanceSpread (0: 5 s).
	rebalanceSpread time.Duration
	// parkAfter is Config.ParkAfter (0: httpproxy's 5 s).
	parkAfter time.Duration
	// appPingAfter is Config.AppPingAfter and AppPingTimeout (0: 5 min
	// and 15 s).
	appPingAfter time.Duration
	// origDst is Config.OrigDst.
	origDst func(syscall.Conn) (netip.AddrPort, error)
	// routing is Config.Routing.
	routing httpproxy.RoutingConfig
	// ipv6 adds a listener on [::1], which dialFrom uses for IPv6
	// sources, as a dual-stack node has a node listener per family.
	ipv6 bool
	// registeredDst makes Config.OrigDst answer with the original
	// destination dialVia registered, as the datapath's record does for
	// the connections of the proxy's own listeners (Serve, ServePod).
	registeredDst bool
}

func newEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	e := &env{t: t, pki: newPKI(t), reg: prometheus.NewRegistry(), logs: &syncbuf.Buffer{}, dsts: make(map[string]chan redirected)}
	cfg := proxy.Config{
		HTTP1TLS: o.http1TLS,
		// A silent client is judged opaque after this: generous, as
		// only TestServerFirstProtocol's apps wait for the server.
		SniffTimeout: cmp.Or(o.sniffTimeout, 2*time.Second),
		// Unmarked as root or not: no datapath captures these tests'
		// connections (ServeConn is handed the destination), so a mark
		// would change nothing but need CAP_NET_ADMIN. That the proxy's
		// dials carry mark.Proxy is dial.TestDirectMarks' to check.
		Dial:              dial.Config{Unmarked: true, Timeout: o.dialTimeout},
		MaxConnsPerClient: o.maxConnsPerClient,
		RebalanceSpread:   o.rebalanceSpread,
		ParkAfter:         o.parkAfter,
		AppPingAfter:      o.appPingAfter,
		AppPingTimeout:    o.appPingAfter,
		OrigDst:           o.origDst,
		Routing:           o.routing,
	}
	if o.registeredDst {
		cfg.OrigDst = func(c syscall.Conn) (netip.AddrPort, error) {
			return (<-e.slot(c.(net.Conn).RemoteAddr().String())).dst, nil
		}
	}
	cfg.Upstream.EjectFor, cfg.Upstream.EjectMax = o.ejectFor, o.ejectFor
	cfg.Upstream.HandshakeTimeout = o.handshakeTimeout
	cfg.Upstream.H2PingAfter, cfg.Upstream.H2PingTimeout = o.upstreamPingAfter, o.upstreamPingAfter
	cfg.Upstream.MaxConnsPerEndpoint = o.maxConnsPerEndpoint
	if o.dialer != nil {
		cfg.Dialer = o.dialer(dial.NewDirect(cfg.Dial))
	}
	if o.systemRoots {
		cfg.Upstream.TLS = upstreamtls.Options{SystemRoots: e.pki.ca.Pool()}
	} else {
		cfg.Upstream.TLS = upstreamtls.Options{SystemRoots: e.pki.other.Pool()}
	}
	log := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := proxy.New(cfg, log, e.reg)
	if err != nil {
		t.Fatal(err)
	}
	e.p = p
	e.ln = e.listen("127.0.0.1:0")
	if o.ipv6 {
		e.ln6 = e.listen("[::1]:0")
	}
	t.Cleanup(func() {
		e.ln.Close()
		if e.ln6 != nil {
			e.ln6.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if t.Failed() {
			t.Logf("proxy log:\n%s", e.logs.String())
		}
	})
	return e
}

// listen accepts connections at addr, each handed to ServeConn once its
// dialer registered it; closed at cleanup.
func (e *env) listen(addr string) net.Listener {
	e.t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		e.t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ch := e.slot(c.RemoteAddr().String())
			go func() {
				r := <-ch
				e.p.ServeConn(c, r.dst, proxy.Client{Addr: c.RemoteAddr().(*net.TCPAddr).AddrPort(), Pod: r.pod})
			}()
		}
	}()
	return ln
}

func (e *env) slot(key string) chan redirected {
	e.mu.Lock()
	defer e.mu.Unlock()
	ch, ok := e.dsts[key]
	if !ok {
		ch = make(chan redirected, 1)
		e.dsts[key] = ch
	}
	return ch
}

// dial opens a client connection whose original destination is dst.
func (e *env) dial(dst netip.AddrPort) (net.Conn, error) {
	return e.dialFrom(dst, netip.Addr{}, nil)
}

// appConn is an app's connection to dst, closed when t ends, whose reads
// and writes fail after hangGuard rather than hang.
func (e *env) appConn(t testing.TB, dst netip.AddrPort) net.Conn {
	t.Helper()
	c, err := e.dial(dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(hangGuard))
	return c
}

// dialFrom opens a client connection whose original destination is dst
// from the loopback address src (zero: any; IPv6 reaches the [::1]
// listener), whose pod, when pod is set, the listener knows (in-pod mode).
func (e *env) dialFrom(dst netip.AddrPort, src netip.Addr, pod *snapshot.ObjectRef) (net.Conn, error) {
	d := net.Dialer{}
	ln := e.ln
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		if src.Is6() {
			ln = e.ln6
		}
	}
	return e.dialVia(ln, d, dst, pod)
}

// dialVia opens a client connection to ln with d and registers its
// original destination dst and pod for the side that accepts it.
func (e *env) dialVia(ln net.Listener, d net.Dialer, dst netip.AddrPort, pod *snapshot.ObjectRef) (net.Conn, error) {
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	e.slot(c.LocalAddr().String()) <- redirected{dst: dst, pod: pod}
	return c, nil
}

// echoFrom opens a connection to a raw echo at dst, as dialFrom does,
// closed when t ends, and reports whether it is served: its bytes come
// back.
func (e *env) echoFrom(t testing.TB, dst netip.AddrPort, src netip.Addr, pod *snapshot.ObjectRef) (net.Conn, bool) {
	t.Helper()
	c, err := e.dialFrom(dst, src, pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "\x00hello")
	got := make([]byte, 6)
	_, err = io.ReadFull(c, got)
	return c, err == nil && string(got) == "\x00hello"
}

// client returns an HTTP client whose every connection is redirected to dst;
// h2c makes it speak HTTP/2 with prior knowledge, as a gRPC app does.
func (e *env) client(dst netip.AddrPort, h2c bool) *http.Client {
	tr := &http.Transport{
		DialContext:        func(context.Context, string, string) (net.Conn, error) { return e.dial(dst) },
		DisableCompression: true,
		Protocols:          new(http.Protocols),
	}
	if h2c {
		tr.Protocols.SetUnencryptedHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	e.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// grpcClient returns a grpc-go channel to target (host:port, the
// authority it sends) whose every connection is redirected to dst; the
// caller closes it.
func (e *env) grpcClient(t testing.TB, target string, dst netip.AddrPort) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return e.dial(dst) }))
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

// get fetches url through c and decodes the echo report (when 200).
func get(t *testing.T, c *http.Client, url string) (int, echo.Report) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	var rep echo.Report
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &rep); err != nil {
			t.Fatalf("GET %s: decode %q: %v", url, body, err)
		}
	}
	return resp.StatusCode, rep
}

// counter reads a counter (or gauge) from the registry by name and labels.
func (e *env) counter(name string, labels map[string]string) float64 {
	e.t.Helper()
	return metricsum.Sum(e.t, e.reg, name, labels)
}

// counterReaches waits, at most hangGuard, for the counter of name with
// labels to reach want, and returns it: some are counted once a write is
// done, which the test's client may have read before.
func (e *env) counterReaches(name string, labels map[string]string, want float64) float64 {
	e.t.Helper()
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(time.Millisecond) {
		if got := e.counter(name, labels); got >= want || time.Now().After(deadline) {
			return got
		}
	}
}

// ejectionsOver waits, at most hangGuard, until no endpoint is ejected or
// probed: the next request to one that was takes its probe.
func (e *env) ejectionsOver() {
	e.t.Helper()
	for deadline := time.Now().Add(hangGuard); e.counter("sockmesh_proxy_upstream_endpoints_ejected", nil) != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			e.t.Fatalf("%v on, an endpoint is still ejected", hangGuard)
		}
	}
}

// checkNoLeaks fails t if goroutines of the proxy packages outlive the test.
// It runs after every cleanup (register it first).
func checkNoLeaks(t *testing.T) { leakcheck.Register(t, "/userspace-proxy/") }

// TestClosedPort: closedPort's address refuses connections, a listener
// bound to it explicitly serves it, and the kernel's picks of a free port
// for other listeners avoid it meanwhile.
func TestClosedPort(t *testing.T) {
	a := closedPort(t)
	if c, err := net.Dial("tcp", a.String()); !errors.Is(err, syscall.ECONNREFUSED) {
		if err == nil {
			c.Close()
		}
		t.Fatalf("connect to the closed port: %v, want ECONNREFUSED", err)
	}
	for range 2000 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		got := l.Addr().(*net.TCPAddr).AddrPort()
		l.Close()
		if got == a {
			t.Fatalf("a listener on a free port got the closed port %v", a)
		}
	}
	l, err := net.Listen("tcp", a.String())
	if err != nil {
		t.Fatalf("listen on the closed port: %v", err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", a.String())
	if err != nil {
		t.Fatalf("connect once a listener serves the closed port: %v", err)
	}
	c.Close()
}
