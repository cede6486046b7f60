package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// Interop on the HTTP/2, gRPC, WebSocket and TCP paths: real clients and
// servers doing what production apps and backends do at the edges —
// cancelling streams, exceeding deadlines, answering gRPC with plain HTTP,
// closing WebSockets from either side, half-closing and resetting TCP.

// hangGuard bounds every wait of these tests: it only turns a hang into a
// failure, no test measures time against it.
const hangGuard = 20 * time.Second

// waitFor receives from ch or fails t after hangGuard.
func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangGuard):
		t.Fatalf("%s: no result within %v", what, hangGuard)
		panic("unreachable")
	}
}

// serveLocal serves srv on loopback, over TLS when srv.TLSConfig is set,
// until the test ends.
func serveLocal(t *testing.T, srv *http.Server) netip.AddrPort {
	t.Helper()
	l := listenLocal(t)
	if srv.TLSConfig != nil {
		go srv.ServeTLS(l, "", "")
	} else {
		go srv.Serve(l)
	}
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).AddrPort()
}

// holdBackend answers /hold with one line and then holds the response
// open until the request is cancelled, which it reports on cancelled; any
// other path answers "ok". tlsCfg nil serves h2c and HTTP/1.1; h1Only
// narrows a TLS server to ALPN http/1.1.
func holdBackend(t *testing.T, tlsCfg *tls.Config, h1Only bool) (netip.AddrPort, <-chan string) {
	t.Helper()
	cancelled := make(chan string, 16)
	srv := &http.Server{Protocols: new(http.Protocols), TLSConfig: tlsCfg,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/hold" {
				io.WriteString(w, "ok")
				return
			}
			io.WriteString(w, "first\n")
			http.NewResponseController(w).Flush()
			<-r.Context().Done()
			cancelled <- r.URL.Query().Get("id")
		})}
	srv.Protocols.SetHTTP1(true)
	if tlsCfg == nil {
		srv.Protocols.SetUnencryptedHTTP2(true)
	} else {
		srv.Protocols.SetHTTP2(!h1Only)
	}
	return serveLocal(t, srv), cancelled
}

// TestInteropH2StreamCancel: an h2c app that cancels one stream mid-response
// (RST_STREAM) on the L7 path gets the backend request cancelled, while its
// other streams on the same connection carry on: to an HTTP/1.1-only TLS
// backend (translation) and to an h2 backend held on L7 by session
// persistence.
func TestInteropH2StreamCancel(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	h1Addr, h1Cancelled := holdBackend(t, serverTLS(e.pki.server), true)
	h2Addr, h2Cancelled := holdBackend(t, serverTLS(e.pki.server), false)
	vH1, vH2 := netip.MustParseAddrPort("10.96.40.1:80"), netip.MustParseAddrPort("10.96.40.2:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "h1", vip: vH1, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(h1Addr)}},
		service{name: "h2", vip: vH2, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, TLS: tlsPolicy(e), Endpoints: endpoints(h2Addr),
			SessionPersistence: &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "x-session"}}},
	))
	for name, c := range map[string]struct {
		dst       netip.AddrPort
		cancelled <-chan string
	}{"to-h1": {vH1, h1Cancelled}, "to-h2": {vH2, h2Cancelled}} {
		t.Run(name, func(t *testing.T) {
			cl := e.client(c.dst, true)
			open := func(id string) (context.CancelFunc, *bufio.Reader, io.Closer) {
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://svc.b.svc/hold?id="+id, nil)
				resp, err := cl.Do(req)
				if err != nil {
					t.Fatalf("open %s: %v", id, err)
				}
				br := bufio.NewReader(resp.Body)
				if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
					t.Fatalf("%s: first line %q, %v", id, line, err)
				}
				return cancel, br, resp.Body
			}
			cancelA, brA, bodyA := open("a")
			defer bodyA.Close()
			cancelB, _, bodyB := open("b")
			defer bodyB.Close()
			cancelA()
			if _, err := brA.ReadByte(); !errors.Is(err, context.Canceled) {
				t.Errorf("read after cancel: %v, want context.Canceled", err)
			}
			if got := waitFor(t, c.cancelled, "backend sees stream a cancelled"); got != "a" {
				t.Errorf("backend cancelled %q, want a", got)
			}
			// The connection and stream b are unaffected.
			for range 3 {
				resp, err := cl.Get("http://svc.b.svc/other")
				if err != nil {
					t.Fatalf("request after cancel: %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(b) != "ok" {
					t.Fatalf("request after cancel: %d %q", resp.StatusCode, b)
				}
			}
			select {
			case id := <-c.cancelled:
				t.Fatalf("stream %s cancelled at the backend, only a was", id)
			default:
			}
			cancelB()
			if got := waitFor(t, c.cancelled, "backend sees stream b cancelled"); got != "b" {
				t.Errorf("backend cancelled %q, want b", got)
			}
		})
	}
	// Each app used one connection for all its streams.
	if got := e.counter("sockmesh_proxy_connections_total", map[string]string{"path": "l7"}); got != 2 {
		t.Errorf("l7 connections = %v, want 2 (one per app)", got)
	}
}

// TestInteropH2LargeToH1: an h2c app's request with a header block larger
// than a frame (HEADERS + CONTINUATION) and a 32 MiB streamed body (flow
// control all the way) reaches an HTTP/1.1-only TLS backend intact.
func TestInteropH2LargeToH1(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	be := startEchoWith(t, echo.Config{Pod: "h1-0", TLS: serverTLS(e.pki.server), ALPN: echo.ALPNHTTP1})
	e.p.Update(buildSnapshot(t, 1, service{name: "h1", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(be.addr)}}))
	up := bytes.Repeat([]byte("0123456789abcdef"), 2<<20) // 32 MiB
	sum := sha256.Sum256(up)
	big := strings.Repeat("h", 40<<10)
	req, _ := http.NewRequest(http.MethodPost, "http://h1.b.svc/upload", io.MultiReader(bytes.NewReader(up)))
	for i := range 4 {
		req.Header.Set(fmt.Sprintf("X-Big-%d", i), big)
	}
	resp, err := e.client(vip, true).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep echo.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, decode: %v", resp.StatusCode, err)
	}
	if rep.Proto != "HTTP/1.1" || rep.BodyBytes != int64(len(up)) || rep.BodySHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("backend saw %s, %d bytes, sha %s; want HTTP/1.1, %d bytes, %x", rep.Proto, rep.BodyBytes, rep.BodySHA256, len(up), sum)
	}
	for i := range 4 {
		if got := rep.Headers.Get(fmt.Sprintf("X-Big-%d", i)); got != big {
			t.Errorf("X-Big-%d: backend saw %d bytes, want %d", i, len(got), len(big))
		}
	}
}

