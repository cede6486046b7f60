package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// Apps that stop in the middle of an exchange (an upload that stops, an
// answer not read) and the endpoint's capped HTTP/1.1 connections, shared
// by every pod on the node. In a synctest bubble over pipes: durations are
// the bubble's, exact.

const stallTimeout = 10 * time.Second

// stallBackend serves over HTTP/1.1: /big a 16 MiB answer (past an HTTP/2
// client's flow-control windows), or ?size=N bytes of it; /sse an event
// stream quiet for ?quiet=D, then one event, quiet again, then its end;
// /kept/fails-first answers its first request 500 at once, its body
// unread; /ws accepts a WebSocket upgrade, then reads until the proxy
// closes; anything else (later requests to /kept/fails-first too) reads
// the body and answers "ok" and how much it read.
func stallBackend(t *testing.T, pn *pipenet.Net, addr netip.AddrPort) {
	big := bytes.Repeat([]byte("x"), 16<<20)
	var failed atomic.Bool
	servePipe(t, pn, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			if n, err := strconv.Atoi(r.URL.Query().Get("size")); err == nil {
				w.Header().Set("Content-Length", strconv.Itoa(n))
				w.Write(big[:n])
				return
			}
			w.Write(big)
		case "/sse":
			quiet, _ := time.ParseDuration(r.URL.Query().Get("quiet"))
			w.Header().Set("Content-Type", "text/event-stream")
			w.(http.Flusher).Flush()
			if sleepCtx(r.Context(), quiet) {
				io.WriteString(w, "data: 1\n\n")
				w.(http.Flusher).Flush()
				sleepCtx(r.Context(), quiet)
			}
		case "/ws":
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
			brw.Flush()
			io.Copy(io.Discard, brw)
		case "/answers-late":
			// Without reading the body, nor sending a 100 Continue for
			// it: net/http's server closes the connection after.
			after, _ := time.ParseDuration(r.URL.Query().Get("after"))
			sleepCtx(r.Context(), after)
			io.WriteString(w, "unread")
		case "/kept/fails-first":
			if !failed.Swap(true) {
				// Closing: net/http's server would otherwise read the body
				// (up to 256 KiB) before it answers.
				w.Header().Set("Connection", "close")
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			fallthrough
		default:
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "ok %d", n)
		}
	}))
}

// stallProxy is a proxy in front of stallBackend (HTTP/1.1, so that every
// request takes one of its pooled connections, an h2c app's too), at most conns of them,
// with the stall timeout and connWait, the wait for a busy connection.
// Bodies to /kept are kept for a retry, those to /auth read for an
// ExternalAuth server (another stallBackend): the proxy reads both itself.
// Requests to /h2c go to the backend over h2c. Those to /failover, retried
// as /kept's, go to a backend of their own, whose first pick refuses
// connections (refused counts them): the proxy then tries the other.
func stallProxy(t *testing.T, k clientKind, conns int, connWait time.Duration) (p *proxy.Proxy, reg failures, refused func() float64) {
	var pn pipenet.Net
	addr, authAddr := netip.MustParseAddrPort("10.0.0.1:8080"), netip.MustParseAddrPort("10.0.0.2:8080")
	deadAddr := netip.MustParseAddrPort("10.0.0.3:8080") // nothing listens
	stallBackend(t, &pn, addr)
	stallBackend(t, &pn, authAddr)
	cfg := proxy.Config{HTTP1TLS: k.path, StallTimeout: stallTimeout}
	cfg.Upstream.MaxConnsPerEndpoint, cfg.Upstream.ConnWait = conns, connWait
	p, metrics := pipeProxy(t, &pn, cfg)
	// A route: without, a cleartext backend's bytes are relayed, over a
	// connection of each app's own. Its matches in the order translate
	// sorts them.
	m := &mesh{t: t}
	be := m.backend("web", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(addr)})
	h2c := m.backend("web-h2c", snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(addr)})
	auth := m.backend("auth", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(authAddr)})
	// Pick's turns start at the second endpoint.
	failover := m.backend("web-failover", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(addr, deadAddr)})
	retry := &snapshot.Retry{Attempts: 1, Codes: []int{500}}
	m.frontend("web", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/kept")}, snapshot.RouteRule{Backends: to(be), Retry: retry}},
		rule{[]snapshot.RouteMatch{prefixMatch("/failover")}, snapshot.RouteRule{Backends: to(failover), Retry: retry}},
		rule{[]snapshot.RouteMatch{prefixMatch("/auth")}, snapshot.RouteRule{Backends: to(be),
			Filters: snapshot.Filters{ExternalAuth: &snapshot.ExternalAuth{Backend: auth, MaxBody: 2000}}}},
		rule{[]snapshot.RouteMatch{prefixMatch("/h2c")}, snapshot.RouteRule{Backends: to(h2c)}},
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be)}})))
	p.Update(m.snapshot(1))
	return p, func(r upstream.Reason) float64 {
			return counterValue(t, metrics, "sockmesh_proxy_request_failures_total", "reason", string(r))
		}, func() float64 {
			return counterValue(t, metrics, "sockmesh_proxy_upstream_dials_total", "result", "refused")
		}
}

