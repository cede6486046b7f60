package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/leakcheck"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// soakSwaps is how many snapshots TestSoak swaps while traffic flows, each
// with a Service of its own name (soakRounds rounds of traffic per path).
const (
	soakSwaps  = 200
	soakRounds = 50
)

// TestSoak: a node proxy runs for months while snapshots swap many times a
// minute and apps open and close connections on every path. Under churn —
// endpoints scaled, ejected and back, a CA bundle rotated, route weights,
// retries, mirrors, timeouts and session persistence edited, a Service of a
// new name per snapshot — with traffic on every path at once (HTTP/1.1
// keep-alive and per-request, HTTP/1.1 to an h2 backend, h2c relayed, an
// HTTP/2 app on the L7 path, gRPC streams, WebSocket over HTTP/1.1 and
// over HTTP/2 (RFC 8441), MCP's server-sent events, an app's own TLS
// passed through, opaque TCP with and without TLS, connections through
// in-pod listeners of pods that come and go (the accept loop and its
// workers), requests cancelled midway, streams, WebSockets and TLS
// handshakes the app gives up, backends that reset or go away
// mid-stream), the proxy comes back to where it started once traffic stops
// and the last snapshot has no backend: no goroutine, descriptor,
// connection or copy buffer left, no endpoint held ejected, and no metric
// series of a Service or backend the current snapshot does not have.
func TestSoak(t *testing.T) {
	checkNoLeaks(t)
	proxy.SetWorkerIdle(t, 10*time.Millisecond) // idle workers end within the final wait
	// Each client's connections are counted (under a limit never reached).
	e := newEnv(t, envOptions{registeredDst: true, maxConnsPerClient: 1 << 20})
	tlsA, tlsB := startEcho(t, "tls-a", serverTLS(e.pki.server)), startEcho(t, "tls-b", serverTLS(e.pki.server))
	clearA, clearB := startEcho(t, "clear-a", nil), startEcho(t, "clear-b", nil)
	tcp, tcpTLS := startTCPEcho(t, nil), startTCPEcho(t, serverTLS(e.pki.server))
	resets := serveTCP(t, nil, func(c net.Conn) {
		c.Read(make([]byte, 1))
		sockio.Reset(c)
	})
	// Backends that go away mid-stream: a WebSocket's resets after its
	// first message (/crash), an event stream's is cut after its first
	// event.
	wsGone := startWSProbe(t, nil).addr
	cut := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "id: 0\ndata: {}\n\n")
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	})}
	cut.Protocols.SetHTTP1(true)
	cut.Protocols.SetUnencryptedHTTP2(true)
	sseGone := serveLocal(t, cut)
	vips := map[string]netip.AddrPort{}
	for i, name := range []string{"tls", "h2", "h2c", "grpc", "ws", "tcp", "tcptls", "front", "reset", "churn", "mcp", "mcp-gone", "ws-gone", "wss"} {
		vips[name] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 7, byte(i + 1)}), 80)
	}
	// The churned backends' refusing endpoints take turns: each holds its
	// port (closedPort) until the test ends, and the descriptors it leaves
	// must not grow with the swaps.
	var refusing [8]netip.AddrPort
	for i := range refusing {
		refusing[i] = closedPort(t)
	}
	// Each version rotates the CA bundle (the test CA alone, or with
	// another: new TLS settings, the same trust), scales endpoints and
	// edits routes; the churn VIP is a Service named for its version,
	// whose second endpoint refuses connections (ejected).
	snap := func(v int, churn bool) *snapshot.Snapshot {
		m := &mesh{t: t}
		pol := tlsPolicy(e)
		if v%2 == 1 {
			pol.RootsPEM += string(e.pki.other.CertPEM)
		}
		two := func(a, b *backend) []snapshot.Endpoint {
			if v%3 == 0 {
				return endpoints(a.addr)
			}
			return endpoints(a.addr, b.addr)
		}
		own := func(name string, be snapshot.Backend) {
			vip, ok := vips[name]
			if !ok {
				vip = vips["churn"]
			}
			m.frontend(name, vip, m.backend(name, be), nil)
		}
		own("tls", snapshot.Backend{TLS: pol, Endpoints: two(tlsA, tlsB), ClientIPAffinitySeconds: int32(v % 2 * 30)})
		own("h2", snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, TLS: pol, Endpoints: two(tlsB, tlsA)})
		own("h2c", snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: two(clearA, clearB)})
		own("grpc", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: pol, Endpoints: two(tlsA, tlsB)})
		own("ws", snapshot.Backend{Protocol: snapshot.ProtocolWS, Endpoints: two(clearB, clearA)})
		own("wss", snapshot.Backend{Protocol: snapshot.ProtocolWSS, TLS: pol, Endpoints: two(tlsA, tlsB)})
		own("tcp", snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(tcp)})
		own("tcptls", snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: pol, Endpoints: endpoints(tcpTLS)})
		own("reset", snapshot.Backend{Endpoints: endpoints(resets)})
		own("mcp", snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: two(clearA, clearB)})
		own("mcp-gone", snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: endpoints(sseGone)})
		own("ws-gone", snapshot.Backend{Protocol: snapshot.ProtocolWS, Endpoints: endpoints(wsGone)})
		v1 := m.backend("v1", snapshot.Backend{Endpoints: two(clearA, clearB), RetryConstraint: &snapshot.RetryConstraint{
			BudgetPercent: 20 + v%2, BudgetInterval: snapshot.Duration(10 * time.Second), MinRetryCount: 3, MinRetryInterval: snapshot.Duration(time.Second)}})
		v2 := m.backend("v2", snapshot.Backend{Endpoints: endpoints(clearB.addr)})
		r := snapshot.RouteRule{
			Backends: []snapshot.WeightedBackend{{Weight: uint32(v%3 + 1), Backend: v1}, {Weight: 1, Backend: v2}},
			Filters:  snapshot.Filters{Mirrors: []snapshot.Mirror{{Backend: v2, Numerator: uint32(v % 2), Denominator: 2}}},
			Timeouts: &snapshot.Timeouts{Request: dur(hangGuard + time.Duration(v%5)*time.Second)},
			Retry:    &snapshot.Retry{Attempts: v % 3, Codes: []int{503}},
		}
		if v%2 == 0 {
			r.SessionPersistence = &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "x-session"}
		}
		m.frontend("front", vips["front"], v2, producer(routeSet(snapshot.KindHTTPRoute, rule{[]snapshot.RouteMatch{prefixMatch("/")}, r})))
		if churn {
			own(fmt.Sprint("churn-", v), snapshot.Backend{Endpoints: endpoints(clearA.addr, refusing[v%len(refusing)])})
		}
		return m.snapshot(uint64(v))
	}
	e.p.Update(snap(0, true))
	// In-pod listeners, each of a pod of its own, served by the accept
	// loop and its workers.
	podServed := make(chan error, soakRounds)
	openPod := func(n int) net.Listener {
		l := listenLocal(t)
		go func() { podServed <- e.p.ServePod(l, snapshot.ObjectRef{Namespace: "a", Name: fmt.Sprint("pod-", n)}) }()
		return l
	}
	pods, podLn := 1, openPod(0)
	baseGoroutines, baseFDs := runtime.NumGoroutine(), leakcheck.OpenFDs(t)

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		served  = map[string]int{}
		failed  = map[string]error{} // the first error of each path
		paths   []string
		rounds  = make(chan struct{}, 64) // a round of a path ended
		version atomic.Int64
	)
	ok := func(path string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			served[path]++
		} else if failed[path] == nil {
			failed[path] = err
		}
	}
	getOK := func(c *http.Client, url string, hdr ...string) error {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s", resp.Status)
		}
		return nil
	}
	traffic := func(path string, round func(i int) error) {
		paths = append(paths, path)
		wg.Go(func() {
			for i := range soakRounds {
				ok(path, round(i))
				rounds <- struct{}{}
			}
		})
	}
	keepAlive := e.client(vips["tls"], false)
	traffic("http1-keepalive", func(int) error { return getOK(keepAlive, "http://tls.b.svc/") })
	perRequest := e.client(vips["tls"], false)
	perRequest.Transport.(*http.Transport).DisableKeepAlives = true
	traffic("http1-per-request", func(int) error { return getOK(perRequest, "http://tls.b.svc/") })
	toH2 := e.client(vips["h2"], false)
	traffic("http1-to-h2", func(int) error { return getOK(toH2, "http://h2.b.svc/") })
	traffic("h2c-relayed", func(i int) error {
		c := e.client(vips["h2c"], true) // a connection per round
		defer c.Transport.(*http.Transport).CloseIdleConnections()
		return getOK(c, "http://h2c.b.svc/")
	})
	routed, routedH1 := e.client(vips["front"], true), e.client(vips["front"], false)
	traffic("h2-routed", func(i int) error { return getOK(routed, "http://front.b.svc/", "x-session", fmt.Sprint(i%3)) })
	traffic("http1-routed", func(i int) error { return getOK(routedH1, "http://front.b.svc/") })
	traffic("grpc-stream", func(i int) error {
		cc, err := grpc.NewClient("passthrough:///grpc.b.svc:80", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return e.dial(vips["grpc"]) }))
		if err != nil {
			return err
		}
		defer cc.Close()
		st, err := cc.NewStream(context.Background(), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, echo.MethodStream)
		if err != nil {
			return err
		}
		for j := range 3 {
			msg := wrapperspb.Bytes(fmt.Appendf(nil, "m%d", j))
			got := new(wrapperspb.BytesValue)
			if err := st.SendMsg(msg); err != nil {
				return err
			}
			if err := st.RecvMsg(got); err != nil {
				return err
			}
		}
		if i%2 == 0 {
			return nil // left open: cc.Close cancels the stream
		}
		st.CloseSend()
		if err := st.RecvMsg(new(wrapperspb.BytesValue)); err != io.EOF {
			return fmt.Errorf("end of stream: %v", err)
		}
		return nil
	})
	// WebSockets relayed (ws) and on the HTTP/1 fast path (wss), half of
	// them given up.
	wsClients := []*http.Client{e.client(vips["ws"], false), e.client(vips["wss"], false)}
	traffic("websocket", func(i int) error {
		ctx := context.Background()
		c, _, err := websocket.Dial(ctx, "ws://ws.b.svc/ws", &websocket.DialOptions{HTTPClient: wsClients[i/2%2]})
		if err != nil {
			return err
		}
		defer c.CloseNow()
		if _, _, err := c.Read(ctx); err != nil { // the backend's report
			return err
		}
		if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
			return err
		}
		if _, got, err := c.Read(ctx); err != nil || string(got) != "hi" {
			return fmt.Errorf("echo %q: %v", got, err)
		}
		if i%2 == 1 {
			return nil // given up: closed without a closing handshake
		}
		return c.Close(websocket.StatusNormalClosure, "")
	})
	// Over HTTP/2, the app's connection closes with the stream open.
	traffic("websocket-h2", func(i int) error { return wsOverH2(e, vips[[]string{"ws", "wss"}[i%2]]) })
	wsGoneClient := e.client(vips["ws-gone"], false)
	traffic("websocket-backend-gone", func(i int) error {
		var msgs func() (string, error)
		if i%2 == 0 {
			ctx := context.Background()
			c, _, err := websocket.Dial(ctx, "ws://ws-gone.b.svc/crash", &websocket.DialOptions{HTTPClient: wsGoneClient})
			if err != nil {
				return err
			}
			defer c.CloseNow()
			msgs = func() (string, error) { _, m, err := c.Read(ctx); return string(m), err }
		} else {
			c, err := e.dial(vips["ws-gone"])
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := startH2WS(c, "ws-gone.b.svc", "/crash")
			if err != nil {
				return err
			}
			msgs = func() (string, error) { _, m, err := readWSFrame(st); return string(m), err }
		}
		if m, err := msgs(); err != nil || m != "bye-soon" {
			return fmt.Errorf("first message %q: %v", m, err)
		}
		if m, err := msgs(); err == nil {
			return fmt.Errorf("a message %q after the backend's reset", m)
		}
		return nil
	})
	// MCP's event streams, from HTTP/1.1 and HTTP/2 apps: one in three
	// runs to its end, one in six ends with its HTTP/2 app's connection,
	// the others stay open (across swaps) until the app gives them up a
	// round later.
	sseClients := []*http.Client{e.client(vips["mcp"], false), e.client(vips["mcp"], true)}
	firstEvent := func(c *http.Client, url string) (*bufio.Reader, context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := c.Do(req)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s", resp.Status)
		}
		if err != nil {
			cancel()
			return nil, nil, err
		}
		r := bufio.NewReader(resp.Body)
		if line, err := r.ReadString('\n'); err != nil || line != "id: 0\n" {
			cancel()
			return nil, nil, fmt.Errorf("first event %q: %v", line, err)
		}
		return r, cancel, nil
	}
	giveUp := func() {}
	traffic("sse", func(i int) error {
		c := sseClients[i%2]
		if i%3 == 0 {
			r, cancel, err := firstEvent(c, "http://mcp.b.svc/sse?n=3&interval=1ms")
			if err != nil {
				return err
			}
			defer cancel()
			if rest, err := io.ReadAll(r); err != nil || !strings.Contains(string(rest), "id: 2\n") {
				return fmt.Errorf("rest of the stream %q: %v", rest, err)
			}
			return nil
		}
		if i%6 == 5 {
			c, err := e.dial(vips["mcp"])
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := startH2(c, [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", "/sse?n=2&interval=1h"}, {":authority", "mcp.b.svc"}}, true)
			if err != nil {
				return err
			}
			if line, err := bufio.NewReader(st).ReadString('\n'); st.status != "200" || line != "id: 0\n" {
				return fmt.Errorf("%s, first event %q: %v", st.status, line, err)
			}
			return nil
		}
		_, cancel, err := firstEvent(c, "http://mcp.b.svc/sse?n=2&interval=1h")
		if err != nil {
			return err
		}
		giveUp()
		giveUp = cancel
		return nil
	})
	sseGoneClients := []*http.Client{e.client(vips["mcp-gone"], false), e.client(vips["mcp-gone"], true)}
	traffic("sse-backend-gone", func(i int) error {
		r, cancel, err := firstEvent(sseGoneClients[i%2], "http://mcp-gone.b.svc/sse")
		if err != nil {
			return err
		}
		defer cancel()
		if _, err := io.ReadAll(r); err == nil {
			return fmt.Errorf("a stream its backend cut ended as if whole")
		}
		return nil
	})
	// The app's own TLS, passed through: one in four requests, the
	// others handshakes the app gives up, within its ClientHello's record
	// or once it is sent, or the backend does (it resets).
	appTLS := &tls.Config{ServerName: sniName, RootCAs: e.pki.ca.Pool(), NextProtos: []string{"http/1.1"}}
	passthrough := e.client(vips["tls"], false)
	passthrough.Transport.(*http.Transport).DialTLSContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		c, err := e.dial(vips["tls"])
		if err != nil {
			return nil, err
		}
		tc := tls.Client(c, appTLS)
		return tc, tc.HandshakeContext(ctx)
	}
	traffic("passthrough", func(i int) error {
		if i%4 == 0 {
			return getOK(passthrough, "https://tls.b.svc/")
		}
		dst, app := vips["tls"], func(c net.Conn) net.Conn { return givesUp{c, []int{10, 1 << 16}[i%4-1]} }
		if i%4 == 3 {
			dst, app = vips["reset"], func(c net.Conn) net.Conn { return c }
		}
		c, err := e.dial(dst)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := tls.Client(app(c), appTLS).Handshake(); err == nil {
			return errors.New("a handshake given up completed")
		}
		return nil
	})
	// Through in-pod listeners: every fifth round the pod before goes
	// away (its listener closes; its keep-alive connections are served
	// on) and another comes.
	podClient := func(name string, h2c bool) *http.Client {
		c := e.client(vips[name], h2c)
		c.Transport.(*http.Transport).DialContext = func(context.Context, string, string) (net.Conn, error) {
			return e.dialVia(podLn, net.Dialer{}, vips[name], nil)
		}
		return c
	}
	podH1, podH2C := podClient("tls", false), podClient("h2c", true)
	traffic("in-pod", func(i int) error {
		if i > 0 && i%5 == 0 {
			podLn.Close()
			podLn = openPod(pods)
			pods++
		}
		if i%2 == 0 {
			return getOK(podH1, "http://tls.b.svc/")
		}
		return getOK(podH2C, "http://h2c.b.svc/")
	})
	for _, name := range []string{"tcp", "tcptls"} {
		traffic(name, func(int) error { return echoTCP(e, vips[name]) })
	}
	traffic("canceled", func(i int) error {
		// An answer too large to come whole, given up midway.
		c := []*http.Client{keepAlive, routed, toH2}[i%3]
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://x.b.svc/bytes/100000000", nil)
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadFull(resp.Body, make([]byte, 64<<10))
		return err
	})
	resetClient := e.client(vips["reset"], false)
	traffic("reset", func(int) error {
		// Relayed, the backend's reset reaches the app as one.
		if err := getOK(resetClient, "http://reset.b.svc/"); err == nil {
			return fmt.Errorf("a backend's reset answered 200")
		}
		return nil
	})
	churn := e.client(vips["churn"], false)
	traffic("churn", func(int) error { return getOK(churn, fmt.Sprint("http://churn-", version.Load(), ".b.svc/")) })
	// Swaps spread over the traffic: those due by the share of rounds
	// the paths together served.
	total := len(paths) * soakRounds
	wg.Go(func() {
		v := 0
		for n := 1; n <= total; n++ {
			<-rounds
			for ; v < soakSwaps && (v+1)*total <= n*soakSwaps; v++ {
				version.Store(int64(v + 1))
				e.p.Update(snap(v+1, true))
			}
		}
	})
	wg.Wait()
	giveUp()
	podLn.Close()
	for range pods {
		if err := <-podServed; !errors.Is(err, net.ErrClosed) {
			t.Errorf("ServePod on a closed listener = %v, want net.ErrClosed", err)
		}
	}
	clients := append([]*http.Client{keepAlive, perRequest, toH2, routed, routedH1, wsGoneClient, resetClient, churn, passthrough, podH1, podH2C},
		slices.Concat(wsClients, sseClients, sseGoneClients)...)
	t.Logf("served per path over %d swaps: %v; first failures: %v", soakSwaps, served, failed)
	for _, path := range paths {
		if served[path] == 0 {
			t.Errorf("no round of %s succeeded", path)
		}
	}

	// The apps close their connections once idle: a stream given up
	// last leaves its connection a moment later.
	eventually(t, func() bool {
		for _, c := range clients {
			c.Transport.(*http.Transport).CloseIdleConnections()
		}
		return e.counter("sockmesh_proxy_active_connections", nil) == 0
	}, "the apps' connections to end")
	// The Services and backends of the last snapshot are the only ones
	// metrics name.
	last := snap(soakSwaps+1, false)
	e.p.Update(last)
	current := map[string]bool{}
	for _, f := range last.Frontends {
		current[f.Service.Name] = true
	}
	for _, b := range last.Backends {
		current[b.Ref.Name] = true
	}
	var gone []string
	for name, metrics := range seriesNames(t, e.reg) {
		if !current[name] {
			gone = append(gone, fmt.Sprint(name, metrics))
		}
	}
	if len(gone) > 0 {
		t.Errorf("metric series name %d Services or backends gone from the snapshot, as %v", len(gone), gone[:min(len(gone), 3)])
	}
	// Without backends, every upstream connection closes; what served the
	// apps' connections ends with them.
	e.p.Update(buildSnapshot(t, soakSwaps+2))
	var left string
	defer func() {
		if left != "" {
			t.Logf("left over:%s", left)
		}
	}()
	eventually(t, func() bool {
		left = ""
		for _, g := range []string{"sockmesh_proxy_active_connections", "sockmesh_proxy_upstream_connections",
			"sockmesh_proxy_copy_buffers_in_use", "sockmesh_proxy_upstream_endpoints_ejected"} {
			if n := e.counter(g, nil); n != 0 {
				left += fmt.Sprintf(" %s %v", g, n)
			}
		}
		if n := proxy.RelayedH2(e.p); n != 0 {
			left += fmt.Sprintf(" relayed HTTP/2 connections registered %d", n)
		}
		if held, counted := proxy.Held(e.p); held+counted != 0 {
			left += fmt.Sprintf(" connections held for Shutdown %d, clients counted %d", held, counted)
		}
		if n := runtime.NumGoroutine(); n > baseGoroutines {
			left += fmt.Sprintf(" goroutines %d (baseline %d)", n, baseGoroutines)
		}
		if n := leakcheck.OpenFDs(t); n > baseFDs {
			left += fmt.Sprintf(" file descriptors %d (baseline %d)", n, baseFDs)
		}
		return left == ""
	}, "the proxy to come back to its baseline")
}

// givesUp is an app that gives up its TLS handshake: of its first write
// (the ClientHello) n bytes go out, and it closes the connection.
type givesUp struct {
	net.Conn
	n int
}

func (g givesUp) Write(b []byte) (int, error) {
	g.Conn.Write(b[:min(len(b), g.n)])
	g.Conn.Close()
	return len(b), nil
}
