package proxy_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// TestEjectRefusedEndpoint: beside a healthy endpoint, one that refuses
// connections (its pod's process gone, the EndpointSlice not yet updated)
// costs one connect in all, on every path: the request that finds it
// refusing goes to the other endpoint, and the requests after it are not
// sent its way while it is ejected.
func TestEjectRefusedEndpoint(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{ejectFor: time.Minute})
	tlsBackend := startEcho(t, "tls-0", serverTLS(e.pki.server))
	h2cBackend := startEcho(t, "h2c-0", nil)
	vFast, vH2C, vTCP := netip.MustParseAddrPort("10.96.8.1:80"), netip.MustParseAddrPort("10.96.8.2:80"), netip.MustParseAddrPort("10.96.8.3:5432")
	vWSS := netip.MustParseAddrPort("10.96.8.4:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "wss", vip: vWSS, backend: snapshot.Backend{Protocol: snapshot.ProtocolWSS, TLS: tlsPolicy(e), Endpoints: endpoints(tlsBackend.addr, closedPort(t))}},
		service{name: "fast", vip: vFast, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(tlsBackend.addr, closedPort(t))}},
		service{name: "h2c", vip: vH2C, backend: snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(h2cBackend.addr, closedPort(t))}},
		service{name: "tcp", vip: vTCP, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(startTCPEcho(t, nil), closedPort(t))}},
	))
	const n = 20
	paths := []struct {
		name string
		try  func(i int) error
	}{
		{"fast", httpGet(e, vFast, "tls-0")},                  // the HTTP/1.1 fast path
		{"h2c", httpGet(e, vH2C, "h2c-0")},                    // net/http's HTTP/2 Transport
		{"tcp", func(int) error { return echoTCP(e, vTCP) }},  // the L4 relay
		{"wss", func(int) error { return wsOverH2(e, vWSS) }}, // RFC 8441 bridged to an Upgrade
	}
	for _, p := range paths {
		before := e.counter("sockmesh_proxy_upstream_dials_total", map[string]string{"result": "refused"})
		for i := range n {
			if err := p.try(i); err != nil {
				t.Fatalf("%s: request %d: %v", p.name, i, err)
			}
		}
		if got := e.counter("sockmesh_proxy_upstream_dials_total", map[string]string{"result": "refused"}) - before; got != 1 {
			t.Errorf("%s: %d requests made %v refused connects, want 1", p.name, n, got)
		}
		if got := e.counter("sockmesh_proxy_upstream_endpoint_ejections_total", map[string]string{"namespace": "b", "backend": p.name}); got != 1 {
			t.Errorf("%s: ejections = %v, want 1", p.name, got)
		}
	}
	if got := e.counter("sockmesh_proxy_upstream_endpoints_ejected", nil); got != float64(len(paths)) {
		t.Errorf("endpoints ejected = %v, want %d", got, len(paths))
	}
	if got := strings.Count(e.logs.String(), `"msg":"endpoint ejected: its connect failed"`); got != len(paths) {
		t.Errorf("%d ejection log lines, want %d; log:\n%s", got, len(paths), e.logs.String())
	}
}

// TestEjectBlackholedEndpoint: an endpoint that does not answer at all, as
// a pod gone with its node, costs one request a connect timeout, not every
// request sent its way; once it answers again, the connection that tries
// it after its ejection brings it back.
func TestEjectBlackholedEndpoint(t *testing.T) {
	checkNoLeaks(t)
	const dialTimeout = 300 * time.Millisecond
	for _, revive := range []bool{false, true} {
		name := map[bool]string{false: "stays-away", true: "comes-back"}[revive]
		t.Run(name, func(t *testing.T) {
			ejectFor := time.Minute
			if revive {
				ejectFor = 200 * time.Millisecond
			}
			e := newEnv(t, envOptions{dialTimeout: dialTimeout, ejectFor: ejectFor})
			healthy := startEcho(t, "healthy", serverTLS(e.pki.server))
			hole, l := blackhole(t)
			vip := netip.MustParseAddrPort("10.96.8.10:80")
			e.p.Update(buildSnapshot(t, 1, service{name: "svc", vip: vip,
				backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(healthy.addr, hole)}}))
			try := httpGet(e, vip, "healthy")
			for i := range 10 {
				if err := try(i); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
			failed := e.counter("sockmesh_proxy_upstream_dials_total", map[string]string{"result": "dial_failed"})
			if !revive {
				if failed != 1 {
					t.Errorf("10 requests made %v connects that timed out, want 1", failed)
				}
				return
			}
			if failed < 1 {
				t.Fatalf("no connect timed out: the blackhole answered")
			}
			srv := echo.New(echo.Config{Pod: "revived", Namespace: "b", TLS: serverTLS(e.pki.server)})
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })
			c := e.client(vip, false)
			for deadline := time.Now().Add(20 * time.Second); ; {
				if code, rep := get(t, c, "http://svc.b.svc/"); code == http.StatusOK && rep.Pod == "revived" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the endpoint, answering again, got no request")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got := e.counter("sockmesh_proxy_upstream_endpoints_ejected", nil); got != 0 {
				t.Errorf("endpoints ejected = %v after it came back, want 0", got)
			}
		})
	}
}

// httpGet returns a function making request i through a client of its own
// to vip, which must reach pod.
func httpGet(e *env, vip netip.AddrPort, pod string) func(int) error {
	c := e.client(vip, false)
	return func(i int) error {
		resp, err := c.Get("http://svc.b.svc/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"pod":"`+pod+`"`) {
			return &unexpected{resp.StatusCode, string(body)}
		}
		return nil
	}
}

type unexpected struct {
	code int
	body string
}

func (u *unexpected) Error() string { return http.StatusText(u.code) + ": " + u.body }

