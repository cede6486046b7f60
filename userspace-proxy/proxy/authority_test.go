package proxy_test

import (
	"bufio"
	"fmt"
	"net/http"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestAbsoluteFormAuthority: a request in absolute-form names its
// authority in its target, and a Host field beside it is ignored (RFC 9112
// §3.2.2: a server MUST) — on both HTTP/1.1 front ends, to a TLS backend
// without routes (whose requests the fast path may read plain) and under a
// route: the backend gets the target's authority, and the target in
// origin-form.
func TestAbsoluteFormAuthority(t *testing.T) {
	checkNoLeaks(t)
	p := newPKI(t)
	for _, k := range http1Kinds {
		for _, routed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/routed=%v", k.name, routed), func(t *testing.T) {
				e := newEnv(t, envOptions{http1TLS: k.path})
				backend := startRecorder(t, serverTLS(p.server), nil)
				m := &mesh{t: t}
				be := m.backend("app", snapshot.Backend{Endpoints: endpoints(backend.addr),
					TLS: &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: sniName, RootsPEM: string(p.ca.CertPEM)}})
				var rt *snapshot.RouteTable
				if routed {
					rt = producer(routeSet(snapshot.KindHTTPRoute,
						rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be)}}))
				}
				m.frontend("app", routedVIP, be, rt)
				e.p.Update(m.snapshot(1))
				c := e.appConn(t, routedVIP)
				fmt.Fprint(c, "GET http://app.b.svc/p?id=a1 HTTP/1.1\r\nHost: elsewhere.example\r\n\r\n")
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("GET http://app.b.svc/p with Host: elsewhere.example: %d, want 200", resp.StatusCode)
				}
				if q := seenID(t, backend, "a1"); q.Host != "app.b.svc" || q.Target != "/p?id=a1" {
					t.Errorf("backend got Host %q, target %q; want app.b.svc, /p?id=a1", q.Host, q.Target)
				}
			})
		}
	}
}

// TestRedirectWithoutHost: an HTTP/1.0 request without Host is redirected
// to an absolute Location, whose authority is the Service address the app
// connected to: a relative one would drop the redirect's scheme and port,
// and the client would come back to the same rule.
func TestRedirectWithoutHost(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range http1Kinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			m := &mesh{t: t}
			be := m.echoBackend("app")
			m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
				rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Filters: snapshot.Filters{
					Redirect: &snapshot.Redirect{Scheme: "https", Port: 8443, StatusCode: http.StatusFound}}}})))
			e.p.Update(m.snapshot(1))
			c := e.appConn(t, routedVIP)
			fmt.Fprint(c, "GET /p?q=1 HTTP/1.0\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := fmt.Sprintf("https://%s:8443/p?q=1", routedVIP.Addr())
			if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusFound || loc != want {
				t.Errorf("GET /p?q=1 HTTP/1.0 without Host: %d, Location %q; want 302, %q", resp.StatusCode, loc, want)
			}
		})
	}
}
