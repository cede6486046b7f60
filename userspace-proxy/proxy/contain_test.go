package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// Bugs that panic in a goroutine a connection started — not the
// connection's own, which ServeConn recovers (TestPanicContained) — used to
// end the process. faultDialer plants them: its connections panic when
// they move a marker, in whichever goroutine moves it.

const (
	panicOnRead  = "PANIC-ON-READ"
	panicOnWrite = "PANIC-ON-WRITE"
)

// faultDialer dials with d and wraps the connections to only (every
// endpoint when zero) in faultConn; with panicDial it panics instead of
// dialing them.
type faultDialer struct {
	d         dial.Dialer
	only      netip.AddrPort
	panicDial bool
}

func (f faultDialer) Dial(ctx context.Context, ep snapshot.Endpoint) (net.Conn, error) {
	if f.only.IsValid() && ep.Addr != f.only {
		return f.d.Dial(ctx, ep)
	}
	if f.panicDial {
		panic("faultDialer: a bug dialing")
	}
	c, err := f.d.Dial(ctx, ep)
	if err != nil {
		return nil, err
	}
	return faultConn{c}, nil
}

// faultConn panics reading panicOnRead or writing panicOnWrite.
type faultConn struct{ net.Conn }

// CloseWrite half-closes the connection underneath, as relays do (a
// net.Pipe cannot).
func (c faultConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (c faultConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if bytes.Contains(p[:n], []byte(panicOnRead)) {
		panic("faultConn: a bug reading")
	}
	return n, err
}

func (c faultConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(panicOnWrite)) {
		panic("faultConn: a bug writing")
	}
	return c.Conn.Write(p)
}

func withFaults(f faultDialer) func(dial.Dialer) dial.Dialer {
	return func(d dial.Dialer) dial.Dialer { f.d = d; return f }
}

