package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
)

// TestH2PingsFrozenBackend: an HTTP/2 connection to a backend that stops
// answering (frozen, or gone with its node, while its kernel or a middle
// box still takes the bytes) is pinged after H2PingAfter without frames,
// and closed after H2PingTimeout without the ping's answer: the request on
// it fails then, not when the app gives up, and the next one gets a new
// connection.
func TestH2PingsFrozenBackend(t *testing.T) {
	w := newWorld(t)
	addr, freeze := startFreezer(t, w.addr)
	pools, err := New(Config{H2PingAfter: 100 * time.Millisecond, H2PingTimeout: 200 * time.Millisecond},
		dial.NewDirect(dial.Config{Unmarked: true}), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	be := backendAt(t, pools, addr, w.policy())
	rt := be.RoundTripper(WireH2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, body := roundTrip(t, rt, request(t, ctx, be, http.MethodGet, "/", nil)); body != "HTTP/2.0" {
		t.Fatalf("first request: %q", body)
	}
	freeze()
	start := time.Now()
	_, err = rt.RoundTrip(request(t, ctx, be, http.MethodGet, "/", nil))
	if err == nil || ctx.Err() != nil {
		t.Fatalf("a request to the frozen backend: %v after %v, want the ping's failure", err, time.Since(start))
	}
	if _, body := roundTrip(t, rt, request(t, ctx, be, http.MethodGet, "/", nil)); body != "HTTP/2.0" {
		t.Errorf("the request after: %q", body)
	}
}

// TestH2TLSCloseToPeerNotReading: Close of an HTTP/2 connection over TLS
// whose backend stopped reading (its send buffer full, as net/http closes
// one whose ping went unanswered) returns, where tls.Conn's close_notify
// waited up to 5 s for room.
func TestH2TLSCloseToPeerNotReading(t *testing.T) {
	w := newWorld(t)
	stop := make(chan struct{})
	addr := serveRawTLS(t, w, true, func(c net.Conn) {
		c.(*tls.Conn).Handshake()
		<-stop // and reads nothing
	})
	t.Cleanup(func() { close(stop) }) // before serveRawTLS's, which waits for it
	tc, err := tls.Dial("tcp", addr.String(), &tls.Config{ServerName: sni, RootCAs: w.ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	// Fill both ends' buffers to the last byte, under the TLS (a write
	// that timed out breaks a tls.Conn for good): the last write of each
	// size times out.
	raw := tc.NetConn()
	for _, size := range []int{64 << 10, 1} {
		raw.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		for err = nil; err == nil; {
			_, err = raw.Write(make([]byte, size))
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- (&h2Checked{Conn: tc}).Close() }()
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Error("Close waits on a backend that stopped reading")
		<-closed
	}
}

// startFreezer relays TCP connections to target until freeze, after which
// the connections open then take bytes both ways and pass none on (a frozen
// peer whose kernel still acknowledges); later connections relay.
func startFreezer(t *testing.T, target netip.AddrPort) (netip.AddrPort, func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var flags []*atomic.Bool
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	pipe := func(dst, src net.Conn, frozen *atomic.Bool) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !frozen.Load() {
				dst.Write(buf[:n])
			}
			if err != nil {
				dst.Close()
				return
			}
		}
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target.String())
			if err != nil {
				c.Close()
				continue
			}
			f := new(atomic.Bool)
			mu.Lock()
			flags = append(flags, f)
			conns = append(conns, c, up)
			mu.Unlock()
			go pipe(up, c, f)
			go pipe(c, up, f)
		}
	}()
	freeze := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, f := range flags {
			f.Store(true)
		}
	}
	return l.Addr().(*net.TCPAddr).AddrPort(), freeze
}

// TestH2ProbeHandedBackWithoutDial: a request over net/http's HTTP/2
// Transport that holds an endpoint's probe and whose context ends before
// the Transport dials hands the probe back. Before, nothing did: the
// endpoint was passed over for probeWait (15 s).
func TestH2ProbeHandedBackWithoutDial(t *testing.T) {
	w := newWorld(t)
	b := backendAt(t, w.pools, w.addr, w.policy())
	h := w.pools.health
	long := time.Now().Add(-time.Hour)
	h.Failed(w.addr, long, long) // an ejection long over
	c := b.Picker.Pick()
	if c == nil || c.Endpoint.Addr != w.addr {
		t.Fatalf("picked %v, want %v", c, w.addr)
	}
	if n := h.Ejected(time.Now()); n != 1 {
		t.Fatalf("endpoints passed over with the probe out: %d, want 1", n)
	}
	ctx, cancel := context.WithCancel(WithEndpoint(t.Context(), c))
	cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+w.addr.String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := b.RoundTripper(WireH2).RoundTrip(req); err == nil {
		resp.Body.Close()
		t.Fatal("a request whose context had ended was answered")
	}
	if n := h.Ejected(time.Now()); n != 0 {
		t.Errorf("endpoints passed over after the request left undialed: %d, want 0", n)
	}
}

