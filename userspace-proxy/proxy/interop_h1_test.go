package proxy_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// HTTP/1.x interop: legacy and unusual backends and clients, through real
// sockets, on each path an HTTP/1.x app may take to a backend.

// interopPath is one way an HTTP/1.x app reaches a backend.
type interopPath struct {
	name string
	// tls: the backend speaks TLS (BackendTLSPolicy).
	tls bool
	// l7: the proxy serves HTTP/1.x on net/http's server (HTTP1TLSL7)
	// rather than the fast path.
	l7 bool
	// sticky gives the backend session persistence, which sends a
	// cleartext backend's HTTP/1.x apps to the fast path (cleartext pool)
	// rather than the byte relay.
	sticky bool
}

var interopPaths = []interopPath{
	{name: "tls-pooled", tls: true},            // the default: fast path, pooled TLS
	{name: "clear-pooled", sticky: true},       // fast path, cleartext pool
	{name: "tls-nethttp", tls: true, l7: true}, // net/http server and Transport
}

// scripted is an HTTP/1.x backend that misbehaves on purpose: it reads
// requests with net/http's parser and answers each with the raw bytes its
// script returns (in one write), closing the connection after it when the
// script says so, without saying so itself.
type scripted struct {
	addr  netip.AddrPort
	conns atomic.Int32
	// crash makes the backend close with a TCP reset, as a crashed one
	// does.
	crash atomic.Bool
	// written counts the answers written whole.
	written atomic.Int32
	mu      sync.Mutex
	seen    []seenRequest
}

// seenRequest is what the backend received.
type seenRequest struct {
	conn, n      int // connection number, request number on it
	method, path string
	header       http.Header
	body         string
}

// script answers the n-th request on a backend connection: raw bytes to
// write (none: write nothing) and whether to close after. The parts of raw
// between flushMarks go out in writes (TLS records) of their own.
type script func(req *http.Request, n int) (raw string, close bool)

const flushMark = "\x00flush\x00"

func startScripted(t *testing.T, tlsCfg *tls.Config, answer script) *scripted {
	t.Helper()
	l := listenLocal(t)
	b := &scripted{addr: l.Addr().(*net.TCPAddr).AddrPort()}
	if tlsCfg != nil {
		l = tls.NewListener(l, tlsCfg)
	}
	tcpserve.Serve(t, l, func(c net.Conn) {
		id := int(b.conns.Add(1))
		defer func() {
			if b.crash.Load() {
				sockio.Reset(c) // no close_notify either
			} else {
				c.Close()
			}
		}()
		br := bufio.NewReader(c)
		for n := 0; ; n++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			body, err := io.ReadAll(req.Body)
			if err != nil {
				return
			}
			b.mu.Lock()
			b.seen = append(b.seen, seenRequest{conn: id, n: n, method: req.Method, path: req.URL.Path, header: req.Header, body: string(body)})
			b.mu.Unlock()
			raw, closeAfter := answer(req, n)
			for part := range strings.SplitSeq(raw, flushMark) {
				if _, err := io.WriteString(c, part); err != nil {
					return
				}
			}
			b.written.Add(1)
			if closeAfter {
				return
			}
		}
	})
	return b
}

// waitWritten waits until the backend has written n answers whole (on
// loopback, in the proxy's socket by then).
func (b *scripted) waitWritten(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); b.written.Load() < int32(n); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the backend wrote %d answers, want %d", b.written.Load(), n)
		}
	}
}

// requests returns what the backend received so far.
func (b *scripted) requests() []seenRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]seenRequest(nil), b.seen...)
}

// count returns how many requests of method to path the backend received.
func (b *scripted) count(method, path string) int {
	n := 0
	for _, r := range b.requests() {
		if r.method == method && r.path == path {
			n++
		}
	}
	return n
}

// rawClient is an app connection written byte for byte; answers are read
// with net/http's parser.
type rawClient struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func (e *env) rawClient(t *testing.T, dst netip.AddrPort) *rawClient {
	t.Helper()
	c, err := e.dial(dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second)) // a hang guard
	return &rawClient{t: t, c: c, r: bufio.NewReader(c)}
}

