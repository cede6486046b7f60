package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/net/http2"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/relay"
)

// TestWebSocketOverH2: a WebSocket toward a backend that declared HTTP/2
// — an h2c-only XBackend H2C, an h2-only XBackend HTTP2 over TLS — goes as
// an RFC 8441 extended CONNECT, opened by an HTTP/1.1 app's Upgrade (on
// the fast path and net/http's) and by an HTTP/2 app's extended CONNECT,
// under a route (which an HTTP/2 app's connection needs to be served
// rather than relayed to an h2c backend as it is) whose response header
// change reaches the 101 and the 200: messages cross both ways, one
// larger than every flow-control window among them, and the close
// handshake ends both sides cleanly. An HTTP/1.1 Upgrade, as sent before,
// reached neither backend.
func TestWebSocketOverH2(t *testing.T) {
	checkNoLeaks(t)
	for name, path := range map[string]proxy.HTTP1TLSPath{"fast": proxy.HTTP1TLSAuto, "nethttp": proxy.HTTP1TLSL7} {
		t.Run(name, func(t *testing.T) { testWebSocketOverH2(t, path) })
	}
}

func testWebSocketOverH2(t *testing.T, path proxy.HTTP1TLSPath) {
	e := newEnv(t, envOptions{http1TLS: path})
	vH2C, vH2 := netip.MustParseAddrPort("10.96.3.3:80"), netip.MustParseAddrPort("10.96.3.4:80")
	m := &mesh{t: t}
	routedWebSocket(m, "h2c", vH2C, snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(startXConnectEcho(t, nil))})
	routedWebSocket(m, "h2", vH2, snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, TLS: tlsPolicy(e),
		Endpoints: endpoints(startXConnectEcho(t, serverTLS(e.pki.server)))})
	e.p.Update(m.snapshot(1))
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	for name, dst := range map[string]netip.AddrPort{"h2c": vH2C, "h2": vH2} {
		t.Run("upgrade/"+name, func(t *testing.T) {
			ctx := context.Background()
			c, resp, err := websocket.Dial(ctx, "ws://"+name+".b.svc/ws?q=1",
				&websocket.DialOptions{HTTPClient: e.client(dst, false), Subprotocols: []string{"echo"}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			c.SetReadLimit(2 << 20)
			if got := resp.Header.Get("Sec-WebSocket-Protocol"); got != "echo" || resp.Header.Get("X-Resp") != "rule" {
				t.Errorf("101 came with fields %v, want the backend's Sec-WebSocket-Protocol: echo and the rule's X-Resp", resp.Header)
			}
			_, first, err := c.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			checkXConnectReport(t, first, "/ws?q=1", name == "h2")
			for i, msg := range [][]byte{[]byte("hello"), big, []byte("bye")} {
				if err := c.Write(ctx, websocket.MessageBinary, msg); err != nil {
					t.Fatal(err)
				}
				if _, got, err := c.Read(ctx); err != nil || !bytes.Equal(got, msg) {
					t.Fatalf("echo %d: %d bytes, %v; want the %d sent", i, len(got), err, len(msg))
				}
			}
			if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
				t.Errorf("close handshake: %v", err)
			}
		})
		if path != proxy.HTTP1TLSAuto {
			continue // an HTTP/2 app's connection takes the same path either way
		}
		t.Run("extended-connect/"+name, func(t *testing.T) {
			st := openH2WS(t, e.appConn(t, dst), name+".b.svc", "/ws")
			if st.header.Get("X-Resp") != "rule" {
				t.Errorf("200 came with fields %v, want the rule's X-Resp", st.header)
			}
			_, first, err := readWSFrame(st)
			if err != nil {
				t.Fatal(err)
			}
			checkXConnectReport(t, first, "/ws", name == "h2")
			for i, msg := range [][]byte{[]byte("over h2"), big} {
				if err := writeWSFrame(st, wsBinary, msg); err != nil {
					t.Fatal(err)
				}
				if _, got, err := readWSFrame(st); err != nil || !bytes.Equal(got, msg) {
					t.Fatalf("echo %d: %d bytes, %v; want the %d sent", i, len(got), err, len(msg))
				}
			}
			if err := writeWSFrame(st, wsClose, []byte{0x03, 0xe8}); err != nil {
				t.Fatal(err)
			}
			if op, _, err := readWSFrame(st); err != nil || op != wsClose {
				t.Fatalf("close answered with opcode %#x, %v; want a close", op, err)
			}
			if _, _, err := readWSFrame(st); !errors.Is(err, io.EOF) {
				t.Errorf("after the close: %v, want the stream's END_STREAM", err)
			}
		})
	}
	if got := e.counter("sockmesh_proxy_upgraded_bytes_total", nil); got < 2<<20 {
		t.Errorf("upgraded_bytes_total = %v, want the 1 MiB messages both ways at least", got)
	}
}

