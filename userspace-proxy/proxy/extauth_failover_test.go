package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
)

// TestRouteExternalAuthFailoverSkipsTried: an ExternalAuth ask whose
// connect is refused by an endpoint of the authorization Service that
// ejection does not count goes on to the endpoint that serves, also when
// other requests took the balancer's turns meanwhile. Of its two
// endpoints, gone's connect for the held request's ask is held until
// another request's ask reached gone, after which gone stops serving:
// refused, that connect began before the success and ejects nothing
// (balance.Health.Failed). The ask's second try took the balancer's next
// turn — gone again, three asks having gone between — and the request
// failed closed, 503, while the other endpoint served.
func TestRouteExternalAuthFailoverSkipsTried(t *testing.T) {
	checkNoLeaks(t)
	gone := startEcho(t, "gone", nil)
	g := &gatedDialer{to: gone.addr, dialing: make(chan struct{}), release: make(chan struct{})}
	e := newEnv(t, envOptions{ejectFor: time.Minute, dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
	m := &mesh{t: t}
	be := m.backend("app", snapshot.Backend{Endpoints: endpoints(startRecorder(t, nil, nil).addr)})
	// The Picker's first turn is gone.
	authRef := m.backend("auth", snapshot.Backend{Endpoints: endpoints(startEcho(t, "serves", nil).addr, gone.addr)})
	m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be), Filters: snapshot.Filters{
			ExternalAuth: &snapshot.ExternalAuth{Backend: authRef}}}},
	)))
	e.p.Update(m.snapshot(1))

	held := make(chan string, 1)
	go func() {
		resp, err := e.client(routedVIP, false).Get("http://app.b.svc/?id=held")
		if err != nil {
			held <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		held <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	<-g.dialing
	c := e.client(routedVIP, false)
	for i := range 3 { // the asks' turns: serves, gone, serves
		if a := send(t, c, newReq(t, http.MethodGet, fmt.Sprintf("http://app.b.svc/?id=between%d", i), nil)); a.status != http.StatusOK {
			t.Fatalf("request %d while the first ask's connect is held: %d %q", i, a.status, a.body)
		}
	}
	if n := g.dials.Load(); n != 2 {
		t.Fatalf("connects to gone: %d, want 2 (the held one and one between)", n)
	}
	gone.srv.Close()
	close(g.release)
	if got, want := <-held, "200 ok"; got != want {
		t.Errorf("the request whose ask gone refused: %q, want %q (authorized by the endpoint that serves)", got, want)
	}
	if got := e.counter("sockmesh_proxy_upstream_endpoint_ejections_total", nil); got != 0 {
		t.Errorf("ejections = %v, want 0: the refused connect began before one that reached gone", got)
	}
}