// TestInteropH2TLSVerifyFailure: an h2c app to a backend whose certificate
// fails verification reads a 502, whichever path the proxy tried first (an
// h2 backend is tried at L4 before the handshake fails) — never plaintext,
// never a hang.
func TestInteropH2TLSVerifyFailure(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	impostor := startEcho(t, "impostor", serverTLS(e.pki.otherSrv))
	vAuto, vH2 := netip.MustParseAddrPort("10.96.40.11:80"), netip.MustParseAddrPort("10.96.40.12:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "auto", vip: vAuto, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(impostor.addr)}},
		service{name: "h2", vip: vH2, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, TLS: tlsPolicy(e), Endpoints: endpoints(impostor.addr)}},
	))
	for _, dst := range []netip.AddrPort{vAuto, vH2} {
		resp, err := e.client(dst, true).Get("http://svc.b.svc/")
		if err != nil {
			t.Fatalf("%s: %v", dst, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || !bytes.Contains(b, []byte("tls_verify")) {
			t.Errorf("%s: %d %q, want 502 tls_verify", dst, resp.StatusCode, b)
		}
	}
}

// TestH2BackendAnswersHTTP1: a backend declared to speak HTTP/2 in
// cleartext (H2C, GRPC) that answers an h2c app's preface in HTTP/1.1 is a
// misconfiguration the app reads: each gRPC call fails UNAVAILABLE with
// "sockmesh: protocol", each h2c request gets 502 with the same body,
// counted under reason protocol and logged with the cause. Before, the relay passed the backend's
// HTTP/1.1 answer on: grpc-go failed reading the server preface, an h2c
// client read garbage, and nothing was logged or counted.
func TestH2BackendAnswersHTTP1(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	h1 := serveHTTP1Only(t)
	vGRPC, vH2C := netip.MustParseAddrPort("10.96.40.21:9000"), netip.MustParseAddrPort("10.96.40.22:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "grpc", vip: vGRPC, backend: snapshot.Backend{Protocol: snapshot.ProtocolGRPC, Endpoints: endpoints(h1)}},
		service{name: "h2c", vip: vH2C, backend: snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(h1)}},
	))
	protocol := map[string]string{"reason": string(upstream.ReasonProtocol)}

	cc := e.grpcClient(t, "grpc.b.svc:9000", vGRPC)
	defer cc.Close()
	// Each call names it: the first on a connection is told the relay's
	// check, which its next connection meets again.
	for i := range 2 {
		wantProtocolCall(t, cc, fmt.Sprintf("gRPC app, call %d", i))
	}
	if n := e.counter("sockmesh_proxy_request_failures_total", protocol); n != 2 {
		t.Errorf("failures counted as protocol after the gRPC calls: %v, want 2", n)
	}

	c := e.client(vH2C, true)
	for i := range 2 {
		wantProtocol502(t, c, "http://h2c.b.svc/", fmt.Sprintf("h2c app, request %d", i))
	}
	if n := e.counter("sockmesh_proxy_request_failures_total", protocol); n != 4 {
		t.Errorf("failures counted as protocol after the h2c requests: %v, want 4", n)
	}

	// An HTTP/1.1 app's requests are translated on the L7 path, whose
	// connects check the answer too.
	wantProtocol502(t, e.client(vH2C, false), "http://h2c.b.svc/", "HTTP/1.1 app")
	for _, svc := range []string{"grpc", "h2c"} {
		if !regexp.MustCompile(`"msg":"request failed".*"reason":"protocol".*answered HTTP/1.x to the HTTP/2 preface.*"service":"b/` + svc + `"`).MatchString(e.logs.String()) {
			t.Errorf("no line names %s's protocol mismatch; log:\n%s", svc, e.logs.String())
		}
	}
}

// TestH2BackendOverTLSAnswersHTTP1: a TLS backend declared HTTP/2 (GRPC)
// that negotiates h2 by ALPN and speaks HTTP/1.1 (a TLS terminator offering
// h2 in front of an HTTP/1.1 server) is told apart as an h2c one is: each
// gRPC call fails UNAVAILABLE "sockmesh: protocol", an HTTP/1.1 app's
// request (the L7 path) gets 502 with the same body, and the cause is
// logged. Before, ALPN was trusted: the relay passed the HTTP/1.1 answer
// on, and the L7 path failed as upstream_error (frame too large).
func TestH2BackendOverTLSAnswersHTTP1(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	h1 := serveHTTP1Only(t)
	// The TLS terminator in front of it, which offers h2.
	cfg := serverTLS(e.pki.server)
	cfg.NextProtos = []string{"h2"}
	l := listenLocal(t)
	tcpserve.Relay(t, tls.NewListener(l, cfg), h1.String())
	terminator := l.Addr().(*net.TCPAddr).AddrPort()
	vip := netip.MustParseAddrPort("10.96.40.23:9000")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "grpc", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: tlsPolicy(e), Endpoints: endpoints(terminator)}},
	))

	cc := e.grpcClient(t, "grpc.b.svc:9000", vip)
	defer cc.Close()
	for i := range 2 {
		wantProtocolCall(t, cc, fmt.Sprintf("gRPC app, call %d", i))
	}
	wantProtocol502(t, e.client(vip, false), "http://grpc.b.svc/", "HTTP/1.1 app")
	if n := e.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": string(upstream.ReasonProtocol)}); n != 3 {
		t.Errorf("failures counted as protocol: %v, want 3", n)
	}
	if !regexp.MustCompile(`"msg":"request failed".*"reason":"protocol".*answered HTTP/1.x to the HTTP/2 preface.*"service":"b/grpc"`).MatchString(e.logs.String()) {
		t.Errorf("no line names the protocol mismatch; log:\n%s", e.logs.String())
	}
}

// serveHTTP1Only serves HTTP/1.1 alone (a backend misdeclared HTTP/2).
func serveHTTP1Only(t *testing.T) netip.AddrPort {
	srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "HTTP/1.1 only")
	})}
	srv.Protocols.SetHTTP1(true)
	return serveLocal(t, srv)
}

// wantProtocolCall checks that a gRPC call through cc fails UNAVAILABLE
// "sockmesh: protocol".
func wantProtocolCall(t *testing.T, cc *grpc.ClientConn, what string) {
	t.Helper()
	err := cc.Invoke(context.Background(), echo.MethodUnary, wrapperspb.Bytes([]byte("ping")), new(wrapperspb.BytesValue))
	if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "sockmesh: protocol" {
		t.Errorf("%s: %v; want UNAVAILABLE, sockmesh: protocol", what, err)
	}
}