// TestWebSocketOverH2Fallback: a backend declared h2c whose SETTINGS do
// not enable extended CONNECT but that serves HTTP/1.1 on the same port,
// as Go's net/http server does by default, gets the WebSocket as an
// HTTP/1.1 Upgrade after its SETTINGS said so, from an HTTP/1.1 app and
// an HTTP/2 app's extended CONNECT alike: such WebSockets worked before
// sockmesh spoke RFC 8441 and must not start failing. Without the
// fallback both got 502.
func TestWebSocketOverH2Fallback(t *testing.T) {
	e := newEnv(t, envOptions{})
	m := &mesh{t: t}
	be, prefaces := startH2WithoutXConnect(t, "")
	routedWebSocket(m, "h2c", vip, snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(be)})
	e.p.Update(m.snapshot(1))
	ctx := context.Background()
	c, _, err := websocket.Dial(ctx, "ws://h2c.b.svc/ws", &websocket.DialOptions{HTTPClient: e.client(vip, false)})
	if err != nil {
		t.Fatalf("HTTP/1.1 app's upgrade: %v", err)
	}
	defer c.CloseNow()
	if _, first, err := c.Read(ctx); err != nil || !strings.Contains(string(first), `"proto":"HTTP/1.1"`) {
		t.Errorf("first message %s, %v; want the echo's report of an HTTP/1.1 upgrade", first, err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, got, err := c.Read(ctx); err != nil || string(got) != "hello" {
		t.Errorf("echo: %q, %v; want hello", got, err)
	}
	c.Close(websocket.StatusNormalClosure, "")

	st := openH2WS(t, e.appConn(t, vip), "h2c.b.svc", "/ws")
	if _, first, err := readWSFrame(st); err != nil || !strings.Contains(string(first), `"proto":"HTTP/1.1"`) {
		t.Errorf("HTTP/2 app's first message %s, %v; want the echo's report of an HTTP/1.1 upgrade", first, err)
	}
	if err := writeWSFrame(st, wsBinary, []byte("over h2")); err != nil {
		t.Fatal(err)
	}
	if _, got, err := readWSFrame(st); err != nil || string(got) != "over h2" {
		t.Errorf("HTTP/2 app's echo: %q, %v; want over h2", got, err)
	}
	if got := prefaces.Load(); got != 1 {
		t.Errorf("the backend saw %d HTTP/2 prefaces, want 1: the declared protocol is offered first, and its refusal remembered", got)
	}
}

// startH2WithoutXConnect runs a backend that takes h2c with prior
// knowledge but not RFC 8441 — its SETTINGS do not enable extended
// CONNECT, and it serves no stream — and HTTP/1.1 on the same port, the
// echo server of pod, whose /ws takes an Upgrade. It counts the HTTP/2
// connections.
func startH2WithoutXConnect(t *testing.T, pod string) (netip.AddrPort, *atomic.Int32) {
	l := listenLocal(t)
	h1 := &handedListener{Listener: l, conns: make(chan net.Conn), closed: make(chan struct{})}
	srv := echo.New(echo.Config{Namespace: "b", Pod: pod})
	go srv.Serve(h1)
	t.Cleanup(func() { srv.Close() })
	var prefaces atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				br := bufio.NewReader(c)
				if p, err := br.Peek(len(http2.ClientPreface)); err != nil || string(p) != http2.ClientPreface {
					h1.hand(&relay.BufferedConn{Conn: c, R: br})
					return
				}
				prefaces.Add(1)
				defer c.Close()
				if err := http2.NewFramer(c, br).WriteSettings(); err == nil {
					io.Copy(io.Discard, br) // until the proxy closes
				}
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).AddrPort(), &prefaces
}

