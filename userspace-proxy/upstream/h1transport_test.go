package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// request builds a request for be's first endpoint, as the proxy's
// handlers address them.
func request(t *testing.T, ctx context.Context, be *Backend, method, path string, body io.Reader) *http.Request {
	t.Helper()
	u := &url.URL{Scheme: be.Scheme(), Host: be.Spec.Endpoints[0].Addr.String(), Path: path}
	req, err := http.NewRequestWithContext(WithEndpoint(ctx, be.Picker.Pick()), method, u.String(), body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = sni
	return req
}

// roundTrip sends req through rt and reads the answer whole.
func roundTrip(t *testing.T, rt http.RoundTripper, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", req.Method, req.URL.Path, err)
	}
	return resp, string(b)
}

// reused reads how many of the pool's hand-outs were idle connections.
func (w *world) reused(t *testing.T) float64 {
	return w.counter(t, "sockmesh_proxy_upstream_pool_gets_total", "reused")
}

// TestH1TransportPools: HTTP/1.1 requests through RoundTripper(WireH1) share
// the fast path's pool — a connection is reused once its answer was read
// to the end, at once for answers without a body, and not after an answer
// closed early — and bodies, trailers and 1xx answers pass as through
// net/http's Transport.
func TestH1TransportPools(t *testing.T) {
	w := newWorldServing(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hints":
			rw.Header().Set("Link", "</a.css>; rel=preload")
			rw.WriteHeader(http.StatusEarlyHints)
			rw.Header().Del("Link")
		case "/empty":
			rw.WriteHeader(http.StatusNoContent)
			return
		case "/big":
			io.WriteString(rw, strings.Repeat("x", 1<<20))
			return
		}
		b, _ := io.ReadAll(r.Body)
		rw.Header().Set("Trailer", "X-Got")
		fmt.Fprintf(rw, "%s %s %s %q", r.Proto, r.Method, r.URL.Path, b)
		rw.Header().Set("X-Got", r.Trailer.Get("X-Sent"))
	}), false)
	be := w.pools.Build(w.snapshot(t, 1, w.policy()), nil).Get(ref)
	rt := be.RoundTripper(WireH1)
	ctx := context.Background()

	if _, body := roundTrip(t, rt, request(t, ctx, be, http.MethodGet, "/a", nil)); body != `HTTP/1.1 GET /a ""` {
		t.Errorf("GET: %q", body)
	}
	req := request(t, ctx, be, http.MethodPost, "/b", io.MultiReader(strings.NewReader("streamed")))
	req.Trailer = http.Header{"X-Sent": {"yes"}}
	resp, body := roundTrip(t, rt, req)
	if body != `HTTP/1.1 POST /b "streamed"` || resp.Trailer.Get("X-Got") != "yes" {
		t.Errorf("chunked POST with a trailer: %q, trailer X-Got %q", body, resp.Trailer.Get("X-Got"))
	}
	if resp, _ := roundTrip(t, rt, request(t, ctx, be, http.MethodGet, "/empty", nil)); resp.StatusCode != http.StatusNoContent {
		t.Errorf("GET /empty: %s", resp.Status)
	}
	var hints []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hints = append(hints, fmt.Sprint(code, " ", h.Get("Link")))
		return nil
	}}
	if resp, _ := roundTrip(t, rt, request(t, httptrace.WithClientTrace(ctx, trace), be, http.MethodGet, "/hints", nil)); resp.StatusCode != http.StatusOK ||
		fmt.Sprint(hints) != "[103 </a.css>; rel=preload]" {
		t.Errorf("GET /hints: %s, 1xx seen %q", resp.Status, hints)
	}
	if n := w.reused(t); n != 3 {
		t.Errorf("pool gets{result=reused} = %v after 4 requests in a row, want 3", n)
	}
	resp, err := rt.RoundTrip(request(t, ctx, be, http.MethodGet, "/big", nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Read(make([]byte, 10))
	resp.Body.Close()
	if _, err := resp.Body.Read(make([]byte, 10)); err == nil {
		t.Error("a closed body still reads")
	}
	if open, idle := be.w.h1.Stats(w.addr); open != 0 || idle != 0 {
		t.Errorf("after an answer closed early: %d open, %d idle; want its connection closed", open, idle)
	}
}

// TestH1TransportStrayAnswer: an answer the backend sends unasked, after
// the one asked for, never becomes the next request's answer: the pool
// drops the connection it arrived on, and the request goes on another.
// (net/http's Transport gave it to the next request when it arrived just
// as the connection was handed over.)
func TestH1TransportStrayAnswer(t *testing.T) {
	for _, tlsOn := range []bool{true, false} {
		t.Run(fmt.Sprint("tls=", tlsOn), func(t *testing.T) {
			w := newWorld(t)
			stray := make(chan struct{})
			addr := serveRawTLS(t, w, tlsOn, func(c net.Conn) {
				br := bufio.NewReader(c)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+fmt.Sprint(len(r.URL.Path))+"\r\n\r\n"+r.URL.Path)
					if r.URL.Path == "/first" {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n/stray")
						awaitAcked(t, c)
						close(stray)
					}
				}
			})
			pol := w.policy()
			if !tlsOn {
				pol = nil
			}
			be := backendAt(t, w.pools, addr, pol)
			rt := be.RoundTripper(WireH1)
			if _, body := roundTrip(t, rt, request(t, context.Background(), be, http.MethodGet, "/first", nil)); body != "/first" {
				t.Fatalf("first answer %q", body)
			}
			<-stray // in the proxy's socket
			if _, body := roundTrip(t, rt, request(t, context.Background(), be, http.MethodGet, "/second", nil)); body != "/second" {
				t.Errorf("the request after a stray answer got %q, want /second", body)
			}
			if n := w.counter(t, "sockmesh_proxy_upstream_pool_dropped_total", "unsolicited"); n != 1 {
				t.Errorf("pool_dropped_total{reason=unsolicited} = %v, want 1", n)
			}
		})
	}
}