// TestH2KeepsWhatStillVerifies: when a backend's TLS settings change, an
// HTTP/2 connection of net/http's Transport stays if the new settings
// verify it, as relayed and pooled HTTP/1.1 connections do: a CA added
// beside the one that verified it (a CA rotation's first step) makes no
// new connection. One they no longer verify (that CA removed, the
// backend's certificate renewed under the new one) finishes its request
// under way, takes no other, and closes once it ends, counted as
// pool_dropped_total{reason="settings_changed"}. Any change built a new
// Transport: every connection to the backend was made again.
func TestH2KeepsWhatStillVerifies(t *testing.T) {
	w, release := newSlowWorld(t)
	next, err := pki.NewCA("next ca")
	if err != nil {
		t.Fatal(err)
	}
	roots := func(cas ...*pki.CA) *snapshot.TLS {
		p := w.policy()
		p.RootsPEM = ""
		for _, ca := range cas {
			p.RootsPEM += string(ca.CertPEM)
		}
		return p
	}
	get := func(s *Set, path string) *http.Response { return getH2(t, s.Get(ref), path) }
	dropped := func() float64 { return w.counter(t, "sockmesh_proxy_upstream_pool_dropped_total", "settings_changed") }

	s1 := w.pools.Build(w.snapshot(t, 1, roots(w.ca)), nil)
	get(s1, "/").Body.Close()
	s2 := w.pools.Build(w.snapshot(t, 2, roots(w.ca, next)), s1)
	get(s2, "/").Body.Close()
	if n := w.accepted.Load(); n != 1 {
		t.Fatalf("a CA added beside the one that verified the connection: %d connections to the backend, want the first only", n)
	}
	if n := dropped(); n != 0 {
		t.Errorf("pool_dropped_total{reason=settings_changed} = %v after a CA was added, want 0", n)
	}

	renewed, err := next.Issue(pki.LeafOptions{CommonName: "backend", DNSNames: []string{sni}})
	if err != nil {
		t.Fatal(err)
	}
	w.cert.Store(&renewed.TLS)
	slow := get(s2, "/slow")
	s3 := w.pools.Build(w.snapshot(t, 3, roots(next)), s2)
	t.Cleanup(s3.CloseIdle)
	if n := dropped(); n != 1 {
		t.Errorf("pool_dropped_total{reason=settings_changed} = %v after the CA that verified the connection was removed, want 1", n)
	}
	close(release)
	w.wantClosedAfter(t, slow, "the request under way when its connection's CA was removed")
	get(s3, "/").Body.Close()
	if n := w.accepted.Load(); n != 2 {
		t.Errorf("after the CA that verified the first connection was removed: %d connections to the backend, want a second", n)
	}
}

// newSlowWorld is a world whose backend answers /slow at once with its
// headers, and with its body once release is closed.
func newSlowWorld(t *testing.T) (w *world, release chan struct{}) {
	release = make(chan struct{})
	return newWorldServing(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			rw.WriteHeader(http.StatusOK)
			http.NewResponseController(rw).Flush()
			<-release
		}
		io.WriteString(rw, r.Proto)
	}), false), release
}

// getH2 sends GET path to be over HTTP/2 and returns the answer, its
// body unread.
func getH2(t *testing.T, be *Backend, path string) *http.Response {
	t.Helper()
	resp, err := be.RoundTripper(WireH2).RoundTrip(request(t, t.Context(), be, http.MethodGet, path, nil))
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp
}

// wantClosedAfter reads slow, an answer of w's backend, to its end, and
// wants its connection closed after it (a guard, not a measure: the
// Transport would close it 90 s later).
func (w *world) wantClosedAfter(t *testing.T, slow *http.Response, what string) {
	t.Helper()
	body, err := io.ReadAll(slow.Body)
	slow.Body.Close()
	if err != nil || string(body) != "HTTP/2.0" {
		t.Errorf("%s: %q, %v; want it answered", what, body, err)
	}
	select {
	case <-w.closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: its connection still open after it ended", what)
	}
}