func (c *rawClient) send(raw string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, raw); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// read reads one answer to a request of method, and its body.
func (c *rawClient) read(method string) (*http.Response, string) {
	c.t.Helper()
	resp, err := c.tryRead(method)
	if err != nil {
		c.t.Fatalf("read answer to %s: %v", method, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("read answer body to %s: %v", method, err)
	}
	return resp, string(b)
}

func (c *rawClient) tryRead(method string) (*http.Response, error) {
	return http.ReadResponse(c.r, &http.Request{Method: method})
}

// closed reports whether the proxy ended the connection.
func (c *rawClient) closed() bool {
	c.t.Helper()
	_, err := c.r.ReadByte()
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// interopEnv is a proxy on one interopPath with one Service per case.
type interopEnv struct {
	*env
	path interopPath
	svcs []service
}

func newInteropEnv(t *testing.T, p interopPath) *interopEnv {
	t.Helper()
	o := envOptions{}
	if p.l7 {
		o.http1TLS = proxy.HTTP1TLSL7
	}
	return &interopEnv{env: newEnv(t, o), path: p}
}

// serverTLS is the backends' TLS config on this path (nil: cleartext).
func (ie *interopEnv) serverTLS() *tls.Config {
	if !ie.path.tls {
		return nil
	}
	return serverTLS(ie.pki.server)
}

// add captures a Service whose endpoint is addr and returns its address.
func (ie *interopEnv) add(addr netip.AddrPort, proto snapshot.Protocol) netip.AddrPort {
	v := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 40, byte(len(ie.svcs) + 1)}), 80)
	be := snapshot.Backend{Protocol: proto, Endpoints: endpoints(addr)}
	if ie.path.tls {
		be.TLS = tlsPolicy(ie.env)
	}
	if ie.path.sticky {
		be.SessionPersistence = &snapshot.SessionPersistence{Type: snapshot.SessionCookie, Name: "sm-session"}
	}
	ie.svcs = append(ie.svcs, service{name: fmt.Sprintf("interop-%d", len(ie.svcs)+1), vip: v, backend: be})
	return v
}

func (ie *interopEnv) publish(t *testing.T) {
	t.Helper()
	ie.p.Update(buildSnapshot(t, 1, ie.svcs...))
}