// failures reads sockmesh_proxy_request_failures_total of a reason.
type failures func(upstream.Reason) float64

// The hostile apps. Those on HTTP/1.1 write their bytes themselves:
// net/http's Transport sends a request's head with its body's first
// bytes only once the body ended.

// stuckUpload starts a POST to path whose 1000-byte body stops after its
// first byte; end reports how its exchange ended (nil: it was answered).
func stuckUpload(t *testing.T, p *proxy.Proxy, k clientKind, path string) (end func() error) {
	send, end := upload(t, p, k, path, 1000)
	send("x")
	return end
}

// upload starts a POST to path with a body of size bytes (-1: unknown,
// chunked on HTTP/1.1) whose parts the app sends, in order, as send is
// called; end reports how its exchange ended (nil: it was answered).
func upload(t *testing.T, p *proxy.Proxy, k clientKind, path string, size int) (send func(part string), end func() error) {
	parts := make(chan string, 4)
	var app io.Writer
	if !k.h2c {
		c := rawApp(t, p)
		app, end = c, func() error { return unanswered(c, 1) }
		framing := "Transfer-Encoding: chunked"
		if size >= 0 {
			framing = "Content-Length: " + strconv.Itoa(size)
		}
		parts <- "POST " + path + " HTTP/1.1\r\nHost: web.b.svc\r\n" + framing + "\r\n\r\n"
	} else {
		pr, pw := io.Pipe()
		t.Cleanup(func() { pw.Close() })
		req, _ := http.NewRequest(http.MethodPost, "http://web.b.svc"+path, pr)
		req.ContentLength = int64(size)
		done := make(chan error, 1)
		go func() {
			resp, err := pipeClient(t, p, true).Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		app, end = pw, func() error { return <-done }
	}
	go func() {
		for part := range parts {
			if _, err := io.WriteString(app, part); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { close(parts) }) // before the app's end is closed
	return func(part string) {
		if size < 0 && !k.h2c {
			part = fmt.Sprintf("%x\r\n%s\r\n", len(part), part)
		}
		parts <- part
	}, end
}

// nonReader asks for /big and reads none of it; end reports how its
// exchange ended (nil: it was answered whole).
func nonReader(t *testing.T, p *proxy.Proxy, k clientKind) (end func() error) {
	if !k.h2c {
		c := rawApp(t, p)
		go io.WriteString(c, "GET /big HTTP/1.1\r\nHost: web.b.svc\r\n\r\n")
		return func() error { return unanswered(c, 16<<20) }
	}
	resp, err := pipeClient(t, p, true).Get("http://web.b.svc/big")
	if err != nil {
		t.Fatalf("GET /big: %v", err)
	}
	return func() error {
		_, err := io.Copy(io.Discard, resp.Body)
		return err
	}
}

// rawApp is an HTTP/1.x app's connection to the proxy, closed when the
// test ends. The proxy's end takes writes as a socket does (socketEnd).
func rawApp(t *testing.T, p *proxy.Proxy) net.Conn {
	c, s := net.Pipe()
	go p.ServeConn(&socketEnd{Conn: s}, routedVIP, proxy.Client{Addr: netip.AddrPortFrom(producerClient, 40001)})
	t.Cleanup(func() { c.Close() })
	return c
}

// socketEnd is the proxy's end of an app's pipe taking a write as a
// socket would, a piece at a time as the app reads, and counting what it
// took meanwhile as sockio.Conn's Progress does: a net.Pipe's write
// returns only once read whole, and shows nothing before.
type socketEnd struct {
	net.Conn
	taken atomic.Uint64
}

const socketPiece = 1 << 10

func (c *socketEnd) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := c.Conn.Write(p[n:min(len(p), n+socketPiece)])
		n += m
		c.taken.Add(uint64(m))
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (c *socketEnd) Progress() uint64 { return c.taken.Load() }

// unanswered reads c to its end: an error when it ended before an answer
// whose body has size bytes (on a pipe, a reset reads as a close).
func unanswered(c net.Conn, size int) error {
	b, _ := io.ReadAll(c)
	if head := bytes.Index(b, []byte("\r\n\r\n")); head >= 0 && len(b)-head-4 == size {
		return nil
	}
	return fmt.Errorf("connection ended after %d bytes", len(b))
}

// TestStalledAppFreesConnection: an app that stops sending its body, or
// stops reading a large answer, holds one of the endpoint's pooled
// connections only until the stall timeout: then its exchange is reset,
// counted, and the connection goes to the next request — another pod's,
// waiting meanwhile for the endpoint's only connections. Two stuck
// requests: for the h2c client, two streams of one connection, each of
// which held an HTTP/1.1 connection.
func TestStalledAppFreesConnection(t *testing.T) {
	for _, k := range clientKinds {
		for _, hostile := range []string{"stuck-upload", "non-reader"} {
			t.Run(k.name+"/"+hostile, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { testStalledAppFreesConnection(t, k, hostile) })
			})
		}
	}
}