// TestH2RetiredClosesOnceIdle: an HTTP/2 connection of net/http's
// Transport busy when a snapshot retired its wire (its backend left, or
// its protocol changed) closes once its last request ends, with no
// snapshot after; a protocol change counts it as
// pool_dropped_total{reason="settings_changed"}. The Transport kept it
// until its idle timeout, 90 s, after that request, unless a later
// snapshot came.
func TestH2RetiredClosesOnceIdle(t *testing.T) {
	for _, c := range []struct {
		name    string
		next    []snapshot.Backend
		counted float64
	}{
		{"backend gone", nil, 0},
		{"protocol changed", []snapshot.Backend{{Ref: ref, Protocol: snapshot.ProtocolHTTP2}}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, release := newSlowWorld(t)
			for i := range c.next {
				c.next[i].TLS, c.next[i].Endpoints = w.policy(), []snapshot.Endpoint{{Addr: w.addr, Ready: true}}
			}
			s1 := w.pools.Build(w.snapshot(t, 1, w.policy()), nil)
			slow := getH2(t, s1.Get(ref), "/slow")
			next, err := snapshot.New(2, nil, c.next, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.pools.Build(next, s1).CloseIdle)
			close(release)
			w.wantClosedAfter(t, slow, "the request under way when its wire was retired")
			if n := w.counter(t, "sockmesh_proxy_upstream_pool_dropped_total", "settings_changed"); n != c.counted {
				t.Errorf("pool_dropped_total{reason=settings_changed} = %v, want %v", n, c.counted)
			}
		})
	}
}

// TestH2PingsWithinGRPCPolicy: a gRPC server stream that idles for
// minutes (a watch between events) lives through the proxy's pings to its
// backend. gRPC servers take a ping sooner than 5 minutes after the last
// one, with no frame of theirs between, as a strike, and at the third
// strike send GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and close the
// connection (grpc-go's default keepalive.EnforcementPolicy, as gRPC
// core's and Java's): pinged every 30 s, the stream broke after about
// two minutes.
func TestH2PingsWithinGRPCPolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var pn pipenet.Net
		addr := netip.MustParseAddrPort("10.0.0.1:80")
		srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
			if err := st.SendMsg(wrapperspb.Bytes([]byte("first"))); err != nil {
				return err
			}
			select {
			case <-time.After(10 * time.Minute):
			case <-st.Context().Done():
				return st.Context().Err()
			}
			return st.SendMsg(wrapperspb.Bytes([]byte("second")))
		}))
		go srv.Serve(pipenet.Buffered(pn.Listen(addr)))
		defer srv.Stop()
		p, err := New(Config{}, &pn, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		be := backendAt(t, p, addr, nil)
		req := request(t, t.Context(), be, http.MethodPost, "/svc.S/Watch", bytes.NewReader([]byte{0, 0, 0, 0, 0}))
		req.Header = http.Header{"Content-Type": {"application/grpc"}, "Te": {"trailers"}}
		resp, body := roundTrip(t, be.RoundTripper(WireH2), req)
		if !strings.Contains(body, "second") || resp.Trailer.Get("Grpc-Status") != "0" {
			t.Errorf("the idle stream ended with %q, grpc-status %q %q; want both messages and status 0",
				body, resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message"))
		}
	})
}

// TestH2ColdBurstDialsOneAtATime: a burst of 150 requests to an endpoint
// that net/http's HTTP/2 Transport holds no connection to dials it one
// connection at a time, over TLS and h2c, and every request is answered.
// The Transport dialed once per request waiting for a connection and
// closed the extras once the first was up: a cold burst opened dozens at
// once, over TLS each a full handshake. (How many it opens in all is
// not 1: it puts no more than 100 requests on a connection before the
// backend's SETTINGS tell how many it takes, and may start a dial for a
// request after the connection that serves it came up.)
func TestH2ColdBurstDialsOneAtATime(t *testing.T) {
	for _, tls := range []bool{true, false} {
		t.Run(map[bool]string{true: "h2", false: "h2c"}[tls], func(t *testing.T) {
			pools, d := countingPools(t)
			w := newWorld(t)
			be := backendAt(t, pools, w.addr, w.policy())
			if !tls {
				addr, _ := startH2C(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, r.Proto) }), 0)
				be = backendAt(t, pools, addr, nil)
			}
			const n = 150
			for _, err := range burst(t, be, n) {
				if err != nil {
					t.Errorf("a request of the burst: %v", err)
				}
			}
			if most := d.most.Load(); most != 1 {
				t.Errorf("a cold burst of %d requests dialed the endpoint %d times at once, want once", n, most)
			}
		})
	}
}

