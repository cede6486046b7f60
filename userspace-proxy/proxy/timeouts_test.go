package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/httpproxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// Route timeouts and retry backoff run in a synctest bubble: clients, the
// proxy and the backend talk over net.Pipe connections (pipenet), time is
// the bubble's fake clock, and every duration below is exact, not a guess
// about a loaded machine.

// slowBackend serves, over HTTP/1.1 and h2c:
//   - ?delay=D: waits D, then 200 "ok";
//   - ?id=I&fail=F&code=C&delayRetry=R: the n-th request for I waits D and,
//     after the first, R more; the first F answer C, the others 200;
//   - /stream?n=N&every=E: 200 at once, then N chunks E apart (of
//     Content-Type application/grpc for a gRPC request).
func slowBackend(t *testing.T, l net.Listener) {
	var mu sync.Mutex
	counts := map[string]int{}
	srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		q := r.URL.Query()
		if r.URL.Path == "/stream" {
			if ct := r.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/grpc") {
				w.Header().Set("Content-Type", ct)
			}
			n, _ := strconv.Atoi(q.Get("n"))
			every, _ := time.ParseDuration(q.Get("every"))
			for i := range n {
				if i > 0 && !sleepCtx(r.Context(), every) {
					return
				}
				fmt.Fprintf(w, "chunk %d\n", i)
				w.(http.Flusher).Flush()
			}
			return
		}
		mu.Lock()
		counts[q.Get("id")]++
		n := counts[q.Get("id")]
		mu.Unlock()
		delay, _ := time.ParseDuration(q.Get("delay"))
		if n > 1 {
			extra, _ := time.ParseDuration(q.Get("delayRetry"))
			delay += extra
		}
		if !sleepCtx(r.Context(), delay) {
			return
		}
		fail, _ := strconv.Atoi(q.Get("fail"))
		if n <= fail {
			code, _ := strconv.Atoi(q.Get("code"))
			w.WriteHeader(code)
			return
		}
		io.WriteString(w, "ok")
	})}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

// sleepCtx waits d unless ctx ends first (the proxy gave up on the
// request): the bubble must end with no handler left sleeping.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// TestRouteTimeouts: GEP-1742 request and backendRequest timeouts (the
// upstream HTTPRouteTimeoutRequest, HTTPRouteTimeoutBackendRequest and
// HTTPRouteRetryWith*Timeout cases), "0s" disabling one, the proxy's
// default for rules without, retries with their backoff inside the
// request timeout, and a response cut when the timeout passes mid-body;
// on the fast path, through net/http's server (h2c client), and from an
// HTTP/1.1 app to an h2c backend (net/http's Transport).
func TestRouteTimeouts(t *testing.T) {
	for _, k := range []struct {
		name  string
		h2c   bool
		proto snapshot.Protocol
	}{
		{"http1-fast", false, snapshot.ProtocolAuto},
		{"h2c", true, snapshot.ProtocolAuto},
		{"http1-to-h2c-backend", false, snapshot.ProtocolH2C},
	} {
		t.Run(k.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testRouteTimeouts(t, k.h2c, k.proto) })
		})
	}
}

