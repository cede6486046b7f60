package httpproxy

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/metricsum"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// TestClientGoneEndsExchange: an app that leaves while its request waits
// on a backend that does not answer ends the exchange — the upstream
// connection closes, on the pooled HTTP/1.1 wire and on h2c — rather than
// holding it until the backend answers; an app that stays gets its slow
// answer, pipelined requests included, and its connection keeps serving.
func TestClientGoneEndsExchange(t *testing.T) {
	left := make(chan string, 4)
	ep := serveRaw(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			r, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, r.Body)
			switch r.URL.Path {
			case "/hang":
				io.Copy(io.Discard, br) // until the proxy closes
				left <- r.Method
				return
			case "/slow":
				time.Sleep(watchAfter + watchAfter/2)
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(r.URL.Path))+"\r\n\r\n"+r.URL.Path)
		}
	})
	f := newFixture(t, Config{}, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}})
	waitLeft := func(method string) {
		t.Helper()
		select {
		case m := <-left:
			if m != method {
				t.Errorf("the backend saw %s leave, want %s", m, method)
			}
		case <-time.After(4 * watchAfter):
			t.Fatalf("%s: the upstream connection is still open %v after the app left", method, 4*watchAfter)
		}
	}

	a := f.dial()
	a.send("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
	a.c.Close()
	waitLeft(http.MethodGet)

	a = f.dial()
	a.send("POST /hang HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	a.c.Close()
	waitLeft(http.MethodPost)
	// Counted once the proxy's side is over, just after the close.
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := f.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "canceled"})
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("failures{reason=canceled} = %v, want 2", n)
			break
		}
	}

	b := f.dial()
	b.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
	for _, want := range []string{"/slow", "/fast"} {
		if resp, body := b.read(http.MethodGet); resp.StatusCode != http.StatusOK || body != want {
			t.Errorf("staying app: %s %q, want 200 %s", resp.Status, body, want)
		}
	}
	b.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, body := b.read(http.MethodGet); resp.StatusCode != http.StatusOK || body != "/slow" {
		t.Errorf("staying app, second slow request: %s %q", resp.Status, body)
	}
	b.send("GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, body := b.read(http.MethodGet); resp.StatusCode != http.StatusOK || body != "/fast" {
		t.Errorf("staying app, after the slow requests: %s %q", resp.Status, body)
	}
}

// TestClientGoneEndsH2CExchange: the same for a backend of protocol H2C
// (net/http's Transport): the app's leaving cancels the backend's stream.
func TestClientGoneEndsH2CExchange(t *testing.T) {
	canceled := make(chan struct{})
	ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		close(canceled)
	}))
	f := newFixture(t, Config{}, snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: []snapshot.Endpoint{ep}})
	a := f.dial()
	a.send("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
	a.c.Close()
	select {
	case <-canceled:
	case <-time.After(4 * watchAfter):
		t.Fatalf("the backend's stream is still open %v after the app left", 4*watchAfter)
	}
}

// TestClientGoneEndsConnWait: an app that leaves while its request waits
// for an upstream connection (the endpoint's one allowed is busy) stops
// waiting: its request never reaches the backend, it is counted canceled,
// and the connection, once free, serves the next app. So does one whose
// request has a body, read already or still to come: before, only a
// bodiless request was watched, and the others reached the backend once
// the connection came free, apps long gone.
func TestClientGoneEndsConnWait(t *testing.T) {
	for _, c := range []struct{ name, req string }{
		{"bodiless", "GET /left HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"body-read", "POST /left HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"},
		{"body-to-come", "POST /left HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhi"},
	} {
		t.Run(c.name, func(t *testing.T) { testClientGoneEndsConnWait(t, c.req) })
	}
}

func testClientGoneEndsConnWait(t *testing.T, left string) {
	seen := make(chan string, 8)
	ep := serveRaw(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			r, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			seen <- r.URL.Path
			if r.URL.Path == "/hang" {
				io.Copy(io.Discard, br) // until the proxy closes
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	f := newFixtureWith(t, Config{}, upstream.Config{MaxConnsPerEndpoint: 1}, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}})
	next := func() string {
		t.Helper()
		select {
		case p := <-seen:
			return p
		case <-time.After(4 * watchAfter):
			t.Fatal("the backend got no request")
			return ""
		}
	}

	a := f.dial()
	a.send("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
	if p := next(); p != "/hang" {
		t.Fatalf("the backend got %s, want /hang", p)
	}
	b := f.dial()
	b.send(left)
	b.c.Close()
	for deadline := time.Now().Add(4 * watchAfter); ; time.Sleep(10 * time.Millisecond) {
		if f.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "canceled"}) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the request of an app that left still waits for a connection %v later", 4*watchAfter)
		}
	}
	a.c.Close() // frees the connection

	c := f.dial()
	c.send("GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, body := c.read(http.MethodGet); resp.StatusCode != http.StatusOK || body != "ok" {
		t.Errorf("next app: %s %q, want 200 ok", resp.Status, body)
	}
	if p := next(); p != "/next" {
		t.Errorf("after /hang the backend got %s, want /next (never /left)", p)
	}
}