// awaitAcked returns once the peer of c (or of the TCP connection under
// its TLS) acknowledged every byte c sent: they are in the peer's socket.
func awaitAcked(t *testing.T, c net.Conn) {
	rc, err := sockio.TCP(c).SyscallConn()
	if err != nil {
		t.Error(err)
		return
	}
	for {
		var queued int
		if err := rc.Control(func(fd uintptr) { queued, err = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil || queued == 0 {
			if err != nil {
				t.Errorf("the send queue of the backend's socket: %v", err)
			}
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// serveRawTLS serves each connection with handle, inside TLS with w's
// backend certificate when tlsOn.
func serveRawTLS(t *testing.T, w *world, tlsOn bool, handle func(net.Conn)) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().(*net.TCPAddr).AddrPort()
	if tlsOn {
		l = tls.NewListener(l, w.serverTLS)
	}
	tcpserve.Serve(t, l, handle)
	return addr
}

// TestH1TransportStaleRetry: a request that finds its reused connection
// closed before any answer, as a backend closes one whose idle timeout
// passed as the request arrived, goes again on a new connection when it is
// idempotent and bodiless; a POST gets the error, never a second delivery.
func TestH1TransportStaleRetry(t *testing.T) {
	w := newWorld(t)
	var mu sync.Mutex
	seen := map[string]int{}
	// Each connection serves one request; the next one it reads, it drops
	// unanswered.
	addr := serveRawTLS(t, w, true, func(c net.Conn) {
		br := bufio.NewReader(c)
		for n := 0; ; n++ {
			r, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			mu.Lock()
			seen[r.Method]++
			mu.Unlock()
			if n == 1 {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	be := backendAt(t, w.pools, addr, w.policy())
	rt := be.RoundTripper(WireH1)
	ctx := context.Background()
	for i := range 3 {
		if resp, body := roundTrip(t, rt, request(t, ctx, be, http.MethodGet, "/", nil)); resp.StatusCode != 200 || body != "ok" {
			t.Errorf("GET %d: %s %q", i, resp.Status, body)
		}
	}
	if _, err := rt.RoundTrip(request(t, ctx, be, http.MethodPost, "/", strings.NewReader("once"))); err == nil {
		t.Error("a POST whose connection closed unanswered succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[http.MethodGet] != 5 || seen[http.MethodPost] != 1 {
		t.Errorf("backend read %d GETs and %d POSTs, want 5 (two sent again) and 1", seen[http.MethodGet], seen[http.MethodPost])
	}
}

// TestH1TransportContext: the request's context ends the exchange while it
// waits for the answer and while the answer's body streams; the error says
// why (Classify: canceled), and the connection is closed, not pooled.
func TestH1TransportContext(t *testing.T) {
	release := make(chan struct{})
	w := newWorldServing(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/body" {
			io.WriteString(rw, "start")
			rw.(http.Flusher).Flush()
		}
		<-release
	}), false)
	defer close(release)
	be := w.pools.Build(w.snapshot(t, 1, w.policy()), nil).Get(ref)
	rt := be.RoundTripper(WireH1)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := rt.RoundTrip(request(t, ctx, be, http.MethodGet, "/head", nil))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting for the answer: %v, want the context's deadline", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	resp, err := rt.RoundTrip(request(t, ctx, be, http.MethodGet, "/body", nil))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "start" {
		t.Fatalf("body start %q, %v", buf, err)
	}
	time.AfterFunc(20*time.Millisecond, cancel)
	_, err = io.ReadAll(resp.Body)
	if !errors.Is(err, context.Canceled) || Classify(err) != ReasonCanceled {
		t.Errorf("reading the body: %v (reason %s), want the cancellation", err, Classify(err))
	}
	resp.Body.Close()
	if open, idle := be.w.h1.Stats(w.addr); open != 0 || idle != 0 {
		t.Errorf("after two ended exchanges: %d open, %d idle; want none", open, idle)
	}
}

// TestConnectEndedByContext: a request whose context ends while its
// connection is made, in the TLS handshake or before the TCP connect,
// fails as canceled (the app left), not as the backend's failure: no
// tls_handshake or dial_failed reason (logged at warn, naming the TLS
// policy), no failed handshake or dial counted.
func TestConnectEndedByContext(t *testing.T) {
	w := newWorld(t)
	hello := make(chan struct{}, 1)
	addr := serveRawTLS(t, w, false, func(c net.Conn) {
		// Reads the ClientHello's first byte, and never answers it.
		c.Read(make([]byte, 1))
		hello <- struct{}{}
		io.Copy(io.Discard, c)
	})
	be := backendAt(t, w.pools, addr, w.policy())
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-hello
		cancel()
	}()
	_, err := be.RoundTripper(WireH1).RoundTrip(request(t, ctx, be, http.MethodGet, "/", nil))
	if !errors.Is(err, context.Canceled) || Classify(err) != ReasonCanceled {
		t.Errorf("handshake ended by the context: %v (reason %s), want canceled", err, Classify(err))
	}
	if failed, canceled := w.counter(t, "sockmesh_proxy_upstream_tls_handshakes_total", "failed"),
		w.counter(t, "sockmesh_proxy_upstream_tls_handshakes_total", "canceled"); failed != 0 || canceled != 1 {
		t.Errorf("handshakes counted failed %v, canceled %v; want 0 and 1", failed, canceled)
	}

	_, err = be.Dial(ctx, be.Picker.Pick(), alpnH1)
	if !errors.Is(err, context.Canceled) || Classify(err) != ReasonCanceled {
		t.Errorf("connect with the context ended: %v (reason %s), want canceled", err, Classify(err))
	}
	if failed, canceled := w.counter(t, "sockmesh_proxy_upstream_dials_total", "dial_failed"),
		w.counter(t, "sockmesh_proxy_upstream_dials_total", "canceled"); failed != 0 || canceled != 1 {
		t.Errorf("dials counted dial_failed %v, canceled %v; want 0 and 1", failed, canceled)
	}
}

// TestH1TransportFullDuplex: the request body streams while the answer
// does — each piece the app sends comes back before it sends the next,
// chunked or of known length (whose pieces waited in the connection's
// writer, for the rest) — and a body cut short by the app fails the
// exchange rather than leaving the backend waiting for the rest.
func TestH1TransportFullDuplex(t *testing.T) {
	w := newWorldServing(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		http.NewResponseController(rw).EnableFullDuplex()
		rw.WriteHeader(http.StatusOK)
		rw.(http.Flusher).Flush()
		buf := make([]byte, 64)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				rw.Write(buf[:n])
				rw.(http.Flusher).Flush()
			}
			if err != nil {
				return
			}
		}
	}), false)
	be := w.pools.Build(w.snapshot(t, 1, w.policy()), nil).Get(ref)
	rt := be.RoundTripper(WireH1)
	for _, size := range []int64{-1, int64(len("onetwothree"))} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pr, pw := io.Pipe()
		req := request(t, ctx, be, http.MethodPost, "/echo", pr)
		req.ContentLength = size
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		for _, msg := range []string{"one", "two", "three"} {
			go pw.Write([]byte(msg))
			buf := make([]byte, len(msg))
			if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != msg {
				t.Fatalf("length %d: echo of %q: %q, %v", size, msg, buf, err)
			}
		}
		pw.CloseWithError(errors.New("app went away"))
		if _, err := io.ReadAll(resp.Body); err == nil && size < 0 {
			t.Error("an answer to a request whose body was cut short ended cleanly")
		}
		resp.Body.Close()
	}
}

