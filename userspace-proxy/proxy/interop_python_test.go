package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/test/echo"
)

// Interop with gRPC's C-core (grpcio) and Python's websockets on either
// side of the proxy, driven by testdata/interop.py (Debian's python3-grpcio,
// python3-protobuf and python3-websockets, which .ci/run installs).

// python returns Debian's interpreter once it has the modules the peers
// need, or skips (fails in CI).
func python(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3" // Debian's, where apt puts the modules
	if err := exec.Command(py, "-c", "import grpc, websockets, google.protobuf").Run(); err != nil {
		testenv.SkipOrFail(t, "%s with grpc, websockets and protobuf: %v (apt-get install python3-grpcio python3-protobuf python3-websockets)", py, err)
	}
	return py
}

// pythonEnv is a Python test's start: the interpreter, the proxy, and
// the test PKI's server certificate and key as files for Python servers.
func pythonEnv(t *testing.T) (py string, e *env, cert, key string) {
	t.Helper()
	py = python(t)
	checkNoLeaks(t)
	e = newEnv(t, envOptions{})
	cert, key, err := e.pki.server.WriteFiles(t.TempDir(), "server")
	if err != nil {
		t.Fatal(err)
	}
	return py, e, cert, key
}

// launchPeer starts interop.py and returns its stdin and stdout; the
// test's cleanup ends it, and logs its stderr if the test failed.
func launchPeer(t *testing.T, py string, args ...string) (io.WriteCloser, io.Reader) {
	t.Helper()
	cmd := exec.Command(py, append([]string{filepath.Join("testdata", "interop.py")}, args...)...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("interop.py %s:\n%s", args[0], stderr.String())
		}
	})
	return in, out
}

// startPeer runs interop.py as a server and returns the port it printed;
// the test's cleanup ends it.
func startPeer(t *testing.T, py string, args ...string) netip.AddrPort {
	t.Helper()
	_, out := launchPeer(t, py, args...)
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(l)
		io.Copy(io.Discard, out)
	}()
	select {
	case l := <-line:
		port, err := strconv.Atoi(l)
		if err != nil {
			t.Fatalf("interop.py %s printed %q, not a port", args[0], l)
		}
		return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
	case <-time.After(30 * time.Second):
		t.Fatalf("interop.py %s did not start within 30s", args[0])
		return netip.AddrPort{}
	}
}

// runPeer runs interop.py as a client and decodes the JSON it prints.
func runPeer(t *testing.T, py string, out any, args ...string) {
	t.Helper()
	b := runTool(t, py, append([]string{filepath.Join("testdata", "interop.py")}, args...)...)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("interop.py %s printed %q: %v", args[0], b, err)
	}
}