func testStalledAppFreesConnection(t *testing.T, k clientKind, hostile string) {
	const held = 2
	p, reg, _ := stallProxy(t, k, held, time.Hour)
	var ends []func() error
	for range held {
		if hostile == "stuck-upload" {
			ends = append(ends, stuckUpload(t, p, k, "/"))
		} else {
			ends = append(ends, nonReader(t, p, k))
		}
	}
	synctest.Wait()
	start := time.Now()
	status, body := getText(t, pipeClient(t, p, false), "http://web.b.svc/")
	if status != http.StatusOK || body != "ok 0" {
		t.Errorf("other app's GET = %d %q, want 200 \"ok 0\"", status, body)
	}
	if waited := time.Since(start); waited < stallTimeout {
		t.Errorf("other app's GET waited %v, less than the stall timeout: the connections were not held", waited)
	}
	// The stuck requests' watches tick at the same instant; the GET may be
	// answered on the first one's connection before the other's tick ran,
	// and its app's reads below would then move it.
	synctest.Wait()
	for i, end := range ends {
		if err := end(); err == nil {
			t.Errorf("stuck request %d ended cleanly, want a reset", i)
		}
	}
	synctest.Wait() // the proxy counts a stall after it reset the app
	if got := reg(upstream.ReasonAppStalled); got != held {
		t.Errorf("request_failures_total{app_stalled} = %v, want %d", got, held)
	}
}

// TestSlowAppNotCut: an upload that sends a byte every 6 s (less than the
// stall timeout between two, much more in all), and an event stream
// whose backend is quiet for three stall timeouts at a time while its app
// waits, are not stalls.
func TestSlowAppNotCut(t *testing.T) {
	inBubbles(t, func(t *testing.T, k clientKind) {
		p, reg, _ := stallProxy(t, k, 1, time.Hour)
		if got := slowUpload(t, p, k); got != "ok 10" {
			t.Errorf("slow upload answered %q, want \"ok 10\"", got)
		}
		app := pipeClient(t, p, k.h2c)
		status, body := getText(t, app, fmt.Sprintf("http://web.b.svc/sse?quiet=%v", 3*stallTimeout))
		if status != http.StatusOK || body != "data: 1\n\n" {
			t.Errorf("quiet event stream = %d %q, want 200 and its event", status, body)
		}
		if got := reg(upstream.ReasonAppStalled); got != 0 {
			t.Errorf("request_failures_total{app_stalled} = %v, want 0", got)
		}
	})
}

