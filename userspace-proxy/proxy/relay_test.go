package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime/debug"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/leakcheck"
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

// keepAlive reports whether the proxy's socket of app's connection has
// SO_KEEPALIVE.
func keepAlive(t *testing.T, app net.Conn) bool {
	t.Helper()
	on, err := unix.GetsockoptInt(proxySocket(t, app), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
	if err != nil {
		t.Fatal(err)
	}
	return on == 1
}

// proxySocket is the descriptor of the proxy's socket of app's connection:
// the one this process holds with app's addresses swapped.
func proxySocket(t *testing.T, app net.Conn) int {
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
		if addrOf(unix.Getsockname(fd)) == local && addrOf(unix.Getpeername(fd)) == remote {
			return fd
		}
	}
	t.Fatalf("no socket of this process is %v→%v", local, remote)
	return -1
}

func addrOf(sa unix.Sockaddr, err error) netip.AddrPort {
	if in, ok := sa.(*unix.SockaddrInet4); ok && err == nil {
		return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port))
	}
	return netip.AddrPort{}
}

// TestRelayEndings: each way a relayed connection ends reaches the other
// side as it would directly — a half-close as a half-close (over TLS
// origination a close_notify, then the FIN) while the other direction
// flows on, a reset as a reset, a backend's TLS stream cut without
// close_notify as a reset — cleartext, with TLS origination and for an
// app's own TLS (passthrough); and once they ended, the proxy holds none
// of their descriptors, goroutines or copy buffers.
func TestRelayEndings(t *testing.T) {
	checkNoLeaks(t)
	// The garbage collector would close, by their finalizers, sockets the
	// proxy leaked and forgot, before the count below sees them.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	e := newEnv(t, envOptions{})
	type backendConn struct {
		c   net.Conn     // what the backend reads and writes: TLS or not
		tcp *net.TCPConn // the TCP connection under it
		end *endWatch
		// done ends the backend's connection (closed when the app's is).
		done chan struct{}
	}
	accepted := make(chan backendConn, 1)
	serve := func(tlsCfg *tls.Config) netip.AddrPort {
		return serveTCP(t, nil, func(c net.Conn) {
			w := &endWatch{Conn: c}
			b := backendConn{c: w, tcp: c.(*net.TCPConn), end: w, done: make(chan struct{})}
			if tlsCfg != nil {
				ts := tls.Server(w, tlsCfg)
				if ts.Handshake() != nil {
					return
				}
				b.c = ts
			}
			accepted <- b
			<-b.done
		})
	}
	vTLS, vClear, vPass := netip.MustParseAddrPort("10.96.4.17:5432"), netip.MustParseAddrPort("10.96.4.18:5432"), netip.MustParseAddrPort("10.96.4.19:443")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "db", vip: vTLS, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e), Endpoints: endpoints(serve(serverTLS(e.pki.server)))}},
		service{name: "raw", vip: vClear, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(serve(nil))}},
		service{name: "own", vip: vPass, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e), Endpoints: endpoints(serve(serverTLS(e.pki.server)))}},
	))
	baseFDs := leakcheck.OpenFDs(t)
	// open connects an app to dst and returns its stream (its own TLS for
	// passthrough), its TCP connection, and the backend's side.
	open := func(t *testing.T, dst netip.AddrPort) (net.Conn, *net.TCPConn, backendConn) {
		c := e.appConn(t, dst)
		app := c
		if dst == vPass {
			app = tls.Client(c, &tls.Config{ServerName: sniName, RootCAs: e.pki.ca.Pool()})
		}
		io.WriteString(app, "\x00hello") // the first bytes: a relay, never HTTP
		b := <-accepted
		t.Cleanup(func() { close(b.done) })
		b.c.SetDeadline(time.Now().Add(hangGuard))
		if _, err := io.ReadFull(b.c, make([]byte, 6)); err != nil {
			t.Fatalf("backend read the first bytes: %v", err)
		}
		return app, c.(*net.TCPConn), b
	}
	closeWrite := func(c net.Conn) {
		if tc, ok := c.(*tls.Conn); ok {
			tc.CloseWrite()
			c = tc.NetConn()
		}
		c.(interface{ CloseWrite() error }).CloseWrite()
	}
	reset := func(c *net.TCPConn) {
		c.SetLinger(0)
		c.Close()
	}
	// readAll reads c to its end and fails t unless it got want, then the
	// end wantErr (nil: a clean one).
	readAll := func(t *testing.T, who string, c net.Conn, want string, wantErr error) {
		t.Helper()
		got, err := io.ReadAll(c)
		if string(got) != want || (wantErr == nil) != (err == nil) || wantErr != nil && !errors.Is(err, wantErr) {
			t.Errorf("%s read %q, then %v; want %q, then %v", who, got, err, want, wantErr)
		}
	}
	for name, dst := range map[string]netip.AddrPort{"clear": vClear, "tls": vTLS, "passthrough": vPass} {
		t.Run(name+"/app-half-closes", func(t *testing.T) {
			app, _, b := open(t, dst)
			io.WriteString(app, "request")
			closeWrite(app)
			readAll(t, "backend", b.c, "request", nil)
			if _, ok := b.c.(*tls.Conn); ok && b.end.ended {
				t.Error("the backend's TLS stream ended with the TCP connection's end, want a close_notify before it")
			}
			io.WriteString(b.c, "answer")
			closeWrite(b.c)
			readAll(t, "app", app, "answer", nil)
		})
		t.Run(name+"/backend-half-closes", func(t *testing.T) {
			app, _, b := open(t, dst)
			io.WriteString(b.c, "pushed")
			closeWrite(b.c)
			readAll(t, "app", app, "pushed", nil)
			io.WriteString(app, "after")
			closeWrite(app)
			readAll(t, "backend", b.c, "after", nil)
		})
		t.Run(name+"/app-resets", func(t *testing.T) {
			_, tcp, b := open(t, dst)
			reset(tcp)
			readAll(t, "backend", b.c, "", syscall.ECONNRESET)
		})
		t.Run(name+"/backend-resets", func(t *testing.T) {
			app, _, b := open(t, dst)
			io.WriteString(b.c, "partial")
			reset(b.tcp)
			readAll(t, "app", app, "partial", syscall.ECONNRESET)
		})
	}
	t.Run("tls/backend-cut-without-close_notify", func(t *testing.T) {
		app, _, b := open(t, vTLS)
		io.WriteString(b.c, "partial")
		b.tcp.CloseWrite()
		readAll(t, "app", app, "partial", syscall.ECONNRESET)
	})
	eventually(t, func() bool {
		return leakcheck.OpenFDs(t) <= baseFDs && e.counter("sockmesh_proxy_copy_buffers_in_use", nil) == 0 &&
			e.counter("sockmesh_proxy_active_connections", map[string]string{"path": "l4"}) == 0 &&
			e.counter("sockmesh_proxy_active_connections", map[string]string{"path": "l4_tls"}) == 0 &&
			e.counter("sockmesh_proxy_active_connections", map[string]string{"path": "passthrough"}) == 0
	}, "the proxy to release every ended relay's descriptors, buffers and connections")
}

// endWatch records whether a read of the connection met its end.
type endWatch struct {
	net.Conn
	ended bool
}

func (c *endWatch) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.ended = c.ended || err == io.EOF
	return n, err
}

func (c *endWatch) CloseWrite() error { return c.Conn.(*net.TCPConn).CloseWrite() }