// echoTCP sends a line through the relay to vip's echo and reads it back.
func echoTCP(e *env, vip netip.AddrPort) error {
	c, err := e.dial(vip)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	const msg = "\x00ping\n"
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return &unexpected{0, string(buf)}
	}
	return nil
}

// wsOverH2 opens a WebSocket over an HTTP/2 connection of its own to vip
// (extended CONNECT) and exchanges a message with the backend's echo.
func wsOverH2(e *env, vip netip.AddrPort) error {
	c, err := e.dial(vip)
	if err != nil {
		return err
	}
	defer c.Close()
	st, err := startH2WS(c, "wss.b.svc", "/ws")
	if err != nil {
		return err
	}
	if _, _, err := readWSFrame(st); err != nil { // the backend's report
		return err
	}
	if err := writeWSFrame(st, wsText, []byte("ping")); err != nil {
		return err
	}
	if _, got, err := readWSFrame(st); err != nil || string(got) != "ping" {
		return fmt.Errorf("echo %q, %v", got, err)
	}
	return nil
}

// blackhole listens on loopback with an accept queue of one connection,
// filled: the kernel drops the connection requests of a full queue, so a
// connect waits for an answer that never comes, as to a pod gone with its
// node, until something accepts from the returned listener.
func blackhole(t *testing.T) (netip.AddrPort, net.Listener) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "blackhole")
	defer f.Close()
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	l, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	addr := l.Addr().(*net.TCPAddr).AddrPort()
	fill, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fill.Close() })
	if c, err := net.DialTimeout("tcp", addr.String(), 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("a connect to a full accept queue was answered")
	}
	return addr, l
}

// TestEjectFrozenEndpoint: an endpoint whose kernel takes connections
// that its process never serves (frozen, or not calling accept) answers no
// TLS handshake; the handshake's timeout ends the wait, the connection
// goes to another endpoint, and the frozen one is passed over, on the relay
// (which dials for the app with no deadline of its own) and the fast path.
func TestEjectFrozenEndpoint(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{handshakeTimeout: 300 * time.Millisecond, ejectFor: time.Minute})
	frozen := func() netip.AddrPort { // never accepts: the kernel completes the connects
		return listenLocal(t).Addr().(*net.TCPAddr).AddrPort()
	}
	tcpEcho := startTCPEcho(t, serverTLS(e.pki.server))
	web := startEcho(t, "web-0", serverTLS(e.pki.server))
	vTCP, vWeb := netip.MustParseAddrPort("10.96.8.20:5432"), netip.MustParseAddrPort("10.96.8.21:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "tcp", vip: vTCP, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e), Endpoints: endpoints(tcpEcho, frozen())}},
		service{name: "web", vip: vWeb, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(web.addr, frozen())}},
	))
	web0 := httpGet(e, vWeb, "web-0")
	for i := range 5 {
		if err := echoTCP(e, vTCP); err != nil {
			t.Fatalf("relay, connection %d: %v", i, err)
		}
		if err := web0(i); err != nil {
			t.Fatalf("fast path, request %d: %v", i, err)
		}
	}
	if got := e.counter("sockmesh_proxy_upstream_endpoint_ejections_total", nil); got != 2 {
		t.Errorf("ejections = %v, want 2 (one per backend)", got)
	}
	if got := e.counter("sockmesh_proxy_upstream_tls_handshakes_total", map[string]string{"result": "timeout"}); got != 2 {
		t.Errorf("handshakes{timeout} = %v, want 2", got)
	}
}

// TestEjectEndpointBreakingHandshake: beside a healthy endpoint, one
// whose TLS handshake breaks off — its pod killed, its TLS listener
// crashed: the connection reset, or closed, once the ClientHello came —
// costs one handshake in all, on every path, as a refused connect does:
// nothing of the app's went out, so the connection or request goes to the
// other endpoint, and the broken one is ejected.
func TestEjectEndpointBreakingHandshake(t *testing.T) {
	checkNoLeaks(t)
	for _, reset := range []bool{true, false} {
		t.Run(map[bool]string{true: "reset", false: "closed"}[reset], func(t *testing.T) {
			e := newEnv(t, envOptions{ejectFor: time.Minute})
			broken := func() netip.AddrPort {
				return serveTCP(t, nil, func(c net.Conn) {
					var hdr [5]byte // the ClientHello's record, whole
					if _, err := io.ReadFull(c, hdr[:]); err != nil {
						return
					}
					io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint16(hdr[3:])))
					if reset {
						c.(*net.TCPConn).SetLinger(0)
					}
				})
			}
			tcpEcho := startTCPEcho(t, serverTLS(e.pki.server))
			web := startEcho(t, "web-0", serverTLS(e.pki.server))
			vTCP, vFast := netip.MustParseAddrPort("10.96.8.50:5432"), netip.MustParseAddrPort("10.96.8.51:80")
			vH2, vL7 := netip.MustParseAddrPort("10.96.8.52:80"), netip.MustParseAddrPort("10.96.8.53:80")
			e.p.Update(buildSnapshot(t, 1,
				service{name: "tcp", vip: vTCP, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e), Endpoints: endpoints(tcpEcho, broken())}},
				service{name: "fast", vip: vFast, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(web.addr, broken())}},
				service{name: "h2", vip: vH2, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, TLS: tlsPolicy(e), Endpoints: endpoints(web.addr, broken())}},
				service{name: "l7", vip: vL7, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, TLS: tlsPolicy(e), Endpoints: endpoints(web.addr, broken())}},
			))
			const n = 10
			h2cApp := e.client(vL7, true)
			paths := []struct {
				name string
				try  func(i int) error
			}{
				{"tcp", func(int) error { return echoTCP(e, vTCP) }}, // the L4 relay
				{"fast", httpGet(e, vFast, "web-0")},                 // the HTTP/1.1 fast path
				{"h2", httpGet(e, vH2, "web-0")},                     // net/http's HTTP/2 Transport
				{"l7", func(int) error { // net/http's server, an h2c app translated to HTTP/1.1
					code, rep := get(t, h2cApp, "http://l7.b.svc/")
					if code != http.StatusOK || rep.Pod != "web-0" {
						return &unexpected{code, rep.Pod}
					}
					return nil
				}},
			}
			for _, p := range paths {
				failed := map[string]string{"result": "failed"}
				before := e.counter("sockmesh_proxy_upstream_tls_handshakes_total", failed)
				for i := range n {
					if err := p.try(i); err != nil {
						t.Fatalf("%s: connection or request %d: %v", p.name, i, err)
					}
				}
				if got := e.counter("sockmesh_proxy_upstream_tls_handshakes_total", failed) - before; got != 1 {
					t.Errorf("%s: %d connections or requests made %v failed handshakes, want 1", p.name, n, got)
				}
				if got := e.counter("sockmesh_proxy_upstream_endpoint_ejections_total", map[string]string{"namespace": "b", "backend": p.name}); got != 1 {
					t.Errorf("%s: ejections = %v, want 1", p.name, got)
				}
			}
		})
	}
}

