package proxy_test

import (
	"cmp"
	"net/http"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestRouteRetryStalledAnswer: an answer whose status the rule retries is
// given up without waiting for its body, and the retry goes at once,
// also when the backend sends the head and holds the body back (a
// misbehaving or overloaded backend), and the rule sets no timeout: Envoy
// resets such an answer as it decides to retry. Before, the proxy read
// the retried answer's body first (to keep its connection), with no bound
// but the rule's timeouts: the request hung until the app gave up, though
// the retry would have served at once.
func TestRouteRetryStalledAnswer(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range clientKinds {
		for _, protocol := range []snapshot.Protocol{"", snapshot.ProtocolH2C} {
			t.Run(k.name+"/"+cmp.Or(string(protocol), "http1"), func(t *testing.T) {
				e := newEnv(t, envOptions{http1TLS: k.path})
				m := &mesh{t: t}
				// The first try of each ?id= gets a 503 head announcing a
				// body that never comes; the next one 200.
				flaky := startRecorder(t, nil, func(w http.ResponseWriter, r *http.Request, n int) bool {
					if n > 1 {
						return false
					}
					w.Header().Set("Content-Length", "10")
					w.WriteHeader(http.StatusServiceUnavailable)
					w.(http.Flusher).Flush()
					<-r.Context().Done()
					return true
				})
				be := m.backend("flaky", snapshot.Backend{Protocol: protocol, Endpoints: endpoints(flaky.addr)})
				m.frontend("front", routedVIP, m.echoBackend("front"), producer(routeSet(snapshot.KindHTTPRoute,
					rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be),
						Retry: &snapshot.Retry{Attempts: 1, Codes: []int{503}, Backoff: dur(1e6)}}},
				)))
				e.p.Update(m.snapshot(1))
				c := e.client(routedVIP, k.h2c)
				for _, id := range []string{"1", "2"} { // the second on the connections the first left
					a := send(t, c, newReq(t, http.MethodGet, "http://front.b.svc/?id="+id, nil))
					if a.status != http.StatusOK || flaky.count(id) != 2 {
						t.Errorf("request %s, its first answer's body held back: %d after %d tries, want 200 after 2", id, a.status, flaky.count(id))
					}
				}
			})
		}
	}
}