// TestClientWatchPanicContained: a panic in the client watch outside its
// read of the client — here in the deadline it clears under its lock
// before that read — is recovered and counted, and ends the exchange as
// an app that left would: the backend's connection closes, the request
// counts canceled, and the app's connection ends, its lock released.
// Only the read was under the recover: the panic ended the process.
func TestClientWatchPanicContained(t *testing.T) {
	var armed atomic.Bool
	upClosed := make(chan struct{})
	ep := serveRaw(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		armed.Store(true) // the next deadline cleared is the watch's
		io.Copy(io.Discard, c)
		close(upClosed)
	})
	reg := prometheus.NewRegistry()
	panics, err := contain.New(slog.New(slog.DiscardHandler), reg, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, Config{Panics: panics}, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}})
	app, proxyEnd := tcpserve.Pair(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.h.ServeHTTP1(deadlinePanicConn{Conn: proxyEnd, armed: &armed}, &Target{OrigDst: vip, Start: f.cur.Load(), Current: &f.cur,
			ClientAddr: app.LocalAddr().(*net.TCPAddr).AddrPort()})
	}()
	t.Cleanup(func() { app.Close(); <-done })
	c := &client{t: t, c: app, r: bufio.NewReader(app)}
	c.send("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
	select {
	case <-upClosed:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's connection is still open 10 s after the watch's panic")
	}
	if !c.closed() {
		t.Error("the app's connection is still open after the watch's panic")
	}
	if n := metricsum.Sum(t, reg, "sockmesh_proxy_panics_total", nil); n != 1 {
		t.Errorf("%v panics counted, want 1", n)
	}
	if n := f.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "canceled"}); n != 1 {
		t.Errorf("failures{reason=canceled} = %v, want 1", n)
	}
}

// deadlinePanicConn panics, once armed, when its read deadline is cleared.
type deadlinePanicConn struct {
	net.Conn
	armed *atomic.Bool
}

func (c deadlinePanicConn) SetReadDeadline(d time.Time) error {
	if d.IsZero() && c.armed.CompareAndSwap(true, false) {
		panic("deadlinePanicConn: a bug clearing the deadline")
	}
	return c.Conn.SetReadDeadline(d)
}