// TestFailedHandshakeBeforeSuccess: a connection whose TLS handshake the
// endpoint breaks off after another connection to it, begun later, came
// up ejects nothing: the later one showed the endpoint up. Before, it
// ejected the endpoint for the ejection time (a minute here).
func TestFailedHandshakeBeforeSuccess(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{ejectFor: time.Minute})
	held, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	flaky := serveTCP(t, nil, func(c net.Conn) {
		if first.CompareAndSwap(false, true) {
			var hdr [5]byte // the ClientHello's record header; then closed
			io.ReadFull(c, hdr[:])
			close(held)
			<-release
			return
		}
		tc := tls.Server(c, serverTLS(e.pki.server))
		io.Copy(tc, tc)
	})
	vTCP := netip.MustParseAddrPort("10.96.8.55:5432")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "tcp", vip: vTCP, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e), Endpoints: endpoints(flaky)}},
	))
	slow := make(chan error, 1)
	go func() { slow <- echoTCP(e, vTCP) }()
	<-held
	if err := echoTCP(e, vTCP); err != nil {
		t.Fatalf("the connection begun second: %v", err)
	}
	close(release)
	<-slow // its outcome aside: the endpoint, not ejected, may take its retry
	if got := e.counter("sockmesh_proxy_upstream_endpoint_ejections_total", nil); got != 0 {
		t.Errorf("ejections = %v, want 0: the failed handshake began before a connection that came up", got)
	}
}

// TestEjectionEndsOverPooledConnections: an endpoint ejected while a
// connection to it lives on — in the HTTP/1.1 pool, or net/http's HTTP/2
// Transport — (its process closed its listener for a moment, and a
// connect was refused) gets its share again once its ejection is over,
// though the request that tries it takes that connection and connects
// nothing: such a request settles nothing, and the one after it may try
// the endpoint too. Holding the probe, it left the endpoint one request
// per 15 s for as long as that connection lived.
func TestEjectionEndsOverPooledConnections(t *testing.T) {
	checkNoLeaks(t)
	for _, proto := range []snapshot.Protocol{snapshot.ProtocolAuto, snapshot.ProtocolHTTP2} {
		t.Run(map[snapshot.Protocol]string{snapshot.ProtocolAuto: "h1-pool", snapshot.ProtocolHTTP2: "h2-transport"}[proto], func(t *testing.T) {
			e := newEnv(t, envOptions{ejectFor: 50 * time.Millisecond})
			a := startEcho(t, "web-a", serverTLS(e.pki.server))
			l := listenLocal(t)
			b := l.Addr().(*net.TCPAddr).AddrPort()
			serveB := func(l net.Listener) {
				s := echo.New(echo.Config{Pod: "web-b", Namespace: "b", TLS: serverTLS(e.pki.server)})
				go s.Serve(l)
				t.Cleanup(func() { s.Close() })
			}
			serveB(l)
			vWeb, vB := netip.MustParseAddrPort("10.96.8.60:80"), netip.MustParseAddrPort("10.96.8.61:80")
			e.p.Update(buildSnapshot(t, 1,
				service{name: "web", vip: vWeb, backend: snapshot.Backend{Protocol: proto, TLS: tlsPolicy(e), Endpoints: endpoints(a.addr, b)}},
				service{name: "only-b", vip: vB, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(b)}},
			))
			web := e.client(vWeb, false)
			pods := func(n int) map[string]int {
				seen := map[string]int{}
				for range n {
					code, rep := get(t, web, "http://web.b.svc/")
					if code != http.StatusOK {
						t.Fatalf("status %d", code)
					}
					seen[rep.Pod]++
				}
				return seen
			}
			if seen := pods(2); seen["web-b"] != 1 {
				t.Fatalf("first requests reached %v, want web-b once", seen)
			}
			// B's listener closes, its connections serve on: a connect
			// through another backend is refused and ejects it; then it
			// listens again.
			l.Close()
			if code, _ := get(t, e.client(vB, false), "http://only-b.b.svc/"); code != http.StatusServiceUnavailable {
				t.Fatalf("B not listening: status %d, want 503", code)
			}
			l2, err := net.Listen("tcp", b.String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l2.Close() })
			serveB(l2)
			for deadline := time.Now().Add(10 * time.Second); pods(1)["web-b"] == 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("10 s on, B's ejection has not ended")
				}
			}
			if seen := pods(10); seen["web-b"] != 5 {
				t.Errorf("after B's ejection ended, 10 requests reached %v, want web-b 5 times", seen)
			}
			if got := e.counter("sockmesh_proxy_upstream_endpoints_ejected", nil); got != 0 {
				t.Errorf("endpoints ejected = %v, want 0", got)
			}
		})
	}
}

