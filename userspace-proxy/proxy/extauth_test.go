package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestRouteExternalAuth: a rule's ExternalAuth filter (GEP-1494, HTTP) on
// every L7 front end, against a real authorization server over TLS
// (BackendTLSPolicy) — it gets the request's method, the path after the
// filter's prefix, Host, Authorization and the allowed headers, no others,
// and the body up to forwardBody.maxSize; its 200 lets the request on with
// its allowed headers (all but Host when none are listed); its other
// answers reach the client as it gave them; a body over maxSize is refused
// 413; a server down or failing TLS fails the request closed, 503. A
// refused request never reaches the backend, a rule's redirect is given
// only to an authorized request, and a CORS preflight is answered unasked. Such a rule answered 500 before.
func TestRouteExternalAuth(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			auth := startRecorder(t, serverTLS(e.pki.server), func(w http.ResponseWriter, r *http.Request, n int) bool {
				if r.URL.Query().Get("auth") == "deny" {
					w.Header().Set("WWW-Authenticate", `Bearer realm="mesh"`)
					w.WriteHeader(http.StatusUnauthorized)
					fmt.Fprint(w, "go away")
					return true
				}
				w.Header().Set("X-Auth-User", "alice")
				w.Header().Set("X-Other", "other")
				return false
			})
			plain := startRecorder(t, nil, nil) // speaks no TLS
			backend := startRecorder(t, nil, nil)
			m := &mesh{t: t}
			be := m.backend("app", snapshot.Backend{Endpoints: endpoints(backend.addr)})
			authRef := m.backend("auth", snapshot.Backend{Endpoints: endpoints(auth.addr), TLS: tlsPolicy(e)})
			downRef := m.backend("down", snapshot.Backend{Endpoints: endpoints(closedPort(t))})
			badTLSRef := m.backend("bad-tls", snapshot.Backend{Endpoints: endpoints(plain.addr), TLS: tlsPolicy(e)})
			authRule := func(prefix string, a snapshot.ExternalAuth) rule {
				return rule{[]snapshot.RouteMatch{prefixMatch(prefix)}, snapshot.RouteRule{Backends: to(be),
					Filters: snapshot.Filters{ExternalAuth: &a}}}
			}
			m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
				authRule("/listed", snapshot.ExternalAuth{Backend: authRef, PathPrefix: "/check", AllowedHeaders: []string{"x-user"},
					AllowedResponseHeaders: []string{"x-auth-user"}, MaxBody: 8}),
				authRule("/all", snapshot.ExternalAuth{Backend: authRef}),
				authRule("/down", snapshot.ExternalAuth{Backend: downRef}),
				authRule("/bad-tls", snapshot.ExternalAuth{Backend: badTLSRef}),
				rule{[]snapshot.RouteMatch{prefixMatch("/moved")}, snapshot.RouteRule{Filters: snapshot.Filters{
					ExternalAuth: &snapshot.ExternalAuth{Backend: authRef}, Redirect: &snapshot.Redirect{Hostname: "example.org", StatusCode: 302}}}},
				rule{[]snapshot.RouteMatch{prefixMatch("/cors")}, snapshot.RouteRule{Backends: to(be), Filters: snapshot.Filters{
					ExternalAuth: &snapshot.ExternalAuth{Backend: authRef}, CORS: &snapshot.CORS{AllowOrigins: []string{"*"}, MaxAge: 5}}}},
			)))
			e.p.Update(m.snapshot(1))
			c := noRedirects(e.client(routedVIP, k.h2c))
			base := "http://app.b.svc"
			get := func(path string) answer {
				t.Helper()
				return send(t, c, newReq(t, http.MethodGet, base+path, nil, "Authorization", "Bearer t", "X-User", "u", "X-Secret", "s"))
			}
			post := func(path, body string) answer {
				t.Helper()
				return send(t, c, newReq(t, http.MethodPost, base+path, strings.NewReader(body), "Authorization", "Bearer t"))
			}
			seen := func(r *recorder, id string) recorded {
				t.Helper()
				r.mu.Lock()
				defer r.mu.Unlock()
				for _, q := range r.reqs {
					if strings.Contains(q.RawQuery, "id="+id) {
						return q
					}
				}
				t.Fatalf("no request %s seen", id)
				return recorded{}
			}

			if a := get("/listed/x?id=a1"); a.status != 200 || string(a.body) != "ok" {
				t.Errorf("allowed: %d %q, want 200 ok", a.status, a.body)
			}
			q := seen(auth, "a1")
			if q.Method != http.MethodGet || q.Path != "/check/listed/x" || q.Host != "app.b.svc" || q.Header.Get("Authorization") != "Bearer t" ||
				q.Header.Get("X-User") != "u" || q.Header["X-Secret"] != nil || len(q.Body) != 0 {
				t.Errorf("auth server saw %s %s host %q headers %v body %q", q.Method, q.Path, q.Host, q.Header, q.Body)
			}
			q = seen(backend, "a1")
			if q.Path != "/listed/x" || q.Header.Get("X-Auth-User") != "alice" || q.Header["X-Other"] != nil || q.Header.Get("X-Secret") != "s" {
				t.Errorf("backend saw %s with headers %v; want X-Auth-User alone of the auth answer's", q.Path, q.Header)
			}
			if a := post("/listed/x?id=a2", "12345678"); a.status != 200 {
				t.Errorf("body within maxSize: %d %q, want 200", a.status, a.body)
			}
			if q := seen(auth, "a2"); string(q.Body) != "12345678" || q.Header.Get("Content-Length") != "8" {
				t.Errorf("auth server got body %q, Content-Length %q; want the 8 bytes", q.Body, q.Header.Get("Content-Length"))
			}
			if q := seen(backend, "a2"); string(q.Body) != "12345678" {
				t.Errorf("backend got body %q, want the 8 bytes", q.Body)
			}
			// A body of unknown length (chunked, or an h2c stream without
			// content-length) is read up to maxSize too.
			chunked := func(id, body string) answer {
				return send(t, c, newReq(t, http.MethodPost, base+"/listed/x?id="+id, io.MultiReader(strings.NewReader(body))))
			}
			if a := chunked("a4", "1234"); a.status != 200 || string(seen(auth, "a4").Body) != "1234" || string(seen(backend, "a4").Body) != "1234" {
				t.Errorf("body of unknown length within maxSize: %d; auth got %q, backend %q", a.status, seen(auth, "a4").Body, seen(backend, "a4").Body)
			}
			if a := chunked("d5", "123456789"); a.status != http.StatusRequestEntityTooLarge {
				t.Errorf("body of unknown length over maxSize: %d %q, want 413", a.status, a.body)
			}
			if a := get("/all?id=a3"); a.status != 200 {
				t.Errorf("allowed, all headers: %d %q", a.status, a.body)
			}
			if q := seen(backend, "a3"); q.Header.Get("X-Auth-User") != "alice" || q.Header.Get("X-Other") != "other" || q.Host != "app.b.svc" {
				t.Errorf("backend saw host %q headers %v; want every header of the auth answer", q.Host, q.Header)
			}
			if a := get("/listed/x?id=d1&auth=deny"); a.status != http.StatusUnauthorized || string(a.body) != "go away" ||
				a.header.Get("WWW-Authenticate") != `Bearer realm="mesh"` {
				t.Errorf("denied: %d %q with %v; want the auth server's 401", a.status, a.body, a.header)
			}
			// A rule's own answer, a redirect, is authorized too.
			if a := get("/moved?id=r1&auth=deny"); a.status != http.StatusUnauthorized || a.header.Get("Location") != "" {
				t.Errorf("redirect, denied: %d with Location %q; want the auth server's 401", a.status, a.header.Get("Location"))
			}
			if a := get("/moved?id=r2"); a.status != http.StatusFound || auth.count("r2") != 1 {
				t.Errorf("redirect, allowed: %d after %d auth requests; want 302 after one", a.status, auth.count("r2"))
			}
			// A preflight carries no credentials: the CORS filter answers it
			// unasked.
			if a := send(t, c, newReq(t, http.MethodOptions, base+"/cors?id=p1&auth=deny", nil, "Origin", "https://a.example",
				"Access-Control-Request-Method", "GET")); a.status != http.StatusOK || auth.count("p1") != 0 {
				t.Errorf("preflight: %d after %d auth requests; want 200 unasked", a.status, auth.count("p1"))
			}
			if a := post("/listed/x?id=d2", "123456789"); a.status != http.StatusRequestEntityTooLarge {
				t.Errorf("body over maxSize: %d %q, want 413", a.status, a.body)
			}
			for _, id := range []string{"d3", "d4"} {
				path := map[string]string{"d3": "/down", "d4": "/bad-tls"}[id]
				if a := get(path + "?id=" + id); a.status != http.StatusServiceUnavailable {
					t.Errorf("auth server unreachable (%s): %d %q, want 503", path, a.status, a.body)
				}
			}
			for id, want := range map[string]int{"a1": 1, "a2": 1, "a3": 1, "a4": 1, "d1": 0, "d2": 0, "d3": 0, "d4": 0, "d5": 0} {
				if got := backend.count(id); got != want {
					t.Errorf("the backend saw %d requests of %s, want %d", got, id, want)
				}
			}
			if got := auth.count("d2"); got != 0 {
				t.Errorf("the auth server saw %d requests of d2 (body over maxSize), want 0", got)
			}
			for reason, want := range map[string]float64{"ext_auth_denied": 2, "ext_auth_body_too_large": 2, "ext_auth_error": 2} {
				if got := e.counter("sockmesh_proxy_route_answers_total", map[string]string{"reason": reason}); got != want {
					t.Errorf("route answers{%s} = %v, want %v", reason, got, want)
				}
			}
		})
	}
}
