package proxy_test

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/h2silent"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestWebSocketOverH2SilentBackend: a WebSocket to an HTTP/2 backend
// that goes silent after its answer (its node gone, its process frozen)
// ends once the backend leaves the proxy's PING unanswered
// (upstream.Config.H2PingAfter, H2PingTimeout), as the proxy's other
// HTTP/2 connections do: an HTTP/1.1 app's connection is closed, an
// HTTP/2 app's stream reset, never ended as if the backend closed it.
// They waited for TCP to give up, minutes to hours.
func TestWebSocketOverH2SilentBackend(t *testing.T) {
	checkNoLeaks(t)
	// A PING left 0.5 s unanswered, every 0.5 s without a frame: quick,
	// yet long beside the proxy's own answers on a loaded machine.
	e := newEnv(t, envOptions{http1TLS: proxy.HTTP1TLSAuto, upstreamPingAfter: 500 * time.Millisecond})
	v := netip.MustParseAddrPort("10.96.3.9:80")
	m := &mesh{t: t}
	routedWebSocket(m, "silent", v, snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(startSilentXConnect(t))})
	e.p.Update(m.snapshot(1))

	t.Run("upgrade", func(t *testing.T) {
		c, br, _ := rawUpgrade(t, e, v, "/ws")
		c.SetReadDeadline(time.Now().Add(hangGuard))
		if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("app's read after the backend went silent: %v, want its connection closed", err)
		}
	})
	t.Run("extended-connect", func(t *testing.T) {
		st := openH2WS(t, e.appConn(t, v), "silent.b.svc", "/ws")
		if _, _, err := readWSFrame(st); err == nil || errors.Is(err, io.EOF) || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("app's read after the backend went silent: %v, want its stream reset", err)
		}
	})
}

// startSilentXConnect runs a backend that takes h2c with prior knowledge
// and extended CONNECT, answers each WebSocket's CONNECT 200, and then
// sends nothing more, an ACK to a PING neither. Its connections close in
// cleanup, before the proxy's: a proxy that never gave up on them would
// otherwise hold its own cleanup.
func startSilentXConnect(t *testing.T) netip.AddrPort {
	l := listenLocal(t)
	tcpserve.Serve(t, l, h2silent.Serve)
	return l.Addr().(*net.TCPAddr).AddrPort()
}