// TestPoolBusy: while an app holds the endpoint's only connection (its
// upload stuck, well within the stall timeout), another request waits
// for it ConnWait at most, then fails 503 pool_busy — a gRPC call with
// the trailers-only UNAVAILABLE — rather than waiting as long as the
// holder does.
func TestPoolBusy(t *testing.T) {
	inBubbles(t, func(t *testing.T, k clientKind) {
		const wait = 5 * time.Second
		p, reg, _ := stallProxy(t, k, 1, wait)
		stuckUpload(t, p, clientKind{}, "/")
		synctest.Wait()
		other := pipeClient(t, p, k.h2c)
		start := time.Now()
		status, body := getText(t, other, "http://web.b.svc/")
		if status != http.StatusServiceUnavailable || body != "sockmesh: pool_busy\n" {
			t.Errorf("GET while the connection is held = %d %q, want 503 pool_busy", status, body)
		}
		if waited := time.Since(start); waited != wait {
			t.Errorf("GET failed after %v, want ConnWait (%v)", waited, wait)
		}
		want := 1.0
		if k.h2c {
			req, _ := http.NewRequest(http.MethodPost, "http://web.b.svc/pkg.Svc/Call", strings.NewReader("\x00\x00\x00\x00\x00"))
			req.Header.Set("Content-Type", "application/grpc")
			resp, err := other.Do(req)
			if err != nil {
				t.Fatalf("gRPC call: %v", err)
			}
			resp.Body.Close()
			if s, m := resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message"); s != "14" || !strings.Contains(m, "pool_busy") {
				t.Errorf("gRPC call while the connection is held: grpc-status %q, message %q; want 14 (UNAVAILABLE), pool_busy", s, m)
			}
			want++
		}
		if got := reg(upstream.ReasonPoolBusy); got != want {
			t.Errorf("request_failures_total{pool_busy} = %v, want %v", got, want)
		}
	})
}

// TestPoolTurnsPerClient: while every connection to the endpoint is in
// use, the one freed goes to the pod that holds the fewest: one pod (an
// address) holding both with a request of its own queued does not keep
// another's waiting behind it, on the fast path and net/http's alike.
func TestPoolTurnsPerClient(t *testing.T) {
	inBubbles(t, func(t *testing.T, k clientKind) {
		var pn pipenet.Net
		addr := netip.MustParseAddrPort("10.0.0.1:8080")
		free := make(chan struct{})
		served := make(chan string, 4)
		servePipe(t, &pn, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				<-free
				return
			}
			served <- r.URL.Query().Get("who")
		}))
		cfg := proxy.Config{HTTP1TLS: k.path}
		cfg.Upstream.MaxConnsPerEndpoint = 2
		p, _ := pipeProxy(t, &pn, cfg)
		m := &mesh{t: t}
		be := m.backend("web", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(addr)})
		m.frontend("web", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
			rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be)}})))
		p.Update(m.snapshot(1))
		hog, other := pipeClientFrom(t, p, producerClient, k.h2c), pipeClientFrom(t, p, consumerClient, k.h2c)
		queued(hog, "/hold")
		queued(hog, "/hold")
		queued(hog, "/?who=hog")
		queued(other, "/?who=other")
		free <- struct{}{}
		if who := <-served; who != "other" {
			t.Errorf("the connection freed went to %s's request, want other's (it held none, hog one)", who)
		}
		close(free)
		<-served
	})
}

// TestPoolTurnsDualStack: a dual-stack pod's two addresses are one pod
// for turns: holding 3 of the endpoint's 5 connections from both, with a
// request queued first, it waits on while the connection another pod
// frees goes to that pod's request queued after (it holds 1 then, the
// dual-stack pod 3). By address, the dual-stack pod's held 1 and 2, and
// the one holding 1, as many as the other pod, came first.
func TestPoolTurnsDualStack(t *testing.T) {
	inBubbles(t, func(t *testing.T, k clientKind) {
		var pn pipenet.Net
		addr := netip.MustParseAddrPort("10.0.0.1:8080")
		var release [5]chan struct{} // by /hold's id; the test frees 3
		for i := range release {
			release[i] = make(chan struct{})
		}
		defer func() {
			for i, c := range release {
				if i != 3 {
					close(c)
				}
			}
		}()
		served := make(chan string, 2)
		servePipe(t, &pn, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				id, _ := strconv.Atoi(r.URL.Query().Get("id"))
				<-release[id]
				return
			}
			served <- r.URL.Query().Get("who")
		}))
		cfg := proxy.Config{HTTP1TLS: k.path}
		cfg.Upstream.MaxConnsPerEndpoint = 5
		p, _ := pipeProxy(t, &pn, cfg)
		m := &mesh{t: t, workloads: []snapshot.Workload{dualStack}}
		be := m.backend("web", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(addr)})
		m.frontend("web", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
			rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be)}})))
		p.Update(m.snapshot(1))
		v4, v6 := pipeClientFrom(t, p, dualStack.IPs[0], k.h2c), pipeClientFrom(t, p, dualStack.IPs[1], k.h2c)
		other := pipeClientFrom(t, p, consumerClient, k.h2c)
		queued(v4, "/hold?id=0")
		queued(v6, "/hold?id=1")
		queued(v6, "/hold?id=2")
		queued(other, "/hold?id=3")
		queued(other, "/hold?id=4")
		queued(v4, "/?who=dual")
		queued(other, "/?who=other")
		close(release[3])
		if who := <-served; who != "other" {
			t.Errorf("the connection freed went to %s's request, want other's (it held 1, the dual-stack pod 3)", who)
		}
		<-served
	})
}