// wantProtocol502 checks that a GET of url through c gets 502 "sockmesh:
// protocol".
func wantProtocol502(t *testing.T, c *http.Client, url, what string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || string(b) != "sockmesh: protocol\n" {
		t.Errorf("%s: %d %q, want 502 sockmesh: protocol", what, resp.StatusCode, b)
	}
}

// The gRPC probe service: methods any gRPC server may have.
const (
	// probeServe streams three messages, then holds the stream until the
	// client's deadline or cancellation ends it; asked "fail", it ends
	// with probeCollect's status and trailers instead.
	probeServe = "/probe.P/Serve"
	// probeCollect reads the client's stream to its end, then fails with
	// FailedPrecondition, a message that needs percent-encoding, and
	// custom trailer metadata (text and binary).
	probeCollect = "/probe.P/Collect"
	// probeHold reads the client's stream without ever answering.
	probeHold = "/probe.P/Hold"
	// probeMessage is probeCollect's status message.
	probeMessage = "collected %d: ünïcödé 100%% \x01"
)

var probeBin = []byte{0, 1, 2, 0xff}

// startGRPCProbe runs the probe service (TLS with ALPN h2 when tlsCfg is
// set, else h2c); each call's end (its context error) is sent on ended.
func startGRPCProbe(t *testing.T, tlsCfg *tls.Config) (netip.AddrPort, <-chan error) {
	t.Helper()
	ended := make(chan error, 16)
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	opts = append(opts, grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(st)
		ctx := st.Context()
		switch method {
		case probeServe:
			in := new(wrapperspb.BytesValue)
			if err := st.RecvMsg(in); err != nil {
				return err
			}
			for i := range 3 {
				if err := st.SendMsg(wrapperspb.Bytes(fmt.Appendf(nil, "m%d", i))); err != nil {
					return err
				}
			}
			if string(in.Value) == "fail" {
				st.SetTrailer(metadata.Pairs("x-probe", "served", "x-probe-bin", string(probeBin)))
				return status.Errorf(codes.FailedPrecondition, probeMessage, 3)
			}
			<-ctx.Done()
			ended <- ctx.Err()
			return status.FromContextError(ctx.Err()).Err()
		case probeCollect:
			n := 0
			for {
				err := st.RecvMsg(new(wrapperspb.BytesValue))
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return err
				}
				n++
			}
			st.SetTrailer(metadata.Pairs("x-probe", "collected", "x-probe-bin", string(probeBin)))
			return status.Errorf(codes.FailedPrecondition, probeMessage, n)
		case probeHold:
			for {
				if err := st.RecvMsg(new(wrapperspb.BytesValue)); err != nil {
					ended <- ctx.Err()
					return err
				}
			}
		}
		return status.Error(codes.Unimplemented, method)
	}))
	srv := grpc.NewServer(opts...)
	l := listenLocal(t)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return l.Addr().(*net.TCPAddr).AddrPort(), ended
}

// plainHTTPBackend answers every request, gRPC included, with a plain
// HTTP status and no grpc-status: /…/NotFound gets 404, others 503, as a
// misrouted request or an overloaded non-gRPC server would.
func plainHTTPBackend(t *testing.T, tlsCfg *tls.Config) netip.AddrPort {
	t.Helper()
	srv := &http.Server{Protocols: new(http.Protocols), TLSConfig: tlsCfg,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			if strings.HasSuffix(r.URL.Path, "/NotFound") {
				http.NotFound(w, r)
				return
			}
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
		})}
	srv.Protocols.SetUnencryptedHTTP2(true)
	srv.Protocols.SetHTTP2(true)
	srv.Protocols.SetHTTP1(true)
	return serveLocal(t, srv)
}