// TestH1TransportUpgrade: a 101 answer's body is the upgraded connection,
// out of the pool, readable and writable both ways.
func TestH1TransportUpgrade(t *testing.T) {
	w := newWorld(t)
	addr := serveRawTLS(t, w, true, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nhello")
		io.Copy(c, br)
	})
	be := backendAt(t, w.pools, addr, w.policy())
	req := request(t, context.Background(), be, http.MethodGet, "/", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := be.RoundTripper(WireH1).RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	conn, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("a 101 answer's body is a %T", resp.Body)
	}
	defer conn.Close()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("first bytes after the 101: %q, %v", buf, err)
	}
	io.WriteString(conn, "ping")
	buf = buf[:4]
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q, %v", buf, err)
	}
	if open, idle := be.w.h1.Stats(addr); open != 0 || idle != 0 {
		t.Errorf("the upgraded connection is still the pool's: %d open, %d idle", open, idle)
	}
}

// TestNegotiated: offered h2 and http/1.1, an HTTP/1.1-only backend gets
// HTTP/1.1 through the pool — the request that learns it too, body and
// all — and the next ones directly (SpeaksH1Only); an h2 backend gets h2.
// A backend that must speak HTTP/2 but does not negotiate h2 is a protocol
// error, never HTTP/1.1.
func TestNegotiated(t *testing.T) {
	echoProto := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(rw, "%s %q", r.Proto, b)
	})
	h1 := newWorldServing(t, echoProto, true)
	be := h1.pools.Build(h1.snapshot(t, 1, h1.policy()), nil).Get(ref)
	rt := be.RoundTripper(WireNegotiate)
	for i := range 2 {
		// A pipe, as a streamed body: closing it would lose the data.
		pr, pw := io.Pipe()
		go func() {
			io.WriteString(pw, "data")
			pw.Close()
		}()
		if _, body := roundTrip(t, rt, request(t, context.Background(), be, http.MethodPost, "/", pr)); body != `HTTP/1.1 "data"` {
			t.Errorf("HTTP/1.1-only backend, request %d: %q", i, body)
		}
	}
	if !be.SpeaksH1Only(time.Now()) {
		t.Error("the backend's refusal of h2 was not remembered")
	}
	if n := h1.counter(t, "sockmesh_proxy_upstream_tls_handshakes_total", "full") + h1.counter(t, "sockmesh_proxy_upstream_tls_handshakes_total", "resumed"); n != 2 {
		t.Errorf("%v TLS handshakes, want 2: the one refused h2, and the pool's", n)
	}
	// A server without ALPN (one that knows http/1.1 alone refuses an
	// offer of h2 in the handshake: a 502 of another reason).
	noALPN := serveRawTLS(t, h1, true, func(c net.Conn) { io.Copy(io.Discard, c) })
	be = backendAt(t, h1.pools, noALPN, h1.policy())
	_, err := be.RoundTripper(WireH2).RoundTrip(request(t, context.Background(), be, http.MethodGet, "/", nil))
	if !errors.Is(err, ErrNotHTTP2) || Classify(err) != ReasonProtocol {
		t.Errorf("HTTP/2 required of a backend without ALPN: %v (reason %s), want ErrNotHTTP2", err, Classify(err))
	}

	h2 := newWorldServing(t, echoProto, false)
	be = h2.pools.Build(h2.snapshot(t, 1, h2.policy()), nil).Get(ref)
	if _, body := roundTrip(t, be.RoundTripper(WireNegotiate), request(t, context.Background(), be, http.MethodPost, "/", strings.NewReader("data"))); body != `HTTP/2.0 "data"` {
		t.Errorf("h2 backend: %q", body)
	}
}