func testRouteTimeouts(t *testing.T, h2c bool, proto snapshot.Protocol) {
	var pn pipenet.Net
	backendAddr := netip.MustParseAddrPort("10.0.0.1:8080")
	slowBackend(t, pn.Listen(backendAddr))
	reg := prometheus.NewRegistry()
	p, err := proxy.New(proxy.Config{Dialer: &pn, Routing: httpproxy.RoutingConfig{RequestTimeout: 5 * time.Second}},
		slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	m := &mesh{t: t}
	be := m.backend("slow", snapshot.Backend{Protocol: proto, Endpoints: endpoints(backendAddr)})
	rule := func(prefix string, request, backend *snapshot.Duration, retry *snapshot.Retry) rule {
		r := snapshot.RouteRule{Backends: to(be), Retry: retry}
		if request != nil || backend != nil {
			r.Timeouts = &snapshot.Timeouts{Request: request, BackendRequest: backend}
		}
		return struct {
			matches []snapshot.RouteMatch
			snapshot.RouteRule
		}{[]snapshot.RouteMatch{prefixMatch(prefix)}, r}
	}
	ms := time.Millisecond
	m.frontend("slow", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		rule("/request-timeout", dur(500*ms), nil, nil),
		rule("/disable-request-timeout", dur(0), nil, nil),
		rule("/backend-timeout", nil, dur(500*ms), nil),
		rule("/disable-backend-timeout", dur(0), dur(0), nil),
		rule("/retry/request-timeout-500ms", dur(500*ms), nil, &snapshot.Retry{Attempts: 5, Codes: []int{500}, Backoff: dur(0)}),
		rule("/retry/backend-timeout-500ms", dur(15*time.Second), dur(500*ms), &snapshot.Retry{Attempts: 3, Codes: []int{500}, Backoff: dur(0)}),
		rule("/retry/backoff", nil, nil, &snapshot.Retry{Attempts: 3, Codes: []int{503}, Backoff: dur(100 * ms)}),
		rule("/retry/backoff-past-request", dur(250*ms), nil, &snapshot.Retry{Attempts: 3, Codes: []int{503}, Backoff: dur(100 * ms)}),
		rule("/retry/backend-timeout-backoff-past-request", dur(600*ms), dur(200*ms), &snapshot.Retry{Attempts: 3, Backoff: dur(time.Second)}),
		rule("/stream", dur(500*ms), nil, nil),
		rule("/", nil, nil, nil),
	)))
	p.Update(m.snapshot(1))

	client := pipeClient(t, p, h2c)
	id := 0
	for _, c := range []struct {
		path    string
		status  int
		elapsed time.Duration // exact; 0: see min and max
		min     time.Duration
		max     time.Duration
	}{
		{path: "/request-timeout", status: 200},
		{path: "/request-timeout?delay=1s", status: 504, elapsed: 500 * ms},
		{path: "/disable-request-timeout?delay=1s", status: 200, elapsed: time.Second},
		{path: "/default?delay=6s", status: 504, elapsed: 5 * time.Second}, // the proxy's default
		{path: "/backend-timeout", status: 200},
		{path: "/backend-timeout?delay=1s", status: 504, elapsed: 500 * ms},
		{path: "/disable-backend-timeout?delay=1s", status: 200, elapsed: time.Second},
		// Retries inside a request timeout: the first retry succeeds in
		// time; with each retry 300 ms slower, the third is cut at 500 ms.
		{path: "/retry/request-timeout-500ms?code=500&fail=1", status: 200},
		{path: "/retry/request-timeout-500ms?code=500&fail=2&delayRetry=300ms", status: 504, elapsed: 500 * ms},
		// Each attempt within backendRequest: 100 + 200 + 200 ms.
		{path: "/retry/backend-timeout-500ms?code=500&fail=2&delay=100ms&delayRetry=100ms", status: 200, elapsed: 500 * ms},
		// Every attempt outlives backendRequest: four of them, then 504.
		{path: "/retry/backend-timeout-500ms?code=500&fail=2&delay=1s&delayRetry=1s", status: 504, elapsed: 2 * time.Second},
		// Backoff base 100 ms: waits in [50,100], [100,200], [200,400] ms.
		{path: "/retry/backoff?code=503&fail=3", status: 200, min: 350 * ms, max: 700 * ms},
		{path: "/retry/backoff?code=503&fail=4", status: 503, min: 350 * ms, max: 700 * ms},
		// The third wait (≥ 200 ms after ≥ 150 ms) would end past the
		// 250 ms request timeout: 504 at the deadline.
		{path: "/retry/backoff-past-request?code=503&fail=3", status: 504, elapsed: 250 * ms},
		// The first try outlives backendRequest; the backoff (≥ 500 ms)
		// would end past the request timeout, which ends the request at
		// 600 ms: a request timeout, not a backendRequest one.
		{path: "/retry/backend-timeout-backoff-past-request?delay=1s", status: 504, elapsed: 600 * ms},
	} {
		id++
		sep := "?"
		if strings.Contains(c.path, "?") {
			sep = "&"
		}
		url := "http://slow.b.svc" + c.path + sep + "id=" + strconv.Itoa(id)
		start := time.Now()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		elapsed := time.Since(start)
		if resp.StatusCode != c.status {
			t.Errorf("GET %s: %d, want %d", url, resp.StatusCode, c.status)
		}
		switch {
		case c.elapsed != 0 && elapsed != c.elapsed:
			t.Errorf("GET %s: answered after %v, want exactly %v", url, elapsed, c.elapsed)
		case c.max != 0 && (elapsed < c.min || elapsed > c.max):
			t.Errorf("GET %s: answered after %v, want %v to %v", url, elapsed, c.min, c.max)
		}
	}

	// A body of unknown length, recorded, goes again after the first try
	// outlived backendRequest (before, it was not retried: 504).
	start := time.Now()
	id++
	url := "http://slow.b.svc/retry/backend-timeout-500ms?delay=1s&delayRetry=-900ms&id=" + strconv.Itoa(id)
	resp, err := client.Post(url, "text/plain", struct{ io.Reader }{strings.NewReader("streamed")})
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || time.Since(start) != 600*ms {
		t.Errorf("POST %s, streamed: %d after %v, want 200 after 600ms", url, resp.StatusCode, time.Since(start))
	}

	// A timeout after the answer started cuts the body: the client sees
	// the chunks sent before 500 ms and then an error, never a clean end.
	// (It is not counted as a timed-out request: the answer was 200.)
	start = time.Now()
	resp, err = client.Get("http://slow.b.svc/stream?n=5&every=200ms")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", resp, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || errors.Is(err, io.EOF) || string(body) != "chunk 0\nchunk 1\nchunk 2\n" || time.Since(start) != 500*ms {
		t.Errorf("stream cut by the request timeout: %q, %v after %v; want three chunks, an error, at 500ms", body, err, time.Since(start))
	}
	if h2c {
		// A gRPC call the route's timeout ends reads DEADLINE_EXCEEDED,
		// before its answer (trailers-only) and once the answer has begun
		// (in its trailers): not UNAVAILABLE, which clients retry
		// (failures.md).
		for _, c := range []struct{ path, body string }{
			{"/request-timeout?delay=1s", ""},
			{"/stream?n=5&every=200ms", "chunk 0\nchunk 1\nchunk 2\n"},
		} {
			start := time.Now()
			req, _ := http.NewRequest(http.MethodPost, "http://slow.b.svc"+c.path, strings.NewReader("\x00\x00\x00\x00\x00"))
			req.Header = http.Header{"Content-Type": {"application/grpc"}, "Te": {"trailers"}}
			resp, err := client.Do(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("gRPC %s: %v %v", c.path, resp, err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			status, msg := resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message")
			if status == "" { // trailers-only: the status is in the header
				status, msg = resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message")
			}
			if err != nil || string(body) != c.body || time.Since(start) != 500*ms || status != "4" || msg != "sockmesh: timeout" {
				t.Errorf("gRPC %s cut by the request timeout: %q, %v, grpc-status %q %q after %v; want %q, then 4 sockmesh: timeout at 500ms",
					c.path, body, err, status, msg, time.Since(start), c.body)
			}
		}
	}
	// The proxy still serves.
	if resp, err := client.Get("http://slow.b.svc/ok"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the timeouts: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	wantRequest := 5.0
	if h2c {
		wantRequest++ // the gRPC call cut before its answer
	}
	if got := counterValue(t, reg, "sockmesh_proxy_request_timeouts_total", "timeout", "request"); got != wantRequest {
		t.Errorf("timeouts{request} = %v, want %v", got, wantRequest)
	}
	if got := counterValue(t, reg, "sockmesh_proxy_request_timeouts_total", "timeout", "backend_request"); got != 2 {
		t.Errorf("timeouts{backend_request} = %v, want 2", got)
	}
}

// TestRouteRequestTimeoutKeptBody: a rule's timeouts.request bounds the
// whole exchange (GEP-1742), the read of the body the proxy keeps for the
// rule's retries (keepBody) included, and nothing goes to the backend once
// it passed. With 300ms, a POST whose sized body stalls after a few bytes
// gets 504 at 300ms, counted as timeouts{request}, and the backend never
// sees it, though the fast path holds an idle connection to it (the pool
// hands none out under an ended context); so does one whose body ends just
// at the deadline, whichever of the two comes first; one whose body ends at
// 100ms gets 200. Before, the proxy waited for the body as long as the app
// took (10s) and then forwarded it: HTTP/1 apps' requests on an idle
// connection reached the backend past the deadline. Time is the synctest
// bubble's, so every duration is exact.
func TestRouteRequestTimeoutKeptBody(t *testing.T) {
	inBubbles(t, testRequestTimeoutKeptBody)
}

func testRequestTimeoutKeptBody(t *testing.T, k clientKind) {
	var pn pipenet.Net
	backendAddr := netip.MustParseAddrPort("10.0.0.1:8080")
	// The backend notes each request as its head arrives, before its body.
	var mu sync.Mutex
	seen := map[string]int{}
	servePipe(t, &pn, backendAddr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Query().Get("id")]++
		mu.Unlock()
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}))
	p, reg := pipeProxy(t, &pn, proxy.Config{HTTP1TLS: k.path})
	m := &mesh{t: t}
	be := m.backend("app", snapshot.Backend{Endpoints: endpoints(backendAddr)})
	ms := time.Millisecond
	// The retry stanza has the proxy keep bodies (within ReplayBytes).
	m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be),
			Timeouts: &snapshot.Timeouts{Request: dur(300 * ms)},
			Retry:    &snapshot.Retry{Attempts: 2, Codes: []int{503}}}},
	)))
	p.Update(m.snapshot(1))
	client := pipeClient(t, p, k.h2c)

	// stalled is an 8-byte body: "abc" at once, the rest after d. The
	// pipes close at the end, should a writer still wait for its reader.
	var bodies []*io.PipeReader
	defer func() {
		for _, pr := range bodies {
			pr.Close()
		}
	}()
	stalled := func(d time.Duration) io.Reader {
		pr, pw := io.Pipe()
		bodies = append(bodies, pr)
		go func() {
			pw.Write([]byte("abc"))
			time.Sleep(d)
			pw.Write([]byte("defgh"))
			pw.Close()
		}()
		return pr
	}
	// post sends id's 8-byte body (Content-Length: 8); a hang turns into
	// an error at hangGuard.
	post := func(id string, body io.Reader) (int, time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://app.b.svc/?id="+id, body)
		req.ContentLength = 8
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", id, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, time.Since(start)
	}
	for _, c := range []struct {
		id      string
		body    io.Reader
		status  int
		elapsed time.Duration
		reached int // requests the backend saw
	}{
		// First a request that leaves an idle connection in the fast
		// path's pool.
		{"whole", strings.NewReader("12345678"), 200, 0, 1},
		{"stalled", stalled(10 * time.Second), 504, 300 * ms, 0},
		{"at-deadline", stalled(300 * ms), 504, 300 * ms, 0},
		{"in-time", stalled(100 * ms), 200, 100 * ms, 1},
	} {
		status, elapsed := post(c.id, c.body)
		if status != c.status || elapsed != c.elapsed {
			t.Errorf("%s: %d after %v, want %d after %v", c.id, status, elapsed, c.status, c.elapsed)
		}
	}
	time.Sleep(time.Minute) // the stalled body has long ended
	synctest.Wait()
	for id, want := range map[string]int{"whole": 1, "stalled": 0, "at-deadline": 0, "in-time": 1} {
		mu.Lock()
		n := seen[id]
		mu.Unlock()
		if n != want {
			t.Errorf("%s: the backend saw %d requests, want %d", id, n, want)
		}
	}
	if got := counterValue(t, reg, "sockmesh_proxy_request_timeouts_total", "timeout", "request"); got != 2 {
		t.Errorf("timeouts{request} = %v, want 2", got)
	}
}