// TestPanicInStartedGoroutine: a panic in a goroutine a connection started
// — a relay's second direction, a request body's writer on either
// HTTP/1.1 path, a mirror, net/http's dial, the fast path's client watch —
// and one in net/http's handler goroutine ends only that connection or
// request: it is counted and logged with its stack and the goroutine's
// name, and the proxy serves the next request. Without the recovery the
// test binary dies (or, for net/http's handler, the panic is not counted).
func TestPanicInStartedGoroutine(t *testing.T) {
	checkNoLeaks(t)
	vip := netip.MustParseAddrPort("10.96.7.1:80")
	// start runs a proxy whose dials fail as f says, serving vip with an
	// echo backend of protocol proto through a route (so that HTTP/1.1
	// apps take the fast path, h2c apps net/http's server).
	start := func(t *testing.T, f faultDialer, proto snapshot.Protocol) *env {
		e := newEnv(t, envOptions{dialer: withFaults(f)})
		be := startEcho(t, "echo-0", nil)
		m := &mesh{t: t}
		ref := m.backend("echo", snapshot.Backend{Protocol: proto, Endpoints: endpoints(be.addr)})
		m.frontend("echo", vip, ref, producer(routeSet(snapshot.KindHTTPRoute, rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(ref)}})))
		e.p.Update(m.snapshot(1))
		return e
	}
	// served checks that one panic was recovered in what, and that the
	// proxy still answers c.
	served := func(t *testing.T, e *env, what string, c *http.Client) {
		t.Helper()
		if got := e.counter("sockmesh_proxy_panics_total", nil); got != 1 {
			t.Errorf("panics = %v, want 1", got)
		}
		if l := e.logs.String(); !strings.Contains(l, `"msg":"panic recovered`) || !strings.Contains(l, `"in":"`+what+`"`) ||
			!strings.Contains(l, "faultConn: a bug") && !strings.Contains(l, "faultDialer: a bug") {
			t.Errorf("want an error line for a panic in %s with the panic and its stack; log:\n%s", what, l)
		}
		if code, _ := get(t, c, "http://echo.b.svc/again"); code != http.StatusOK {
			t.Errorf("next request: %d, want 200", code)
		}
	}

	t.Run("relay", func(t *testing.T) {
		// The backend echoes the marker: the relay's backend-to-app
		// goroutine reads it.
		e := newEnv(t, envOptions{dialer: withFaults(faultDialer{})})
		echo := startTCPEcho(t, nil)
		tcpVIP := netip.MustParseAddrPort("10.96.7.2:5432")
		e.p.Update(buildSnapshot(t, 1, service{name: "db", vip: tcpVIP, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(echo)}}))
		exchange := func(msg string) (string, error) {
			c, err := e.dial(tcpVIP)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, msg)
			buf := make([]byte, len(msg))
			n, err := io.ReadFull(c, buf)
			return string(buf[:n]), err
		}
		if got, err := exchange("\x00hello " + panicOnRead); err == nil {
			t.Errorf("the panicking relay's app read %q; want its connection ended", got)
		}
		if got := e.counter("sockmesh_proxy_panics_total", nil); got != 1 {
			t.Errorf("panics = %v, want 1", got)
		}
		if !strings.Contains(e.logs.String(), `"in":"relay"`) {
			t.Errorf("no panic line for the relay; log:\n%s", e.logs.String())
		}
		if got, err := exchange("\x00hello again"); err != nil || got != "\x00hello again" {
			t.Errorf("next connection: %q, %v", got, err)
		}
	})

	t.Run("fast-path-request-body", func(t *testing.T) {
		// Expect: 100-continue makes the app send its body only once the
		// body's goroutine reads it; that goroutine writes the marker.
		e := start(t, faultDialer{}, snapshot.ProtocolHTTP11)
		c, err := e.dial(vip)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if resp, err := postAfterContinue(t, c, "body "+panicOnWrite); err != nil || resp.StatusCode != http.StatusBadGateway {
			t.Errorf("request whose body's writer panicked: %v, %v; want 502", resp, err)
		}
		served(t, e, "request body", e.client(vip, false))
	})

	t.Run("nethttp-request-body", func(t *testing.T) {
		// An h2c app to an HTTP/1.1 backend: net/http's server, and the
		// HTTP/1.1 transport's body writer writes the marker.
		e := start(t, faultDialer{}, snapshot.ProtocolHTTP11)
		c := e.client(vip, true)
		resp, err := c.Post("http://echo.b.svc/upload", "text/plain", strings.NewReader("body "+panicOnWrite))
		if err != nil || resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("request whose body's writer panicked: %v, %v; want 502", resp, err)
		}
		resp.Body.Close()
		served(t, e, "request body", c)
	})

	t.Run("mirror", func(t *testing.T) {
		// Only the mirror's connections carry faults; its request line
		// carries the marker.
		mirror := startEcho(t, "mirror-0", nil)
		e := newEnv(t, envOptions{dialer: withFaults(faultDialer{only: mirror.addr})})
		m := &mesh{t: t}
		front := m.echoBackend("echo")
		mref := m.backend("mirror", snapshot.Backend{Endpoints: endpoints(mirror.addr)})
		m.frontend("echo", vip, front, producer(routeSet(snapshot.KindHTTPRoute,
			rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(front), Filters: snapshot.Filters{
				Mirrors: []snapshot.Mirror{{Backend: mref, Numerator: 1, Denominator: 1}},
			}}})))
		e.p.Update(m.snapshot(1))
		c := e.client(vip, false)
		if code, _ := get(t, c, "http://echo.b.svc/"+panicOnWrite); code != http.StatusOK {
			t.Errorf("mirrored request: %d, want 200 (mirrors do not touch the answer)", code)
		}
		eventually(t, func() bool {
			return e.counter("sockmesh_proxy_mirrored_requests_total", map[string]string{"result": "failed"}) == 1
		}, "the panicked mirror counted failed")
		served(t, e, "mirror", c)
	})

	t.Run("h2-dial", func(t *testing.T) {
		// An H2C backend: net/http's Transport dials on a goroutine of
		// its own, through the proxy's dialer.
		e := start(t, faultDialer{panicDial: true}, snapshot.ProtocolH2C)
		c := e.client(vip, false)
		if code, _ := get(t, c, "http://echo.b.svc/"); code < 500 {
			t.Errorf("request whose dial panicked: %d, want a 5xx", code)
		}
		if got := e.counter("sockmesh_proxy_panics_total", nil); got != 1 {
			t.Errorf("panics = %v, want 1", got)
		}
		if !strings.Contains(e.logs.String(), `"in":"dial"`) {
			t.Errorf("no panic line for the dial; log:\n%s", e.logs.String())
		}
	})

	// net/http's HTTP/2 Transport reads and writes its connections, and
	// sends request bodies, on goroutines of its own; the proxy's code
	// beneath — its socket layer, the fast path's body readers — must not
	// end the process from there.
	t.Run("h2-connection-read", func(t *testing.T) {
		// The echo's answer carries the path: the Transport's read loop
		// reads the marker — with the answer's head, which then fails
		// (5xx), or after it, which cuts the answer (a reset).
		e := start(t, faultDialer{}, snapshot.ProtocolH2C)
		c := e.client(vip, false)
		resp, err := c.Get("http://echo.b.svc/" + panicOnRead)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode < 500 {
				t.Errorf("request whose answer's read panicked: %d, want a 5xx or the answer cut", resp.StatusCode)
			}
		}
		served(t, e, "upstream connection", c)
	})

	t.Run("h2-connection-write", func(t *testing.T) {
		// The body's DATA frame carries the marker (HPACK would hide it in
		// a header).
		e := start(t, faultDialer{}, snapshot.ProtocolH2C)
		c := e.client(vip, false)
		resp, err := c.Post("http://echo.b.svc/upload", "text/plain", strings.NewReader("body "+panicOnWrite))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 500 {
			t.Errorf("request whose body's write panicked: %d, want a 5xx", resp.StatusCode)
		}
		served(t, e, "upstream connection", c)
	})

	t.Run("h2-request-body", func(t *testing.T) {
		// The app's connection reads the marker: Expect: 100-continue
		// makes the app send its body only once the Transport's goroutine
		// reads it, through the fast path's body readers.
		e := start(t, faultDialer{}, snapshot.ProtocolH2C)
		app, done := faultyApp(e, vip)
		if resp, err := postAfterContinue(t, app, "body "+panicOnRead); err != nil || resp.StatusCode != http.StatusBadGateway {
			t.Errorf("request whose body's reader panicked: %v, %v; want 502; log:\n%s", resp, err, e.logs.String())
		}
		app.Close()
		<-done
		served(t, e, "request body", e.client(vip, false))
	})

	t.Run("nethttp-connection", func(t *testing.T) {
		// An h2c app whose DATA frame carries the marker: net/http's
		// server reads it in the connection's frame-reading goroutine.
		e := start(t, faultDialer{}, snapshot.ProtocolHTTP11)
		app, done := faultyApp(e, vip)
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		tr.DialContext = func(context.Context, string, string) (net.Conn, error) { return app, nil }
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		if resp, err := c.Post("http://echo.b.svc/upload", "text/plain", strings.NewReader("body "+panicOnRead)); err == nil {
			resp.Body.Close()
			t.Errorf("request on a connection whose read panicked: %d, want the connection ended", resp.StatusCode)
		}
		<-done
		served(t, e, "app connection", e.client(vip, true))
	})

	t.Run("nethttp-handler", func(t *testing.T) {
		// net/http recovers its handlers' panics itself, with a line at
		// debug level: the proxy's Handler reports them as bugs.
		e := start(t, faultDialer{panicDial: true}, snapshot.ProtocolHTTP11)
		c := e.client(vip, true)
		if resp, err := c.Get("http://echo.b.svc/"); err == nil {
			resp.Body.Close()
			t.Errorf("request whose handler panicked: %d, want the stream reset", resp.StatusCode)
		}
		if got := e.counter("sockmesh_proxy_panics_total", nil); got != 1 {
			t.Errorf("panics = %v, want 1", got)
		}
		if !strings.Contains(e.logs.String(), `"in":"request"`) {
			t.Errorf("no panic line for the request; log:\n%s", e.logs.String())
		}
	})

	t.Run("client-watch", func(t *testing.T) {
		// A backend that does not answer: after watchAfter the fast path
		// reads the app's connection in the background, and reads the
		// marker there.
		release := make(chan struct{})
		rec := startRecorder(t, nil, func(w http.ResponseWriter, r *http.Request, n int) bool {
			<-release
			return false
		})
		defer close(release)
		e := newEnv(t, envOptions{})
		m := &mesh{t: t}
		ref := m.backend("slow", snapshot.Backend{Endpoints: endpoints(rec.addr)})
		m.frontend("slow", vip, ref, producer(routeSet(snapshot.KindHTTPRoute, rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(ref)}})))
		e.p.Update(m.snapshot(1))
		app, done := faultyApp(e, vip)
		app.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(app, "GET /slow HTTP/1.1\r\nHost: slow.b.svc\r\n\r\n")
		<-rec.seen
		// Written once the watch reads (net.Pipe: a write waits for it).
		io.WriteString(app, panicOnRead)
		app.Close()
		<-done
		if got := e.counter("sockmesh_proxy_panics_total", nil); got != 1 {
			t.Errorf("panics = %v, want 1", got)
		}
		if !strings.Contains(e.logs.String(), `"in":"client watch"`) {
			t.Errorf("no panic line for the client watch; log:\n%s", e.logs.String())
		}
	})
}

// postAfterContinue posts body on c with Expect: 100-continue, sending it
// once the 100 came (when the proxy's goroutine that sends the body reads
// it), and returns the final answer.
func postAfterContinue(t *testing.T, c net.Conn, body string) (*http.Response, error) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: echo.b.svc\r\nExpect: 100-continue\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("want 100 Continue, got %v, %v", resp, err)
	}
	io.WriteString(c, body)
	return http.ReadResponse(br, nil)
}

// faultyApp serves the proxy's end of a pipe, in faultConn, as a
// connection to vip, and returns the app's end; done is closed when
// ServeConn returns.
func faultyApp(e *env, vip netip.AddrPort) (app net.Conn, done <-chan struct{}) {
	app, s := net.Pipe()
	served := make(chan struct{})
	go func() {
		defer close(served)
		e.p.ServeConn(faultConn{s}, vip, proxy.Client{})
	}()
	return app, served
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