// TestH2CAnsweredHTTP1InPieces: a cleartext backend declared HTTP/2 whose
// HTTP/1.1 answer's first bytes come apart from the rest (a segment of
// their own) fails the request as protocol (ErrNotHTTP2), as one whose
// answer comes whole does: the check judged the first read alone, and
// net/http's HTTP/2 Transport read the rest as a frame too large
// (upstream_error).
func TestH2CAnsweredHTTP1InPieces(t *testing.T) {
	w := newWorld(t)
	addr := serveRawTLS(t, w, false, func(c net.Conn) {
		if _, err := io.ReadFull(c, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		io.WriteString(c, "HTT")
		// The rest once the request came, which the Transport sends
		// while its reader waits on the first bytes.
		fr := http2.NewFramer(nil, c)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if f.Header().Type == http2.FrameHeaders {
				break
			}
		}
		io.WriteString(c, "P/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		io.Copy(io.Discard, c)
	})
	be := backendAt(t, w.pools, addr, nil)
	_, err := be.RoundTripper(WireH2).RoundTrip(request(t, context.Background(), be, http.MethodGet, "/", nil))
	if !errors.Is(err, ErrNotHTTP2) || Classify(err) != ReasonProtocol {
		t.Errorf("h2c backend answering HTTP/1.1 in pieces: %v (reason %s), want ErrNotHTTP2", err, Classify(err))
	}
}

// TestH2OverTLSAnsweredHTTP1: a TLS backend that negotiates h2 by ALPN and
// answers HTTP/1.1 (a TLS terminator offering h2 in front of an HTTP/1.1
// server) fails the request as protocol (ErrNotHTTP2), as an h2c one does:
// ALPN was trusted, and net/http's HTTP/2 Transport read the answer as a
// frame too large (upstream_error).
func TestH2OverTLSAnsweredHTTP1(t *testing.T) {
	w := newWorld(t)
	w.serverTLS.NextProtos = []string{http2.NextProtoTLS}
	addr := serveRawTLS(t, w, true, func(c net.Conn) {
		if _, err := io.ReadFull(c, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		io.Copy(io.Discard, c)
	})
	be := backendAt(t, w.pools, addr, w.policy())
	_, err := be.RoundTripper(WireH2).RoundTrip(request(t, context.Background(), be, http.MethodGet, "/", nil))
	if !errors.Is(err, ErrNotHTTP2) || Classify(err) != ReasonProtocol {
		t.Errorf("h2 backend over TLS answering HTTP/1.1: %v (reason %s), want ErrNotHTTP2", err, Classify(err))
	}
}

// TestH2CAnsweredHTTP1BeforeTheRequest: a cleartext backend declared
// HTTP/2 that answers HTTP/1.x at once may have its connection closed by
// net/http's reader before the first request takes it; that request fails
// as protocol all the same, not with net/http's "client conn could not be
// established" (upstream_error, as CI once saw: TestH2BackendAnswersHTTP1).
func TestH2CAnsweredHTTP1BeforeTheRequest(t *testing.T) {
	w := newWorld(t)
	closed := make(chan struct{})
	addr := serveRawTLS(t, w, false, func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		io.Copy(io.Discard, c)
		close(closed)
	})
	be := backendAt(t, w.pools, addr, nil)
	// The request takes its connection only once the reader closed it.
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) {
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Error("the connection was not closed")
		}
	}})
	_, err := be.RoundTripper(WireH2).RoundTrip(request(t, ctx, be, http.MethodGet, "/", nil))
	if !errors.Is(err, ErrNotHTTP2) || Classify(err) != ReasonProtocol {
		t.Errorf("h2c backend answering HTTP/1.1 before the request: %v (reason %s), want ErrNotHTTP2", err, Classify(err))
	}
}
