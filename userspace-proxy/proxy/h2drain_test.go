package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
)

// TestRelayedH2Rebalance: gRPC channels relayed to a backend's only
// endpoint spread over the endpoints it scales up to. Six channels reach
// one pod; when the backend gains two more, four of them are asked to go
// away (each endpoint's share is two), their streams in flight go on to
// the end, and their next calls reach the new pods, two each (the
// endpoints with the fewest relayed connections). Over h2c and h2 (TLS
// origination).
func TestRelayedH2Rebalance(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{rebalanceSpread: 20 * time.Millisecond})
	for _, withTLS := range []bool{false, true} {
		name, path := "h2c", "l4"
		if withTLS {
			name, path = "h2", "l4_tls"
		}
		t.Run(name, func(t *testing.T) {
			var eps []netip.AddrPort
			for i := range 3 {
				var cfg = serverTLS(e.pki.server)
				if !withTLS {
					cfg = nil
				}
				eps = append(eps, startEcho(t, fmt.Sprintf("%s-%d", name, i), cfg).addr)
			}
			vip := netip.MustParseAddrPort(map[bool]string{false: "10.96.9.1:9000", true: "10.96.9.2:9000"}[withTLS])
			update := func(version uint64, eps ...netip.AddrPort) {
				be := snapshot.Backend{Protocol: snapshot.ProtocolGRPC, Endpoints: endpoints(eps...)}
				if withTLS {
					be.TLS = tlsPolicy(e)
				}
				e.p.Update(buildSnapshot(t, version, service{name: name, vip: vip, backend: be}))
			}
			update(1, eps[0])
			var ccs []*grpc.ClientConn
			var streams []grpc.ClientStream
			for range 6 {
				cc := e.grpcClient(t, name+".b.svc:9000", vip)
				t.Cleanup(func() { cc.Close() })
				if pod := unaryPod(t, cc); pod != name+"-0" {
					t.Fatalf("reached %s before the scale-up", pod)
				}
				st, err := cc.NewStream(t.Context(), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, echo.MethodStream)
				if err != nil {
					t.Fatal(err)
				}
				pingStream(t, st, 0)
				ccs, streams = append(ccs, cc), append(streams, st)
			}
			update(2, eps...)

			// A channel that read the GOAWAY goes idle until its next call.
			var idle int
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				idle = 0
				for _, cc := range ccs {
					if cc.GetState() == connectivity.Idle {
						idle++
					}
				}
				if idle >= 4 || time.Now().After(deadline) {
					break
				}
			}
			if idle != 4 {
				t.Fatalf("%d channels moved off the first endpoint, want 4", idle)
			}
			if got := e.counterReaches("sockmesh_proxy_goaways_total", map[string]string{"backend": name, "reason": "rebalance"}, 4); got != 4 {
				t.Errorf("goaways counted %v, want 4", got)
			}
			for i, st := range streams {
				pingStream(t, st, 1) // streams in flight go on
				st.CloseSend()
				if err := st.RecvMsg(new(wrapperspb.BytesValue)); err == nil {
					t.Errorf("channel %d: stream not ended", i)
				}
			}
			pods := map[string]int{}
			for _, cc := range ccs {
				pods[unaryPod(t, cc)]++
			}
			if len(pods) != 3 || pods[name+"-0"] != 2 || pods[name+"-1"] != 2 {
				t.Errorf("after the scale-up, channels reach %v; want two on each pod", pods)
			}
			if got := e.counter("sockmesh_proxy_connections_total", map[string]string{"path": path}); got != 10 {
				t.Errorf("%v relayed connections, want 10 (6, then 4 again)", got)
			}
		})
	}
}