// handedListener is a listener whose connections another goroutine hands
// over, having looked at their first bytes.
type handedListener struct {
	net.Listener
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *handedListener) hand(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.closed:
		c.Close()
	}
}

func (l *handedListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *handedListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// TestWebSocketOverH2Unsupported: a backend declared h2c whose SETTINGS do
// not enable extended CONNECT and that takes no HTTP/1.1 Upgrade either
// (nghttpd: HTTP/2 only, no RFC 8441) cannot take a WebSocket: the app
// gets 502, counted as protocol, the log naming RFC 8441.
func TestWebSocketOverH2Unsupported(t *testing.T) {
	e := newEnv(t, envOptions{})
	m := &mesh{t: t}
	routedWebSocket(m, "h2c", vip, snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(startNghttpd(t, e, t.TempDir(), false))})
	e.p.Update(m.snapshot(1))
	_, resp, err := websocket.Dial(context.Background(), "ws://h2c.b.svc/ws", &websocket.DialOptions{HTTPClient: e.client(vip, false)})
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Errorf("HTTP/1.1 app's upgrade: %v, %v; want 502", resp, err)
	}
	if st := connectH2WS(t, e.appConn(t, vip), "websocket", "h2c.b.svc", "/ws"); st.status != "502" {
		t.Errorf("HTTP/2 app's extended CONNECT answered %s, want 502", st.status)
	}
	if got := e.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "protocol"}); got != 2 {
		t.Errorf("request_failures_total{reason=protocol} = %v, want 2", got)
	}
	if !strings.Contains(e.logs.String(), "SETTINGS_ENABLE_CONNECT_PROTOCOL=1, RFC 8441") {
		t.Errorf("no log line names RFC 8441's setting:\n%s", e.logs.String())
	}
}

// TestWebSocketOverH2Refused: an HTTP/2 backend's refusal of an extended
// CONNECT (403 with a body) reaches an HTTP/1.1 app as it came, and one
// that does not answer before the route's request timeout gets 504,
// counted as timeout: the timeout bounds the CONNECT as it bounds an
// Upgrade's wait for its 101.
func TestWebSocketOverH2Refused(t *testing.T) {
	e := newEnv(t, envOptions{})
	m := &mesh{t: t}
	l := listenLocal(t)
	srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/deny" {
			w.Header().Set("Content-Length", "7")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, "denied\n")
			return
		}
		<-r.Context().Done() // never answers
	})}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	ref := m.backend("h2c-be", snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(l.Addr().(*net.TCPAddr).AddrPort())})
	m.frontend("h2c", vip, ref, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(ref), Timeouts: &snapshot.Timeouts{Request: dur(200 * time.Millisecond)}}})))
	e.p.Update(m.snapshot(1))
	for target, want := range map[string]int{"/deny": http.StatusForbidden, "/hang": http.StatusGatewayTimeout} {
		_, resp, err := websocket.Dial(context.Background(), "ws://h2c.b.svc"+target, &websocket.DialOptions{HTTPClient: e.client(vip, false)})
		if err == nil || resp == nil || resp.StatusCode != want {
			t.Errorf("upgrade to %s: %v, %v; want %d", target, resp, err, want)
			continue
		}
		if b, _ := io.ReadAll(resp.Body); want == http.StatusForbidden && string(b) != "denied\n" {
			t.Errorf("403 came with body %q, want the backend's", b)
		}
	}
	if got := e.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "timeout"}); got != 1 {
		t.Errorf("request_failures_total{reason=timeout} = %v, want 1", got)
	}
}