// TestInteropPythonGRPC: grpcio's client through the proxy to grpc-go's
// server (the echo backend), and grpc-go's client to grpcio's server, each
// over TLS origination: relayed (h2c app, h2 backend) and through a
// GRPCRoute (net/http's server and Transport). Messages, streaming,
// trailers and status codes cross unchanged; a fail-closed backend gives
// grpcio UNAVAILABLE naming the reason.
func TestInteropPythonGRPC(t *testing.T) {
	py, e, cert, key := pythonEnv(t)
	m := &mesh{t: t}
	goRef := m.backend("grpc-go", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: tlsPolicy(e),
		Endpoints: endpoints(startEcho(t, "grpc-go", serverTLS(e.pki.server)).addr)})
	pyRef := m.backend("grpc-py", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: tlsPolicy(e),
		Endpoints: endpoints(startPeer(t, py, "grpc-server", cert, key))})
	broken := m.backend("grpc-broken", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, Invalid: &snapshot.Invalid{
		Policy: snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: "b", Name: "broken"}, Reason: "NoValidCACertificate", Message: "no ca.crt"}})
	vips := map[string]netip.AddrPort{}
	front := func(name string, own snapshot.BackendRef, routed bool) {
		vips[name] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 7, byte(len(vips) + 1)}), 9000)
		var rt *snapshot.RouteTable
		if routed {
			rt = producer(routeSet(snapshot.KindGRPCRoute, rule{[]snapshot.RouteMatch{prefixMatch("/" + echo.EchoService)}, snapshot.RouteRule{Backends: to(own)}}))
		}
		m.frontend(name, vips[name], own, rt)
	}
	front("grpc-go", goRef, false)
	front("grpc-go-routed", goRef, true)
	front("grpc-py", pyRef, false)
	front("grpc-py-routed", pyRef, true)
	front("grpc-broken", broken, false)
	e.p.Update(m.snapshot(1))

	type result struct {
		Unary, UnaryTrailer, StreamTrailer, Code, Details string
		Stream                                            []bool
	}
	for _, svc := range []string{"grpc-go", "grpc-go-routed"} {
		t.Run("grpcio-client/"+svc, func(t *testing.T) {
			var r result
			runPeer(t, py, &r, "grpc-client", e.listenFor(vips[svc]), svc+".b.svc:9000")
			if r.Unary != "ping" || r.UnaryTrailer != "grpc-go" || len(r.Stream) != 20 || strings.Contains(fmt.Sprint(r.Stream), "false") ||
				r.StreamTrailer != "grpc-go" || r.Code != "UNIMPLEMENTED" {
				t.Errorf("got %+v; want the echoes, trailers %s=grpc-go, 20 stream replies, then UNIMPLEMENTED for Fail", r, echo.TrailerKey)
			}
		})
	}
	t.Run("grpcio-client/grpc-broken", func(t *testing.T) {
		var r result
		runPeer(t, py, &r, "grpc-client", e.listenFor(vips["grpc-broken"]), "grpc-broken.b.svc:9000")
		if r.Code != "UNAVAILABLE" || !strings.Contains(r.Details, "sockmesh: invalid_policy") {
			t.Errorf("got %+v; want UNAVAILABLE naming invalid_policy", r)
		}
	})
	for _, svc := range []string{"grpc-py", "grpc-py-routed"} {
		t.Run("grpc-go-client/"+svc, func(t *testing.T) {
			dst := vips[svc]
			cc := e.grpcClient(t, svc+".b.svc:9000", dst)
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var trailer metadata.MD
			out := new(wrapperspb.BytesValue)
			if err := cc.Invoke(ctx, echo.MethodUnary, wrapperspb.Bytes([]byte("ping")), out, grpc.Trailer(&trailer)); err != nil ||
				string(out.Value) != "ping" || fmt.Sprint(trailer.Get(echo.TrailerKey)) != "[python]" {
				t.Errorf("unary = %q, trailer %v, %v; want ping, %s=python", out.Value, trailer, err, echo.TrailerKey)
			}
			st, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, echo.MethodStream)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 50 {
				msg := fmt.Appendf(nil, "m%d", i)
				got := new(wrapperspb.BytesValue)
				if err := st.SendMsg(wrapperspb.Bytes(msg)); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
				if err := st.RecvMsg(got); err != nil || string(got.Value) != string(msg) {
					t.Fatalf("recv %d = %q, %v", i, got.Value, err)
				}
			}
			st.CloseSend()
			if err := st.RecvMsg(new(wrapperspb.BytesValue)); err != io.EOF || fmt.Sprint(st.Trailer().Get(echo.TrailerKey)) != "[python]" {
				t.Errorf("end of stream = %v, trailer %v; want EOF, %s=python", err, st.Trailer(), echo.TrailerKey)
			}
			err = cc.Invoke(ctx, "/"+echo.EchoService+"/Fail", wrapperspb.Bytes(nil), new(wrapperspb.BytesValue))
			if s, _ := status.FromError(err); s.Code() != codes.NotFound || s.Message() != "no such thing" {
				t.Errorf("Fail = %v; want NotFound: no such thing", err)
			}
		})
	}
}

// TestInteropPythonGRPCMoves: grpcio's channel, relayed to an endpoint
// that then stops being ready, takes the proxy's GOAWAY: its calls move to
// the ready pod. An idle C-core channel reads the GOAWAY only with its next
// call (still there, a second later too), which so goes to the old pod —
// serving while it terminates — and the call after it to the ready one.
func TestInteropPythonGRPCMoves(t *testing.T) {
	py, e, _, _ := pythonEnv(t)
	old, next := startEcho(t, "grpc-old", serverTLS(e.pki.server)), startEcho(t, "grpc-new", serverTLS(e.pki.server))
	vip := netip.MustParseAddrPort("10.96.7.20:9000")
	e.p.Update(buildSnapshot(t, 1, service{name: "grpc", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: tlsPolicy(e),
		Endpoints: endpoints(old.addr)}}))
	stdin, stdout := launchPeer(t, py, "grpc-move", e.listenFor(vip), "grpc.b.svc:9000")
	lines := json.NewDecoder(stdout)
	var r struct {
		First, Next string
		Calls       int
	}
	if err := lines.Decode(&r); err != nil || r.First != "grpc-old" {
		t.Fatalf("first call: %+v, %v; want grpc-old", r, err)
	}
	e.p.Update(buildSnapshot(t, 2, service{name: "grpc", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: tlsPolicy(e),
		Endpoints: replaced(old.addr, next.addr)}}))
	for deadline := time.Now().Add(10 * time.Second); e.counter("sockmesh_proxy_goaways_total", map[string]string{"reason": "endpoint_gone"}) != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no GOAWAY sent")
		}
	}
	io.WriteString(stdin, "go\n")
	if err := lines.Decode(&r); err != nil || r.Next != "grpc-new" || r.Calls > 2 {
		t.Fatalf("after the GOAWAY: %+v, %v; want grpc-new by the second call", r, err)
	}
}