// okAnswer is a plain keep-alive answer.
func okAnswer(body string) string {
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// interopCase is one probe: start a backend, capture it, talk to it.
type interopCase struct {
	name string
	// setup starts the backend, adds its Service and returns the test,
	// run after the snapshot is published.
	setup func(t *testing.T, ie *interopEnv) func(t *testing.T)
}

// TestInteropH1: legacy and unusual HTTP/1.x backends (close-delimited
// HTTP/1.0 answers, Connection: close, idle connections closed by the
// backend, bytes a backend sends where no body belongs, 1xx answers) on
// every path HTTP/1.x apps take; each keeps the app's connection in step
// and never sends a non-idempotent request twice.
func TestInteropH1(t *testing.T) {
	checkNoLeaks(t)
	cases := []interopCase{
		{"http10-body-until-close", func(t *testing.T, ie *interopEnv) func(t *testing.T) {
			b := startScripted(t, ie.serverTLS(), func(*http.Request, int) (string, bool) {
				return "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nbody until close", true
			})
			dst := ie.add(b.addr, "")
			return func(t *testing.T) {
				c := ie.rawClient(t, dst)
				for i := range 2 {
					c.send("GET /a HTTP/1.1\r\nHost: legacy\r\n\r\n")
					resp, body := c.read(http.MethodGet)
					if resp.StatusCode != 200 || body != "body until close" || resp.Close {
						t.Fatalf("HTTP/1.1 app, request %d: %s %q close=%v; want 200, the whole body, keep-alive", i, resp.Status, body, resp.Close)
					}
				}
				c10 := ie.rawClient(t, dst)
				c10.send("GET /a HTTP/1.0\r\nHost: legacy\r\nConnection: keep-alive\r\n\r\n")
				if resp, body := c10.read(http.MethodGet); resp.StatusCode != 200 || body != "body until close" || !resp.Close {
					t.Errorf("HTTP/1.0 app: %s %q close=%v; want 200, the body, then close", resp.Status, body, resp.Close)
				}
				if got := b.conns.Load(); got != 3 {
					t.Errorf("backend connections = %d, want 3 (a close-delimited answer's connection is never reused)", got)
				}
			}
		}},
		{"backend-crashes-mid-answer", func(t *testing.T, ie *interopEnv) func(t *testing.T) {
			b := startScripted(t, ie.serverTLS(), func(*http.Request, int) (string, bool) {
				return "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\npart of a body until close", true
			})
			b.crash.Store(true)
			dst := ie.add(b.addr, "")
			return func(t *testing.T) {
				// Whether the proxy read the answer's head before the
				// reset (then the app's connection is reset mid-body) or
				// not (then a 502), the app never gets a 200 whose body
				// ends cleanly — for an HTTP/1.0 app, whose body is
				// delimited by the close, that would be a complete answer.
				for _, proto := range []string{"HTTP/1.0", "HTTP/1.1"} {
					c := ie.rawClient(t, dst)
					c.send("GET /a " + proto + "\r\nHost: legacy\r\n\r\n")
					resp, err := c.tryRead(http.MethodGet)
					if err != nil {
						continue // reset before the head: as good
					}
					body, err := io.ReadAll(resp.Body)
					if resp.StatusCode == http.StatusOK && err == nil {
						t.Errorf("%s app: 200 with body %q ending cleanly; want the connection reset", proto, body)
					}
				}
			}
		}},
		{"backend-connection-close", func(t *testing.T, ie *interopEnv) func(t *testing.T) {
			b := startScripted(t, ie.serverTLS(), func(*http.Request, int) (string, bool) {
				return "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", true
			})
			dst := ie.add(b.addr, "")
			return func(t *testing.T) {
				c := ie.rawClient(t, dst)
				for i := range 3 {
					c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
					if resp, body := c.read(http.MethodGet); resp.StatusCode != 200 || body != "ok" || resp.Close {
						t.Fatalf("request %d: %s %q close=%v; want 200 ok on a kept app connection", i, resp.Status, body, resp.Close)
					}
				}
				if got := b.conns.Load(); got != 3 {
					t.Errorf("backend connections = %d, want 3", got)
				}
			}
		}},
		{"backend-idle-timeout", func(t *testing.T, ie *interopEnv) func(t *testing.T) {
			// A real server whose keep-alive ends after a short idle time
			// (Node.js's is 5 s): the proxy's pooled connection is gone
			// when the app's next request comes.
			var posts atomic.Int32
			closed := make(chan struct{}, 10)
			srv := &http.Server{
				IdleTimeout: 50 * time.Millisecond,
				TLSConfig:   ie.serverTLS(),
				Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					body, _ := io.ReadAll(r.Body)
					if r.Method == http.MethodPost {
						posts.Add(1)
					}
					fmt.Fprintf(w, "%s %s", r.Method, body)
				}),
				ConnState: func(_ net.Conn, s http.ConnState) {
					if s == http.StateClosed {
						closed <- struct{}{}
					}
				},
			}
			l := listenLocal(t)
			if ie.path.tls {
				go srv.ServeTLS(l, "", "")
			} else {
				go srv.Serve(l)
			}
			t.Cleanup(func() { srv.Close() })
			dst := ie.add(l.Addr().(*net.TCPAddr).AddrPort(), "")
			return func(t *testing.T) {
				c := ie.rawClient(t, dst)
				for i, req := range []struct{ raw, method, want string }{
					{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", http.MethodGet, "GET "},
					{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", http.MethodGet, "GET "},
					{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\ndata", http.MethodPost, "POST data"},
				} {
					if i > 0 {
						select { // the backend closed the pooled connection
						case <-closed:
						case <-time.After(10 * time.Second):
							t.Fatal("backend kept its idle connection")
						}
					}
					c.send(req.raw)
					if resp, body := c.read(req.method); resp.StatusCode != 200 || body != req.want {
						t.Fatalf("request %d after the backend closed its idle connection: %s %q, want 200 %q", i, resp.Status, body, req.want)
					}
				}
				if got := posts.Load(); got != 1 {
					t.Errorf("backend received the POST %d times, want once", got)
				}
			}
		}},
		{"reused-connection-dropped", func(t *testing.T, ie *interopEnv) func(t *testing.T) {
			// The backend reads the second request on each connection and
			// closes without answering: a GET may go again on a new
			// connection, a POST must not.
			b := startScripted(t, ie.serverTLS(), func(req *http.Request, n int) (string, bool) {
				if n == 1 {
					return "", true
				}
				return okAnswer(req.Method), false
			})
			dst := ie.add(b.addr, "")
			return func(t *testing.T) {
				c := ie.rawClient(t, dst)
				c.send("GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
				if resp, body := c.read(http.MethodGet); resp.StatusCode != 200 || body != "GET" {
					t.Fatalf("first GET: %s %q", resp.Status, body)
				}
				c.send("GET /replayed HTTP/1.1\r\nHost: x\r\n\r\n")
				if resp, body := c.read(http.MethodGet); resp.StatusCode != 200 || body != "GET" {
					t.Fatalf("GET dropped on a reused connection: %s %q, want 200 (replayed)", resp.Status, body)
				}
				c.send("POST /once HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx")
				if resp, _ := c.read(http.MethodPost); resp.StatusCode != http.StatusBadGateway {
					t.Errorf("POST dropped on a reused connection: %s, want 502", resp.Status)
				}
				if got := b.count(http.MethodPost, "/once"); got != 1 {
					t.Errorf("backend received the POST %d times, want once", got)
				}
				c2 := ie.rawClient(t, dst)
				c2.send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
				if resp, _ := c2.read(http.MethodGet); resp.StatusCode != 200 {
					t.Errorf("GET after the dropped POST: %s", resp.Status)
				}
			}
		}},
		{"bytes-where-no-body-belongs", func(t *testing.T, ie *interopEnv) func(t *testing.T) {
			// Legacy servers that send a body with HEAD, 204 or 304: the
			// stray bytes must not become the next request's answer.
			b := startScripted(t, ie.serverTLS(), func(req *http.Request, _ int) (string, bool) {
				switch {
				case req.Method == http.MethodHead:
					return "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false
				case req.URL.Path == "/204":
					return "HTTP/1.1 204 No Content\r\n\r\nstray", false
				case req.URL.Path == "/304":
					return "HTTP/1.1 304 Not Modified\r\nEtag: \"v1\"\r\nContent-Length: 5\r\n\r\nstray", false
				}
				return okAnswer("fine"), false
			})
			dst := ie.add(b.addr, "")
			return func(t *testing.T) {
				for _, r := range []struct {
					method, path string
					code         int
				}{{http.MethodHead, "/", 200}, {http.MethodGet, "/204", 204}, {http.MethodGet, "/304", 304}} {
					c := ie.rawClient(t, dst)
					c.send(r.method + " " + r.path + " HTTP/1.1\r\nHost: x\r\n\r\n")
					resp, body := c.read(r.method)
					if resp.StatusCode != r.code || body != "" {
						t.Errorf("%s %s: %s %q, want %d without a body", r.method, r.path, resp.Status, body, r.code)
					}
					if r.method == http.MethodHead && resp.ContentLength != 5 {
						t.Errorf("HEAD: Content-Length %d, want the backend's 5", resp.ContentLength)
					}
					c.send("GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
					if resp, err := c.tryRead(http.MethodGet); err != nil {
						t.Errorf("GET after %s %s, same app connection: %v", r.method, r.path, err)
					} else if body, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(body) != "fine" {
						t.Errorf("GET after %s %s, same app connection: %s %q, want 200 fine", r.method, r.path, resp.Status, body)
					}
					// Another app's request, which the pooled connection
					// serves next.
					c2 := ie.rawClient(t, dst)
					c2.send("GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
					if resp, body := c2.read(http.MethodGet); resp.StatusCode != 200 || body != "fine" {
						t.Errorf("another app's GET after %s %s: %s %q, want 200 fine", r.method, r.path, resp.Status, body)
					}
				}
			}
		}},
		{"stray-answer-in-its-own-write", func(t *testing.T, ie *interopEnv) func(t *testing.T) {
			// An answer nobody asked for, right after the one asked for
			// but in a write (a TLS record) of its own, as from a backend
			// that took one request for two: arrived before the next
			// request on the pooled connection, another app's, it must not
			// become that request's answer. (One that arrives after the
			// request was sent cannot be told from its answer, by any
			// HTTP/1.1 client.)
			b := startScripted(t, ie.serverTLS(), func(req *http.Request, _ int) (string, bool) {
				if req.URL.Path == "/first" {
					return okAnswer("first") + flushMark + okAnswer("stray"), false
				}
				return okAnswer(req.URL.Path), false
			})
			dst := ie.add(b.addr, "")
			return func(t *testing.T) {
				for i := range 5 {
					c := ie.rawClient(t, dst)
					c.send("GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
					if resp, body := c.read(http.MethodGet); resp.StatusCode != 200 || body != "first" {
						t.Fatalf("round %d, first app: %s %q", i, resp.Status, body)
					}
					b.waitWritten(t, 2*i+1) // the stray answer too
					c2 := ie.rawClient(t, dst)
					c2.send("GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
					if resp, body := c2.read(http.MethodGet); resp.StatusCode != 200 || body != "/other" {
						t.Errorf("round %d, the next app: %s %q, want 200 /other", i, resp.Status, body)
					}
				}
				if !ie.path.tls {
					return // an h2c app's HTTP/2 is relayed to a cleartext backend
				}
				// HTTP/2 apps, whose requests are translated for the
				// HTTP/1.1 backend, share its pool.
				for i := range 5 {
					for n, want := range []string{"first", "/other"} {
						resp, err := ie.client(dst, true).Get("http://x/" + strings.TrimPrefix(want, "/"))
						if err != nil {
							t.Fatalf("round %d, h2 app %d: %v", i, n, err)
						}
						body, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 || string(body) != want {
							t.Errorf("round %d, h2 app %d: %s %q, want 200 %q", i, n, resp.Status, body, want)
						}
						if n == 0 {
							b.waitWritten(t, 10+2*i+1)
						}
					}
				}
			}
		}},
		{"head-without-bound", func(t *testing.T, ie *interopEnv) func(t *testing.T) {
			// A backend whose answer's head has no end in sight — header
			// fields, or 1xx answers, by the megabyte — gets the app a
			// 502 once the proxy read 1 MiB of it, instead of having the
			// proxy, shared by the node's pods, buffer it all.
			huge := "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Filler: "+strings.Repeat("f", 1000)+"\r\n", 2<<10) + "Content-Length: 2\r\n\r\nok"
			processing := strings.Repeat("HTTP/1.1 102 Processing\r\n\r\n", (2<<20)/26) + okAnswer("ok")
			b := startScripted(t, ie.serverTLS(), func(req *http.Request, _ int) (string, bool) {
				if req.URL.Path == "/processing" {
					return processing, true
				}
				return huge, true
			})
			dst := ie.add(b.addr, "")
			return func(t *testing.T) {
				for _, path := range []string{"/fields", "/processing"} {
					c := ie.rawClient(t, dst)
					c.send("GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n")
					resp, _ := c.read(http.MethodGet)
					for resp.StatusCode == http.StatusProcessing {
						resp, _ = c.read(http.MethodGet)
					}
					if resp.StatusCode != http.StatusBadGateway {
						t.Errorf("GET %s: %s, want 502", path, resp.Status)
					}
					if !ie.path.tls {
						continue // an h2c app's HTTP/2 is relayed to a cleartext backend
					}
					resp2, err := ie.client(dst, true).Get("http://x" + path)
					if err != nil {
						t.Fatalf("h2 app, GET %s: %v", path, err)
					}
					resp2.Body.Close()
					if resp2.StatusCode != http.StatusBadGateway {
						t.Errorf("h2 app, GET %s: %s, want 502", path, resp2.Status)
					}
				}
			}
		}},
		{"informational", func(t *testing.T, ie *interopEnv) func(t *testing.T) {
			b := startScripted(t, ie.serverTLS(), func(*http.Request, int) (string, bool) {
				return "HTTP/1.1 100 Continue\r\n\r\n" +
					"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" +
					"HTTP/1.1 102 Processing\r\n\r\n" + okAnswer("done"), false
			})
			dst := ie.add(b.addr, "")
			return func(t *testing.T) {
				c := ie.rawClient(t, dst)
				for i := range 2 {
					c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
					var codes []int
					for {
						resp, body := c.read(http.MethodGet)
						codes = append(codes, resp.StatusCode)
						if resp.StatusCode == 103 && resp.Header.Get("Link") == "" {
							t.Errorf("103 without its Link field")
						}
						if resp.StatusCode >= 200 {
							if resp.StatusCode != 200 || body != "done" {
								t.Fatalf("request %d: final answer %s %q", i, resp.Status, body)
							}
							break
						}
						if resp.StatusCode == 100 {
							t.Errorf("request %d: a 100 Continue the app did not ask for", i)
						}
					}
					if fmt.Sprint(codes) != "[103 102 200]" {
						t.Errorf("request %d: answers %v, want [103 102 200]", i, codes)
					}
				}
				c10 := ie.rawClient(t, dst)
				c10.send("GET / HTTP/1.0\r\nHost: x\r\n\r\n")
				if resp, body := c10.read(http.MethodGet); resp.StatusCode != 200 || body != "done" {
					t.Errorf("HTTP/1.0 app: first answer %s %q, want 200 done (no 1xx to HTTP/1.0)", resp.Status, body)
				}
				if !ie.path.tls {
					return // an h2c app's HTTP/2 is relayed to a cleartext backend
				}
				var codes []string
				trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
					codes = append(codes, fmt.Sprint(code, h["Link"]))
					return nil
				}}
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodGet, "http://x/", nil)
				resp, err := ie.client(dst, true).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(body) != "done" || fmt.Sprint(codes) != "[103 [</style.css>; rel=preload] 102 []]" {
					t.Errorf("h2 app: %s %q after 1xx %v, want 200 done after 103 (with its Link) and 102", resp.Status, body, codes)
				}
			}
		}},
	}
	for _, p := range interopPaths {
		t.Run(p.name, func(t *testing.T) {
			ie := newInteropEnv(t, p)
			runs := make([]func(*testing.T), len(cases))
			for i, c := range cases {
				runs[i] = c.setup(t, ie)
			}
			ie.publish(t)
			for i, c := range cases {
				t.Run(c.name, runs[i])
			}
		})
	}
}

// curlH2CUpgrade is what `curl --http2 http://…` sends.
const curlH2CUpgrade = "GET /h2c HTTP/1.1\r\nHost: up.b.svc\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n" +
	"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"

// TestInteropH2CUpgrade: an app asking for an h2c upgrade gets a
// well-formed answer on every path: HTTP/1.1 where the proxy forwards
// requests (it never passes the upgrade on: its wire to the backend is its
// own), the backend's own 101 and HTTP/2 where bytes are relayed.
func TestInteropH2CUpgrade(t *testing.T) {
	checkNoLeaks(t)
	paths := append(append([]interopPath(nil), interopPaths...), interopPath{name: "clear-relayed"})
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			ie := newInteropEnv(t, p)
			// A backend that accepts the upgrade when it sees one, as
			// nghttpx or x/net's h2c handler do: 101, then its SETTINGS.
			up := startScripted(t, ie.serverTLS(), func(req *http.Request, _ int) (string, bool) {
				if strings.EqualFold(req.Header.Get("Upgrade"), "h2c") {
					return "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n" +
						"\x00\x00\x00\x04\x00\x00\x00\x00\x00", true
				}
				return okAnswer("http/1.1"), false
			})
			vUp := ie.add(up.addr, "")
			// The echo server (net/http: ignores h2c upgrades).
			vEcho := ie.add(startEcho(t, "echo-0", ie.serverTLS()).addr, "")
			vH2C := netip.AddrPort{}
			if !p.tls {
				vH2C = ie.add(startEcho(t, "h2c-0", nil).addr, snapshot.ProtocolH2C)
			}
			ie.publish(t)
			t.Run("upgrading-backend", func(t *testing.T) {
				c := ie.rawClient(t, vUp)
				c.send(curlH2CUpgrade)
				resp, err := c.tryRead(http.MethodGet)
				if err != nil {
					t.Fatalf("answer: %v", err)
				}
				if p.name == "clear-relayed" {
					// Relayed bytes: the backend's own answer.
					var frame [9]byte
					if resp.StatusCode != 101 {
						t.Fatalf("relayed upgrade: %s, want 101", resp.Status)
					}
					if _, err := io.ReadFull(c.r, frame[:]); err != nil || frame[3] != 0x4 {
						t.Fatalf("after 101: frame header %x, %v; want SETTINGS", frame, err)
					}
					return
				}
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 200 || string(body) != "http/1.1" {
					t.Fatalf("answer %s %q, want 200 over HTTP/1.1", resp.Status, body)
				}
				for _, r := range up.requests() {
					if r.header.Get("Upgrade") != "" || r.header.Get("Http2-Settings") != "" {
						t.Errorf("backend saw the app's upgrade: %v", r.header)
					}
				}
			})
			check := func(t *testing.T, dst netip.AddrPort, wantProto string) {
				c := ie.rawClient(t, dst)
				for i := range 2 {
					c.send(curlH2CUpgrade)
					resp, body := c.read(http.MethodGet)
					if resp.StatusCode != 200 || resp.ProtoMajor != 1 || !strings.Contains(body, `"proto":"`+wantProto+`"`) {
						t.Fatalf("request %d: %s %s %q; want HTTP/1.x 200 from a backend speaking %s", i, resp.Proto, resp.Status, body, wantProto)
					}
				}
			}
			t.Run("echo", func(t *testing.T) { check(t, vEcho, "HTTP/1.1") })
			if vH2C.IsValid() {
				t.Run("h2c-backend", func(t *testing.T) { check(t, vH2C, "HTTP/2.0") })
			}
		})
	}
}