// TestInteropGRPC: gRPC streaming calls whose deadline passes or that the
// app cancels end at the backend too; status codes, messages and custom
// trailer metadata arrive intact; a backend answering plain HTTP 404/503
// reaches the app as UNIMPLEMENTED/UNAVAILABLE (gRPC's HTTP-to-status
// mapping), not a hang. To XBackend GRPC TLS and h2c backends, on the L4
// path (an h2c app to a gRPC backend) and the L7 path (a GRPCRoute).
func TestInteropGRPC(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	m := &mesh{t: t}
	tlsAddr, tlsEnded := startGRPCProbe(t, serverTLS(e.pki.server))
	clearAddr, clearEnded := startGRPCProbe(t, nil)
	type target struct {
		dst   netip.AddrPort
		ended <-chan error
		path  string
	}
	targets := map[string]target{}
	n := 0
	add := func(name string, be snapshot.Backend, ended <-chan error) {
		ref := m.backend(name, be)
		for _, routed := range []bool{false, true} {
			n++
			v := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 41, byte(n)}), 9000)
			var rt *snapshot.RouteTable
			path := "l4"
			if be.TLS != nil {
				path = "l4_tls"
			}
			if routed {
				rt = producer(routeSet(snapshot.KindGRPCRoute, rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(ref)}}))
				path = "l7"
			}
			m.frontend(fmt.Sprintf("%s-%d", name, n), v, ref, rt)
			targets[name+"/"+path] = target{v, ended, path}
		}
	}
	add("grpc-tls", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: tlsPolicy(e), Endpoints: endpoints(tlsAddr)}, tlsEnded)
	add("grpc-h2c", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, Endpoints: endpoints(clearAddr)}, clearEnded)
	add("plain-tls", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: tlsPolicy(e), Endpoints: endpoints(plainHTTPBackend(t, serverTLS(e.pki.server)))}, nil)
	add("plain-h2c", snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(plainHTTPBackend(t, nil))}, nil)
	e.p.Update(m.snapshot(1))

	for name, tg := range targets {
		t.Run(name, func(t *testing.T) {
			before := e.counter("sockmesh_proxy_connections_total", map[string]string{"path": tg.path})
			cc := e.grpcClient(t, "svc.b.svc:9000", tg.dst)
			defer cc.Close()
			if tg.ended == nil {
				for method, want := range map[string]codes.Code{"/probe.P/NotFound": codes.Unimplemented, "/probe.P/Any": codes.Unavailable} {
					ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
					err := cc.Invoke(ctx, method, wrapperspb.Bytes([]byte("x")), new(wrapperspb.BytesValue))
					cancel()
					if status.Code(err) != want {
						t.Errorf("%s answered plain HTTP: %v, want %v", method, err, want)
					}
				}
				if got := e.counter("sockmesh_proxy_connections_total", map[string]string{"path": tg.path}); got != before+1 {
					t.Errorf("connections{path=%s} grew by %v, want 1", tg.path, got-before)
				}
				return
			}
			serve := &grpc.StreamDesc{ServerStreams: true}
			collect := &grpc.StreamDesc{ClientStreams: true}

			// Server streaming, cancelled by the app after three messages.
			ctx, cancel := context.WithCancel(context.Background())
			st, err := cc.NewStream(ctx, serve, probeServe)
			if err != nil {
				t.Fatal(err)
			}
			st.SendMsg(wrapperspb.Bytes(nil))
			st.CloseSend()
			for i := range 3 {
				got := new(wrapperspb.BytesValue)
				if err := st.RecvMsg(got); err != nil || string(got.Value) != fmt.Sprint("m", i) {
					t.Fatalf("message %d = %q, %v", i, got.Value, err)
				}
			}
			cancel()
			if err := st.RecvMsg(new(wrapperspb.BytesValue)); status.Code(err) != codes.Canceled {
				t.Errorf("after cancel: %v, want Canceled", err)
			}
			if err := waitFor(t, tg.ended, "backend sees the cancellation"); !errors.Is(err, context.Canceled) {
				t.Errorf("backend call ended with %v, want context.Canceled", err)
			}

			// Server streaming whose deadline passes while the backend
			// holds the stream: both ends see it end.
			ctx, cancel = context.WithTimeout(context.Background(), time.Second)
			st, err = cc.NewStream(ctx, serve, probeServe)
			if err != nil {
				t.Fatal(err)
			}
			st.SendMsg(wrapperspb.Bytes(nil))
			st.CloseSend()
			var recvErr error
			for recvErr == nil {
				recvErr = st.RecvMsg(new(wrapperspb.BytesValue))
			}
			cancel()
			if status.Code(recvErr) != codes.DeadlineExceeded {
				t.Errorf("server stream past its deadline: %v, want DeadlineExceeded", recvErr)
			}
			if err := waitFor(t, tg.ended, "backend sees the deadline"); err == nil {
				t.Errorf("backend call ended without a context error")
			}

			// Server streaming that fails after its messages: the status
			// and custom metadata come in trailers after DATA.
			ctx, cancel = context.WithTimeout(context.Background(), hangGuard)
			st, err = cc.NewStream(ctx, serve, probeServe)
			if err != nil {
				t.Fatal(err)
			}
			st.SendMsg(wrapperspb.Bytes([]byte("fail")))
			st.CloseSend()
			for recvErr = nil; recvErr == nil; {
				recvErr = st.RecvMsg(new(wrapperspb.BytesValue))
			}
			cancel()
			checkProbeStatus(t, recvErr, st.Trailer(), "served", 3)

			// Client streaming past its deadline.
			ctx, cancel = context.WithTimeout(context.Background(), time.Second)
			st, err = cc.NewStream(ctx, collect, probeHold)
			if err != nil {
				t.Fatal(err)
			}
			for range 5 {
				st.SendMsg(wrapperspb.Bytes([]byte("chunk")))
			}
			err = st.RecvMsg(new(wrapperspb.BytesValue))
			cancel()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Errorf("client stream past its deadline: %v, want DeadlineExceeded", err)
			}
			waitFor(t, tg.ended, "backend sees the client stream end")

			// Client streaming to its end: an error status with message
			// and trailers.
			ctx, cancel = context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			st, err = cc.NewStream(ctx, collect, probeCollect)
			if err != nil {
				t.Fatal(err)
			}
			for range 100 {
				if err := st.SendMsg(wrapperspb.Bytes(bytes.Repeat([]byte("z"), 1000))); err != nil {
					t.Fatal(err)
				}
			}
			st.CloseSend()
			err = st.RecvMsg(new(wrapperspb.BytesValue))
			checkProbeStatus(t, err, st.Trailer(), "collected", 100)
			if got := e.counter("sockmesh_proxy_connections_total", map[string]string{"path": tg.path}); got != before+1 {
				t.Errorf("connections{path=%s} grew by %v, want 1", tg.path, got-before)
			}
		})
	}
}

// checkProbeStatus checks the probe's failure: its code, its message for
// n messages, and its trailers (x-probe: want, and the binary one).
func checkProbeStatus(t *testing.T, err error, tr metadata.MD, want string, n int) {
	t.Helper()
	s := status.Convert(err)
	if s.Code() != codes.FailedPrecondition || s.Message() != fmt.Sprintf(probeMessage, n) {
		t.Errorf("status = %v, want FailedPrecondition %q", err, fmt.Sprintf(probeMessage, n))
	}
	if got := tr.Get("x-probe"); len(got) != 1 || got[0] != want {
		t.Errorf("trailer x-probe = %v, want %s", got, want)
	}
	if got := tr.Get("x-probe-bin"); len(got) != 1 || got[0] != string(probeBin) {
		t.Errorf("trailer x-probe-bin = %q, want %q", got, probeBin)
	}
}

// wsProbe is a WebSocket backend: /echo echoes every message (up to 64 MiB)
// and reports the close status the client sent; /close-first sends one
// message and closes with 4001 "backend-bye"; /crash sends one message and
// resets its connection, as a crashed backend does.
type wsProbe struct {
	addr   netip.AddrPort
	closed chan websocket.StatusCode
}

func startWSProbe(t *testing.T, tlsCfg *tls.Config) *wsProbe {
	t.Helper()
	p := &wsProbe{closed: make(chan websocket.StatusCode, 16)}
	// Cancelled at cleanup: srv.Close leaves hijacked connections open, and
	// a test that failed may have left a relay waiting on one.
	ctx, cancel := context.WithCancel(context.Background())
	srv := &http.Server{Protocols: new(http.Protocols), TLSConfig: tlsCfg,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/crash" {
				crashWebSocket(w, r)
				return
			}
			// A cookie of the backend's own in its handshake's answer.
			w.Header().Set("Set-Cookie", "probe=1")
			c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
			if err != nil {
				return
			}
			defer c.CloseNow()
			c.SetReadLimit(64 << 20)
			if r.URL.Path == "/close-first" {
				c.Write(ctx, websocket.MessageText, []byte("bye-soon"))
				c.Close(4001, "backend-bye")
				return
			}
			for {
				typ, msg, err := c.Read(ctx)
				if err != nil {
					p.closed <- websocket.CloseStatus(err)
					return
				}
				if err := c.Write(ctx, typ, msg); err != nil {
					return
				}
			}
		})}
	srv.Protocols.SetHTTP1(true) // WebSocket backends speak HTTP/1.1
	t.Cleanup(cancel)
	p.addr = serveLocal(t, srv)
	return p
}

// crashWebSocket accepts a WebSocket upgrade by hand (the library keeps
// the connection), sends "bye-soon" and resets the connection.
func crashWebSocket(w http.ResponseWriter, r *http.Request) {
	h := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(h[:]))
	brw.Write(append([]byte{0x80 | wsText, byte(len("bye-soon"))}, "bye-soon"...))
	brw.Flush()
	time.Sleep(50 * time.Millisecond) // the message goes ahead of the reset
	sockio.Reset(c)
}