// TestProbeHandedBackByCanceledWait: a request that takes the probe of an
// endpoint whose ejection is over, and whose app leaves while it waits for
// one of the endpoint's connections (all MaxConnsPerEndpoint in use),
// hands the probe to the next: once the connection comes back, the next
// request reaches the endpoint. Before, the probe stayed out for 15 s,
// and requests went to another zone's endpoint meanwhile.
func TestProbeHandedBackByCanceledWait(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{ejectFor: 50 * time.Millisecond, maxConnsPerEndpoint: 1})
	l := listenLocal(t)
	here := l.Addr().(*net.TCPAddr).AddrPort()
	s := echo.New(echo.Config{Pod: "zone-a", Namespace: "b", TLS: serverTLS(e.pki.server)})
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	there := startEcho(t, "zone-b", serverTLS(e.pki.server)).addr
	eps := endpoints(here, there)
	eps[0].Zone, eps[1].Zone, eps[1].Fallback = "zone-a", "zone-b", snapshot.FallbackFar
	vWeb, vHere := netip.MustParseAddrPort("10.96.8.62:80"), netip.MustParseAddrPort("10.96.8.63:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "web", vip: vWeb, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: eps}},
		service{name: "only-here", vip: vHere, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(here)}},
	))
	web := e.client(vWeb, false)
	// A request holds the zone's endpoint's one connection: its body is
	// still to come.
	body, sendBody := io.Pipe()
	held := make(chan string, 1)
	go func() {
		resp, err := web.Post("http://web.b.svc/", "text/plain", io.MultiReader(strings.NewReader("first"), body))
		if err != nil {
			held <- err.Error()
			return
		}
		defer resp.Body.Close()
		var rep echo.Report
		json.NewDecoder(resp.Body).Decode(&rep)
		held <- rep.Pod
	}()
	t.Cleanup(func() { sendBody.Close() })
	if got := e.counterReaches("sockmesh_proxy_upstream_tls_handshakes_total", map[string]string{"result": "full"}, 1); got != 1 {
		t.Fatalf("handshakes with the zone's endpoint: %v, want 1", got)
	}
	// Its listener closes, its connection serves on: a connect through
	// another backend is refused and ejects it.
	l.Close()
	if code, _ := get(t, e.client(vHere, false), "http://only-here.b.svc/"); code != http.StatusServiceUnavailable {
		t.Fatalf("the zone's endpoint not listening: status %d, want 503", code)
	}
	e.ejectionsOver()
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://web.b.svc/", nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := web.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	// It holds the probe, and waits for the endpoint's connection.
	if got := e.counterReaches("sockmesh_proxy_upstream_endpoints_ejected", nil, 1); got != 1 {
		t.Fatalf("endpoints ejected or probed: %v, want 1", got)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the request waiting for the endpoint's connection was answered")
	}
	// The proxy saw it leave before the connection comes back.
	if got := e.counterReaches("sockmesh_proxy_request_failures_total", map[string]string{"reason": "canceled"}, 1); got != 1 {
		t.Fatalf("requests canceled: %v, want 1", got)
	}
	sendBody.Close()
	if pod := <-held; pod != "zone-a" {
		t.Fatalf("the request holding the connection: %q, want zone-a", pod)
	}
	if _, rep := get(t, web, "http://web.b.svc/"); rep.Pod != "zone-a" {
		t.Errorf("after the app waiting with the probe left: reached %q, want zone-a", rep.Pod)
	}
}

// TestStaleHandBackLeavesProbe: while a request's probe of an endpoint
// whose ejection is over is out (its connect held), a request whose
// session names the endpoint rides along on a pooled connection and hands
// no probe back, as it holds none: the next request passes the endpoint
// over, which gets one connect at a time. Before, a hand-back named the
// endpoint, not the probe: the session's request let the probe out go,
// and the next request took a second, another connect to an endpoint
// that refuses.
func TestStaleHandBackLeavesProbe(t *testing.T) {
	checkNoLeaks(t)
	l := listenLocal(t)
	here := l.Addr().(*net.TCPAddr).AddrPort()
	// Its dials: the session's, the refused one that ejects it, the probe
	// (held).
	g := &gatedDialer{to: here, pass: 2, dialing: make(chan struct{}), release: make(chan struct{})}
	e := newEnv(t, envOptions{ejectFor: 50 * time.Millisecond, dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
	s := echo.New(echo.Config{Pod: "zone-a", Namespace: "b", TLS: serverTLS(e.pki.server)})
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	eps := endpoints(here, startEcho(t, "zone-b", serverTLS(e.pki.server)).addr)
	eps[0].Zone, eps[1].Zone, eps[1].Fallback = "zone-a", "zone-b", snapshot.FallbackFar
	vWeb, vSticky, vHere := netip.MustParseAddrPort("10.96.8.64:80"), netip.MustParseAddrPort("10.96.8.65:80"), netip.MustParseAddrPort("10.96.8.66:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "web", vip: vWeb, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: eps}},
		service{name: "sticky", vip: vSticky, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: eps,
			SessionPersistence: &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "session"}}},
		service{name: "only-here", vip: vHere, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(here)}},
	))
	sticky := e.client(vSticky, false)
	a := send(t, sticky, newReq(t, http.MethodGet, "http://sticky.b.svc/", nil))
	session := a.header.Get("session")
	if a.report.Pod != "zone-a" || session == "" {
		t.Fatalf("first request: %q, session %q; want zone-a, a session", a.report.Pod, session)
	}
	// Its listener closes, the session's connection serves on: a connect
	// through another backend is refused and ejects it.
	l.Close()
	if code, _ := get(t, e.client(vHere, false), "http://only-here.b.svc/"); code != http.StatusServiceUnavailable {
		t.Fatalf("the zone's endpoint not listening: status %d, want 503", code)
	}
	e.ejectionsOver()
	web := e.client(vWeb, false)
	probed := make(chan error, 1)
	go func() {
		resp, err := web.Get("http://web.b.svc/")
		if err == nil {
			resp.Body.Close()
		}
		probed <- err
	}()
	<-g.dialing // the probe's connect, held
	if a := send(t, sticky, newReq(t, http.MethodGet, "http://sticky.b.svc/", nil, "session", session)); a.report.Pod != "zone-a" {
		t.Fatalf("the session's request with the probe out: %d from %q, want zone-a", a.status, a.report.Pod)
	}
	if _, rep := get(t, web, "http://web.b.svc/"); rep.Pod != "zone-b" {
		t.Errorf("with the probe out: reached %q, want zone-b", rep.Pod)
	}
	if n := g.dials.Load(); n != 3 {
		t.Errorf("connects to the zone's endpoint: %d, want 3 (one probe)", n)
	}
	close(g.release)
	if err := <-probed; err != nil {
		t.Fatalf("the probing request: %v", err)
	}
}