// TestRelayedH2RebalanceBesideFallback: when a backend gains an endpoint,
// as many relayed h2c connections are asked to move with fallback
// endpoints (other zones', which take none) as without: each endpoint's
// share counts the endpoints taking connections only. Eight connections
// reach A; once B is added, four go, and the next four connections all
// reach B. Before, the two fallback endpoints made the share two: six
// went, and one of the next four reached A.
func TestRelayedH2RebalanceBesideFallback(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{rebalanceSpread: 20 * time.Millisecond})
	for i, fallbacks := range []int{0, 2} {
		name := fmt.Sprintf("fallbacks-%d", fallbacks)
		t.Run(name, func(t *testing.T) {
			a, b := startEcho(t, "a", nil).addr, startEcho(t, "b", nil).addr
			var others []snapshot.Endpoint
			for range fallbacks {
				others = append(others, snapshot.Endpoint{Addr: startEcho(t, "other-zone", nil).addr, Ready: true, Serving: true, Fallback: snapshot.FallbackFar})
			}
			vip := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 9, byte(20 + i)}), 80)
			update := func(version uint64, eps ...netip.AddrPort) {
				be := snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: append(endpoints(eps...), others...)}
				e.p.Update(buildSnapshot(t, version, service{name: name, vip: vip, backend: be}))
			}
			reach := func(n int) map[string]int {
				pods := map[string]int{}
				for range n {
					_, rep := get(t, e.client(vip, true), "http://web.b.svc/")
					pods[rep.Pod]++
				}
				return pods
			}
			update(1, a)
			if pods := reach(8); pods["a"] != 8 {
				t.Fatalf("before B: connections reach %v, want A only", pods)
			}
			update(2, a, b)
			// Those asked to move no longer count toward A's load: new
			// connections go to B until it carries as many as A keeps.
			if pods := reach(4); pods["b"] != 4 {
				t.Errorf("after B was added, new connections reach %v, want B only (four left A)", pods)
			}
			if got := e.counterReaches("sockmesh_proxy_goaways_total", map[string]string{"backend": name, "reason": "rebalance"}, 4); got != 4 {
				t.Errorf("goaways counted %v, want 4", got)
			}
		})
	}
}

// TestRelayedH2BackToZone: a relayed h2c connection that went to another
// zone's endpoint (a fallback) while its own zone's took none is asked to
// go away once the zone's endpoint takes connections again — a snapshot
// shows it ready again, or its ejection after refused connects ends and it
// serves — and the app's next request reaches it. Before, the connection
// stayed in the other zone for as long as it lived. Under sessionAffinity
// ClientIP too (client-ip, the zone's endpoint ready again), whose client
// is pinned back to the zone: it was left on zone-b while its client was
// pinned there, and then once the client no longer was.
func TestRelayedH2BackToZone(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{ejectFor: 100 * time.Millisecond, rebalanceSpread: 20 * time.Millisecond})
	for i, name := range []string{"ready-again", "ejection-over", "client-ip"} {
		t.Run(name, func(t *testing.T) {
			var affinity int32
			if name == "client-ip" {
				affinity = 60
			}
			vip := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 9, byte(30 + i)}), 80)
			here, update := e.zoneBackend(t, name, vip, affinity)
			// ready-again: the zone's endpoint is not ready; ejection-over:
			// it refuses, and is ejected.
			update(1, name == "ejection-over")
			c := e.client(vip, true)
			if _, rep := get(t, c, "http://web.b.svc/"); rep.Pod != "zone-b" {
				t.Fatalf("the zone's endpoint taking none: reached %q, want zone-b", rep.Pod)
			}
			startEchoOn(t, here.String(), echo.Config{Pod: "zone-a"})
			if name != "ejection-over" {
				update(2, true)
			}
			untilZoneA(t, c, "the zone's endpoint serves again")
			if got := e.counterReaches("sockmesh_proxy_goaways_total", map[string]string{"backend": name, "reason": "preferred_back"}, 1); got != 1 {
				t.Errorf("goaways counted %v, want 1", got)
			}
		})
	}
}

