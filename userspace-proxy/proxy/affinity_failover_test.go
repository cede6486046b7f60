package proxy_test

import (
	"io"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestAffinityFailoverRepins: under Service sessionAffinity ClientIP, a
// request whose connect to the endpoint its client is pinned to is
// refused goes on to the other endpoint, and the client is pinned there,
// on every path (the fast path, net/http's), as the L4 relay pins it: its
// next request, once the refusing endpoint's ejection is over, goes to
// the endpoint that served. Before, the client stayed pinned to the one
// that refused, and each of its requests first connected there again
// (dials{refused} 2).
func TestAffinityFailoverRepins(t *testing.T) {
	inBubbles(t, testAffinityFailoverRepins)
}

func testAffinityFailoverRepins(t *testing.T, k clientKind) {
	var pn pipenet.Net
	addrs := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:8080"), netip.MustParseAddrPort("10.0.0.2:8080")}
	var (
		mu      sync.Mutex
		reached []netip.AddrPort // the endpoint of each request served
	)
	servers := map[netip.AddrPort]*http.Server{}
	for _, a := range addrs {
		srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			reached = append(reached, a)
			mu.Unlock()
			io.WriteString(w, "ok")
		})}
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
		servers[a] = srv
		go srv.Serve(pn.Listen(a))
		t.Cleanup(func() { srv.Close() })
	}
	p, reg := pipeProxy(t, &pn, proxy.Config{HTTP1TLS: k.path})
	m := &mesh{t: t}
	front := m.backend("front", snapshot.Backend{Endpoints: endpoints(netip.MustParseAddrPort("10.0.1.1:8080"))}) // never asked
	pair := m.backend("pair", snapshot.Backend{Endpoints: endpoints(addrs...), ClientIPAffinitySeconds: 60})
	m.frontend("front", routedVIP, front, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(pair)}},
	)))
	p.Update(m.snapshot(1))
	client := pipeClient(t, p, k.h2c)
	// served sends a request, and returns the endpoint that answered it.
	served := func(step string) netip.AddrPort {
		t.Helper()
		resp, err := client.Get("http://front.b.svc/")
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		mu.Lock()
		defer mu.Unlock()
		if resp.StatusCode != http.StatusOK || len(reached) == 0 {
			t.Fatalf("%s: %d, want 200", step, resp.StatusCode)
		}
		return reached[len(reached)-1]
	}

	pinned := served("the first request")
	servers[pinned].Close() // its pod gone: connects to it are refused
	other := served("the request whose connect was refused")
	if other == pinned {
		t.Fatalf("the request after %v was gone was served by it", pinned)
	}
	// Past the refusing endpoint's ejection (EjectFor, 1 s), only the
	// pin keeps the client's requests from it.
	time.Sleep(2 * time.Second)
	if got := served("the next request"); got != other {
		t.Errorf("the next request was served by %v, want %v, where its client's failover went", got, other)
	}
	if got := counterValue(t, reg, "sockmesh_proxy_upstream_dials_total", "result", "refused"); got != 1 {
		t.Errorf("dials{refused} = %v, want 1: the client, pinned to %v after its failover, connected to %v once", got, other, pinned)
	}
}