// TestRelayRefusedAnsweredOnce: a cleartext HTTP app whose connection
// the relay could not connect anywhere (every endpoint refusing) gets its
// 503 from the L7 path without another connect: the relay's connects were
// its request's tries, one per endpoint. Before, the L7 path connected to
// each again (the endpoints ejected, all of them: so tried anyway) — two
// connects per endpoint for one request.
func TestRelayRefusedAnsweredOnce(t *testing.T) {
	checkNoLeaks(t)
	for _, h2c := range []bool{false, true} {
		t.Run(map[bool]string{false: "http1", true: "h2c"}[h2c], func(t *testing.T) {
			g := &gatedDialer{pass: 1000} // counts, holds none
			e := newEnv(t, envOptions{ejectFor: time.Minute, dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
			vip := netip.MustParseAddrPort("10.96.8.70:80")
			e.p.Update(buildSnapshot(t, 1, service{name: "web", vip: vip, backend: snapshot.Backend{Endpoints: endpoints(closedPort(t), closedPort(t))}}))
			if code, _ := get(t, e.client(vip, h2c), "http://web.b.svc/"); code != http.StatusServiceUnavailable {
				t.Fatalf("every endpoint refusing: status %d, want 503", code)
			}
			if n := g.dials.Load(); n != 2 {
				t.Errorf("connects for one request to two refusing endpoints: %d, want 2", n)
			}
		})
	}
}

// TestSessionFailover: under session persistence, a request whose connect
// is refused goes to another endpoint, as any request does, and the
// session it gets names the endpoint that answered: one that carries no
// session yet, and one whose session names the refusing endpoint (nothing
// reached it), whose session starts afresh there. On every L7 path, toward
// HTTP/1.1 and h2c backends. Before, a request without a session got the
// dead endpoint's 503, and later one whose session named it did (only the
// session's next request moved).
func TestSessionFailover(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range clientKinds {
		for _, proto := range []snapshot.Protocol{"", snapshot.ProtocolH2C} {
			t.Run(fmt.Sprintf("%s/backend=%s", k.name, cmp.Or(proto, "HTTP")), func(t *testing.T) {
				e := newEnv(t, envOptions{http1TLS: k.path, ejectFor: time.Minute})
				sp := &snapshot.SessionPersistence{Type: snapshot.SessionCookie, Name: "sm-session"}
				gone := startEcho(t, "gone", nil)
				podA, podB := startEcho(t, "pod-a", nil).addr, startEcho(t, "pod-b", nil).addr
				vGone, vFresh, vPinned := netip.MustParseAddrPort("10.96.8.50:80"), netip.MustParseAddrPort("10.96.8.51:80"), netip.MustParseAddrPort("10.96.8.52:80")
				sticky := func(eps ...netip.AddrPort) snapshot.Backend {
					return snapshot.Backend{Protocol: proto, Endpoints: endpoints(eps...), SessionPersistence: sp}
				}
				// Backends have pools of their own, and a session names its
				// endpoint by address: "gone" hands out a session for an
				// endpoint that "pinned" has never connected to.
				e.p.Update(buildSnapshot(t, 1,
					service{name: "gone", vip: vGone, backend: sticky(gone.addr)},
					service{name: "fresh", vip: vFresh, backend: sticky(podA, closedPort(t), podB)},
					service{name: "pinned", vip: vPinned, backend: sticky(gone.addr, podA)},
				))
				refused := func() float64 {
					return e.counter("sockmesh_proxy_upstream_dials_total", map[string]string{"result": "refused"})
				}
				clients := map[netip.AddrPort]*http.Client{}
				// get sends a request with cookie (nil: none) to vip and
				// returns the answer and the session cookie it sets.
				get := func(vip netip.AddrPort, cookie *http.Cookie) (answer, *http.Cookie) {
					t.Helper()
					if clients[vip] == nil {
						clients[vip] = e.client(vip, k.h2c)
					}
					req := newReq(t, http.MethodGet, "http://svc.b.svc/", nil)
					if cookie != nil {
						req.AddCookie(cookie)
					}
					a := send(t, clients[vip], req)
					for _, c := range (&http.Response{Header: a.header}).Cookies() {
						if c.Name == sp.Name {
							return a, c
						}
					}
					return a, nil
				}

				// The Picker's first turn is the refused endpoint.
				first, session := get(vFresh, nil)
				if first.status != http.StatusOK || session == nil || refused() != 1 {
					t.Fatalf("no session, the refused endpoint tried first: %d %s, session %v, %v refused connects; want 200, a session, 1",
						first.status, first.body, session, refused())
				}
				for i := range 4 {
					// No Set-Cookie: the session named the endpoint it went to.
					if a, set := get(vFresh, session); a.status != http.StatusOK || a.report.Pod != first.report.Pod || set != nil {
						t.Fatalf("request %d with the session: %d from %q, Set-Cookie %v; want 200 from %s, none", i, a.status, a.report.Pod, set, first.report.Pod)
					}
				}

				a, session := get(vGone, nil)
				if a.report.Pod != "gone" || session == nil {
					t.Fatalf("gone: answered by %q, session %v", a.report.Pod, session)
				}
				gone.srv.Close()
				a, session = get(vPinned, session)
				if a.status != http.StatusOK || a.report.Pod != "pod-a" || session == nil || refused() != 2 {
					t.Fatalf("session on a refusing endpoint: %d from %q, session %v, %v refused connects; want 200 from pod-a, a new session, 2",
						a.status, a.report.Pod, session, refused())
				}
				if a, set := get(vPinned, session); a.report.Pod != "pod-a" || set != nil {
					t.Errorf("the new session: answered by %q, Set-Cookie %v; want pod-a, none", a.report.Pod, set)
				}
			})
		}
	}
}

// TestZoneFallback: a backend's endpoints on other nodes or in other
// zones, which topology hints leave to those (snapshot.Endpoint.Fallback),
// take nothing while the node's own endpoint serves, and take the requests
// and connections once it refuses, on every path — the zone's other
// node's first, other zones' once that refuses too, as Istio's locality
// failover: before, the agent left them out of the snapshot, and the proxy
// answered 503 or reset the app while they served; then the zone's and
// the other zone's took turns.
func TestZoneFallback(t *testing.T) {
	checkNoLeaks(t)
	paths := []struct {
		name  string
		proto snapshot.Protocol
		h2c   bool // the app speaks h2c
	}{
		{"http1-fast", "", false},
		{"http1-to-h2c", snapshot.ProtocolH2C, false},    // the fast path's HTTP/2 round trip
		{"h2c-to-http11", snapshot.ProtocolHTTP11, true}, // net/http's path
		{"h2c-relayed", "", true},                        // relayed HTTP/2: PickFewest
		{"tcp", snapshot.ProtocolTCP, false},             // HTTP/1.1 relayed as opaque TCP: the L4 path
	}
	for i, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			// A proxy of its own: ejections are node-wide, and a listener
			// here may get the port of an endpoint an earlier path ejected,
			// which a shared proxy would still pass over.
			e := newEnv(t, envOptions{ejectFor: time.Minute})
			there := startEcho(t, "zone-b", nil).addr
			// zoned: here on this node (preferred, PreferSameNode), near on
			// another node of its zone, there in another zone.
			zoned := func(here, near netip.AddrPort) snapshot.Backend {
				eps := endpoints(here, near, there)
				eps[0].Zone, eps[1].Zone, eps[2].Zone = "zone-a", "zone-a", "zone-b"
				eps[1].Fallback, eps[2].Fallback = snapshot.FallbackZone, snapshot.FallbackFar
				return snapshot.Backend{Protocol: p.proto, Endpoints: eps}
			}
			vip := func(k int) netip.AddrPort {
				return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 8, byte(70 + 3*i + k)}), 80)
			}
			near := startEcho(t, "node-a2", nil).addr
			e.p.Update(buildSnapshot(t, uint64(i+1),
				service{name: "serving", vip: vip(0), backend: zoned(startEcho(t, "node-a", nil).addr, near)},
				service{name: "node-refusing", vip: vip(1), backend: zoned(closedPort(t), near)},
				service{name: "zone-refusing", vip: vip(2), backend: zoned(closedPort(t), closedPort(t))},
			))
			answers := func(vip netip.AddrPort) map[string]int {
				c := e.client(vip, p.h2c)
				if p.proto == snapshot.ProtocolTCP {
					c.Transport.(*http.Transport).DisableKeepAlives = true // the L4 path picks per connection
				}
				seen := map[string]int{}
				for range 4 {
					code, rep := get(t, c, "http://svc.b.svc/")
					seen[cmp.Or(rep.Pod, strconv.Itoa(code))]++
				}
				return seen
			}
			if seen := answers(vip(0)); seen["node-a"] != 4 {
				t.Errorf("the node's endpoint serving: answers %v, want node-a's only", seen)
			}
			if seen := answers(vip(1)); seen["node-a2"] != 4 {
				t.Errorf("the node's endpoint refusing: answers %v, want the zone's other node's only", seen)
			}
			if seen := answers(vip(2)); seen["zone-b"] != 4 {
				t.Errorf("the zone's endpoints refusing: answers %v, want zone-b's", seen)
			}
		})
	}
}