// TestH2ColdBurstRefused: the requests of a cold burst to an endpoint
// that refuses connections, whose dials waited for one under way, fail as
// it did: refused.
func TestH2ColdBurstRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	pools, d := countingPools(t)
	be := backendAt(t, pools, l.Addr().(*net.TCPAddr).AddrPort(), nil)
	for _, err := range burst(t, be, 50) {
		if Classify(err) != ReasonRefused {
			t.Errorf("a request of the burst: %v (reason %s), want refused", err, Classify(err))
		}
	}
	if most := d.most.Load(); most != 1 {
		t.Errorf("a cold burst dialed the endpoint %d times at once, want once", most)
	}
}

// countingPools returns Pools that dial directly, through the
// dialCounter it returns.
func countingPools(t *testing.T) (*Pools, *dialCounter) {
	t.Helper()
	d := &dialCounter{Dialer: dial.NewDirect(dial.Config{Unmarked: true})}
	pools, err := New(Config{}, d, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return pools, d
}

// burst sends n GETs to be over HTTP/2 at once, reads their answers, and
// returns their errors.
func burst(t *testing.T, be *Backend, n int) []error {
	t.Helper()
	reqs := make([]*http.Request, n)
	for i := range reqs {
		reqs[i] = request(t, t.Context(), be, http.MethodGet, "/", nil)
	}
	rt := be.RoundTripper(WireH2)
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() {
			<-start
			resp, err := rt.RoundTrip(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// dialCounter is a dial.Dialer that records the most dials it had under
// way at once.
type dialCounter struct {
	dial.Dialer
	now, most atomic.Int32
}

func (d *dialCounter) Dial(ctx context.Context, ep snapshot.Endpoint) (net.Conn, error) {
	n := d.now.Add(1)
	defer d.now.Add(-1)
	for m := d.most.Load(); n > m; m = d.most.Load() {
		if d.most.CompareAndSwap(m, n) {
			break
		}
	}
	return d.Dialer.Dial(ctx, ep)
}

// TestH2ConnectsPastStreamLimit: connections to one endpoint are not
// capped: once those open take no more streams (the backend's
// MaxConcurrentStreams), the Transport opens another, and every request
// is answered — past MaxConnsPerEndpoint (the Transport's MaxConnsPerHost)
// too, so no request waits for a stream once a connection's SETTINGS are
// read (TestH2StreamWaitBounded: one that waits before).
func TestH2ConnectsPastStreamLimit(t *testing.T) {
	release := make(chan struct{})
	free := sync.OnceFunc(func() { close(release) })
	t.Cleanup(free)
	addr, accepted := startH2C(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.WriteHeader(http.StatusOK)
		http.NewResponseController(rw).Flush()
		<-release
		io.WriteString(rw, r.Proto)
	}), 10)
	pools, err := New(Config{MaxConnsPerEndpoint: 2}, dial.NewDirect(dial.Config{Unmarked: true}), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	be := backendAt(t, pools, addr, nil)
	rt := be.RoundTripper(WireH2)
	type answer struct {
		resp *http.Response
		err  error
	}
	var resps []*http.Response
	// In rounds of 10, each answered before the next starts: a round's
	// requests find the connections before it full, with the backend's
	// SETTINGS read (they come before any answer).
	for round := range 3 {
		answers := make(chan answer, 10)
		for range 10 {
			req := request(t, t.Context(), be, http.MethodGet, "/", nil)
			go func() {
				resp, err := rt.RoundTrip(req)
				answers <- answer{resp, err}
			}()
		}
		for range 10 {
			select {
			case a := <-answers:
				if a.err != nil {
					t.Fatalf("round %d: %v", round, a.err)
				}
				resps = append(resps, a.resp)
			case <-time.After(10 * time.Second): // a guard, not a measure
				t.Fatalf("round %d: a request unanswered while %d connections take 10 streams each", round, accepted.Load())
			}
		}
	}
	if n := accepted.Load(); n < 3 {
		t.Errorf("30 requests held open by a backend that takes 10 streams a connection: %d connections, want 3", n)
	}
	free()
	for _, resp := range resps {
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != "HTTP/2.0" {
			t.Errorf("a request held open: %q, %v; want it answered", body, err)
		}
	}
}

// startH2C serves h over h2c (HTTP/2 with prior knowledge) on loopback,
// at most streams requests at once on a connection (0: net/http's
// default), and counts its connections.
func startH2C(t testing.TB, h http.Handler, streams int) (netip.AddrPort, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := new(atomic.Int32)
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{MaxConcurrentStreams: streams},
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				accepted.Add(1)
			}
		}}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).AddrPort(), accepted
}

