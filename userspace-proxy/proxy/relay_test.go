package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestRelayKeepAlive: a relayed connection may idle for ever, so the
// proxy's socket toward the app has TCP keep-alive on, whatever path
// relays it — an opaque TCP relay, a WebSocket after its 101 on either
// HTTP/1 path — although the proxy's listeners accept without it
// (ListenConfig: the L7 paths close idle connections themselves). An
// upgraded WebSocket, which no idle timeout closes, had none: an app
// gone without a word left its relay open for the proxy's life.
func TestRelayKeepAlive(t *testing.T) {
	checkNoLeaks(t)
	for name, path := range map[string]proxy.HTTP1TLSPath{"fast": proxy.HTTP1TLSAuto, "nethttp": proxy.HTTP1TLSL7} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, envOptions{registeredDst: true, http1TLS: path})
			vTCP, vWS := netip.MustParseAddrPort("10.96.4.15:5432"), netip.MustParseAddrPort("10.96.4.16:80")
			e.p.Update(buildSnapshot(t, 1,
				service{name: "db", vip: vTCP, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(startTCPEcho(t, nil))}},
				service{name: "wss", vip: vWS, backend: snapshot.Backend{Protocol: snapshot.ProtocolWSS, TLS: tlsPolicy(e),
					Endpoints: endpoints(startEcho(t, "wss-0", serverTLS(e.pki.server)).addr)}},
			))
			ln, err := proxy.ListenConfig().Listen(context.Background(), "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go e.p.Serve(ln)
			t.Run("tcp", func(t *testing.T) {
				c := dialListener(t, e, ln, vTCP)
				io.WriteString(c, "\x00ping")
				if _, err := io.ReadFull(c, make([]byte, 5)); err != nil {
					t.Fatal(err)
				}
				checkKeepAlive(t, c)
			})
			t.Run("websocket", func(t *testing.T) {
				c := dialListener(t, e, ln, vWS)
				io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: wss.b.svc\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
					"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
				br := bufio.NewReader(c)
				rep, err := http.ReadResponse(br, nil)
				if err != nil || rep.StatusCode != http.StatusSwitchingProtocols {
					t.Fatalf("upgrade: %v, %v; want a 101", rep, err)
				}
				// The echo's first message: what follows the 101 comes
				// through the relay, which is running then.
				if _, err := br.ReadByte(); err != nil {
					t.Fatal(err)
				}
				checkKeepAlive(t, c)
			})
		})
	}
}

// dialListener opens an app's connection to dst through ln, one of the
// proxy's own listeners (envOptions.registeredDst), closed when t ends.
func dialListener(t *testing.T, e *env, ln net.Listener, dst netip.AddrPort) net.Conn {
	t.Helper()
	c, err := e.dialVia(ln, net.Dialer{KeepAlive: -1}, dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(hangGuard))
	return c
}

func checkKeepAlive(t *testing.T, app net.Conn) {
	t.Helper()
	if !keepAlive(t, app) {
		t.Error("the proxy's socket toward the app has no TCP keep-alive")
	}
}

// keepAlive reports whether the proxy's socket of app's connection (the
// one this process holds with app's addresses swapped) has SO_KEEPALIVE.
func keepAlive(t *testing.T, app net.Conn) bool {
	t.Helper()
	local, remote := app.RemoteAddr().(*net.TCPAddr).AddrPort(), app.LocalAddr().(*net.TCPAddr).AddrPort()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fds {
		fd, err := strconv.Atoi(f.Name())
		if err != nil {
			continue
		}
		if addrOf(unix.Getsockname(fd)) != local || addrOf(unix.Getpeername(fd)) != remote {
			continue
		}
		on, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		if err != nil {
			t.Fatal(err)
		}
		return on == 1
	}
	t.Fatalf("no socket of this process is %v→%v", local, remote)
	return false
}

func addrOf(sa unix.Sockaddr, err error) netip.AddrPort {
	if in, ok := sa.(*unix.SockaddrInet4); ok && err == nil {
		return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port))
	}
	return netip.AddrPort{}
}