// TestClientGoneEndsConnectBackoff: an app that leaves while its request,
// whose body is still to come, waits out the backoff of a retry after its
// connects were refused ends the wait: the request counts canceled and is
// never tried again. The watch took the body's first bytes for a
// pipelined request and stopped watching: the retry went out after the
// backoff, for an app long gone.
func TestClientGoneEndsConnectBackoff(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := snapshot.Endpoint{Addr: l.Addr().(*net.TCPAddr).AddrPort(), Ready: true, Serving: true}
	l.Close()
	backoff := snapshot.Duration(30 * time.Second)
	f := newFixture(t, Config{}, snapshot.Backend{})
	f.updateRoutes(2, snapshot.Backend{Endpoints: []snapshot.Endpoint{refused}}, &snapshot.RouteTable{Producer: &snapshot.RouteSet{
		Kind:    snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{{Path: snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/"}}},
		// The first wait is 15 to 30 s: the watch looks after 1.
		Rules: []snapshot.RouteRule{{Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: backendRef}},
			Retry: &snapshot.Retry{Attempts: 1, Backoff: &backoff}}},
	}})
	a := f.dial()
	// Streamed, recorded for the retry as it goes: none of it is read
	// before a connection is made.
	a.send("POST /left HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n")
	for f.counter("sockmesh_proxy_upstream_dials_total", map[string]string{"result": "refused"}) == 0 {
		time.Sleep(10 * time.Millisecond) // until the first connect was refused: the backoff runs
	}
	a.c.Close()
	for {
		canceled := f.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "canceled"})
		if canceled == 1 {
			break
		}
		if n := f.counter("sockmesh_proxy_request_retries_total", nil); n != 0 {
			t.Fatalf("retried %v times after the app left; want the request canceled, never retried", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestClientGoneEndsStatusBackoff: an app whose streamed body (chunked,
// recorded for the retry) was partly read when the backend answered a
// code its rule retries, and which leaves during the retry's backoff,
// ends the wait: the request counts canceled and the retry never goes.
// Before, the watch took the body as still read by its goroutine (which
// the retry had stopped) and never looked at the app: the retry went out
// after the backoff, its body cut short, for an app long gone.
func TestClientGoneEndsStatusBackoff(t *testing.T) {
	var seen atomic.Int32
	ep := midBodyBackend(t, &seen)
	f := newFixture(t, Config{}, snapshot.Backend{})
	// The first wait is 15 to 30 s: the watch looks after 1.
	f.updateRoutes(2, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}}, retryRoutes(30*time.Second))
	a := f.dial()
	a.send("POST /left HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n")
	// The 503 came: the try's read of the body in progress ends with the
	// app's next chunk, which the retry would send.
	waitGoroutine("httpproxy.(*h1Conn).halt(", nil)
	a.send("2\r\nho\r\n")
	waitGoroutine("httpproxy.(*policy).wait(", nil)
	a.c.Close()
	for f.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "canceled"}) != 1 {
		if n := f.counter("sockmesh_proxy_request_retries_total", nil); n != 0 {
			t.Fatalf("retried %v times after the app left; want the request canceled, never retried", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := seen.Load(); n != 1 {
		t.Errorf("the backend saw %d requests, want 1", n)
	}
}

// midBodyBackend is a backend that answers the first request it sees
// 503 once it got the first 2 bytes of its body and the proxy's try waits
// for the app's next bytes, which the try's halt then waits for too;
// others it never answers. It reads each until the proxy closes, and
// counts them in seen.
func midBodyBackend(t *testing.T, seen *atomic.Int32) snapshot.Endpoint {
	return serveRaw(t, func(c net.Conn) {
		r, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		n := seen.Add(1)
		if _, err := io.ReadFull(r.Body, make([]byte, 2)); err != nil {
			return
		}
		ended := make(chan struct{})
		go func() { io.Copy(io.Discard, r.Body); close(ended) }()
		if n == 1 {
			// The body's end stops the wait too: a try that ended first
			// (a route's timeout passed on a loaded machine) never reads
			// on, and the wait would hold the server's cleanup for ever.
			waitGoroutine("httpproxy.(*tryBody).readOn(", ended)
			io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
		}
		<-ended
	})
}

// waitGoroutine waits until a goroutine runs fn (as goroutinesIn names
// it), or stop is closed (nil: never).
func waitGoroutine(fn string, stop <-chan struct{}) {
	for goroutinesIn(fn) == 0 {
		select {
		case <-stop:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// TestStatusRetryBodyBrokenOff: an app whose streamed body breaks off
// (here it half-closes) while the try that got an answer its rule
// retries is stopped gets that answer, as an early answer to a body that
// breaks off goes out; the retry never goes, as its body cannot be sent
// whole. It went, the recorded part of the body and then a cut.
func TestStatusRetryBodyBrokenOff(t *testing.T) {
	var seen atomic.Int32
	ep := midBodyBackend(t, &seen)
	f := newFixture(t, Config{}, snapshot.Backend{})
	f.updateRoutes(2, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}}, retryRoutes(0))
	a := f.dial()
	a.send("POST /cut HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n")
	waitGoroutine("httpproxy.(*h1Conn).halt(", nil) // the 503 came: the try stops once its read of the body ends
	a.c.(*net.TCPConn).CloseWrite()
	if resp, _ := a.read(http.MethodPost); resp.StatusCode != http.StatusServiceUnavailable || !resp.Close {
		t.Errorf("answer %s, close=%v; want the backend's 503 with Connection: close", resp.Status, resp.Close)
	}
	if n := seen.Load(); n != 1 {
		t.Errorf("the backend saw %d requests, want 1: no retry of a body that broke off", n)
	}
}

// retryRoutes is a route table sending every request to backendRef,
// retried once on a 503 after backoff.
func retryRoutes(backoff time.Duration) *snapshot.RouteTable {
	b := snapshot.Duration(backoff)
	return &snapshot.RouteTable{Producer: &snapshot.RouteSet{
		Kind:    snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{{Path: snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/"}}},
		Rules: []snapshot.RouteRule{{Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: backendRef}},
			Retry: &snapshot.Retry{Attempts: 1, Codes: []int{503}, Backoff: &b}}},
	}}
}

// TestConnWaitBackendTimeout: a request whose rule's backendRequest
// timeout passes while it waits for an upstream connection (the
// endpoint's one allowed is busy) fails as the timeout: 504, counted
// timeout, and a rule that retries tries it again (backend_timeout), as
// net/http's path does. It was a 502 counted upstream_error, blaming the
// backend, and never retried. The retry waits for a connection too, gets
// none before its own timeout, and is never sent: not counted in
// retries_total (before 2026-11-30 it was).
func TestConnWaitBackendTimeout(t *testing.T) {
	for _, retries := range []int{0, 1} {
		t.Run("retries="+strconv.Itoa(retries), func(t *testing.T) { testConnWaitBackendTimeout(t, retries) })
	}
}

func testConnWaitBackendTimeout(t *testing.T, retries int) {
	hung := make(chan struct{})
	ep := serveRaw(t, func(c net.Conn) {
		r, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		if r.URL.Path == "/hang" {
			close(hung)
			io.Copy(io.Discard, c) // until the proxy closes
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	f := newFixtureWith(t, Config{}, upstream.Config{MaxConnsPerEndpoint: 1}, snapshot.Backend{})
	d, backoff := snapshot.Duration(100*time.Millisecond), snapshot.Duration(0)
	to := []snapshot.WeightedBackend{{Weight: 1, Backend: backendRef}}
	f.updateRoutes(2, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}}, &snapshot.RouteTable{Producer: &snapshot.RouteSet{
		Kind: snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{
			{Rule: 0, Path: snapshot.PathMatch{Type: snapshot.PathExact, Value: "/hang"}},
			{Rule: 1, Path: snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/"}},
		},
		Rules: []snapshot.RouteRule{{Backends: to}, {Backends: to, Timeouts: &snapshot.Timeouts{BackendRequest: &d},
			Retry: &snapshot.Retry{Attempts: retries, Backoff: &backoff}}},
	}})
	a := f.dial()
	a.send("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
	<-hung
	b := f.dial()
	b.send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, _ := b.read(http.MethodGet); resp.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("answer %s, want 504", resp.Status)
	}
	if n := f.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "timeout"}); n != 1 {
		t.Errorf("failures{reason=timeout} = %v, want 1", n)
	}
	if n := f.counter("sockmesh_proxy_request_retries_total", map[string]string{"reason": "backend_timeout"}); n != 0 {
		t.Errorf("retries{reason=backend_timeout} = %v, want 0: no try got a connection", n)
	}
}

// TestStatusRetryHaltTimeout: an app that stops mid-body once the backend
// answered a code its rule retries — the try waits for its next bytes
// before the retry — gets 504 when the rule's timeout passes meanwhile,
// as policies.md says, counted timeout. The timeout cut only the upstream
// connection, and the wait went on until the stall watch reset the app.
func TestStatusRetryHaltTimeout(t *testing.T) {
	d := snapshot.Duration(200 * time.Millisecond)
	for _, c := range routeTimeouts(d) {
		t.Run(c.name, func(t *testing.T) {
			ep := midBodyBackend(t, new(atomic.Int32))
			// The stall watch ends the wait in 3 s at the latest.
			f := newFixture(t, Config{StallTimeout: 3 * time.Second}, snapshot.Backend{})
			routes := retryRoutes(0)
			routes.Producer.Rules[0].Timeouts = &c.timeouts
			f.updateRoutes(2, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}}, routes)
			a := f.dial()
			a.send("POST /stop HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n")
			if resp, _ := a.read(http.MethodPost); resp.StatusCode != http.StatusGatewayTimeout {
				t.Errorf("answer %s, want 504", resp.Status)
			}
			if n := f.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "timeout"}); n != 1 {
				t.Errorf("failures{reason=timeout} = %v, want 1", n)
			}
		})
	}
}