// TestRelayedH2FallbackDialedAcrossBack: a connection whose dial to
// another zone's endpoint was under way when the zone's endpoint came back
// (its ejection over, an HTTP/1.1 app's connect to it succeeded: nothing
// was relayed to the fallback yet to be asked back) is asked back once
// relayed, not left in the other zone for as long as it lives.
func TestRelayedH2FallbackDialedAcrossBack(t *testing.T) {
	checkNoLeaks(t)
	there := startEcho(t, "zone-b", nil).addr
	g := &gatedDialer{to: there, dialing: make(chan struct{}), release: make(chan struct{})}
	e := newEnv(t, envOptions{ejectFor: 100 * time.Millisecond, rebalanceSpread: 20 * time.Millisecond,
		dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
	here := closedPort(t)
	vip := netip.MustParseAddrPort("10.96.9.40:80")
	eps := endpoints(here, there)
	eps[0].Zone, eps[1].Zone, eps[1].Fallback = "zone-a", "zone-b", snapshot.FallbackFar
	e.p.Update(buildSnapshot(t, 1, service{name: "web", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: eps}}))
	c := e.client(vip, true)
	first := make(chan int, 1)
	go func() {
		resp, err := c.Get("http://web.b.svc/")
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-g.dialing // the zone's endpoint refused, and is ejected
	startEchoOn(t, here.String(), echo.Config{Pod: "zone-a"})
	h1 := e.client(vip, false)
	untilZoneA(t, h1, "the zone's endpoint serves again (an HTTP/1.1 app)")
	close(g.release)
	if code := <-first; code != http.StatusOK {
		t.Fatalf("the request dialed to the other zone: %d, want 200", code)
	}
	untilZoneA(t, c, "it was relayed")
}

// TestRelayedH2BackAfterCanceledProbe: when the connect that probes the
// zone's endpoint, its ejection over, ends because its app left, the
// relayed h2c connection on another zone's endpoint is still asked back,
// and the app's next request reaches the zone. Before, the probe stayed
// out for 15 s, and no event came after it: the connection stayed in the
// other zone until the next snapshot or ejection.
func TestRelayedH2BackAfterCanceledProbe(t *testing.T) {
	checkNoLeaks(t)
	here, there := closedPort(t), startEcho(t, "zone-b", nil).addr
	// The relay's dial to the zone's endpoint is refused, which ejects
	// it; the next, the probe, is held.
	g := &gatedDialer{to: here, pass: 1, dialing: make(chan struct{}), release: make(chan struct{})}
	e := newEnv(t, envOptions{ejectFor: 100 * time.Millisecond, rebalanceSpread: 20 * time.Millisecond,
		dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
	t.Cleanup(func() { close(g.release) })
	eps := endpoints(here, there)
	eps[0].Zone, eps[1].Zone, eps[1].Fallback = "zone-a", "zone-b", snapshot.FallbackFar
	relayed, sticky := netip.MustParseAddrPort("10.96.9.41:80"), netip.MustParseAddrPort("10.96.9.42:80")
	// sticky's session persistence serves its HTTP/1.1 apps on the fast
	// path, whose connects end when their app leaves; the endpoints'
	// health is the proxy's.
	e.p.Update(buildSnapshot(t, 1,
		service{name: "web", vip: relayed, backend: snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: eps}},
		service{name: "sticky", vip: sticky, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: eps,
			SessionPersistence: &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "session"}}}))
	c := e.client(relayed, true)
	if _, rep := get(t, c, "http://web.b.svc/"); rep.Pod != "zone-b" {
		t.Fatalf("the zone's endpoint refusing: reached %q, want zone-b", rep.Pod)
	}
	startEchoOn(t, here.String(), echo.Config{Pod: "zone-a"})
	h1 := e.client(sticky, false)
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(5 * time.Millisecond) {
		// Once the ejection is over, a request takes the probe, and
		// its app leaves while it connects.
		ctx, cancel := context.WithCancel(t.Context())
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://sticky.b.svc/", nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			resp, err := h1.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		probing := false
		select {
		case <-g.dialing:
			probing = true
		case err = <-done:
		}
		cancel()
		if probing {
			<-done
			break
		}
		if err != nil {
			t.Fatalf("a request before the probe: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v on, no request probed the zone's endpoint", hangGuard)
		}
	}
	untilZoneA(t, c, "the probe's app left")
}

// TestRelayedH2AllBackAfterIdleMove: of two relayed h2c connections on
// another zone's endpoint, one is asked back when the zone's endpoint's
// ejection ends (its connect would probe it); when its app stays idle, so
// that no connect comes, the other is asked back too, and its app's next
// request reaches the zone. Before, the other stayed in the other zone
// until the idle app's next request or an unrelated snapshot or ejection.
func TestRelayedH2AllBackAfterIdleMove(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{ejectFor: 100 * time.Millisecond, rebalanceSpread: 20 * time.Millisecond})
	vip := netip.MustParseAddrPort("10.96.9.47:80")
	here, update := e.zoneBackend(t, "web", vip, 0)
	update(1, true) // the zone's endpoint refuses, and is ejected
	apps := []*http.Client{e.client(vip, true), e.client(vip, true)}
	for i, c := range apps {
		if _, rep := get(t, c, "http://web.b.svc/"); rep.Pod != "zone-b" {
			t.Fatalf("app %d, the zone's endpoint taking none: reached %q, want zone-b", i, rep.Pod)
		}
	}
	startEchoOn(t, here.String(), echo.Config{Pod: "zone-a"})
	if got := e.counterReaches("sockmesh_proxy_goaways_total", map[string]string{"backend": "web", "reason": "preferred_back"}, 2); got != 2 {
		t.Fatalf("goaways counted %v, want 2 (both apps idle)", got)
	}
	// Each app reads its GOAWAY before its next request, or with it.
	for i, c := range apps {
		untilZoneA(t, c, fmt.Sprintf("both apps were asked back (app %d)", i))
	}
}

