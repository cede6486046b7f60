package proxy_test

import (
	"net/http"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestRouteExternalAuthHostNotCopied: a Host field in an HTTP
// authorization server's 200 never reaches the backend, even when the
// filter lists it in allowedResponseHeaders, on every L7 front end: the
// authority is the request's (Host is no header the answer can copy; the
// GRPC protocol's OkHttpResponse cannot set it either). On the fast path
// it went out as a second Host line, which a backend must answer 400
// (RFC 9112 §3.2) and which two servers may read as two requests' hosts.
func TestRouteExternalAuthHostNotCopied(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			auth := startRecorder(t, nil, func(w http.ResponseWriter, r *http.Request, _ int) bool {
				w.Header().Set("Host", "elsewhere.example")
				w.Header().Set("X-Auth-User", "alice")
				return false
			})
			backend := startRecorder(t, nil, nil)
			m := &mesh{t: t}
			be := m.backend("app", snapshot.Backend{Endpoints: endpoints(backend.addr)})
			authRef := m.backend("auth", snapshot.Backend{Endpoints: endpoints(auth.addr)})
			m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
				rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be), Filters: snapshot.Filters{
					ExternalAuth: &snapshot.ExternalAuth{Backend: authRef, AllowedResponseHeaders: []string{"host", "x-auth-user"}}}}},
			)))
			e.p.Update(m.snapshot(1))
			c := e.client(routedVIP, k.h2c)
			if a := send(t, c, newReq(t, http.MethodGet, "http://app.b.svc/x?id=h1", nil)); a.status != 200 {
				t.Fatalf("allowed request: %d %q, want 200", a.status, a.body)
			}
			q := seenID(t, backend, "h1")
			if q.Host != "app.b.svc" || q.Header["Host"] != nil || q.Header.Get("X-Auth-User") != "alice" {
				t.Errorf("backend saw host %q, headers %v; want app.b.svc and X-Auth-User alone of the answer's", q.Host, q.Header)
			}
		})
	}
}
