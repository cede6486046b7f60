package proxy_test

import (
	"bufio"
	"fmt"
	"net/http"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestRouteAbsoluteFormRoot: an HTTP/1.1 request in absolute-form without
// a path ("GET http://app.b.svc?id=1") names the root on both HTTP/1.1
// front ends: an Exact "/" rule takes it, and the backend gets "/" — it
// met no rule but a "/" prefix, and got 404 no_match here before.
func TestRouteAbsoluteFormRoot(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range http1Kinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			backend := startRecorder(t, nil, nil)
			m := &mesh{t: t}
			be := m.backend("app", snapshot.Backend{Endpoints: endpoints(backend.addr)})
			m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
				rule{[]snapshot.RouteMatch{exactMatch("/")}, snapshot.RouteRule{Backends: to(be)}},
			)))
			e.p.Update(m.snapshot(1))
			c := e.appConn(t, routedVIP)
			fmt.Fprint(c, "GET http://app.b.svc?id=r1 HTTP/1.1\r\nHost: app.b.svc\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET http://app.b.svc?id=r1 under an Exact \"/\" rule: %d, want 200", resp.StatusCode)
			}
			if q := seenID(t, backend, "r1"); q.Target != "/?id=r1" {
				t.Errorf("backend got target %q, want /?id=r1", q.Target)
			}
		})
	}
}