// counterValue reads the counter name{label=value} from reg; with label
// "", the counter name of no labels.
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" {
				return m.GetCounter().GetValue()
			}
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// pipeClient is a client whose every connection is served by p in
// memory (net.Pipe, so synctest can run it) as a connection to routedVIP
// from a producer-namespace client, speaking h2c or HTTP/1.1.
func pipeClient(t testing.TB, p *proxy.Proxy, h2c bool) *http.Client {
	return pipeClientFrom(t, p, producerClient, h2c)
}

// pipeClientFrom is pipeClient for a client at src.
func pipeClientFrom(t testing.TB, p *proxy.Proxy, src netip.Addr, h2c bool) *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols), DisableCompression: true,
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			c, s := net.Pipe()
			go p.ServeConn(s, routedVIP, proxy.Client{Addr: netip.AddrPortFrom(src, 40000)})
			return c, nil
		}}
	if h2c {
		tr.Protocols.SetUnencryptedHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestRetryBackoffAppLeft: an app that leaves while its request waits out
// a retry's backoff ends the wait, as on net/http's paths (the request's
// context): the retry is never sent — the backend sees one request — and
// the request counts as canceled. Before, the fast path waited the backoff
// out unwatched, and then sent the retry for an app long gone.
func TestRetryBackoffAppLeft(t *testing.T) {
	inBubbles(t, testRetryBackoffAppLeft)
}

func testRetryBackoffAppLeft(t *testing.T, k clientKind) {
	var pn pipenet.Net
	backendAddr := netip.MustParseAddrPort("10.0.0.1:8080")
	var seen atomic.Int32
	servePipe(t, &pn, backendAddr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	p, reg := pipeProxy(t, &pn, proxy.Config{HTTP1TLS: k.path})
	m := &mesh{t: t}
	be := m.backend("app", snapshot.Backend{Endpoints: endpoints(backendAddr)})
	// The first wait is 5 to 10 s; the app leaves after 2.
	m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be),
			Retry: &snapshot.Retry{Attempts: 1, Codes: []int{503}, Backoff: dur(10 * time.Second)}}},
	)))
	p.Update(m.snapshot(1))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://app.b.svc/", nil)
	if resp, err := pipeClient(t, p, k.h2c).Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d before the app left", resp.StatusCode)
	}
	time.Sleep(time.Minute) // past any backoff
	synctest.Wait()
	if n := seen.Load(); n != 1 {
		t.Errorf("the backend saw %d requests, want 1: no retry for an app that left", n)
	}
	if got := counterValue(t, reg, "sockmesh_proxy_request_failures_total", "reason", "canceled"); got != 1 {
		t.Errorf("failures{canceled} = %v, want 1", got)
	}
}