// rawUpgrade opens an HTTP/1.1 WebSocket upgrade to path, byte for byte,
// and returns the connection, its reader after the 101, and the 101.
func rawUpgrade(t *testing.T, e *env, dst netip.AddrPort, path string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c := e.appConn(t, dst)
	io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: svc.b.svc\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	return c, br, resp
}

// testWSBackendCrash: a backend that resets an upgraded connection resets
// the app's too (HTTP/1.1), never ending it cleanly.
func testWSBackendCrash(t *testing.T, e *env, dst netip.AddrPort) {
	_, br, _ := rawUpgrade(t, e, dst, "/crash")
	if op, p, err := readWSFrame(br); err != nil || op != wsText || string(p) != "bye-soon" {
		t.Fatalf("first message op %#x %q, %v", op, p, err)
	}
	if _, err := io.ReadAll(br); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("after the backend's reset: %v, want a reset", err)
	}
}

// TestInteropWebSocket: large messages both ways, ping/pong, a close
// status reaching the backend, the backend closing first, and the app
// half-closing, for an HTTP/1.1 app (ws relayed at L4; wss, and ws held on
// L7, on the HTTP/1 fast path and on net/http's server) and an h2c app's
// RFC 8441 extended CONNECT to ws and wss.
func TestInteropWebSocket(t *testing.T) {
	checkNoLeaks(t)
	for _, path := range []proxy.HTTP1TLSPath{proxy.HTTP1TLSAuto, proxy.HTTP1TLSL7} {
		t.Run(fmt.Sprint("path=", path), func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: path})
			clear := startWSProbe(t, nil)
			secure := startWSProbe(t, serverTLS(e.pki.server))
			vWS, vWSS, vSticky := netip.MustParseAddrPort("10.96.42.1:80"), netip.MustParseAddrPort("10.96.42.2:80"), netip.MustParseAddrPort("10.96.42.3:80")
			e.p.Update(buildSnapshot(t, 1,
				service{name: "ws", vip: vWS, backend: snapshot.Backend{Protocol: snapshot.ProtocolWS, Endpoints: endpoints(clear.addr)}},
				service{name: "wss", vip: vWSS, backend: snapshot.Backend{Protocol: snapshot.ProtocolWSS, TLS: tlsPolicy(e), Endpoints: endpoints(secure.addr)}},
				// Session persistence keeps cleartext ws off the L4 path.
				service{name: "ws-sticky", vip: vSticky, backend: snapshot.Backend{Protocol: snapshot.ProtocolWS, Endpoints: endpoints(clear.addr),
					SessionPersistence: &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "x-session"}}},
			))
			for name, c := range map[string]struct {
				dst netip.AddrPort
				be  *wsProbe
			}{"ws": {vWS, clear}, "wss": {vWSS, secure}, "ws-sticky": {vSticky, clear}} {
				t.Run("upgrade/"+name, func(t *testing.T) { testWSUpgrade(t, e, c.dst, c.be) })
				t.Run("app-half-close/"+name, func(t *testing.T) { testWSAppHalfClose(t, e, c.dst, c.be) })
				t.Run("backend-crash/"+name, func(t *testing.T) { testWSBackendCrash(t, e, c.dst) })
			}
			if path == proxy.HTTP1TLSAuto {
				t.Run("extended-connect/ws", func(t *testing.T) { testWSExtendedConnect(t, e, vWS, clear) })
				t.Run("extended-connect/wss", func(t *testing.T) { testWSExtendedConnect(t, e, vWSS, secure) })
			}
		})
	}
}

func testWSUpgrade(t *testing.T, e *env, dst netip.AddrPort, be *wsProbe) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	dial := func(path string) *websocket.Conn {
		c, _, err := websocket.Dial(ctx, "ws://svc.b.svc"+path, &websocket.DialOptions{HTTPClient: e.client(dst, false)})
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadLimit(64 << 20)
		return c
	}
	c := dial("/echo")
	defer c.CloseNow()
	// A ping is answered while a large message travels both ways (the
	// reader goroutine handles the pong).
	msg := bytes.Repeat([]byte("ws-large-"), 1<<20) // 9 MiB
	echoed := make(chan error, 1)
	go func() {
		typ, got, err := c.Read(ctx)
		if err == nil && (typ != websocket.MessageBinary || !bytes.Equal(got, msg)) {
			err = fmt.Errorf("echo: %d bytes of type %v", len(got), typ)
		}
		echoed <- err
	}()
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	if err := c.Write(ctx, websocket.MessageBinary, msg); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(t, echoed, "large message echoed"); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(4002, "client-bye"); err != nil {
		t.Errorf("close: %v", err)
	}
	if got := waitFor(t, be.closed, "backend sees the close"); got != 4002 {
		t.Errorf("backend saw close status %v, want 4002", got)
	}

	c = dial("/close-first")
	defer c.CloseNow()
	if _, got, err := c.Read(ctx); err != nil || string(got) != "bye-soon" {
		t.Fatalf("first message %q, %v", got, err)
	}
	_, _, err := c.Read(ctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != 4001 || ce.Reason != "backend-bye" {
		t.Errorf("backend close reached the app as %v, want 4001 backend-bye", err)
	}
}

func closePayload(code uint16, reason string) []byte {
	return append(binary.BigEndian.AppendUint16(nil, code), reason...)
}