// TestRelayedH2BackAfterProbeVerifyFailed: when the connect that probes
// the zone's endpoint, its ejection over, reaches it but its certificate
// fails verification, the endpoint takes connections again as one never
// ejected does (its TLS policy fails them, and the probe's app gets 502):
// once its certificate is fixed, an HTTP/1.1 app's next request reaches
// it, and the relayed HTTP/2 connection on another zone's endpoint is
// asked back. Before, the probe stayed out for 15 s, the next request went
// to the other zone, and no event came after it: the connection stayed
// there until the next snapshot or ejection.
func TestRelayedH2BackAfterProbeVerifyFailed(t *testing.T) {
	checkNoLeaks(t)
	here := closedPort(t)
	// The relay's dial to the zone's endpoint is refused, which ejects
	// it; the next one is the probe.
	released := make(chan struct{})
	close(released)
	g := &gatedDialer{to: here, pass: 1, dialing: make(chan struct{}), release: released}
	e := newEnv(t, envOptions{ejectFor: 100 * time.Millisecond, rebalanceSpread: 20 * time.Millisecond,
		dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
	there := startEcho(t, "zone-b", serverTLS(e.pki.server)).addr
	eps := endpoints(here, there)
	eps[0].Zone, eps[1].Zone, eps[1].Fallback = "zone-a", "zone-b", snapshot.FallbackFar
	relayed, sticky := netip.MustParseAddrPort("10.96.9.43:80"), netip.MustParseAddrPort("10.96.9.44:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "web", vip: relayed, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, TLS: tlsPolicy(e), Endpoints: eps}},
		service{name: "sticky", vip: sticky, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, TLS: tlsPolicy(e), Endpoints: eps,
			SessionPersistence: &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "session"}}}))
	c := e.client(relayed, true)
	if _, rep := get(t, c, "http://web.b.svc/"); rep.Pod != "zone-b" {
		t.Fatalf("the zone's endpoint refusing: reached %q, want zone-b", rep.Pod)
	}
	// The zone's endpoint comes back with a certificate the policy's CA
	// did not sign.
	var fixed atomic.Bool
	startEchoOn(t, here.String(), echo.Config{Pod: "zone-a", TLS: &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if fixed.Load() {
				return &e.pki.server.TLS, nil
			}
			return &e.pki.otherSrv.TLS, nil
		}}})
	h1 := e.client(sticky, false)
	if code := getUntilDialed(t, g, h1, "http://sticky.b.svc/"); code != http.StatusBadGateway {
		t.Fatalf("the probe met the untrusted certificate: %d, want 502", code)
	}
	fixed.Store(true)
	if _, rep := get(t, h1, "http://sticky.b.svc/"); rep.Pod != "zone-a" {
		t.Errorf("after the probe met the untrusted certificate, then the certificate was fixed: reached %q, want zone-a", rep.Pod)
	}
	untilZoneA(t, c, "the probe met the untrusted certificate")
}

