package proxy_test

import (
	"net"
	"net/http"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestRouteExternalAuthPathAsRouted: an authorization server is asked
// about the path the rules matched, dot segments resolved, with either
// protocol and on every L7 front end — "/public/../admin" is taken by the
// "/admin" rule, and its server must judge "/admin": shown the path as
// sent, a server allowing "/public/" let it on, and the backend, resolving
// it as the rules did, served "/admin" (an HTTP server allowing only
// "/check/public/" let it on before; ext_authz saw "/public/../gadmin").
func TestRouteExternalAuthPathAsRouted(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			// Allows what is under /public, as a path policy does.
			auth := startRecorder(t, nil, func(w http.ResponseWriter, r *http.Request, _ int) bool {
				if strings.HasPrefix(r.URL.Path, "/check/public/") {
					return false
				}
				w.WriteHeader(http.StatusForbidden)
				return true
			})
			az := &extAuthz{seen: map[string]*authv3.AttributeContext_HttpRequest{}}
			srv := grpc.NewServer()
			authv3.RegisterAuthorizationServer(srv, az)
			l := listenLocal(t)
			go srv.Serve(l)
			t.Cleanup(srv.Stop)
			backend := startRecorder(t, nil, nil)
			m := &mesh{t: t}
			be := m.backend("app", snapshot.Backend{Endpoints: endpoints(backend.addr)})
			authRef := m.backend("auth", snapshot.Backend{Endpoints: endpoints(auth.addr)})
			azRef := m.backend("authz", snapshot.Backend{Endpoints: endpoints(l.Addr().(*net.TCPAddr).AddrPort()), Protocol: snapshot.ProtocolH2C})
			authRule := func(prefix string, a snapshot.ExternalAuth) rule {
				return rule{[]snapshot.RouteMatch{prefixMatch(prefix)}, snapshot.RouteRule{Backends: to(be),
					Filters: snapshot.Filters{ExternalAuth: &a}}}
			}
			m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
				authRule("/admin", snapshot.ExternalAuth{Backend: authRef, PathPrefix: "/check"}),
				authRule("/gadmin", snapshot.ExternalAuth{Backend: azRef, GRPC: true}),
				rule{[]snapshot.RouteMatch{prefixMatch("/public")}, snapshot.RouteRule{Backends: to(be)}},
			)))
			e.p.Update(m.snapshot(1))
			c := e.client(routedVIP, k.h2c)
			base := "http://app.b.svc"

			if a := send(t, c, newReq(t, http.MethodGet, base+"/public/../admin?id=h1", nil)); a.status != http.StatusForbidden {
				t.Errorf("/public/../admin under the /admin rule: %d %q, want the server's 403", a.status, a.body)
			}
			if q := seenID(t, auth, "h1"); q.Target != "/check/admin?id=h1" {
				t.Errorf("HTTP server asked about %q, want /check/admin?id=h1", q.Target)
			}
			if a := send(t, c, newReq(t, http.MethodGet, base+"/public/%2e%2E/gadmin/%7Ex?id=g1", nil, "Authorization", "Bearer good")); a.status != 200 {
				t.Errorf("/public/%%2e%%2E/gadmin/%%7Ex under the /gadmin rule: %d %q, want 200", a.status, a.body)
			}
			if p := az.request("g1").GetPath(); p != "/gadmin/~x?id=g1" {
				t.Errorf("ext_authz asked about %q, want /gadmin/~x?id=g1", p)
			}
			// Encoded "/" stays encoded: it never splits a segment.
			if a := send(t, c, newReq(t, http.MethodGet, base+"/admin/a%2F..%2Fb?id=h2", nil)); a.status != http.StatusForbidden {
				t.Errorf("/admin/a%%2F..%%2Fb: %d %q, want the server's 403", a.status, a.body)
			}
			if q := seenID(t, auth, "h2"); q.Target != "/check/admin/a%2F..%2Fb?id=h2" {
				t.Errorf("HTTP server asked about %q, want /check/admin/a%%2F..%%2Fb?id=h2", q.Target)
			}
			for id, want := range map[string]int{"h1": 0, "g1": 1, "h2": 0} {
				if got := backend.count(id); got != want {
					t.Errorf("the backend saw %d requests of %s, want %d", got, id, want)
				}
			}
		})
	}
}