// TestServingTerminatingEndpoint: while a Service's only pod is replaced
// (the old one terminating but still serving, the new one not ready yet)
// its requests go to the old one, as kube-proxy sends them, not 503; once
// the new one is ready, to it.
func TestServingTerminatingEndpoint(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	old, next := startEcho(t, "web-old", serverTLS(e.pki.server)), startEcho(t, "web-new", serverTLS(e.pki.server))
	vip := netip.MustParseAddrPort("10.96.8.30:80")
	rollout := func(version uint64, newReady bool) {
		e.p.Update(buildSnapshot(t, version, service{name: "web", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: []snapshot.Endpoint{
			{Addr: old.addr, Serving: true, Terminating: true},
			{Addr: next.addr, Ready: newReady, Serving: newReady},
		}}}))
	}
	rollout(1, false)
	if err := httpGet(e, vip, "web-old")(0); err != nil {
		t.Fatalf("the new pod not ready yet: %v", err)
	}
	rollout(2, true)
	if err := httpGet(e, vip, "web-new")(0); err != nil {
		t.Fatalf("the new pod ready: %v", err)
	}
}

// TestClientIPAffinityAllEjected: when every endpoint of a backend with
// sessionAffinity ClientIP is ejected, a client's connection tries them
// in turn, as other clients' do, rather than only the one it is pinned
// to: the one that came back serves it. Pinned, the relay tried the
// client's dead endpoint three times and reset the app, until the other's
// ejection ended (up to 30 s).
func TestClientIPAffinityAllEjected(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{ejectFor: time.Minute})
	eps := []netip.AddrPort{closedPort(t), closedPort(t)}
	vip := netip.MustParseAddrPort("10.96.8.41:5432")
	e.p.Update(buildSnapshot(t, 1, service{name: "db", vip: vip, backend: snapshot.Backend{
		Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(eps...), ClientIPAffinitySeconds: 60}}))
	if err := echoTCP(e, vip); err == nil {
		t.Fatal("a connection served with every endpoint refusing")
	}
	// Both are ejected, and the client pinned to the one tried last: the
	// one tried first comes back.
	var first netip.AddrPort
	for line := range strings.Lines(e.logs.String()) {
		var l struct{ Msg, Endpoint string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "endpoint ejected: its connect failed" {
			first = netip.MustParseAddrPort(l.Endpoint)
			break
		}
	}
	if got := e.counter("sockmesh_proxy_upstream_endpoints_ejected", nil); got != 2 || !first.IsValid() {
		t.Fatalf("%v endpoints ejected, the first %v; want 2", got, first)
	}
	l, err := net.Listen("tcp", first.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go echo.ServeTCPEcho(l)
	if err := echoTCP(e, vip); err != nil {
		t.Errorf("with the endpoint tried first back: %v", err)
	}
}

// TestClientIPAffinity: a Service with sessionAffinity ClientIP sends each
// client's connections to one endpoint, as kube-proxy does — on the relay
// (an h2c app) and on net/http's path (an HTTP/1.1 app), each connection
// fresh — and a new snapshot does not move them.
func TestClientIPAffinity(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	var eps []netip.AddrPort
	for i := range 3 {
		eps = append(eps, startEcho(t, fmt.Sprintf("h2c-%d", i), nil).addr)
	}
	vip := netip.MustParseAddrPort("10.96.8.40:80")
	update := func(version uint64) {
		e.p.Update(buildSnapshot(t, version, service{name: "sticky", vip: vip, backend: snapshot.Backend{
			Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(eps...), ClientIPAffinitySeconds: 60}}))
	}
	update(1)
	for _, src := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
		pods := map[string]int{}
		for i := range 6 {
			if i == 3 {
				update(uint64(i) + 10) // a new snapshot, the same backend
			}
			tr := &http.Transport{
				DialContext: func(context.Context, string, string) (net.Conn, error) {
					return e.dialFrom(vip, netip.MustParseAddr(src), nil)
				},
				Protocols: new(http.Protocols),
			}
			if i%2 == 0 {
				tr.Protocols.SetUnencryptedHTTP2(true) // relayed
			} else {
				tr.Protocols.SetHTTP1(true) // translated to h2c
			}
			code, rep := get(t, &http.Client{Transport: tr, Timeout: 10 * time.Second}, "http://sticky.b.svc/")
			tr.CloseIdleConnections()
			if code != http.StatusOK {
				t.Fatalf("%s, connection %d: status %d", src, i, code)
			}
			pods[rep.Pod]++
		}
		if len(pods) != 1 {
			t.Errorf("client %s reached %v, want one pod", src, pods)
		}
	}
}

