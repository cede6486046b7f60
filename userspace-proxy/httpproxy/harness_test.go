package httpproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/leakcheck"
	"github.com/sockmesh/sockmesh/internal/metricsum"
	"github.com/sockmesh/sockmesh/internal/syncbuf"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// TestMain runs the tests with GODEBUG=http2xconnect=1, as
// the proxy's process runs (proxy.RuntimeSettings): net/http reads it
// once at init, and its HTTP/2 server takes an extended CONNECT (RFC
// 8441, extendedConnect) only under it.
func TestMain(m *testing.M) { testenv.MainWithGODEBUG(m, "http2xconnect=1") }

// vip is the Service address the tests' clients "connected to".
var vip = netip.MustParseAddrPort("10.96.0.10:80")

var backendRef = snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: "echo", Port: 80}

// fixture is the HTTP/1 fast path fed by a real TCP listener: every
// accepted connection is a redirected one whose original destination is
// vip, served by ServeHTTP1 as the proxy does.
type fixture struct {
	t     *testing.T
	h     *Handler
	reg   *prometheus.Registry
	pools *upstream.Pools
	cur   atomic.Pointer[View]
	ln    net.Listener
	logs  *syncbuf.Buffer
	wg    sync.WaitGroup
	// l7 is the listener of the server serveL7 started; wrapL7, if set,
	// wraps the Handler that server serves.
	l7     net.Listener
	wrapL7 func(http.Handler) http.Handler
}

func newFixture(t *testing.T, cfg Config, be snapshot.Backend) *fixture {
	t.Helper()
	return newFixtureWith(t, cfg, upstream.Config{}, be)
}

// newFixtureWith is newFixture with the upstream pools' configuration.
func newFixtureWith(t *testing.T, cfg Config, ucfg upstream.Config, be snapshot.Backend) *fixture {
	t.Helper()
	return newFixtureDialing(t, cfg, ucfg, dial.NewDirect(dial.Config{Unmarked: true}), be)
}

// newFixtureDialing is newFixtureWith with the upstream pools' dialer.
func newFixtureDialing(t *testing.T, cfg Config, ucfg upstream.Config, d dial.Dialer, be snapshot.Backend) *fixture {
	t.Helper()
	checkNoLeaks(t)
	f := &fixture{t: t, reg: prometheus.NewRegistry(), logs: &syncbuf.Buffer{}}
	log := slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var err error
	if f.h, err = New(cfg, log, f.reg); err != nil {
		t.Fatal(err)
	}
	if f.pools, err = upstream.New(ucfg, d, log, f.reg); err != nil {
		t.Fatal(err)
	}
	f.update(1, be)
	if f.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	f.wg.Go(func() {
		for {
			c, err := f.ln.Accept()
			if err != nil {
				return
			}
			f.wg.Go(func() {
				// As the proxy: raw reads and writes (sockio) under the
				// connection, and its end is Ended (it may park).
				ended := make(chan struct{})
				f.h.ServeHTTP1(sockio.Wrap(c.(*net.TCPConn)), &Target{OrigDst: vip, Start: f.cur.Load(), Current: &f.cur,
					ClientAddr: c.RemoteAddr().(*net.TCPAddr).AddrPort(), Ended: func() { close(ended) }})
				<-ended
			})
		}
	})
	t.Cleanup(func() {
		f.ln.Close()
		f.h.Drain()
		f.wg.Wait()
		f.cur.Load().Backends.CloseIdle()
		if t.Failed() {
			t.Logf("proxy log:\n%s", f.logs)
		}
	})
	return f
}

// update publishes a snapshot whose Service vip leads to be.
func (f *fixture) update(version uint64, be snapshot.Backend) {
	f.t.Helper()
	f.updateRoutes(version, be, nil)
}

// updateRoutes is update with the Service port's GAMMA routes, whose
// rules may name be (backendRef) and others (by their Ref).
func (f *fixture) updateRoutes(version uint64, be snapshot.Backend, routes *snapshot.RouteTable, others ...snapshot.Backend) {
	f.t.Helper()
	be.Ref = backendRef
	s, err := snapshot.New(version, []snapshot.Frontend{{
		Service: snapshot.ObjectRef{Namespace: "b", Name: "echo"}, Port: vip.Port(), Addresses: []netip.Addr{vip.Addr()},
		FailurePolicy: snapshot.FailClosed, Backend: backendRef, Routes: routes,
	}}, append([]snapshot.Backend{be}, others...), nil)
	if err != nil {
		f.t.Fatal(err)
	}
	var prev *upstream.Set
	if v := f.cur.Load(); v != nil {
		prev = v.Backends
	}
	f.cur.Store(NewView(s, f.pools.Build(s, prev)))
}

// client is a raw client connection: requests are written as given, and
// answers read with net/http's parser.
type client struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func (f *fixture) dial() *client {
	f.t.Helper()
	return f.dialTo(f.ln.Addr().String())
}