// routedWebSocket captures Service b/name at v, leading to be, under a
// route whose rule sets X-Resp: rule on every answer.
func routedWebSocket(m *mesh, name string, v netip.AddrPort, be snapshot.Backend) {
	ref := m.backend(name+"-be", be)
	m.frontend(name, v, ref, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(ref), Filters: snapshot.Filters{
			ResponseHeaders: &snapshot.HeaderModifier{Set: []snapshot.Header{{Name: "X-Resp", Value: "rule"}}},
		}}})))
}

// startXConnectEcho runs Go's net/http HTTP/2 server alone — h2c with
// prior knowledge, or h2 over TLS with tlsCfg — whose handler takes RFC
// 8441 WebSocket streams (the tests run with GODEBUG=http2xconnect=1:
// TestMain): it answers 200 with the first subprotocol asked, sends what
// it saw as its first message, echoes every message, a close included,
// and ends the stream after the close.
func startXConnectEcho(t *testing.T, tlsCfg *tls.Config) netip.AddrPort {
	l := listenLocal(t)
	srv := &http.Server{Handler: http.HandlerFunc(xconnectEcho), Protocols: new(http.Protocols), TLSConfig: tlsCfg}
	if tlsCfg != nil {
		srv.Protocols.SetHTTP2(true)
		go srv.ServeTLS(l, "", "")
	} else {
		srv.Protocols.SetUnencryptedHTTP2(true)
		go srv.Serve(l)
	}
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).AddrPort()
}

// xconnectReport is what startXConnectEcho's backend saw of the stream.
type xconnectReport struct {
	Method, Proto, Protocol, Path, ALPN string
	Key, Version                        string
}

func xconnectEcho(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect || r.Header.Get(":protocol") != "websocket" {
		http.Error(w, "not a websocket extended CONNECT", http.StatusBadRequest)
		return
	}
	if p, _, _ := strings.Cut(r.Header.Get("Sec-WebSocket-Protocol"), ","); p != "" {
		w.Header().Set("Sec-WebSocket-Protocol", strings.TrimSpace(p))
	}
	rep := xconnectReport{Method: r.Method, Proto: r.Proto, Protocol: r.Header.Get(":protocol"), Path: r.URL.RequestURI(),
		Key: r.Header.Get("Sec-WebSocket-Key"), Version: r.Header.Get("Sec-WebSocket-Version")}
	if r.TLS != nil {
		rep.ALPN = r.TLS.NegotiatedProtocol
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(op byte, p []byte) error {
		if _, err := w.Write(wsFrame(op, p, false)); err != nil {
			return err
		}
		return rc.Flush()
	}
	b, _ := json.Marshal(rep)
	if send(wsText, b) != nil {
		return
	}
	for {
		op, p, err := readWSFrame(r.Body)
		if err != nil || send(op, p) != nil || op == wsClose {
			return
		}
	}
}

// checkXConnectReport checks first, startXConnectEcho's first message:
// the WebSocket came as an RFC 8441 extended CONNECT for target, over h2
// by ALPN when overTLS, without the HTTP/1.1 handshake's key (§5).
func checkXConnectReport(t *testing.T, first []byte, target string, overTLS bool) {
	t.Helper()
	var rep xconnectReport
	if err := json.Unmarshal(first, &rep); err != nil {
		t.Fatalf("first message %q: %v", first, err)
	}
	want := xconnectReport{Method: http.MethodConnect, Proto: "HTTP/2.0", Protocol: "websocket", Path: target, Version: "13"}
	if overTLS {
		want.ALPN = "h2"
	}
	if rep != want {
		t.Errorf("backend saw %+v, want %+v", rep, want)
	}
}