// TestRelayedH2BackAfterProbeFailedHere: when the connect that probes the
// zone's endpoint, its ejection over, fails for want of this node (here,
// no such source address), the probe goes to the next connection: the
// relayed HTTP/2 connection on another zone's endpoint is asked back and
// reaches the zone, as does an HTTP/1.1 app's next request. Before, the
// probe stayed out for 15 s, the next request went to the other zone, and
// no event came after it: the connection stayed there until the next
// snapshot or ejection.
func TestRelayedH2BackAfterProbeFailedHere(t *testing.T) {
	checkNoLeaks(t)
	here, there := closedPort(t), startEcho(t, "zone-b", nil).addr
	// The relay's dial to the zone's endpoint is refused, which ejects
	// it; the next one, the probe, fails on this node.
	released := make(chan struct{})
	close(released)
	g := &gatedDialer{to: here, pass: 1, from: netip.MustParseAddr("192.0.2.1"), dialing: make(chan struct{}), release: released}
	e := newEnv(t, envOptions{ejectFor: 100 * time.Millisecond, rebalanceSpread: 20 * time.Millisecond,
		dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
	eps := endpoints(here, there)
	eps[0].Zone, eps[1].Zone, eps[1].Fallback = "zone-a", "zone-b", snapshot.FallbackFar
	relayed, sticky := netip.MustParseAddrPort("10.96.9.45:80"), netip.MustParseAddrPort("10.96.9.46:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "web", vip: relayed, backend: snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: eps}},
		service{name: "sticky", vip: sticky, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: eps,
			SessionPersistence: &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "session"}}}))
	c := e.client(relayed, true)
	if _, rep := get(t, c, "http://web.b.svc/"); rep.Pod != "zone-b" {
		t.Fatalf("the zone's endpoint refusing: reached %q, want zone-b", rep.Pod)
	}
	startEchoOn(t, here.String(), echo.Config{Pod: "zone-a"})
	h1 := e.client(sticky, false)
	getUntilDialed(t, g, h1, "http://sticky.b.svc/")
	if got := e.counter("sockmesh_proxy_upstream_dials_total", map[string]string{"result": "dial_failed"}); got != 1 {
		t.Fatalf("dials failed for want of this node: %v, want 1 (the probe)", got)
	}
	untilZoneA(t, c, "the probe failed for want of this node")
	if _, rep := get(t, h1, "http://sticky.b.svc/"); rep.Pod != "zone-a" {
		t.Errorf("after the probe failed for want of this node: reached %q, want zone-a", rep.Pod)
	}
}

// getUntilDialed GETs url through c until a request makes the dial g
// holds (the probe, once the endpoint's ejection is over), and returns
// that request's status.
func getUntilDialed(t *testing.T, g *gatedDialer, c *http.Client, url string) int {
	t.Helper()
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(5 * time.Millisecond) {
		code, _ := get(t, c, url)
		select {
		case <-g.dialing:
			return code
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v on, no request made the dial held", hangGuard)
		}
	}
}

// trustUpdate returns update, which gives the Service web at vip the
// backend b under tlsPolicy trusting roots alone, as snapshot version.
func trustUpdate(t *testing.T, e *env, vip netip.AddrPort, b snapshot.Backend) func(version uint64, roots ...*pki.CA) {
	return func(version uint64, roots ...*pki.CA) {
		b.TLS = tlsPolicy(e)
		b.TLS.RootsPEM = ""
		for _, ca := range roots {
			b.TLS.RootsPEM += string(ca.CertPEM)
		}
		e.p.Update(buildSnapshot(t, version, service{name: "web", vip: vip, backend: b}))
	}
}

// getUntil fetches url through c until it answers want, for up to 10 s
// after what happened.
func getUntil(t *testing.T, c *http.Client, url string, want int, after string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		code, _ := get(t, c, url)
		if code == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after %s: %d, want %d", after, code, want)
		}
	}
}

// unaryPod makes a unary call on cc and returns the pod that answered.
func unaryPod(t *testing.T, cc *grpc.ClientConn) string {
	t.Helper()
	var trailer metadata.MD
	if err := cc.Invoke(t.Context(), echo.MethodUnary, wrapperspb.Bytes([]byte("ping")), new(wrapperspb.BytesValue), grpc.Trailer(&trailer)); err != nil {
		t.Fatalf("unary: %v", err)
	}
	return strings.Join(trailer.Get(echo.TrailerKey), ",")
}