// dialL7 is dial to the server serveL7 started: net/http's path.
func (f *fixture) dialL7() *client {
	f.t.Helper()
	return f.dialTo(f.l7.Addr().String())
}

func (f *fixture) dialTo(addr string) *client {
	f.t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { c.Close() })
	return &client{t: f.t, c: c, r: bufio.NewReader(c)}
}

func (c *client) send(raw string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, raw); err != nil {
		c.t.Fatal(err)
	}
}

// read reads one answer to a request of method and its whole body.
func (c *client) read(method string) (*http.Response, string) {
	c.t.Helper()
	resp, err := http.ReadResponse(c.r, &http.Request{Method: method})
	if err != nil {
		c.t.Fatalf("read answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("read answer body: %v", err)
	}
	return resp, string(b)
}

// closed reports whether the proxy closed the connection (nothing more
// arrives).
func (c *client) closed() bool {
	c.t.Helper()
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.r.ReadByte()
	return err != nil && !isTimeout(err)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// httpClient is a net/http client whose connections go to the fixture.
func (f *fixture) httpClient() *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", f.ln.Addr().String())
		},
		DisableCompression: true,
	}
	f.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// appClient is a client of the kind app names: "h1" speaks HTTP/1.1 to
// the fast path, "h2c" HTTP/2 to net/http's server (serveL7).
func (f *fixture) appClient(app string) *http.Client {
	if app == "h2c" {
		return f.serveL7(true)
	}
	return f.httpClient()
}

// startBackend runs a cleartext net/http backend (HTTP/1.1 and h2c) and
// returns its endpoint.
func startBackend(t *testing.T, h http.Handler) snapshot.Endpoint {
	t.Helper()
	ep, _ := serveBackend(t, h, true) // for backends of protocol H2C
	return ep
}

// serveBackend is startBackend speaking h2c only if h2c; it returns the
// server too, for a test to stop.
func serveBackend(t *testing.T, h http.Handler, h2c bool) (snapshot.Endpoint, *http.Server) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols), DisableGeneralOptionsHandler: true} // h sees "OPTIONS *" too
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(h2c)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return snapshot.Endpoint{Addr: l.Addr().(*net.TCPAddr).AddrPort(), Ready: true, Serving: true}, srv
}

// serveRaw runs a backend that handles each connection with handle
// (closed after it) until t ends, and returns its endpoint.
func serveRaw(t *testing.T, handle func(net.Conn)) snapshot.Endpoint {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tcpserve.Serve(t, l, handle)
	return snapshot.Endpoint{Addr: l.Addr().(*net.TCPAddr).AddrPort(), Ready: true, Serving: true}
}

// smallBuffers gives c (a connection, or a listener: the connections it
// accepts from then on inherit them) the kernel's least socket buffers, so
// that a peer that stops reading soon holds up its writer.
func smallBuffers(t *testing.T, c any) {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for _, opt := range []int{syscall.SO_SNDBUF, syscall.SO_RCVBUF} {
			if err := syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, opt, 0); err != nil {
				serr = fmt.Errorf("setsockopt %d: %w", opt, err)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
}

// counter reads a counter by name and label values.
func (f *fixture) counter(name string, labels map[string]string) float64 {
	f.t.Helper()
	return metricsum.Sum(f.t, f.reg, name, labels)
}

// checkNoLeaks fails t if goroutines running this package's code outlive
// the test; it runs after every other cleanup (register it first).
func checkNoLeaks(t *testing.T) { leakcheck.Register(t, "/userspace-proxy/httpproxy/") }

// tlsBackend is serveRaw behind TLS (a certificate for echo.test from a
// CA of its own), and returns a backend whose policy trusts it.
func tlsBackend(t *testing.T, handle func(net.Conn)) snapshot.Backend {
	t.Helper()
	ca, err := pki.NewCA("httpproxy test ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "echo", DNSNames: []string{"echo.test"}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{leaf.TLS}})
	if err != nil {
		t.Fatal(err)
	}
	tcpserve.Serve(t, l, handle)
	return snapshot.Backend{
		TLS: &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: "echo.test", RootsPEM: string(ca.CertPEM),
			Policy: snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: "b", Name: "echo-tls"}},
		Endpoints: []snapshot.Endpoint{{Addr: l.Addr().(*net.TCPAddr).AddrPort(), Ready: true, Serving: true}},
	}
}

// routeTimeout names a rule's timeouts for a subtest.
type routeTimeout struct {
	name     string
	timeouts snapshot.Timeouts
}

// routeTimeouts is a rule's request timeout of d, and its backendRequest
// timeout of d: tests of what a timeout ends run under each.
func routeTimeouts(d snapshot.Duration) []routeTimeout {
	return []routeTimeout{
		{"request", snapshot.Timeouts{Request: &d}},
		{"backendRequest", snapshot.Timeouts{BackendRequest: &d}},
	}
}