// TestAnswerAsAppLeaves: an answer that came just as the client watch saw
// its app leave, and closed the upstream connection behind it, counts
// canceled and goes to no one: the outcome is decided where the answer
// begins. The interleaving is held in place: the backend sends a 103 and
// the final answer in one segment, the proxy's write of the 103 to the
// app waits while the app leaves and the watch closes the backend's
// connection; the final answer, read already, comes next. Before, it was
// counted with its status (200, and a 101 the relay then found cut).
func TestAnswerAsAppLeaves(t *testing.T) {
	for _, c := range []struct{ name, req, answer string }{
		{"answer", "GET /x HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"},
		{"switch", "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
			"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			upClosed := make(chan struct{})
			ep := serveRaw(t, func(uc net.Conn) {
				if _, err := http.ReadRequest(bufio.NewReader(uc)); err != nil {
					return
				}
				io.WriteString(uc, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"+c.answer)
				io.Copy(io.Discard, uc) // until the proxy closes
				close(upClosed)
			})
			f := newFixture(t, Config{}, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}})
			app, proxyEnd := tcpserve.Pair(t)
			held := &heldWriteConn{Conn: proxyEnd, writing: make(chan struct{}), release: make(chan struct{})}
			served, ended := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(served)
				f.h.ServeHTTP1(held, &Target{OrigDst: vip, Start: f.cur.Load(), Current: &f.cur,
					ClientAddr: app.LocalAddr().(*net.TCPAddr).AddrPort(), Ended: func() { close(ended) }})
			}()
			t.Cleanup(func() {
				app.Close()
				select {
				case <-held.release:
				default:
					close(held.release)
				}
				<-served
				<-ended
			})
			if _, err := io.WriteString(app, c.req); err != nil {
				t.Fatal(err)
			}
			<-held.writing // the 103's: the final answer waits in the proxy's reader
			app.Close()
			<-upClosed // the watch saw the app leave
			close(held.release)
			<-served
			<-ended
			if n := f.counter("sockmesh_proxy_requests_total", nil); n != 0 {
				t.Errorf("requests_total = %v, want 0: the answer was counted for an app that left before it began", n)
			}
			if n := f.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "canceled"}); n != 1 {
				t.Errorf("failures{reason=canceled} = %v, want 1", n)
			}
		})
	}
}