// pingStream sends one message on st and reads its echo.
func pingStream(t *testing.T, st grpc.ClientStream, i int) {
	t.Helper()
	msg := fmt.Appendf(nil, "m%d", i)
	if err := st.SendMsg(wrapperspb.Bytes(msg)); err != nil {
		t.Fatalf("send %d: %v", i, err)
	}
	got := new(wrapperspb.BytesValue)
	if err := st.RecvMsg(got); err != nil || string(got.Value) != string(msg) {
		t.Fatalf("recv %d = %q, %v", i, got.Value, err)
	}
}

// TestRelayedH2EndpointGone: when the endpoint an h2c app's relayed
// connection reaches stops being ready (its pod terminates), the app is
// asked to go away at once: the event stream it is reading goes on to
// its end, and its next request opens a connection to the ready pod.
func TestRelayedH2EndpointGone(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	old, next := startEcho(t, "web-old", serverTLS(e.pki.server)), startEcho(t, "web-new", serverTLS(e.pki.server))
	vip := netip.MustParseAddrPort("10.96.9.3:80")
	e.p.Update(buildSnapshot(t, 1, service{name: "web", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(old.addr)}}))
	c := e.client(vip, true)
	resp, err := c.Get("http://web.b.svc/sse?n=20&interval=20ms")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := bufio.NewScanner(resp.Body)
	readEvent := func() string {
		for events.Scan() {
			if data, ok := strings.CutPrefix(events.Text(), "data: "); ok {
				return data
			}
		}
		return ""
	}
	if ev := readEvent(); !strings.Contains(ev, `"web-old"`) {
		t.Fatalf("first event %q", ev)
	}
	e.p.Update(buildSnapshot(t, 2, service{name: "web", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: replaced(old.addr, next.addr)}}))
	n := 1
	for readEvent() != "" {
		n++
	}
	if n != 20 || events.Err() != nil {
		t.Fatalf("the stream in flight ended after %d of 20 events: %v", n, events.Err())
	}
	resp.Body.Close()
	if code, rep := get(t, c, "http://web.b.svc/"); code != http.StatusOK || rep.Pod != "web-new" {
		t.Errorf("next request: %d from %q, want 200 from web-new", code, rep.Pod)
	}
	if got := e.counterReaches("sockmesh_proxy_goaways_total", map[string]string{"backend": "web", "reason": "endpoint_gone"}, 1); got != 1 {
		t.Errorf("goaways counted %v, want 1", got)
	}
}

// TestRelayedH2PolicyChanged: a relayed h2c connection does not outlive
// its backend's TLS policy: when the policy turns invalid, the app is
// asked at once to go away (not within the spread of a rebalancing), and
// its next request, on a new connection, gets the fail-closed 503 rather
// than the backend's answer over the connection the old policy let
// through.
func TestRelayedH2PolicyChanged(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{rebalanceSpread: time.Hour})
	be := startEcho(t, "web", serverTLS(e.pki.server))
	vip := netip.MustParseAddrPort("10.96.9.5:80")
	e.p.Update(buildSnapshot(t, 1, service{name: "web", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(be.addr)}}))
	c := e.client(vip, true)
	if code, rep := get(t, c, "http://web.b.svc/"); code != http.StatusOK || rep.Proto != "HTTP/2.0" {
		t.Fatalf("before: %d over %s, want 200 over HTTP/2", code, rep.Proto)
	}
	e.p.Update(buildSnapshot(t, 2, service{name: "web", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(be.addr),
		Invalid: &snapshot.Invalid{Policy: snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: "b", Name: "echo-tls"}, Reason: "NoValidCACertificate", Message: "no ca.crt"}}}))
	getUntil(t, c, "http://web.b.svc/", http.StatusServiceUnavailable, "the policy turned invalid")
	if got := e.counterReaches("sockmesh_proxy_goaways_total", map[string]string{"backend": "web", "reason": "policy_changed"}, 1); got != 1 {
		t.Errorf("goaways counted %v, want 1", got)
	}
}