// TestClientIPAffinityBackToZone: a client of a Service with
// sessionAffinity ClientIP, pinned to another zone's endpoint (a
// fallback) while its own zone's took no connection, is pinned back to the
// zone's endpoint once it takes connections again — a snapshot shows it
// ready again, or its ejection after refused connects ends and it serves —
// on the relay (an h2c app) and on net/http's path (an HTTP/1.1 app), each
// connection fresh. Before, the client stayed in the other zone for as
// long as it came back within the affinity timeout.
func TestClientIPAffinityBackToZone(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{ejectFor: 100 * time.Millisecond})
	for i, name := range []string{"ready-again", "ejection-over"} {
		t.Run(name, func(t *testing.T) {
			vip := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 8, byte(42 + i)}), 80)
			here, update := e.zoneBackend(t, name, vip, 60)
			// Each request on a connection of its own, relayed or translated.
			n := 0
			reached := func() string {
				n++
				c := e.client(vip, n%2 == 0)
				defer c.CloseIdleConnections()
				code, rep := get(t, c, "http://sticky.b.svc/")
				return cmp.Or(rep.Pod, strconv.Itoa(code))
			}
			// ready-again: the zone's endpoint is not ready; ejection-over:
			// it refuses, and is ejected.
			update(1, name == "ejection-over")
			for range 2 {
				if pod := reached(); pod != "zone-b" {
					t.Fatalf("the zone's endpoint taking none: reached %q, want zone-b", pod)
				}
			}
			startEchoOn(t, here.String(), echo.Config{Pod: "zone-a"})
			if name == "ready-again" {
				update(2, true)
			}
			for deadline := time.Now().Add(hangGuard); reached() != "zone-a"; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%v after the zone's endpoint serves again, the client still reaches zone-b", hangGuard)
				}
			}
			for range 4 {
				if pod := reached(); pod != "zone-a" {
					t.Fatalf("pinned back to the zone: reached %q, want zone-a", pod)
				}
			}
		})
	}
}