// TestH2DialedAcrossRetire: an HTTP/2 connection net/http's Transport was
// dialing when a snapshot retired its wire (its backend left) closes once
// the request it was dialed for ends, as one open at the swap does
// (TestH2RetiredClosesOnceIdle): the swap's GOAWAYs went to the
// connections open then, and the Transport kept this one until its idle
// timeout, 90 s, unless a later snapshot came.
func TestH2DialedAcrossRetire(t *testing.T) {
	w := newWorld(t)
	// A backend of the test's own, whose handshake waits for the swap.
	handshake, hold := make(chan struct{}), make(chan struct{})
	cfg := w.serverTLS.Clone()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		close(handshake)
		<-hold
		return nil, nil
	}
	srv := &http.Server{TLSConfig: cfg, Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, r.Proto) }),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed {
				w.closed <- struct{}{}
			}
		}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	w.addr = l.Addr().(*net.TCPAddr).AddrPort()

	s1 := w.pools.Build(w.snapshot(t, 1, w.policy()), nil)
	be := s1.Get(ref)
	req := request(t, t.Context(), be, http.MethodGet, "/", nil)
	got := make(chan *http.Response, 1)
	go func() {
		resp, err := be.RoundTripper(WireH2).RoundTrip(req)
		if err != nil {
			t.Errorf("GET /: %v", err)
		}
		got <- resp
	}()
	<-handshake
	gone, err := snapshot.New(2, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.pools.Build(gone, s1).CloseIdle)
	close(hold)
	resp := <-got
	if resp == nil {
		t.FailNow()
	}
	w.wantClosedAfter(t, resp, "the request whose connection was dialed across the swap")
}

// TestH2StreamWaitBounded: a request the Transport gave a new HTTP/2
// connection before the backend's SETTINGS lowered its stream limit, and
// which then waits there for a stream to end, fails pool_busy after
// ConnWait (10 s), as one waiting for an HTTP/1.1 connection does. Before,
// it waited as long as the connection's streams lasted — here, one never
// answered. Its error says that nothing of it was sent (ErrNotSent: a
// retry that fails so is not counted), the first's, ended after its
// HEADERS went, does not. The backend, a framer of its own, sends its
// SETTINGS (one stream at a time) only once the second request has the
// connection the first holds. In a synctest bubble, where 10 s are exact.
func TestH2StreamWaitBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var pn pipenet.Net
		addr := netip.MustParseAddrPort("10.0.0.1:8080")
		l := pn.Listen(addr)
		firstOpened, secondGot, applied := make(chan struct{}), make(chan struct{}), make(chan struct{})
		served := make(chan net.Conn, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				return
			}
			served <- c
			if _, err := io.ReadFull(c, make([]byte, len(http2.ClientPreface))); err != nil {
				return
			}
			fr := http2.NewFramer(c, c)
			go func() {
				<-secondGot
				fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1})
				fr.WriteSettingsAck()
			}()
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					return
				}
				switch f := f.(type) {
				case *http2.HeadersFrame:
					if f.StreamID == 1 {
						close(firstOpened) // and never answered
					}
				case *http2.SettingsFrame:
					if f.IsAck() {
						close(applied)
					}
				}
			}
		}()
		pools, err := New(Config{}, &pn, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		be := backendAt(t, pools, addr, nil)
		rt := be.RoundTripper(WireH2)

		ctx, cancel := context.WithCancel(t.Context())
		first := make(chan error, 1)
		go func() {
			_, err := rt.RoundTrip(request(t, ctx, be, http.MethodGet, "/first", nil))
			first <- err
		}()
		<-firstOpened
		var reused bool
		ctx2, cancel2 := context.WithTimeout(httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				reused = info.Reused
				close(secondGot)
				<-applied // the Transport took the limit in (it acknowledged it)
			},
		}), time.Minute) // a guard
		defer cancel2()
		start := time.Now()
		_, err = rt.RoundTrip(request(t, ctx2, be, http.MethodGet, "/second", nil))
		if !reused {
			t.Error("the second request was not given the first's connection")
		}
		if Classify(err) != ReasonPoolBusy || time.Since(start) != 10*time.Second {
			t.Errorf("a request waiting for a stream: %v (reason %s) after %v, want pool_busy after 10s", err, Classify(err), time.Since(start))
		}
		if !errors.Is(err, ErrNotSent) {
			t.Errorf("a request that got no stream: %v, want it ErrNotSent", err)
		}
		cancel()
		if err := <-first; err == nil || errors.Is(err, ErrNotSent) {
			t.Errorf("the request whose HEADERS went, then ended: %v, want an error that is not ErrNotSent", err)
		}
		(<-served).Close()
	})
}