// dualStack is pod a/dual, with an IPv4 and an IPv6 address, as in
// node-IP mode on a dual-stack cluster.
var dualStack = snapshot.Workload{Pod: snapshot.ObjectRef{Namespace: "a", Name: "dual"},
	IPs: []netip.Addr{netip.MustParseAddr("127.0.0.4"), netip.MustParseAddr("fd00::4")}, Enrolled: true}

// TestPoolShare: no pod holds more than all but an eighth of an
// endpoint's connections (7 of 8), or the share the agent sets
// (--pool-pod-share: at a half, 4 of 8; before, it was all but an eighth
// whatever was set). While one holds its share with event streams that
// never end, its next stream waits ConnWait and fails 503 pool_busy,
// counted as its share's, and another pod's request, sent meanwhile, is
// answered at once: before, the holder's stream took the last connection
// too, and every other pod's requests failed pool_busy for as long as it
// held them. The holder is a dual-stack pod whose streams come from both
// of its addresses: one pod (by address, each held less than its share).
func TestPoolShare(t *testing.T) {
	for _, c := range []struct {
		share float64 // proxy.Config.Upstream.ClientShare
		holds int     // of 8
	}{{0, 7}, {0.5, 4}} {
		t.Run(fmt.Sprintf("share %v", c.share), func(t *testing.T) {
			inBubbles(t, func(t *testing.T, k clientKind) {
				const wait = 5 * time.Second
				var pn pipenet.Net
				addr := netip.MustParseAddrPort("10.0.0.1:8080")
				end := make(chan struct{})
				defer close(end)
				servePipe(t, &pn, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path == "/events" {
						w.Header().Set("Content-Type", "text/event-stream")
						w.(http.Flusher).Flush()
						select {
						case <-end:
						case <-r.Context().Done():
						}
						return
					}
					io.WriteString(w, "ok")
				}))
				cfg := proxy.Config{HTTP1TLS: k.path}
				cfg.Upstream.MaxConnsPerEndpoint, cfg.Upstream.ConnWait, cfg.Upstream.ClientShare = 8, wait, c.share
				p, metrics := pipeProxy(t, &pn, cfg)
				m := &mesh{t: t, workloads: []snapshot.Workload{dualStack}}
				be := m.backend("web", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(addr)})
				m.frontend("web", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
					rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be)}})))
				p.Update(m.snapshot(1))
				hog := []*http.Client{pipeClientFrom(t, p, dualStack.IPs[0], k.h2c), pipeClientFrom(t, p, dualStack.IPs[1], k.h2c)}
				for i := range c.holds {
					resp, err := hog[i%2].Get("http://web.b.svc/events")
					if err != nil {
						t.Fatalf("event stream %d: %v", i+1, err)
					}
					defer resp.Body.Close()
				}
				type result struct {
					status int
					body   string
					waited time.Duration
					stream io.Closer // an event stream's body, left open
				}
				hogs := make(chan result, 1)
				go func() {
					start := time.Now()
					resp, err := hog[0].Get("http://web.b.svc/events")
					if err != nil {
						hogs <- result{body: err.Error()}
						return
					}
					r := result{status: resp.StatusCode, waited: time.Since(start), stream: resp.Body}
					if resp.StatusCode != http.StatusOK {
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						r.body, r.stream = string(b), nil
					}
					hogs <- r
				}()
				synctest.Wait() // waiting for a connection, or answered
				start := time.Now()
				status, body := getText(t, pipeClientFrom(t, p, consumerClient, k.h2c), "http://web.b.svc/")
				if status != http.StatusOK || body != "ok" || time.Since(start) != 0 {
					t.Errorf("another pod's GET = %d %q after %v, want 200 ok at once", status, body, time.Since(start))
				}
				r := <-hogs
				if r.stream != nil {
					defer r.stream.Close()
				}
				if r.status != http.StatusServiceUnavailable || r.body != "sockmesh: pool_busy\n" || r.waited != wait {
					t.Errorf("the holder's next stream = %d %q after %v, want 503 pool_busy after ConnWait (%v)", r.status, r.body, r.waited, wait)
				}
				if got := counterValue(t, metrics, "sockmesh_proxy_upstream_pool_busy_at_share_total", "", ""); got != 1 {
					t.Errorf("pool_busy_at_share_total = %v, want 1", got)
				}
			})
		})
	}
}