// TestRelayedH2TrustWidened: a relayed h2c connection stays when its
// backend's TLS settings change in a way that still verifies its
// connection — a CA added beside the one that verified it, the first step
// of a CA rotation: its next request goes over the same connection to the
// backend; once that CA is rotated out, it is asked to go away at once,
// and its next request, on a new connection, fails verification. Every
// relayed connection was asked to go away on any change: a node's gRPC
// channels all connected again at once, for trust that only widened.
func TestRelayedH2TrustWidened(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{rebalanceSpread: time.Hour})
	be := startEcho(t, "web", serverTLS(e.pki.server))
	vip := netip.MustParseAddrPort("10.96.9.8:80")
	update := trustUpdate(t, e, vip, snapshot.Backend{Endpoints: endpoints(be.addr)})
	update(1, e.pki.ca)
	c := e.client(vip, true)
	code, first := get(t, c, "http://web.b.svc/")
	if code != http.StatusOK || first.Proto != "HTTP/2.0" {
		t.Fatalf("before: %d over %s, want 200 over HTTP/2", code, first.Proto)
	}
	// An event stream across the update: a GOAWAY would come between its
	// events, so the next request would see it.
	resp, err := c.Get("http://web.b.svc/sse?n=20&interval=20ms")
	if err != nil {
		t.Fatal(err)
	}
	update(2, e.pki.ca, e.pki.other)
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatalf("the stream across the update: %v", err)
	}
	resp.Body.Close()
	if code, rep := get(t, c, "http://web.b.svc/"); code != http.StatusOK || rep.RemoteAddr != first.RemoteAddr {
		t.Errorf("after a CA was added: %d from the proxy's %s, want 200 over the connection from %s", code, rep.RemoteAddr, first.RemoteAddr)
	}
	update(3, e.pki.other)
	getUntil(t, c, "http://web.b.svc/", http.StatusBadGateway, "the CA that verified the backend was rotated out")
	// One GOAWAY: the connection was not asked away when the CA was added
	// (then its successor, verified under both CAs, would be the second).
	if got := e.counterReaches("sockmesh_proxy_goaways_total", map[string]string{"backend": "web", "reason": "policy_changed"}, 1); got != 1 {
		t.Errorf("goaways counted %v, want 1", got)
	}
}

// TestL7H2TrustWidened: TestRelayedH2TrustWidened's twin on the L7 path,
// an HTTP/1.1 app to an h2 backend, whose requests go over net/http's
// HTTP/2 Transport: a CA added beside the one that verified the proxy's
// connection to the backend keeps that connection; once that CA is
// rotated out, the connection is set aside (pool_dropped_total{reason=
// "settings_changed"}), and the next request's new one fails
// verification. Any change of the settings made a new connection.
func TestL7H2TrustWidened(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	be := startEcho(t, "web", serverTLS(e.pki.server))
	vip := netip.MustParseAddrPort("10.96.9.9:80")
	update := trustUpdate(t, e, vip, snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, Endpoints: endpoints(be.addr)})
	update(1, e.pki.ca)
	c := e.client(vip, false)
	code, first := get(t, c, "http://web.b.svc/")
	if code != http.StatusOK || first.Proto != "HTTP/2.0" {
		t.Fatalf("before: %d over %s, want 200 over HTTP/2", code, first.Proto)
	}
	update(2, e.pki.ca, e.pki.other)
	if code, rep := get(t, c, "http://web.b.svc/"); code != http.StatusOK || rep.RemoteAddr != first.RemoteAddr {
		t.Errorf("after a CA was added: %d from the proxy's %s, want 200 over the connection from %s", code, rep.RemoteAddr, first.RemoteAddr)
	}
	update(3, e.pki.other)
	getUntil(t, c, "http://web.b.svc/", http.StatusBadGateway, "the CA that verified the backend was rotated out")
	if got := e.counterReaches("sockmesh_proxy_upstream_pool_dropped_total", map[string]string{"reason": "settings_changed"}, 1); got != 1 {
		t.Errorf("pool_dropped_total{reason=settings_changed} = %v, want 1", got)
	}
}