// testWSExtendedConnect: an h2c app's RFC 8441 WebSocket gets the fields
// of the backend's 101 on its 200 (a cookie the backend set: only the
// subprotocol and extensions went), pings, large messages both ways and
// closes from either side.
func testWSExtendedConnect(t *testing.T, e *env, dst netip.AddrPort, be *wsProbe) {
	open := func(path string) (*h2WS, net.Conn) {
		c, err := e.dial(dst)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return openH2WS(t, c, "svc.b.svc", path), c
	}
	s, _ := open("/echo")
	if got := s.header.Get("Set-Cookie"); got != "probe=1" {
		t.Errorf("the 200 came with Set-Cookie %q, want the backend's probe=1 (fields %v)", got, s.header)
	}
	if err := writeWSFrame(s, wsPing, []byte("p1")); err != nil {
		t.Fatal(err)
	}
	if op, p, err := readWSFrame(s); err != nil || op != wsPong || string(p) != "p1" {
		t.Fatalf("ping answered with op %#x %q, %v; want pong p1", op, p, err)
	}
	msg := bytes.Repeat([]byte("h2-large-"), 256<<10) // 2.25 MiB, beyond every window
	if err := writeWSFrame(s, wsBinary, msg); err != nil {
		t.Fatal(err)
	}
	if op, p, err := readWSFrame(s); err != nil || op != wsBinary || !bytes.Equal(p, msg) {
		t.Fatalf("echo: op %#x, %d bytes, %v; want %d bytes", op, len(p), err, len(msg))
	}
	// The app closes with a status; the backend sees it and answers the
	// close, then ends its connection: the app's stream must end too.
	if err := writeWSFrame(s, wsClose, closePayload(4002, "client-bye")); err != nil {
		t.Fatal(err)
	}
	if got := waitFor(t, be.closed, "backend sees the close"); got != 4002 {
		t.Errorf("backend saw close status %v, want 4002", got)
	}
	if op, p, err := readWSFrame(s); err != nil || op != wsClose || binary.BigEndian.Uint16(p) != 4002 {
		t.Errorf("close answered with op %#x %q, %v", op, p, err)
	}
	if _, err := s.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("after the close handshake: %v, want END_STREAM", err)
	}

	// The backend closes first: its close frame and then the end of its
	// connection reach the app as END_STREAM (RFC 8441 §5: an orderly TCP
	// close is END_STREAM), not as a stream left open.
	s, _ = open("/close-first")
	if op, p, err := readWSFrame(s); err != nil || op != wsText || string(p) != "bye-soon" {
		t.Fatalf("first message op %#x %q, %v", op, p, err)
	}
	op, p, err := readWSFrame(s)
	if err != nil || op != wsClose || binary.BigEndian.Uint16(p) != 4001 || string(p[2:]) != "backend-bye" {
		t.Fatalf("backend close reached the app as op %#x %q, %v; want close 4001 backend-bye", op, p, err)
	}
	if err := writeWSFrame(s, wsClose, p); err != nil { // the client's answer, RFC 6455 §5.5.1
		t.Fatal(err)
	}
	if _, err := s.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("after the backend closed: %v, want END_STREAM", err)
	}

	// The app ends its stream without a close frame (a TCP FIN): the
	// backend sees its connection end, and so the app its stream.
	s, _ = open("/echo")
	if err := s.fr.WriteData(s.id, true, nil); err != nil {
		t.Fatal(err)
	}
	if got := waitFor(t, be.closed, "backend sees the app's end"); got != -1 {
		t.Errorf("backend saw close status %v, want none (end of stream)", got)
	}
	if _, err := s.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("after the app's END_STREAM: %v, want END_STREAM", err)
	}

	// The backend resets its connection: the app's stream is reset
	// (RFC 8441 §5), not ended as if the backend had closed.
	s, _ = open("/crash")
	if op, p, err := readWSFrame(s); err != nil || op != wsText || string(p) != "bye-soon" {
		t.Fatalf("first message op %#x %q, %v", op, p, err)
	}
	if _, err := s.Read(make([]byte, 1)); err == nil || err == io.EOF || !strings.Contains(err.Error(), "stream reset") {
		t.Errorf("after the backend's reset: %v, want RST_STREAM", err)
	}
}

// TestExtendedConnectNotUpgraded: an h2c app's RFC 8441 WebSocket to a
// backend that does not upgrade gets the backend's refusal (403) as it
// came, but never a 2xx, which is RFC 8441's success: a backend answering
// 200 to everything (a single-page app's server) had the app take its
// page for an open WebSocket. A refusal whose body breaks off is a reset
// stream, never one that ended as if it were whole. An extended CONNECT
// for another protocol than WebSocket is refused (405).
func TestExtendedConnectNotUpgraded(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	addr := serveLocal(t, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/forbidden":
			http.Error(w, "no", http.StatusForbidden)
			return
		case "/broken":
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, "no, because")
			w.(http.Flusher).Flush()
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
			return
		}
		io.WriteString(w, "<html>index</html>")
	})})
	vip := netip.MustParseAddrPort("10.96.42.9:80")
	e.p.Update(buildSnapshot(t, 1, service{name: "web", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolWS, Endpoints: endpoints(addr)}}))
	for _, tc := range []struct{ protocol, path, want string }{
		{"websocket", "/forbidden", "403"}, {"websocket", "/", "502"},
		// Another protocol has no HTTP/1.1 Upgrade to bridge to: it went
		// to the backend as a CONNECT, whose 200 the app took for its
		// tunnel.
		{"connect-udp", "/", "405"},
	} {
		c, err := e.dial(vip)
		if err != nil {
			t.Fatal(err)
		}
		if s := connectH2WS(t, c, tc.protocol, "web.b.svc", tc.path); s.status != tc.want {
			t.Errorf("extended CONNECT (%s) to %s answered %s, want %s", tc.protocol, tc.path, s.status, tc.want)
		}
		c.Close()
	}
	c, err := e.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := connectH2WS(t, c, "websocket", "web.b.svc", "/broken")
	if _, err := io.ReadAll(s); s.status != "403" || err == nil {
		t.Errorf("a refusal cut short: %s, %v; want 403 and a reset", s.status, err)
	}
}

// TestH2RequestLineRefused: an HTTP/2 request whose :method is not a
// token (net/http's server takes any field value) is refused (400),
// never written into an HTTP/1.1 request line: "GET /admin" reached the
// backend as "GET /admin /a HTTP/1.1", whose target is not the one routed.
// Nor is a :path with a fragment, routed as "/admin%23x" where the
// backend reads "/admin".
func TestH2RequestLineRefused(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	be := startScripted(t, nil, func(*http.Request, int) (string, bool) { return okAnswer("ok"), false })
	e.p.Update(buildSnapshot(t, 1, service{name: "s", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(be.addr)}}))
	for _, c := range []struct{ method, path string }{{"GET /admin", "/a"}, {"G(E)T", "/a"}, {"GET", "/admin#x"}} {
		s := requestH2(t, e.appConn(t, vip), [][2]string{{":method", c.method}, {":scheme", "http"}, {":path", c.path}, {":authority", "s.b.svc"}}, true)
		if s.status != "400" {
			t.Errorf(":method %q :path %q answered %s, want 400", c.method, c.path, s.status)
		}
	}
	if n := be.conns.Load(); n != 0 {
		t.Errorf("the backend got %d connections, want none", n)
	}
}

// testWSAppHalfClose: an HTTP/1.1 app that half-closes an upgraded
// connection without a close frame: the backend sees the end, then the
// app.
func testWSAppHalfClose(t *testing.T, e *env, dst netip.AddrPort, be *wsProbe) {
	c, br, _ := rawUpgrade(t, e, dst, "/echo")
	c.(*net.TCPConn).CloseWrite()
	if got := waitFor(t, be.closed, "backend sees the app's end"); got != -1 {
		t.Errorf("backend saw close status %v, want none (end of stream)", got)
	}
	if _, err := io.ReadAll(br); err != nil {
		t.Errorf("app after its half-close: %v, want EOF", err)
	}
}