// TestPoolShareOfCopies: the copies a RequestMirror filter sends and the
// asks of an ExternalAuth filter count in the upstream pools as their
// request's pod's, not as one client shared by every pod: while one pod's
// copies (asks) hold their endpoint's share, 7 of 8, another pod's reach
// it at once — its request answered at once too.
func TestPoolShareOfCopies(t *testing.T) {
	for _, path := range []string{"/mirrored", "/auth"} {
		t.Run(path[1:], func(t *testing.T) {
			inBubbles(t, func(t *testing.T, k clientKind) {
				var pn pipenet.Net
				webAddr, sideAddr := netip.MustParseAddrPort("10.0.0.1:8080"), netip.MustParseAddrPort("10.0.0.2:8080")
				end := make(chan struct{})
				defer close(end)
				servePipe(t, &pn, webAddr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
				// The mirror backend, or the authorization server: it
				// holds the hog's until the test ends.
				reached := make(chan string, 16)
				servePipe(t, &pn, sideAddr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					who := r.URL.Query().Get("who")
					reached <- who
					if who == "hog" {
						select {
						case <-end:
						case <-r.Context().Done():
						}
					}
				}))
				cfg := proxy.Config{HTTP1TLS: k.path}
				cfg.Upstream.MaxConnsPerEndpoint = 8
				p, _ := pipeProxy(t, &pn, cfg)
				m := &mesh{t: t}
				web := m.backend("web", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(webAddr)})
				side := m.backend("side", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(sideAddr)})
				m.frontend("web", routedVIP, web, producer(routeSet(snapshot.KindHTTPRoute,
					rule{[]snapshot.RouteMatch{prefixMatch("/mirrored")}, snapshot.RouteRule{Backends: to(web),
						Filters: snapshot.Filters{Mirrors: []snapshot.Mirror{{Backend: side, Numerator: 1, Denominator: 1}}}}},
					rule{[]snapshot.RouteMatch{prefixMatch("/auth")}, snapshot.RouteRule{Backends: to(web),
						Filters: snapshot.Filters{ExternalAuth: &snapshot.ExternalAuth{Backend: side}}}})))
				p.Update(m.snapshot(1))
				hog := pipeClientFrom(t, p, producerClient, k.h2c)
				for range 7 {
					go func() {
						if resp, err := hog.Get("http://web.b.svc" + path + "?who=hog"); err == nil {
							resp.Body.Close()
						}
					}()
					if who := <-reached; who != "hog" {
						t.Fatalf("%s reached the side backend, want hog", who)
					}
				}
				start := time.Now()
				status, body := getText(t, pipeClientFrom(t, p, consumerClient, k.h2c), "http://web.b.svc"+path+"?who=other")
				if status != http.StatusOK || body != "ok" || time.Since(start) != 0 {
					t.Errorf("another pod's GET = %d %q after %v, want 200 ok at once", status, body, time.Since(start))
				}
				synctest.Wait() // the copy sent, or waiting for a connection
				select {
				case who := <-reached:
					if who != "other" {
						t.Errorf("%s reached the side backend, want other", who)
					}
				default:
					t.Error("another pod's copy did not reach the side backend: it waited behind the hog's share")
				}
			})
		})
	}
}