// TestInteropH1BadRequests: requests the proxy must not forward as they
// are — head blocks past the limit, malformed lines, and framing a
// request smuggler would use (RFC 9112 §6.1, §6.3) — get a 4xx and the end
// of the connection, never reach the backend, and leave the proxy serving.
func TestInteropH1BadRequests(t *testing.T) {
	checkNoLeaks(t)
	for _, p := range interopPaths {
		t.Run(p.name, func(t *testing.T) {
			ie := newInteropEnv(t, p)
			b := startScripted(t, ie.serverTLS(), func(req *http.Request, _ int) (string, bool) {
				return okAnswer(req.Method + " " + req.URL.Path), false
			})
			dst := ie.add(b.addr, "")
			ie.publish(t)
			big := func(n int) string { return "X-Big: " + strings.Repeat("a", n) + "\r\n" }
			for _, c := range []struct {
				name, req string
				// code is the answer; 200 means forwarded as the path
				// /ok, whole.
				code int
			}{
				{"100KiB-header", "GET /ok HTTP/1.1\r\nHost: x\r\n" + big(100<<10) + "\r\n", 200},
				{"2MiB-header", "GET /bad HTTP/1.1\r\nHost: x\r\n" + big(2<<20) + "\r\n", 431},
				{"request-line-extra-field", "GET /bad HTTP/1.1 x\r\nHost: x\r\n\r\n", 400},
				{"control-byte-in-target", "GET /bad\x01 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
				{"space-before-colon", "GET /bad HTTP/1.1\r\nHost: x\r\nContent-Length : 3\r\n\r\nabc", 400},
				{"nul-in-field-value", "GET /bad HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400},
				{"control-byte-in-field-value", "GET /bad HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n", 400},
				{"http11-without-host", "GET /bad HTTP/1.1\r\nX-A: a\r\n\r\n", 400},
				{"two-hosts", "GET /bad HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400},
				{"differing-content-lengths", "POST /bad HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 10\r\n\r\nabcGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", 400},
				{"content-length-list", "POST /bad HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 10\r\n\r\nabc", 400},
				{"content-length-and-chunked", "POST /bad HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", 400},
				{"chunked-in-http10", "POST /bad HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", 400},
				{"unknown-transfer-coding", "POST /bad HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 400},
			} {
				if p.l7 && (c.name == "content-length-and-chunked" || c.name == "chunked-in-http10") {
					// net/http's server settles these as its parser does
					// (chunked wins; HTTP/1.0's Transfer-Encoding is
					// dropped) and keeps the connection: /smuggled is
					// served. The fast path refuses them (checkFraming);
					// HTTP/1.x apps take net/http's server only when
					// proxy.Config.HTTP1TLS asks for it.
					continue
				}
				t.Run(c.name, func(t *testing.T) {
					cl := ie.rawClient(t, dst)
					// Paths name the case, so what reached the backend says
					// which case let it through.
					req := strings.NewReplacer("/bad", "/bad-"+c.name, "/smuggled", "/smuggled-"+c.name).Replace(c.req)
					go io.WriteString(cl.c, req) // a large head may outlast the answer
					resp, err := cl.tryRead(http.MethodGet)
					if err != nil {
						t.Fatalf("read answer: %v", err)
					}
					// A refusal's body may be lost to the reset of a
					// connection closed with the request unread.
					body, _ := io.ReadAll(resp.Body)
					// net/http's server answers an unknown transfer coding
					// with 501.
					refused := resp.StatusCode/100 == 4 || resp.StatusCode == http.StatusNotImplemented
					switch {
					case c.code == 200 && (resp.StatusCode != 200 || string(body) != "GET /ok"):
						t.Errorf("%s %q, want it forwarded", resp.Status, body)
					case c.code != 200 && (!refused || !resp.Close):
						t.Errorf("%s close=%v; want a refusal (%d) and close", resp.Status, resp.Close, c.code)
					case c.code != 200 && resp.StatusCode != c.code:
						t.Logf("%s (%d would be the usual answer)", resp.Status, c.code)
					}
					// The proxy serves the next app.
					ok := ie.rawClient(t, dst)
					ok.send("GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
					if resp, body := ok.read(http.MethodGet); resp.StatusCode != 200 || body != "GET /ok" {
						t.Errorf("next app: %s %q", resp.Status, body)
					}
				})
			}
			for _, r := range b.requests() {
				if r.path != "/ok" {
					t.Errorf("backend received %s %s (%v, body %q), want nothing but /ok", r.method, r.path, r.header, r.body)
				}
			}
		})
	}
}

// TestInteropH1Clients: HTTP/1.0 apps, Connection: close and pipelined
// requests to a pooled TLS backend that answers in different framings.
func TestInteropH1Clients(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	b := startScripted(t, serverTLS(e.pki.server), func(req *http.Request, _ int) (string, bool) {
		if req.URL.Path == "/chunked" {
			return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nchun\r\n3\r\nked\r\n0\r\n\r\n", false
		}
		return okAnswer(req.Method + " " + req.URL.Path + " " + req.Host), false
	})
	dst := netip.MustParseAddrPort("10.96.41.1:80")
	e.p.Update(buildSnapshot(t, 1, service{name: "clients", vip: dst, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(b.addr)}}))
	t.Run("http10-without-host", func(t *testing.T) {
		c := e.rawClient(t, dst)
		c.send("GET /chunked HTTP/1.0\r\n\r\n")
		resp, body := c.read(http.MethodGet)
		if resp.StatusCode != 200 || body != "chunked" || !resp.Close || len(resp.TransferEncoding) != 0 {
			t.Errorf("%s %q close=%v te=%v; want the body close-delimited (no chunks to HTTP/1.0)", resp.Status, body, resp.Close, resp.TransferEncoding)
		}
		if !c.closed() {
			t.Error("HTTP/1.0 connection left open")
		}
	})
	t.Run("pipelined-close", func(t *testing.T) {
		c := e.rawClient(t, dst)
		c.send("GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /chunked HTTP/1.1\r\nHost: a\r\n\r\nHEAD /3 HTTP/1.1\r\nHost: a\r\n\r\n" +
			"GET /4 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET /5 HTTP/1.1\r\nHost: a\r\n\r\n")
		for _, want := range []struct{ method, body string }{
			{http.MethodGet, "GET /1 a"}, {http.MethodGet, "chunked"}, {http.MethodHead, ""}, {http.MethodGet, "GET /4 a"},
		} {
			resp, body := c.read(want.method)
			if resp.StatusCode != 200 || body != want.body {
				t.Fatalf("pipelined answer: %s %q, want 200 %q", resp.Status, body, want.body)
			}
		}
		if !c.closed() {
			t.Error("connection open after Connection: close")
		}
		if n := b.count(http.MethodGet, "/5"); n != 0 {
			t.Errorf("request after Connection: close forwarded %d times", n)
		}
	})
}