// TestRelayedH2DialedAcrossSnapshot: a connection whose dial was under
// way when a snapshot removed its endpoint (the snapshot's update did not
// see it yet) is asked to go away once it is relayed, not left there until
// some later snapshot.
func TestRelayedH2DialedAcrossSnapshot(t *testing.T) {
	checkNoLeaks(t)
	g := &gatedDialer{dialing: make(chan struct{}), release: make(chan struct{})}
	e := newEnv(t, envOptions{dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
	old, next := startEcho(t, "h2c-old", nil), startEcho(t, "h2c-new", nil)
	vip := netip.MustParseAddrPort("10.96.9.7:80")
	update := func(version uint64, eps []snapshot.Endpoint) {
		e.p.Update(buildSnapshot(t, version, service{name: "web", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: eps}}))
	}
	update(1, endpoints(old.addr))
	c := e.client(vip, true)
	first := make(chan string, 1)
	go func() {
		resp, err := c.Get("http://web.b.svc/")
		if err != nil {
			first <- err.Error()
			return
		}
		defer resp.Body.Close()
		var rep echo.Report
		json.NewDecoder(resp.Body).Decode(&rep)
		first <- rep.Pod
	}()
	<-g.dialing
	update(2, replaced(old.addr, next.addr))
	close(g.release)
	if pod := <-first; pod != "h2c-old" {
		t.Fatalf("the request whose dial began before the update: %q, want h2c-old", pod)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, rep := get(t, c, "http://web.b.svc/"); rep.Pod == "h2c-new" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("10 s on, the connection still reaches the endpoint gone before it was relayed")
		}
	}
}

// gatedDialer holds one dial — the first (to the endpoint at to, when
// set) after pass others — until release is closed or the dial's context
// ends, after closing dialing; the others go at once. With from, the held
// dial then binds its socket to from, an address no interface has, which
// the kernel refuses (EADDRNOTAVAIL): a connect that fails for want of
// this node.
type gatedDialer struct {
	d                dial.Dialer
	to               netip.AddrPort
	pass             int32
	from             netip.Addr
	dials            atomic.Int32
	dialing, release chan struct{}
}

func (g *gatedDialer) Dial(ctx context.Context, ep snapshot.Endpoint) (net.Conn, error) {
	if (!g.to.IsValid() || ep.Addr == g.to) && g.dials.Add(1) == g.pass+1 {
		close(g.dialing)
		select {
		case <-g.release:
		case <-ctx.Done():
		}
		if g.from.IsValid() {
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(g.from, 0))}
			return d.DialContext(ctx, "tcp", ep.Addr.String())
		}
	}
	return g.d.Dial(ctx, ep)
}

// TestShutdownDrainsRelayedH2: a proxy shutting down asks relayed gRPC
// channels to go away, and returns as soon as their streams in flight
// have ended (without it, it waits for its deadline and cuts them).
func TestShutdownDrainsRelayedH2(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	be := startEcho(t, "grpc-0", nil)
	vip := netip.MustParseAddrPort("10.96.9.4:9000")
	e.p.Update(buildSnapshot(t, 1, service{name: "grpc", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolGRPC, Endpoints: endpoints(be.addr)}}))
	cc := e.grpcClient(t, "grpc.b.svc:9000", vip)
	defer cc.Close()
	st, err := cc.NewStream(t.Context(), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, echo.MethodStream)
	if err != nil {
		t.Fatal(err)
	}
	pingStream(t, st, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- e.p.Shutdown(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); cc.GetState() != connectivity.Idle; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the channel did not leave its connection: %v", cc.GetState())
		}
	}
	pingStream(t, st, 1)
	st.CloseSend()
	st.RecvMsg(new(wrapperspb.BytesValue))
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("shutdown: %v, want nil (drained)", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("shutdown still waiting 10 s after the stream ended")
	}
}

// untilZoneA sends requests on c to web.b.svc until one reaches zone-a,
// and fails once hangGuard passes after what happened (after).
func untilZoneA(t *testing.T, c *http.Client, after string) {
	t.Helper()
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(5 * time.Millisecond) {
		if _, rep := get(t, c, "http://web.b.svc/"); rep.Pod == "zone-a" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after %s, requests still reach zone-b", hangGuard, after)
		}
	}
}
