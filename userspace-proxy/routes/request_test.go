package routes

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestMethodOf: an RFC 8441 extended CONNECT stands for the GET of an
// HTTP/1.1 Upgrade; any other request for its own method.
func TestMethodOf(t *testing.T) {
	tests := []struct {
		name   string
		major  int
		method string
		header http.Header
		want   string
	}{
		{"extended CONNECT", 2, http.MethodConnect, http.Header{":protocol": {"websocket"}}, http.MethodGet},
		{"plain CONNECT over HTTP/2", 2, http.MethodConnect, http.Header{}, http.MethodConnect},
		{"HTTP/1.1 CONNECT with a stray field", 1, http.MethodConnect, http.Header{":protocol": {"websocket"}}, http.MethodConnect},
		{"HTTP/1.1 Upgrade", 1, http.MethodGet, http.Header{"Upgrade": {"websocket"}}, http.MethodGet},
		{"HEAD", 2, http.MethodHead, http.Header{}, http.MethodHead},
	}
	for _, tc := range tests {
		r := &http.Request{ProtoMajor: tc.major, Method: tc.method, Header: tc.header, URL: &url.URL{Path: "/ws"}}
		if got := MethodOf(r); got != tc.want {
			t.Errorf("%s: MethodOf = %s, want %s", tc.name, got, tc.want)
		}
		if got := FromHTTP(r).Method; got != tc.want {
			t.Errorf("%s: FromHTTP(r).Method = %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestUpgradeMatchExtendedConnect: a rule matching Upgrade: websocket
// takes an HTTP/2 app's WebSocket, an extended CONNECT, as it takes an
// HTTP/1.1 app's Upgrade: it carries the field as its :protocol. It went
// to another rule before.
func TestUpgradeMatchExtendedConnect(t *testing.T) {
	ws := prefix("/")
	rs := &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{
			{Path: ws, Headers: []snapshot.StringMatch{{Name: "upgrade", Type: snapshot.MatchExact, Value: "websocket"}}, Rule: 0},
			{Path: ws, Rule: 1},
		},
		Rules: []snapshot.RouteRule{to(v1), to(v2)}}
	s := compileSet(80, rs)
	for _, tc := range []struct {
		name string
		r    *http.Request
		want snapshot.BackendRef
	}{
		{"HTTP/1.1 Upgrade", &http.Request{ProtoMajor: 1, Method: http.MethodGet, Header: http.Header{"Upgrade": {"websocket"}, "Connection": {"Upgrade"}}}, v1},
		{"extended CONNECT", &http.Request{ProtoMajor: 2, Method: http.MethodConnect, Header: http.Header{":protocol": {"websocket"}}}, v1},
		{"extended CONNECT of another protocol", &http.Request{ProtoMajor: 2, Method: http.MethodConnect, Header: http.Header{":protocol": {"webtransport"}}}, v2},
		{"plain GET", &http.Request{ProtoMajor: 2, Method: http.MethodGet, Header: http.Header{}}, v2},
	} {
		tc.r.URL = &url.URL{Path: "/chat"}
		req := FromHTTP(tc.r)
		if d := decide(s, &req); d.Action != Forward || d.Backend != tc.want {
			t.Errorf("%s: %v to %v, want Forward to %v", tc.name, d.Action, d.Backend.Name, tc.want.Name)
		}
	}
}

// TestAbsoluteFormWithoutPath: "GET http://echo" (absolute-form, no path)
// names the root, as the backend gets it ("/"): an Exact "/" rule takes
// it, and a redirect's Location names the root. It met no rule but a "/"
// prefix before, and went to another rule or 404.
func TestAbsoluteFormWithoutPath(t *testing.T) {
	u, err := url.ParseRequestURI("http://echo?q=1")
	if err != nil {
		t.Fatal(err)
	}
	r := &http.Request{ProtoMajor: 1, Method: http.MethodGet, URL: u, Host: "echo", Header: http.Header{}}
	rs := &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{{Path: exact("/"), Rule: 0}, {Path: prefix("/"), Rule: 1}},
		Rules: []snapshot.RouteRule{
			{Filters: snapshot.Filters{Redirect: &snapshot.Redirect{Hostname: "example.org", StatusCode: 302}}},
			to(v2),
		}}
	req := FromHTTP(r)
	d := decide(compileSet(80, rs), &req)
	if d.Action != Redirect || d.Location != "http://example.org/?q=1" || d.RequestPath != "/" {
		t.Errorf("GET http://echo?q=1: %v %q, RequestPath %q; want the Exact \"/\" rule's redirect to http://example.org/?q=1", d.Action, d.Location, d.RequestPath)
	}
}