// TestConnectEndedByRouteTimeout: a connect, or a TLS handshake, that a
// route's request timeout ends counts as route_timeout in
// sockmesh_proxy_upstream_dials_total and _tls_handshakes_total, one the
// app's leaving ends as canceled, and the app gets its 504 as the timeout
// passes: an operator tells a slow backend from apps that give up.
// Before, both counted as canceled; toward HTTP/2 backends, whose
// connections net/http's Transport dials apart from the request's
// context, the dial ran on to HandshakeTimeout (10 s), counted timeout.
// The backends, HTTP/1.1 and HTTP/2 (h2c, h2 over TLS) alike: one that
// takes no connection (its connect waits, as for a SYN nobody answers),
// one that takes connections and never answers their ClientHello, nor,
// over h2c, the preface.
func TestConnectEndedByRouteTimeout(t *testing.T) {
	inBubbles(t, testConnectEndedByRouteTimeout)
}

func testConnectEndedByRouteTimeout(t *testing.T, k clientKind) {
	var pn pipenet.Net
	silent, mute := netip.MustParseAddrPort("10.0.0.1:8080"), netip.MustParseAddrPort("10.0.0.2:8443")
	pn.Listen(silent) // never accepts
	l := pn.Listen(mute)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c) // the ClientHello, or the preface, unanswered
				c.Close()
			}()
		}
	}()
	ca, err := pki.NewCA("route timeout test ca")
	if err != nil {
		t.Fatal(err)
	}
	p, reg := pipeProxy(t, &pn, proxy.Config{HTTP1TLS: k.path})
	tlsTo := &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: sniName, RootsPEM: string(ca.CertPEM)}
	const (
		dials      = "sockmesh_proxy_upstream_dials_total"
		handshakes = "sockmesh_proxy_upstream_tls_handshakes_total"
		failures   = "sockmesh_proxy_request_failures_total"
	)
	// Each backend is asked once under a route's timeout (/timeout/name)
	// and once by an app that leaves first (/left/name); counts are what
	// each request adds, as metric{value}.
	backends := []struct {
		name          string
		be            snapshot.Backend
		timeout, left []string
	}{
		{"h1-connect", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(silent)},
			[]string{dials + "{route_timeout}", failures + "{timeout}"},
			[]string{dials + "{canceled}", failures + "{canceled}"}},
		{"h1-handshake", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(mute), TLS: tlsTo},
			[]string{dials + "{ok}", handshakes + "{route_timeout}", failures + "{timeout}"},
			[]string{dials + "{ok}", handshakes + "{canceled}", failures + "{canceled}"}},
		{"h2c-connect", snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(silent)},
			[]string{dials + "{route_timeout}", failures + "{timeout}"},
			[]string{dials + "{canceled}", failures + "{canceled}"}},
		{"h2-handshake", snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, Endpoints: endpoints(mute), TLS: tlsTo},
			[]string{dials + "{ok}", handshakes + "{route_timeout}", failures + "{timeout}"},
			[]string{dials + "{ok}", handshakes + "{canceled}", failures + "{canceled}"}},
		// Connected: net/http's Transport sends the request without
		// waiting for the backend's SETTINGS, and only the request's
		// own wait ends. Asked once: the connection stays for the next.
		{"h2c-settings", snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(mute)},
			[]string{dials + "{ok}", failures + "{timeout}"}, nil},
	}
	timeout := &snapshot.Timeouts{Request: dur(500 * time.Millisecond)}
	m := &mesh{t: t}
	var rules []rule
	for _, b := range backends {
		ref := m.backend(b.name, b.be)
		rules = append(rules,
			rule{[]snapshot.RouteMatch{prefixMatch("/timeout/" + b.name)}, snapshot.RouteRule{Backends: to(ref), Timeouts: timeout}},
			rule{[]snapshot.RouteMatch{prefixMatch("/left/" + b.name)}, snapshot.RouteRule{Backends: to(ref)}})
	}
	m.frontend("slow", routedVIP, m.backends[0].Ref, producer(routeSet(snapshot.KindHTTPRoute, rules...)))
	p.Update(m.snapshot(1))
	client := pipeClient(t, p, k.h2c)
	// checked are the counters each request is checked on; read reads
	// them.
	checked := []string{
		dials + "{ok}", dials + "{route_timeout}", dials + "{canceled}",
		handshakes + "{route_timeout}", handshakes + "{canceled}",
		failures + "{timeout}", failures + "{canceled}",
	}
	read := func() map[string]float64 {
		got := map[string]float64{}
		for _, c := range checked {
			metric, value, _ := strings.Cut(strings.TrimSuffix(c, "}"), "{")
			label := "result"
			if metric == failures {
				label = "reason"
			}
			got[c] = counterValue(t, reg, metric, label, value)
		}
		return got
	}
	ask := func(path string, counts []string) {
		before := read()
		// The app leaves after 1 s: past the route's timeout, well before
		// the proxy's default (15 s) and HandshakeTimeout (10 s).
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://slow.b.svc"+path, nil)
		start := time.Now()
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		if strings.HasPrefix(path, "/timeout/") && (err != nil || resp.StatusCode != http.StatusGatewayTimeout || time.Since(start) != 500*time.Millisecond) {
			t.Errorf("GET %s: %v, %v after %v; want 504 after 500ms", path, resp, err, time.Since(start))
		}
		synctest.Wait()
		want := map[string]float64{}
		for _, c := range counts {
			want[c]++
		}
		after := read()
		for _, c := range checked {
			if n := after[c] - before[c]; n != want[c] {
				t.Errorf("GET %s added %v to %s, want %v", path, n, c, want[c])
			}
		}
	}
	for _, b := range backends {
		ask("/timeout/"+b.name, b.timeout)
		if b.left != nil {
			ask("/left/"+b.name, b.left)
		}
	}
	time.Sleep(time.Minute) // past HandshakeTimeout
	synctest.Wait()
	if got := counterValue(t, reg, handshakes, "result", "timeout"); got != 0 {
		t.Errorf("%s{timeout} = %v, want 0: no handshake outlived its request", handshakes, got)
	}
}
