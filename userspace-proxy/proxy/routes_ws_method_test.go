package proxy_test

import (
	"net/http"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestRouteWebSocketMethod: a WebSocket is a GET with Upgrade: websocket
// to the rules and to an ExternalAuth server whichever HTTP its app speaks
// — an HTTP/2 app's RFC 8441 extended CONNECT meets a rule's GET method
// match and its Upgrade header match as an HTTP/1.1 app's Upgrade does,
// and its authorization server is asked with GET. The extended CONNECT
// matched as a CONNECT without Upgrade: 404 no_match under a rule for GET,
// another rule than the Upgrade match's, and a server asked about a
// CONNECT.
func TestRouteWebSocketMethod(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{http1TLS: proxy.HTTP1TLSAuto})
	m := &mesh{t: t}
	ws := m.echoBackend("ws")
	auth := startRecorder(t, nil, nil)
	authRef := m.backend("auth", snapshot.Backend{Endpoints: endpoints(auth.addr)})
	get := func(p string) snapshot.RouteMatch {
		match := prefixMatch(p)
		match.Method = http.MethodGet
		return match
	}
	authorized := get("/ws")
	authorized.QueryParams = []snapshot.StringMatch{{Name: "auth", Type: snapshot.MatchExact, Value: "1"}}
	upgrading := prefixMatch("/ws")
	upgrading.QueryParams = []snapshot.StringMatch{{Name: "hdr", Type: snapshot.MatchExact, Value: "1"}}
	upgrading.Headers = []snapshot.StringMatch{{Name: "upgrade", Type: snapshot.MatchExact, Value: "websocket"}}
	m.frontend("front", routedVIP, ws, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{upgrading}, snapshot.RouteRule{Filters: snapshot.Filters{
			Redirect: &snapshot.Redirect{Hostname: "example.org", StatusCode: http.StatusFound}}}},
		rule{[]snapshot.RouteMatch{authorized}, snapshot.RouteRule{Backends: to(ws),
			Filters: snapshot.Filters{ExternalAuth: &snapshot.ExternalAuth{Backend: authRef}}}},
		rule{[]snapshot.RouteMatch{get("/ws")}, snapshot.RouteRule{Backends: to(ws)}},
	)))
	e.p.Update(m.snapshot(1))

	if _, _, resp := rawUpgrade(t, e, routedVIP, "/ws"); resp.StatusCode != http.StatusSwitchingProtocols {
		t.Errorf("HTTP/1.1 Upgrade under a GET rule: %d, want 101", resp.StatusCode)
	}
	if st := connectH2WS(t, e.appConn(t, routedVIP), "websocket", "front.b.svc", "/ws"); st.status != "200" {
		t.Errorf("extended CONNECT under a GET rule: %s, want 200", st.status)
	}
	if st := connectH2WS(t, e.appConn(t, routedVIP), "websocket", "front.b.svc", "/ws?auth=1&id=w1"); st.status != "200" {
		t.Errorf("extended CONNECT under a GET rule with ExternalAuth: %s, want 200", st.status)
	}
	// A match on Upgrade: websocket (an HTTP/1.1 Upgrade meets it as
	// sent): the extended CONNECT carries it as its :protocol.
	if st := connectH2WS(t, e.appConn(t, routedVIP), "websocket", "front.b.svc", "/ws?hdr=1"); st.status != "302" {
		t.Errorf("extended CONNECT under an Upgrade: websocket rule: %s, want its 302", st.status)
	}
	if q := seenID(t, auth, "w1"); q.Method != http.MethodGet || q.Target != "/ws?auth=1&id=w1" {
		t.Errorf("authorization server asked %s %s, want GET /ws?auth=1&id=w1", q.Method, q.Target)
	}
}