// TestInteropPythonWebSocket: Python's websockets client through the
// proxy to the echo backend (ws relayed, wss originated, and through an
// HTTPRoute that rewrites the path and sends it to the wss backend), and
// Go's client to a websockets server over TLS (kubernetes.io/wss): text,
// a 1 MiB binary message, and a clean close.
func TestInteropPythonWebSocket(t *testing.T) {
	py, e, cert, key := pythonEnv(t)
	m := &mesh{t: t}
	ws := m.backend("ws", snapshot.Backend{Protocol: snapshot.ProtocolWS, Endpoints: endpoints(startEcho(t, "ws-0", nil).addr)})
	wss := m.backend("wss", snapshot.Backend{Protocol: snapshot.ProtocolWSS, TLS: tlsPolicy(e), Endpoints: endpoints(startEcho(t, "wss-0", serverTLS(e.pki.server)).addr)})
	wssPy := m.backend("wss-py", snapshot.Backend{Protocol: snapshot.ProtocolWSS, TLS: tlsPolicy(e), Endpoints: endpoints(startPeer(t, py, "wss-server", cert, key))})
	vips := map[string]netip.AddrPort{}
	front := func(name string, own snapshot.BackendRef, rt *snapshot.RouteTable) {
		vips[name] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 8, byte(len(vips) + 1)}), 80)
		m.frontend(name, vips[name], own, rt)
	}
	front("ws", ws, nil)
	front("wss", wss, nil)
	front("wss-py", wssPy, nil)
	front("ws-routed", ws, producer(routeSet(snapshot.KindHTTPRoute, rule{[]snapshot.RouteMatch{prefixMatch("/chat")}, snapshot.RouteRule{
		Backends: to(wss), Filters: snapshot.Filters{Rewrite: &snapshot.Rewrite{Path: &snapshot.PathModifier{Type: snapshot.ReplacePrefixMatch, Value: "/ws"}}}}})))
	e.p.Update(m.snapshot(1))
	for svc, path := range map[string]string{"ws": "/ws", "wss": "/ws", "ws-routed": "/chat"} {
		t.Run("websockets-client/"+svc, func(t *testing.T) {
			var r struct {
				Report       echo.Report
				Text, Binary bool
				CloseCode    int
			}
			runPeer(t, py, &r, "ws-client", e.listenFor(vips[svc]), "ws://"+svc+".b.svc"+path)
			if r.Report.Path != "/ws" || r.Report.Host != svc+".b.svc" || (r.Report.TLS != nil) != (svc != "ws") ||
				!r.Text || !r.Binary || r.CloseCode != int(websocket.StatusNormalClosure) {
				t.Errorf("got %+v; want the report of /ws (TLS but for ws), both echoes, close 1000", r)
			}
		})
	}
	t.Run("go-client/wss-py", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, "ws://wss-py.b.svc/chat", &websocket.DialOptions{HTTPClient: e.client(vips["wss-py"], false)})
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow()
		ws.SetReadLimit(-1)
		_, first, err := ws.Read(ctx)
		if err != nil || !strings.Contains(string(first), `"path": "/chat"`) || !strings.Contains(string(first), `"host": "wss-py.b.svc"`) {
			t.Fatalf("first message %s, %v; want the server's view of /chat on wss-py.b.svc", first, err)
		}
		blob := make([]byte, 1<<20)
		for i := range blob {
			blob[i] = byte(i)
		}
		for _, msg := range []struct {
			typ  websocket.MessageType
			data []byte
		}{{websocket.MessageText, []byte("hello")}, {websocket.MessageBinary, blob}} {
			if err := ws.Write(ctx, msg.typ, msg.data); err != nil {
				t.Fatal(err)
			}
			typ, got, err := ws.Read(ctx)
			if err != nil || typ != msg.typ || string(got) != string(msg.data) {
				t.Fatalf("echo of %d bytes: %d bytes, %v", len(msg.data), len(got), err)
			}
		}
		if err := ws.Close(websocket.StatusNormalClosure, ""); err != nil {
			t.Errorf("close: %v", err)
		}
	})
}