// heldWriteConn holds its first write until release is closed, closing
// writing as it starts to wait.
type heldWriteConn struct {
	net.Conn
	writing, release chan struct{}
	once             sync.Once
}

func (c *heldWriteConn) Write(p []byte) (int, error) {
	c.once.Do(func() {
		close(c.writing)
		<-c.release
	})
	return c.Conn.Write(p)
}

// TestAppLeavesStuckBody: an app that leaves while its request body's
// goroutine is held sending it upstream (the backend stopped taking the
// body, and never answers: an HTTP/1.1 backend's socket is full, an h2c
// backend's stream window spent) ends the exchange, counted canceled; an
// app that vanished without a word would be found by keep-alive, on by
// then. The goroutine reads the app no more, so neither the watch's read
// (which waits while that goroutine may read the app) nor the stall watch
// (no read or write of the app under way; its timeout here is two
// seconds) noticed: the exchange, its goroutines and its upstream
// connection or stream were held until the backend answered, or for ever.
func TestAppLeavesStuckBody(t *testing.T) {
	fin := func(c *net.TCPConn) { c.Close() }
	for _, c := range []struct {
		name  string
		h2c   bool
		leave func(*net.TCPConn)
	}{
		{"h1-fin", false, fin},
		{"h1-reset", false, func(c *net.TCPConn) { c.SetLinger(0); c.Close() }},
		{"h2c-fin", true, fin},
	} {
		t.Run(c.name, func(t *testing.T) {
			be, got, release := stuckBodyBackend(t, c.h2c)
			f := newFixture(t, Config{StallTimeout: 2 * watchAfter}, be)
			app, proxyEnd := tcpserve.Pair(t)
			proxyEnd.SetKeepAlive(false) // as the proxy's listeners accept (proxy.ListenConfig)
			ended := make(chan struct{})
			go f.h.ServeHTTP1(sockio.Wrap(proxyEnd), &Target{OrigDst: vip, Start: f.cur.Load(), Current: &f.cur,
				ClientAddr: app.LocalAddr().(*net.TCPAddr).AddrPort(), Ended: func() { close(ended) }})
			t.Cleanup(func() {
				release() // the backend's end ends an exchange still stuck
				app.Close()
				<-ended
			})

			if _, err := io.WriteString(app, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			<-got
			chunk := make([]byte, 16<<10)
			guard := 10 * f.h.cfg.StallTimeout // fails a hang; never reached otherwise
			for stuck := false; !stuck; {
				for !bodySendStuck() {
					if _, err := app.Write(chunk); err != nil {
						t.Fatal(err)
					}
				}
				for deadline := time.Now().Add(guard); !sockoptOn(t, proxyEnd, unix.SOL_SOCKET, unix.SO_KEEPALIVE); time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("no keep-alive toward the app %v into the exchange", guard)
					}
				}
				// Still, a second on, the app writing no more: no pause
				// that the backend's flow control ended.
				stuck = bodySendStuck()
			}
			c.leave(app)
			select {
			case <-ended:
			case <-time.After(guard):
				t.Fatalf("the exchange still runs %v after its app left", guard)
			}
			if n := f.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "canceled"}); n != 1 {
				t.Errorf("failures{reason=canceled} = %v, want 1", n)
			}
			if n := f.counter("sockmesh_proxy_request_failures_total", nil); n != 1 {
				t.Errorf("failures = %v, want only the canceled one", n)
			}
			if n := f.counter("sockmesh_proxy_requests_total", nil); n != 0 {
				t.Errorf("requests_total = %v, want 0", n)
			}
		})
	}
}