// TestInteropTCPHalfClose: opaque TCP with TLS origination when the
// backend ends its side first (close_notify and FIN) while the app keeps
// sending, and when the backend resets: the app sees the end or the reset,
// never a hang.
func TestInteropTCPHalfClose(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	type result struct {
		n   int64
		err error
	}
	got := make(chan result, 4)
	l := listenLocal(t)
	go func() {
		for {
			raw, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				c := tls.Server(raw, serverTLS(e.pki.server))
				defer c.Close()
				var mode [1]byte
				if _, err := io.ReadFull(c, mode[:]); err != nil {
					got <- result{err: err}
					return
				}
				switch mode[0] {
				case 'h': // half-close first, then read the rest
					io.WriteString(c, "greeting")
					c.CloseWrite()
					raw.(*net.TCPConn).CloseWrite()
					n, err := io.Copy(io.Discard, c)
					got <- result{n, err}
				case 'r': // reset once the app is sending
					io.ReadFull(c, make([]byte, 1000))
					raw.(*net.TCPConn).SetLinger(0)
					raw.Close()
				case 'p': // part of an answer, then a reset (a crash)
					io.WriteString(c, "partial")
					raw.(*net.TCPConn).SetLinger(0)
					raw.Close()
				}
			}()
		}
	}()
	tcpVIP := netip.MustParseAddrPort("10.96.43.1:5432")
	e.p.Update(buildSnapshot(t, 1, service{name: "db", vip: tcpVIP, backend: snapshot.Backend{
		Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e), Endpoints: endpoints(l.Addr().(*net.TCPAddr).AddrPort())}}))
	// dial opens an app connection that asks the backend for mode.
	dial := func(t *testing.T, mode byte) net.Conn {
		c := e.appConn(t, tcpVIP)
		if _, err := c.Write([]byte{mode}); err != nil {
			t.Fatal(err)
		}
		return c
	}

	t.Run("backend-half-closes-first", func(t *testing.T) {
		c := dial(t, 'h')
		b, err := io.ReadAll(c)
		if err != nil || string(b) != "greeting" {
			t.Fatalf("app read %q, %v; want greeting then EOF", b, err)
		}
		// The backend still reads: the app's bytes after the backend's
		// half-close all arrive.
		payload := bytes.Repeat([]byte("after-fin"), 100_000)
		if _, err := c.Write(payload); err != nil {
			t.Fatalf("write after the backend's half-close: %v", err)
		}
		c.(*net.TCPConn).CloseWrite()
		if r := waitFor(t, got, "backend reads to the app's end"); r.err != nil || r.n != int64(len(payload)) {
			t.Errorf("backend read %d bytes, %v; want %d", r.n, r.err, len(payload))
		}
	})
	t.Run("backend-resets", func(t *testing.T) {
		c := dial(t, 'r')
		go func() {
			for {
				if _, err := c.Write(make([]byte, 32<<10)); err != nil {
					return
				}
			}
		}()
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("app hung after the backend reset")
		}
	})
	// A backend that resets after part of an answer: the app must not
	// read a clean end, which it could take for a complete answer (a
	// close-delimited body), as the L7 path aborts such a response too.
	t.Run("backend-resets-mid-answer", func(t *testing.T) {
		c := dial(t, 'p')
		b, err := io.ReadAll(c)
		if !strings.HasPrefix("partial", string(b)) || !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("app read %q, %v; want a prefix of partial, then a reset", b, err)
		}
	})
}

// TestInteropShutdownForcesUpgraded: Shutdown whose context ends closes a
// WebSocket still open on net/http's server (hijacked, so the server's own
// Close leaves it alone) and returns, and the app sees its connection end.
func TestInteropShutdownForcesUpgraded(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{http1TLS: proxy.HTTP1TLSL7})
	be := startWSProbe(t, serverTLS(e.pki.server))
	e.p.Update(buildSnapshot(t, 1, service{name: "wss", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolWSS, TLS: tlsPolicy(e), Endpoints: endpoints(be.addr)}}))
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://wss.b.svc/echo", &websocket.DialOptions{HTTPClient: e.client(vip, false)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, got, err := c.Read(ctx); err != nil || string(got) != "hi" {
		t.Fatalf("echo %q, %v", got, err)
	}
	done := make(chan error, 1)
	forced, stop := context.WithCancel(context.Background())
	stop() // the drain is over at once: whatever is open is forced
	go func() { done <- e.p.Shutdown(forced) }()
	if err := waitFor(t, done, "shutdown returns"); !errors.Is(err, context.Canceled) {
		t.Errorf("shutdown = %v, want context.Canceled (forced)", err)
	}
	if _, _, err := c.Read(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("app read after shutdown: %v, want its connection ended", err)
	}
}

// startResetBackend runs an h2c gRPC backend at the frame level that ends
// every call as its metadata says: x-reset is an HTTP/2 error code for
// RST_STREAM, or "close" to drop the connection; x-reset-at "headers" does
// it before answering, otherwise after the answer's headers and one
// message. With x-reset-past-deadline it first lets the call's
// grpc-timeout pass, as gRPC servers reset with CANCEL at a deadline. A real gRPC server
// cannot be told which code to reset with.
func startResetBackend(t *testing.T) netip.AddrPort {
	t.Helper()
	return serveTCP(t, nil, serveResets)
}

func serveResets(c net.Conn) {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	msg, _ := proto.Marshal(wrapperspb.Bytes([]byte("m0")))
	serveFrames(c, func(fr *http2.Framer, f *http2.MetaHeadersFrame) bool {
		field := func(name string) string {
			for _, hf := range f.Fields {
				if hf.Name == name {
					return hf.Value
				}
			}
			return ""
		}
		if d, err := grpcTimeout(field("grpc-timeout")); err == nil && field("x-reset-past-deadline") != "" {
			time.Sleep(d + 50*time.Millisecond)
		}
		if field("x-reset-at") != "headers" {
			hb.Reset()
			enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
			enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: hb.Bytes(), EndHeaders: true})
			fr.WriteData(f.StreamID, false, append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg))), msg...))
		}
		code := field("x-reset")
		if code == "close" {
			return false
		}
		n, _ := strconv.Atoi(code)
		fr.WriteRSTStream(f.StreamID, http2.ErrCode(n))
		return true
	})
}