// slowUpload POSTs a 10-byte body a byte every 6 s, and returns the
// answer's body or why there is none.
func slowUpload(t *testing.T, p *proxy.Proxy, k clientKind) string {
	pr, pw := io.Pipe()
	go func() {
		for range 10 {
			time.Sleep(6 * time.Second)
			pw.Write([]byte("x"))
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, "http://web.b.svc/", pr)
	req.ContentLength = 10
	var resp *http.Response
	var err error
	if k.h2c {
		resp, err = pipeClient(t, p, true).Do(req)
	} else {
		// As stuckUpload: the head goes before the body, a byte at a time.
		c := rawApp(t, p)
		go func() {
			io.WriteString(c, "POST / HTTP/1.1\r\nHost: web.b.svc\r\nContent-Length: 10\r\n\r\n")
			io.Copy(c, pr)
		}()
		resp, err = http.ReadResponse(bufio.NewReader(c), req)
	}
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// getText returns the status and body of a GET of url on c.
func getText(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// TestSlowReaderNotCut: an HTTP/1.1 app that reads a large answer a KiB
// every half stall timeout is no stall, though each 32 KiB write to it
// (the fast path's, net/http's server's) takes sixteen stall timeouts: the
// bytes a write under way hands on count (sockio.Conn.Progress), not only
// its end. An app that reads none is still cut
// (TestStalledAppFreesConnection's non-reader, over the same socketEnd).
//
// HTTP/1.1 apps only: an HTTP/2 stream waits on its flow control, which
// moves as the app reads.
func TestSlowReaderNotCut(t *testing.T) {
	inBubbles(t, func(t *testing.T, k clientKind) {
		p, reg, _ := stallProxy(t, k, 1, time.Hour)
		const size = 40 << 10
		c := rawApp(t, p)
		go io.WriteString(c, fmt.Sprintf("GET /big?size=%d HTTP/1.1\r\nHost: web.b.svc\r\n\r\n", size))
		resp, err := http.ReadResponse(bufio.NewReaderSize(slowReader{c}, socketPiece), nil)
		if err != nil {
			t.Fatalf("slow reader: read answer: %v", err)
		}
		if n, err := io.Copy(io.Discard, resp.Body); n != size || err != nil {
			t.Errorf("slow reader: read %d bytes of the body (%v), want %d", n, err, size)
		}
		if got := reg(upstream.ReasonAppStalled); got != 0 {
			t.Errorf("request_failures_total{app_stalled} = %v, want 0", got)
		}
	}, http1Kinds...)
}

// slowReader reads a KiB at most every half stall timeout.
type slowReader struct{ r io.Reader }

func (s slowReader) Read(p []byte) (int, error) {
	time.Sleep(stallTimeout / 2)
	return s.r.Read(p[:min(len(p), socketPiece)])
}

// TestStalledBodyReadByProxy: an app that stops in a body the proxy reads
// itself before the request goes — kept for a rule's retries, or sent to
// its ExternalAuth server — is reset at the stall timeout, as one that
// stops in a body the backend reads, whatever the backend's wire.
func TestStalledBodyReadByProxy(t *testing.T) {
	inBubbles(t, func(t *testing.T, k clientKind) {
		p, reg, _ := stallProxy(t, k, 1, time.Hour)
		for i, path := range []string{"/kept", "/auth"} {
			start := time.Now()
			if err := stuckUpload(t, p, k, path)(); err == nil {
				t.Errorf("POST %s stuck in its body: answered, want a reset", path)
			}
			if waited := time.Since(start); waited < stallTimeout {
				t.Errorf("POST %s stuck in its body: reset after %v, before the stall timeout", path, waited)
			}
			// net/http's HTTP/2 server resets the stream as the deadline
			// passes, maybe before the handler counts it.
			synctest.Wait()
			if got := reg(upstream.ReasonAppStalled); got != float64(i+1) {
				t.Errorf("after POST %s: request_failures_total{app_stalled} = %v, want %d", path, got, i+1)
			}
		}
	})
}

// TestUnreadAnswersCut: the fast path's own answers, its 100 Continue and
// the 101 of an upgrade are written under the stall watch too: an app
// that reads none of them is reset at the stall timeout, and what its
// exchange held (the endpoint's only connection, for the 100 Continue a
// backend asked for, or the upgrade) goes to the next request. The 101
// that stalled was not counted, nor its app reset.
func TestUnreadAnswersCut(t *testing.T) {
	for _, c := range []struct{ name, request string }{
		{"400", "GET / HTTP/1.1\r\nHost: web.b.svc\r\nno colon\r\n\r\n"},
		{"405", "CONNECT web.b.svc:443 HTTP/1.1\r\nHost: web.b.svc:443\r\n\r\n"},
		{"505", "GET / HTTP/2.0\r\nHost: web.b.svc\r\n\r\n"},
		{"101", "GET /ws HTTP/1.1\r\nHost: web.b.svc\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"},
		{"max-forwards", "TRACE / HTTP/1.1\r\nHost: web.b.svc\r\nMax-Forwards: 0\r\n\r\n"},
		{"continue", "POST / HTTP/1.1\r\nHost: web.b.svc\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"},
		{"continue-h2c", "POST /h2c HTTP/1.1\r\nHost: web.b.svc\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"},
		{"continue-auth", "POST /auth HTTP/1.1\r\nHost: web.b.svc\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"},
		// The final answer comes after the proxy began its own 100 (the
		// backend sent none for upstream.ExpectContinueTimeout, 1 s).
		{"continue-then-answer", "POST /answers-late?after=2s HTTP/1.1\r\nHost: web.b.svc\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p, reg, _ := stallProxy(t, clientKinds[0], 1, time.Hour)
				app := rawApp(t, p)
				go io.WriteString(app, c.request)
				time.Sleep(2 * stallTimeout)
				if b, _ := io.ReadAll(app); len(b) > 0 {
					t.Errorf("app that read nothing for two stall timeouts then read %q, want its connection reset", b)
				}
				if got := reg(upstream.ReasonAppStalled); got != 1 {
					t.Errorf("request_failures_total{app_stalled} = %v, want 1", got)
				}
				status, body := getText(t, pipeClient(t, p, false), "http://web.b.svc/")
				if status != http.StatusOK || body != "ok 0" {
					t.Errorf("next GET = %d %q, want 200 \"ok 0\"", status, body)
				}
			})
		})
	}
}

