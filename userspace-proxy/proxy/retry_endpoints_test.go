package proxy_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestRouteRetryAvoidsFailedEndpoint: a rule's retry goes to an endpoint
// the request has not tried, also when other requests took the Picker's
// turns while its first try was under way (as Istio has Envoy retry:
// retry_host_predicate previous_hosts). Before, the retry took the next
// turn: with two endpoints and one request in between, the endpoint that
// had just answered 503, and the app got its 503 while the other served.
func TestRouteRetryAvoidsFailedEndpoint(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			m := &mesh{t: t}
			// The endpoint the request ?id=held reaches first answers it
			// 503, every time, after it held the first try until the
			// test releases it; the other answers 200.
			var mu sync.Mutex
			bad := ""
			arrived, release := make(chan struct{}), make(chan struct{})
			endpoint := func(name string) *recorder {
				return startRecorder(t, nil, func(w http.ResponseWriter, r *http.Request, _ int) bool {
					if r.URL.Query().Get("id") != "held" {
						return false
					}
					mu.Lock()
					first := bad == ""
					if first {
						bad = name
					}
					failing := bad == name
					mu.Unlock()
					if first {
						close(arrived)
						<-release
					}
					if failing {
						w.WriteHeader(http.StatusServiceUnavailable)
					}
					return failing
				})
			}
			one, two := endpoint("one"), endpoint("two")
			pair := m.backend("pair", snapshot.Backend{Endpoints: endpoints(one.addr, two.addr)})
			m.frontend("front", routedVIP, m.echoBackend("front"), producer(routeSet(snapshot.KindHTTPRoute,
				rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(pair),
					Retry: &snapshot.Retry{Attempts: 1, Codes: []int{503}, Backoff: dur(1e6)}}},
			)))
			e.p.Update(m.snapshot(1))
			c := e.client(routedVIP, k.h2c)

			held := make(chan answer, 1)
			go func() { held <- send(t, c, newReq(t, http.MethodGet, "http://front.b.svc/?id=held", nil)) }()
			<-arrived
			// This one takes the Picker's next turn: the other endpoint.
			if a := send(t, c, newReq(t, http.MethodGet, "http://front.b.svc/?id=between", nil)); a.status != 200 {
				t.Errorf("request while the first try was held: %d, want 200", a.status)
			}
			close(release)
			a := <-held
			counts := fmt.Sprintf("one got %d, two got %d", one.count("held"), two.count("held"))
			if a.status != 200 || one.count("held")+two.count("held") != 2 {
				t.Errorf("request whose first try got 503 from %s: %d (%s); want 200 from the other endpoint, one try each", bad, a.status, counts)
			}
		})
	}
}