// stuckBodyBackend is a backend, of protocol H2C if h2c, that takes no
// more of a request's body once its head came (got is closed then) and
// never answers, until release.
func stuckBodyBackend(t *testing.T, h2c bool) (be snapshot.Backend, got chan struct{}, release func()) {
	got, hold := make(chan struct{}), make(chan struct{})
	if h2c {
		be.Protocol = snapshot.ProtocolH2C
		be.Endpoints = []snapshot.Endpoint{startBackend(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			close(got)
			<-hold
		}))}
	} else {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		smallBuffers(t, l)
		tcpserve.Serve(t, l, func(uc net.Conn) {
			if _, err := http.ReadRequest(bufio.NewReader(uc)); err != nil {
				return
			}
			close(got)
			<-hold
		})
		be.Endpoints = []snapshot.Endpoint{{Addr: l.Addr().(*net.TCPAddr).AddrPort(), Ready: true, Serving: true}}
	}
	release = sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release) // before the server's, which waits for the handler
	return be, got, release
}

// bodySendStuck reports whether a request body's sending waits on the
// backend: the fast path's goroutine parked in its write upstream, or
// net/http's HTTP/2 Transport for the stream's flow control (which it
// also passes through, not waiting, with every frame it sends).
func bodySendStuck() bool {
	buf := make([]byte, 1<<20)
	for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "httpproxy.writeRequest(") && strings.Contains(g, "(*pollDesc).waitWrite(") ||
			strings.Contains(g, "awaitFlowControl(") && strings.Contains(g, "sync.(*Cond).Wait(") {
			return true
		}
	}
	return false
}

// sockoptOn reports whether the socket option level, opt of c is set.
func sockoptOn(t *testing.T, c *net.TCPConn, level, opt int) bool {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	if err := rc.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return v != 0
}