// TestStalledRetryFreesConnection: a body of unknown length recorded for a
// rule's retries is read from the app under the stall watch by every try,
// not only the first — a retry of an answer the rule retries, which sends
// the recording, then reads on from the app; a try on another endpoint
// after a refused connect — and an app that stops in it while such a try
// is under way is reset at the stall timeout: the endpoint's only
// connection, which the try holds, goes to the next request.
func TestStalledRetryFreesConnection(t *testing.T) {
	t.Run("status", func(t *testing.T) {
		inBubbles(t, func(t *testing.T, k clientKind) {
			p, reg, _ := stallProxy(t, k, 1, time.Hour)
			send, end := upload(t, p, k, "/kept/fails-first", -1)
			send("first")
			// Answered 500: the retry is to come (net/http's paths: after
			// its backoff; the fast path: once the first try's read ends).
			synctest.Wait()
			// The first try's read under way takes it and records it (the
			// fast path's retry waits for that read): the retry sends it
			// after "first", then reads on from the app, which sends no more.
			send("second")
			last := time.Now()
			time.Sleep(time.Second) // past the retry's backoff (25 ms at most)
			heldUntilStalled(t, p, reg, "/", last, end)
		})
	})
	t.Run("connect", func(t *testing.T) {
		inBubbles(t, func(t *testing.T, k clientKind) {
			p, reg, refused := stallProxy(t, k, 1, time.Hour)
			send, end := upload(t, p, k, "/failover", -1)
			send("first")
			synctest.Wait()
			if n := refused(); n != 1 {
				t.Fatalf("upstream_dials_total{refused} = %v, want 1: the request's first connect was not refused", n)
			}
			heldUntilStalled(t, p, reg, "/failover", time.Now(), end)
		})
	})
}

// heldUntilStalled checks that a request whose app sent its last byte at
// last, and whose exchange ends as end says, holds the endpoint's only
// connection until the stall timeout resets it: another app's GET of path
// waits for it, then is answered.
func heldUntilStalled(t *testing.T, p *proxy.Proxy, reg failures, path string, last time.Time, end func() error) {
	t.Helper()
	status, body := getText(t, pipeClient(t, p, false), "http://web.b.svc"+path)
	if status != http.StatusOK || body != "ok 0" {
		t.Errorf("other app's GET = %d %q, want 200 \"ok 0\"", status, body)
	}
	if quiet := time.Since(last); quiet < stallTimeout {
		t.Errorf("other app's GET answered %v after the stuck app's last byte, before the stall timeout: the connection was not held", quiet)
	}
	synctest.Wait() // the stuck exchange may free its connection before it counts
	if got := reg(upstream.ReasonAppStalled); got != 1 {
		t.Fatalf("request_failures_total{app_stalled} = %v, want 1", got) // end would wait for good
	}
	if err := end(); err == nil {
		t.Error("request stuck in its body ended cleanly, want a reset")
	}
	// The backend's server lingers before it closes the connection whose
	// chunked body broke off (rstAvoidanceDelay, 500 ms).
	time.Sleep(time.Second)
}

// queued sends a GET of path from c in a bubble and returns once it is at
// the backend, or queued for a connection.
func queued(c *http.Client, path string) {
	go func() {
		if resp, err := c.Get("http://web.b.svc" + path); err == nil {
			resp.Body.Close()
		}
	}()
	synctest.Wait()
}