// serveFrames serves h2c on c at the frame level, for backends a real
// server cannot imitate: it settles SETTINGS and PING itself and hands
// each request's headers to onHeaders until that returns false or c ends.
func serveFrames(c net.Conn, onHeaders func(*http2.Framer, *http2.MetaHeadersFrame) bool) {
	if _, err := io.ReadFull(c, make([]byte, len(http2.ClientPreface))); err != nil {
		return
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.WriteSettings()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				fr.WritePing(true, f.Data)
			}
		case *http2.MetaHeadersFrame:
			if !onHeaders(fr, f) {
				return
			}
		}
	}
}

// grpcTimeout reads the grpc-timeout values gRPC clients send.
func grpcTimeout(v string) (time.Duration, error) {
	units := map[byte]time.Duration{'H': time.Hour, 'M': time.Minute, 'S': time.Second, 'm': time.Millisecond, 'u': time.Microsecond, 'n': time.Nanosecond}
	if v == "" || units[v[len(v)-1]] == 0 {
		return 0, fmt.Errorf("grpc-timeout %q", v)
	}
	n, err := strconv.Atoi(v[:len(v)-1])
	return time.Duration(n) * units[v[len(v)-1]], err
}

// TestInteropGRPCBackendResets: a backend that resets a call's stream (or
// drops its connection), before answering or after part of the answer,
// gives the app the status grpc-go's HTTP/2 error mapping gives a client
// connected to the backend — on the L4 path, where the reset itself
// crosses, and on the L7 path, where the proxy must say it in a status
// (its own reset could only be INTERNAL_ERROR). A CANCEL at the call's
// deadline is DEADLINE_EXCEEDED even to a client that does not watch the
// deadline itself.
func TestInteropGRPCBackendResets(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	m := &mesh{t: t}
	ref := m.backend("resets", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, Endpoints: endpoints(startResetBackend(t))})
	l4, l7 := netip.MustParseAddrPort("10.96.44.1:9000"), netip.MustParseAddrPort("10.96.44.2:9000")
	m.frontend("resets-l4", l4, ref, nil)
	m.frontend("resets-l7", l7, ref, producer(routeSet(snapshot.KindGRPCRoute, rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(ref)}})))
	e.p.Update(m.snapshot(1))

	// Every RST_STREAM code, as grpc-go reads it (on the L4 path it does
	// so itself, which checks this table), and codes HTTP/2 does not
	// define, which grpc-go reads as UNKNOWN.
	cases := map[string]codes.Code{"close": codes.Unavailable}
	for code, want := range map[http2.ErrCode]codes.Code{
		http2.ErrCodeNo: codes.Internal, http2.ErrCodeProtocol: codes.Internal, http2.ErrCodeInternal: codes.Internal,
		http2.ErrCodeFlowControl: codes.ResourceExhausted, http2.ErrCodeSettingsTimeout: codes.Internal,
		http2.ErrCodeStreamClosed: codes.Internal, http2.ErrCodeFrameSize: codes.Internal,
		http2.ErrCodeRefusedStream: codes.Unavailable, http2.ErrCodeCancel: codes.Canceled,
		http2.ErrCodeCompression: codes.Internal, http2.ErrCodeConnect: codes.Internal,
		http2.ErrCodeEnhanceYourCalm: codes.ResourceExhausted, http2.ErrCodeInadequateSecurity: codes.PermissionDenied,
		http2.ErrCodeHTTP11Required: codes.Internal, http2.ErrCodeHTTP11Required + 1: codes.Unknown, 0xdead: codes.Unknown,
	} {
		cases[fmt.Sprint(uint32(code))] = want
	}
	for path, dst := range map[string]netip.AddrPort{"l4": l4, "l7": l7} {
		t.Run(path, func(t *testing.T) {
			cc := e.grpcClient(t, "resets.b.svc:9000", dst)
			defer cc.Close()
			for reset, want := range cases {
				for _, at := range []string{"headers", "body"} {
					ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
					ctx = metadata.AppendToOutgoingContext(ctx, "x-reset", reset, "x-reset-at", at)
					st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, probeServe)
					if err == nil {
						st.SendMsg(wrapperspb.Bytes(nil))
						st.CloseSend()
						for err == nil {
							err = st.RecvMsg(new(wrapperspb.BytesValue))
						}
					}
					cancel()
					if status.Code(err) != want {
						t.Errorf("reset %s at %s: %v, want %v", reset, at, err, want)
					}
				}
			}
		})
	}

	// The app's client does not enforce the deadline it sent (grpc-timeout
	// 100 ms); the backend's CANCEL after it is DEADLINE_EXCEEDED.
	client := e.client(l7, true)
	for _, at := range []string{"headers", "body"} {
		req, _ := http.NewRequest(http.MethodPost, "http://resets.b.svc:9000"+probeServe, bytes.NewReader([]byte{0, 0, 0, 0, 0}))
		req.Header = http.Header{"Content-Type": {"application/grpc"}, "Te": {"trailers"}, "Grpc-Timeout": {"100m"},
			"X-Reset-Past-Deadline": {"1"},
			"X-Reset":               {fmt.Sprint(uint32(http2.ErrCodeCancel))}, "X-Reset-At": {at}}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		got := resp.Trailer.Get("Grpc-Status")
		if at == "headers" {
			got = resp.Header.Get("Grpc-Status") // trailers-only
		}
		if err != nil || got != fmt.Sprint(int(codes.DeadlineExceeded)) {
			t.Errorf("CANCEL at %s past the deadline: grpc-status %q (%v), want %d", at, got, err, codes.DeadlineExceeded)
		}
	}
}

// TestInteropShutdownForcesHungExchange: a forced shutdown ends a fast-path
// request waiting on a backend that never answers (closing the app's
// connection ends the exchange: the fast path watches an app whose
// exchange lasts), instead of waiting for the backend forever.
func TestInteropShutdownForcesHungExchange(t *testing.T) {
	checkNoLeaks(t)
	ie := newInteropEnv(t, interopPaths[0])
	b := startScripted(t, ie.serverTLS(), func(*http.Request, int) (string, bool) { return "", false })
	dst := ie.add(b.addr, "")
	ie.publish(t)
	c := ie.rawClient(t, dst)
	c.send("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
	for deadline := time.Now().Add(hangGuard); b.count(http.MethodGet, "/hang") == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the backend never got the request")
		}
	}
	done := make(chan error, 1)
	forced, stop := context.WithCancel(context.Background())
	stop()
	go func() { done <- ie.p.Shutdown(forced) }()
	if err := waitFor(t, done, "shutdown returns"); !errors.Is(err, context.Canceled) {
		t.Errorf("shutdown = %v, want context.Canceled (forced)", err)
	}
	if !c.closed() {
		t.Error("the app's connection is still open after the shutdown")
	}
}
