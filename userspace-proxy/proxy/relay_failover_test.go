package proxy_test

import (
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
)

// TestRelayFailoverSkipsTried: an opaque TCP connection whose connect is
// refused by an endpoint that ejection does not count goes on to the
// endpoint that serves, with ClientIP affinity or without, and a client
// pinned to the refusing one is pinned to the one that served. Of two
// endpoints, gone's connect for the held connection is held until
// another connection reached gone, after which gone stops listening:
// refused, that connect began before the success and ejects nothing
// (balance.Health.Failed). The relay's second try took the balancer's
// next turn, gone again whenever other connections took the turns
// between (an even number), or the client's pin, gone again: both its
// tries refused, the app was reset while the other endpoint served.
func TestRelayFailoverSkipsTried(t *testing.T) {
	checkNoLeaks(t)
	for _, c := range []struct {
		name     string
		affinity int32
		// between is how many connections go between the held one's
		// first connect and its second; the last to gone.
		between int
	}{
		{"round-robin", 0, 3}, // turns: held gone, then serves, gone, serves
		{"client-ip-affinity", 60, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			gone := listenLocal(t)
			goneAddr := gone.Addr().(*net.TCPAddr).AddrPort()
			go echo.ServeTCPEcho(gone)
			g := &gatedDialer{to: goneAddr, dialing: make(chan struct{}), release: make(chan struct{})}
			e := newEnv(t, envOptions{ejectFor: time.Minute, dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
			vip := netip.MustParseAddrPort("10.96.8.80:5432")
			// The Picker's first turn is gone.
			e.p.Update(buildSnapshot(t, 1, service{name: "db", vip: vip, backend: snapshot.Backend{
				Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(startTCPEcho(t, nil), goneAddr), ClientIPAffinitySeconds: c.affinity}}))

			held := make(chan error, 1)
			go func() { held <- echoTCP(e, vip) }()
			<-g.dialing
			for i := range c.between {
				if err := echoTCP(e, vip); err != nil {
					t.Fatalf("connection %d while the first connect is held: %v", i, err)
				}
			}
			gone.Close()
			close(g.release)
			if err := <-held; err != nil {
				t.Errorf("the connection whose connect gone refused: %v; want it served by the other endpoint", err)
			}
			if got := e.counter("sockmesh_proxy_upstream_endpoint_ejections_total", nil); got != 0 {
				t.Fatalf("ejections = %v, want 0: the refused connect began before one that reached gone", got)
			}
			// Pinned to the endpoint that served, the client's next
			// connection connects nothing to gone, which ejection still
			// does not keep out.
			if err := echoTCP(e, vip); err != nil {
				t.Errorf("the next connection: %v", err)
			}
			if got, want := g.dials.Load(), int32(2); c.affinity > 0 && got != want {
				t.Errorf("connects to gone: %d, want %d (the held one's and the one between)", got, want)
			}
		})
	}
}

// TestRelayedH2FailoverSkipsTried: a relayed HTTP/2 connection, which
// goes to the endpoint carrying the fewest such connections, goes on to
// the endpoint that serves when its connect to one that ejection does not
// count is refused. Of two endpoints, gone's connect for the held
// connection is held while one connection goes to the other endpoint and
// stays, and another reaches gone and ends; then gone stops serving, and
// the refused connect, begun before that success, ejects nothing. The
// relay's second try went to the endpoint with the fewest connections,
// gone again, and the app got 503 while the other endpoint served.
func TestRelayedH2FailoverSkipsTried(t *testing.T) {
	checkNoLeaks(t)
	gone := startEcho(t, "gone", nil)
	g := &gatedDialer{to: gone.addr, dialing: make(chan struct{}), release: make(chan struct{})}
	e := newEnv(t, envOptions{ejectFor: time.Minute, dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
	vip := netip.MustParseAddrPort("10.96.8.81:80")
	// The first connection's first choice among equals is gone.
	e.p.Update(buildSnapshot(t, 1, service{name: "h2", vip: vip, backend: snapshot.Backend{
		Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(startEcho(t, "serves", nil).addr, gone.addr)}}))
	active := func() float64 { return e.counter("sockmesh_proxy_active_connections", nil) }

	held := make(chan string, 1)
	go func() {
		c := e.client(vip, true)
		defer c.CloseIdleConnections()
		resp, err := c.Get("http://h2.b.svc/")
		if err != nil {
			held <- err.Error()
			return
		}
		resp.Body.Close()
		held <- resp.Status
	}()
	<-g.dialing
	stays := e.client(vip, true)
	defer stays.CloseIdleConnections()
	if code, rep := get(t, stays, "http://h2.b.svc/"); code != http.StatusOK || rep.Pod != "serves" {
		t.Fatalf("the connection that stays: %d from %q, want 200 from serves", code, rep.Pod)
	}
	ends := e.client(vip, true)
	if code, rep := get(t, ends, "http://h2.b.svc/"); code != http.StatusOK || rep.Pod != "gone" {
		t.Fatalf("the connection that ends: %d from %q, want 200 from gone", code, rep.Pod)
	}
	ends.CloseIdleConnections()
	for deadline := time.Now().Add(hangGuard); active() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%v on, %v connections relayed, want 1", hangGuard, active())
		}
	}
	gone.srv.Close()
	close(g.release)
	if got := <-held; got != "200 OK" {
		t.Errorf("the connection whose connect gone refused: %q, want 200 OK from the endpoint that serves", got)
	}
	if got := e.counter("sockmesh_proxy_upstream_endpoint_ejections_total", nil); got != 0 {
		t.Errorf("ejections = %v, want 0: the refused connect began before one that reached gone", got)
	}
}
