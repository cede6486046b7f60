package upstream

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/h2silent"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/h2connect"
)

// noXConnectBackend is a backend that takes h2c with prior knowledge —
// its SETTINGS do not enable extended CONNECT, as Go's net/http server's
// by default — and HTTP/1.1 on the same port, where it answers every
// request 101: it counts both kinds of connection.
type noXConnectBackend struct {
	addr   netip.AddrPort
	h2, h1 atomic.Int32
}

func startNoXConnect(t *testing.T) *noXConnectBackend {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	b := &noXConnectBackend{addr: l.Addr().(*net.TCPAddr).AddrPort()}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go b.serve(c)
		}
	}()
	return b
}

func (b *noXConnectBackend) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	if p, err := br.Peek(len(http2.ClientPreface)); err == nil && string(p) == http2.ClientPreface {
		b.h2.Add(1)
		if http2.NewFramer(c, br).WriteSettings() == nil {
			io.Copy(io.Discard, br) // until the proxy closes
		}
		return
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	b.h1.Add(1)
	io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "+
		WebSocketAccept(req.Header.Get("Sec-WebSocket-Key"))+"\r\n\r\n")
	io.Copy(io.Discard, br)
}

// h2cBackend builds, with p, a snapshot whose one backend is declared
// protocol at addr (built on prev), and returns its Set.
func h2cBackend(t *testing.T, p *Pools, version uint64, protocol snapshot.Protocol, addr netip.AddrPort, prev *Set) *Set {
	t.Helper()
	s, err := snapshot.New(version, nil, []snapshot.Backend{{Ref: ref, Protocol: protocol,
		Endpoints: []snapshot.Endpoint{{Addr: addr, Ready: true}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	set := p.Build(s, prev)
	t.Cleanup(set.CloseIdle)
	return set
}

// webSocket sends a WebSocket's Upgrade through b's WebSocketH2 and
// checks it was switched.
func webSocket(t *testing.T, b *Backend, addr netip.AddrPort) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+addr.String()+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "ws.example"
	req.Header = http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"},
		"Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}}
	resp, err := b.WebSocketH2().RoundTrip(req)
	if err != nil {
		t.Fatalf("websocket: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("websocket answered %d, want 101", resp.StatusCode)
	}
}

func newPools(t *testing.T) *Pools {
	t.Helper()
	p, err := New(Config{}, dial.NewDirect(dial.Config{Unmarked: true}), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRefusalRemembered: an endpoint whose SETTINGS refused a WebSocket's
// extended CONNECT gets the next ones as HTTP/1.1 Upgrades without being
// asked again — one HTTP/2 connection for all, where each cost one —
// until refusedFor passed, or its backend's protocol or TLS settings
// changed; then it is asked again, once.
func TestRefusalRemembered(t *testing.T) {
	be := startNoXConnect(t)
	p := newPools(t)
	set := h2cBackend(t, p, 1, snapshot.ProtocolH2C, be.addr, nil)
	clock := time.Now()
	set.Get(ref).w.noXConnect.now = func() time.Time { return clock }
	check := func(when string, h2, h1 int32) {
		t.Helper()
		if got1, got2 := be.h1.Load(), be.h2.Load(); got2 != h2 || got1 != h1 {
			t.Errorf("%s: the backend saw %d HTTP/2 and %d HTTP/1.1 connections, want %d and %d", when, got2, got1, h2, h1)
		}
	}
	for range 3 {
		webSocket(t, set.Get(ref), be.addr)
	}
	check("three WebSockets", 1, 3)

	clock = clock.Add(refusedFor - time.Second)
	webSocket(t, set.Get(ref), be.addr)
	check("just before refusedFor", 1, 4)
	clock = clock.Add(time.Second)
	webSocket(t, set.Get(ref), be.addr)
	check("at refusedFor", 2, 5)

	set = h2cBackend(t, p, 2, snapshot.ProtocolH2C, be.addr, set) // the same wire
	webSocket(t, set.Get(ref), be.addr)
	check("a snapshot keeping the wire", 2, 6)
	set = h2cBackend(t, p, 3, snapshot.ProtocolGRPC, be.addr, set) // another protocol
	webSocket(t, set.Get(ref), be.addr)
	check("the backend's protocol changed", 3, 7)
}

// TestRefusalsForgotten: each refusal remembered forgets those older than
// refusedFor, so the endpoints that came and went take no memory.
func TestRefusalsForgotten(t *testing.T) {
	clock := time.Now()
	r := &refusals{now: func() time.Time { return clock }}
	a, b := netip.MustParseAddrPort("10.0.0.1:80"), netip.MustParseAddrPort("10.0.0.2:80")
	r.remember(a)
	clock = clock.Add(refusedFor)
	if _, ok := r.refused(a); ok {
		t.Error("a refusal is remembered at refusedFor")
	}
	r.remember(b)
	if len(r.at) != 1 {
		t.Errorf("%d refusals held, want b's alone: %v", len(r.at), r.at)
	}
	if at, ok := r.refused(b); !ok || !at.Equal(clock) {
		t.Errorf("b's refusal: %v, %v; want at %v", at, ok, clock)
	}
}

// TestWebSocketH2Liveness: a WebSocket's extended CONNECT connection is
// bounded as the pools' other connections are — an endpoint that took
// the connection and sends no SETTINGS fails it within HandshakeTimeout,
// a connect failure another endpoint may retry (it held the WebSocket
// until the app gave up); one that went silent after its answer is
// pinged after H2PingAfter and closed H2PingTimeout later, the
// WebSocket's reads failing (it waited for TCP to give up).
func TestWebSocketH2Liveness(t *testing.T) {
	upgrade := func(t *testing.T, cfg Config, addr netip.AddrPort) (*http.Response, error) {
		t.Helper()
		p, err := New(cfg, dial.NewDirect(dial.Config{Unmarked: true}), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		b := h2cBackend(t, p, 1, snapshot.ProtocolH2C, addr, nil).Get(ref)
		// A guard, not a measure: it tells a hang from an end.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+"/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"},
			"Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}}
		return b.WebSocketH2().RoundTrip(req)
	}

	t.Run("no SETTINGS", func(t *testing.T) {
		addr := serveRaw(t, func(c net.Conn) { io.Copy(io.Discard, c) })
		_, err := upgrade(t, Config{HandshakeTimeout: 50 * time.Millisecond}, addr)
		if !errors.Is(err, h2connect.ErrNoSettings) || !NoConnection(err) {
			t.Fatalf("RoundTrip = %v, want ErrNoSettings, as a connect that failed", err)
		}
	})
	t.Run("silent after the answer", func(t *testing.T) {
		addr := serveRaw(t, h2silent.Serve) // no ACK to the PINGs
		resp, err := upgrade(t, Config{H2PingAfter: 20 * time.Millisecond, H2PingTimeout: time.Second}, addr)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("RoundTrip = %v, %v; want 101", resp, err)
		}
		defer resp.Body.Close()
		guard := time.AfterFunc(30*time.Second, func() { resp.Body.Close() }) // tells a hang from an end
		defer guard.Stop()
		if _, err := resp.Body.Read(make([]byte, 1)); !errors.Is(err, h2connect.ErrPingTimeout) {
			t.Fatalf("Read = %v, want ErrPingTimeout", err)
		}
	})
}

// serveRaw serves each connection to a loopback listener with serve,
// closing it after; the listener and its connections close in cleanup.
func serveRaw(t *testing.T, serve func(net.Conn)) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tcpserve.Serve(t, l, serve)
	return l.Addr().(*net.TCPAddr).AddrPort()
}
