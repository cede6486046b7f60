package proxy_test

import (
	"cmp"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestRetryFailoverSkipsTried: a retry whose connect fails goes on to an
// endpoint the request has not tried, not back to the one whose 503 it
// retries, also when other requests took the balancer's turns meanwhile,
// on every path (the fast path, net/http's, toward HTTP/1.1 and h2c
// backends). Of three endpoints, the first try of ?id=held reaches one
// that answers it 503, held until another request has been served by the
// second; the third is gone (refused) when the retry goes there, and its
// connect's failover asked the balancer for its next turn: the first
// endpoint again, whose second 503 the app got, while the second served.
func TestRetryFailoverSkipsTried(t *testing.T) {
	for _, k := range clientKinds {
		for _, protocol := range []snapshot.Protocol{"", snapshot.ProtocolH2C} {
			t.Run(k.name+"/"+cmp.Or(string(protocol), "http1"), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { testRetryFailoverSkipsTried(t, k, protocol) })
			})
		}
	}
}

func testRetryFailoverSkipsTried(t *testing.T, k clientKind, protocol snapshot.Protocol) {
	var pn pipenet.Net
	addrs := []netip.AddrPort{
		netip.MustParseAddrPort("10.0.0.1:8080"), netip.MustParseAddrPort("10.0.0.2:8080"), netip.MustParseAddrPort("10.0.0.3:8080"),
	}
	var (
		mu      sync.Mutex
		bad     netip.AddrPort                  // the endpoint that got held's first try
		reached = map[string][]netip.AddrPort{} // by id, the endpoints its tries reached
	)
	arrived, release := make(chan struct{}), make(chan struct{})
	listeners := map[netip.AddrPort]*pipenet.Listener{}
	for _, a := range addrs {
		srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			id := r.URL.Query().Get("id")
			mu.Lock()
			reached[id] = append(reached[id], a)
			first := id == "held" && !bad.IsValid()
			if first {
				bad = a
			}
			failing := id == "held" && bad == a
			mu.Unlock()
			if first {
				close(arrived)
				<-release
			}
			if failing {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ok")
		})}
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
		l := pn.Listen(a)
		listeners[a] = l
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	p, reg := pipeProxy(t, &pn, proxy.Config{HTTP1TLS: k.path})
	m := &mesh{t: t}
	front := m.backend("front", snapshot.Backend{Endpoints: endpoints(netip.MustParseAddrPort("10.0.1.1:8080"))}) // never asked
	trio := m.backend("trio", snapshot.Backend{Protocol: protocol, Endpoints: endpoints(addrs...)})
	m.frontend("front", routedVIP, front, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(trio),
			Retry: &snapshot.Retry{Attempts: 1, Codes: []int{503}, Backoff: dur(1e6)}}},
	)))
	p.Update(m.snapshot(1))
	client := pipeClient(t, p, k.h2c)
	get := func(id string) (int, error) {
		resp, err := client.Get("http://front.b.svc/?id=" + id)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}

	type result struct {
		status int
		err    error
	}
	held := make(chan result, 1)
	go func() {
		status, err := get("held")
		held <- result{status, err}
	}()
	<-arrived
	if status, err := get("between"); err != nil || status != http.StatusOK {
		t.Fatalf("request while the first try was held: %d %v, want 200", status, err)
	}
	mu.Lock()
	gone := slices.IndexFunc(addrs, func(a netip.AddrPort) bool { return a != bad && a != reached["between"][0] })
	mu.Unlock()
	listeners[addrs[gone]].Close() // its pod gone: connects to it are refused
	close(release)
	r := <-held

	mu.Lock()
	defer mu.Unlock()
	tries := fmt.Sprintf("tries reached %v, %v refused", reached["held"], addrs[gone])
	if r.err != nil || r.status != http.StatusOK || len(reached["held"]) != 2 || reached["held"][1] == bad {
		t.Errorf("request whose first try got 503 from %v: %d %v (%s); want 200 from the endpoint it had not tried", bad, r.status, r.err, tries)
	}
	if got := counterValue(t, reg, "sockmesh_proxy_upstream_dials_total", "result", "refused"); got != 1 {
		t.Errorf("dials{refused} = %v, want 1: the retry's connect went to the endpoint gone (%s)", got, tries)
	}
}