// zoneBackend is an h2c Service name at vip whose endpoint in this node's
// zone, here, refuses until the test serves it, and whose other one, in
// another zone, serves as the fallback; update publishes it at version,
// here ready or not, with ClientIP affinity of affinity seconds (0: none).
func (e *env) zoneBackend(t *testing.T, name string, vip netip.AddrPort, affinity int32) (here netip.AddrPort, update func(version uint64, hereReady bool)) {
	here = closedPort(t)
	there := startEcho(t, "zone-b", nil).addr
	return here, func(version uint64, hereReady bool) {
		eps := endpoints(here, there)
		eps[0].Ready, eps[0].Serving = hereReady, hereReady
		eps[0].Zone, eps[1].Zone, eps[1].Fallback = "zone-a", "zone-b", snapshot.FallbackFar
		e.p.Update(buildSnapshot(t, version, service{name: name, vip: vip, backend: snapshot.Backend{
			Protocol: snapshot.ProtocolH2C, Endpoints: eps, ClientIPAffinitySeconds: affinity}}))
	}
}

// TestMCPSessionPath: an app's connections to an MCP backend go through
// the L7 paths, whose requests keep an MCP session on the replica that
// issued it, on a new connection too. Before, a cleartext MCP backend
// without routes or session persistence was relayed at L4: each
// connection went to its own endpoint, whose replica did not know a
// session begun on another one (404).
func TestMCPSessionPath(t *testing.T) {
	checkNoLeaks(t)
	// replica issues its name as the session ID and answers 404 to
	// another one.
	replica := func(name string) netip.AddrPort {
		srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id := r.Header.Get("Mcp-Session-Id"); id != "" && id != name {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Mcp-Session-Id", name)
			io.WriteString(w, name)
		})}
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
		return serveLocal(t, srv)
	}
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			vip := netip.MustParseAddrPort("10.96.8.70:80")
			e.p.Update(buildSnapshot(t, 1, service{name: "mcp", vip: vip,
				backend: snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: endpoints(replica("pod-a"), replica("pod-b"), replica("pod-c"))}}))
			init := send(t, e.client(vip, k.h2c), newReq(t, http.MethodPost, "http://mcp.b.svc/", strings.NewReader("{}")))
			id := init.header.Get("Mcp-Session-Id")
			if !strings.HasSuffix(id, "."+string(init.body)) {
				t.Errorf("initialize: Mcp-Session-Id %q from %s, want it prefixed", id, init.body)
			}
			for range 4 { // each on a new connection
				a := send(t, e.client(vip, k.h2c), newReq(t, http.MethodPost, "http://mcp.b.svc/", strings.NewReader("{}"), "Mcp-Session-Id", id))
				if a.status != http.StatusOK || string(a.body) != string(init.body) {
					t.Errorf("POST with the session: %d %q, want 200 from %s", a.status, a.body, init.body)
				}
			}
		})
	}
}

// TestRelayMixedFailures: a relay whose connects met a refusal and then an
// endpoint whose TLS failed, or that endpoint alone, answers the app's
// first request as the L7 path does the same tries: with the last one's
// cause (a certificate that
// failed verification, 502 tls_verify; a handshake the endpoint broke off,
// 502 tls_handshake), logged alone, and without connecting again. Before,
// the relay's causes were joined: a broken-off handshake after a refusal
// answered 503 refused, where the L7 path answers 502, the log named both
// causes, and a relay whose only try met a certificate that failed
// verification was handed over without it, and the L7 path met it again.
func TestRelayMixedFailures(t *testing.T) {
	checkNoLeaks(t)
	type answer struct {
		status int
		body   string
		dials  int32
	}
	for _, bad := range []struct {
		name   string
		reason upstream.Reason
	}{{"verify", upstream.ReasonTLSVerify}, {"broken-off", upstream.ReasonTLSHandshake}} {
		for _, c := range []struct {
			name  string
			h2c   bool
			path  proxy.HTTP1TLSPath
			proto snapshot.Protocol
		}{
			{"l7", false, proxy.HTTP1TLSAuto, ""}, // the L7 path's own tries
			{"relay-h2c", true, proxy.HTTP1TLSAuto, snapshot.ProtocolHTTP2},
			{"relay-http1", false, proxy.HTTP1TLSL4, ""},
		} {
			for _, alone := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/alone=%v", bad.name, c.name, alone), func(t *testing.T) {
					g := &gatedDialer{pass: 1000} // counts, holds none
					e := newEnv(t, envOptions{http1TLS: c.path, ejectFor: time.Minute, dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
					badTLS := serveTCP(t, nil, func(c net.Conn) { c.Close() })
					if bad.reason == upstream.ReasonTLSVerify {
						badTLS = startEcho(t, "impostor", serverTLS(e.pki.otherSrv)).addr
					}
					vip := netip.MustParseAddrPort("10.96.8.71:80")
					// The Picker's first turn is the refused endpoint.
					eps := endpoints(badTLS, closedPort(t))
					if alone {
						eps = endpoints(badTLS)
					}
					e.p.Update(buildSnapshot(t, 1, service{name: "web", vip: vip,
						backend: snapshot.Backend{Protocol: c.proto, TLS: tlsPolicy(e), Endpoints: eps}}))
					resp, err := e.client(vip, c.h2c).Get("http://web.b.svc/")
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					want := answer{bad.reason.Status(), "sockmesh: " + string(bad.reason) + "\n", int32(len(eps))}
					if got := (answer{resp.StatusCode, string(b), g.dials.Load()}); got != want {
						t.Errorf("%v: %+v; want %+v", eps, got, want)
					}
					if l := e.logs.String(); !strings.Contains(l, `"msg":"request failed"`) || regexp.MustCompile(`"msg":"request failed".*connection refused`).MatchString(l) {
						t.Errorf("the request's line should name the last try's cause alone; log:\n%s", l)
					}
				})
			}
		}
	}
}
