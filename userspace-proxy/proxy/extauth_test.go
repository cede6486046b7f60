package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/userspace-proxy/httpproxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestRouteExternalAuth: a rule's ExternalAuth filter (GEP-1494, HTTP) on
// every L7 front end, against a real authorization server over TLS
// (BackendTLSPolicy) — it gets the request's method, the path after the
// filter's prefix, Host, Authorization and the allowed headers, no others,
// and the body up to forwardBody.maxSize; its 200 lets the request on with
// its allowed headers (all but Host when none are listed); its other
// answers reach the client as it gave them; a body over maxSize is refused
// 413, an upload going on as soon as maxSize+1 bytes came (net/http's
// HTTP/1 server read on for up to 256 KiB more first); a server down or failing TLS fails the request closed, 503. A
// refused request never reaches the backend, a rule's redirect is given
// only to an authorized request, and a CORS preflight is answered unasked. Such a rule answered 500 before.
// Each of the filter's answers — the server's denial, 413, 503 — carries
// the rule's response header changes and CORS headers, the denial with the
// server's Content-Type (ruleMarks); they had none before.
func TestRouteExternalAuth(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			auth := startRecorder(t, serverTLS(e.pki.server), func(w http.ResponseWriter, r *http.Request, n int) bool {
				if auth := r.URL.Query().Get("auth"); auth == "deny" || auth == "deny-untyped" {
					w.Header().Set("WWW-Authenticate", `Bearer realm="mesh"`)
					w.Header().Set("Content-Type", "text/html; charset=utf-8")
					if auth == "deny-untyped" {
						w.Header()["Content-Type"] = nil // none, not one guessed from the body
					}
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
				rule{[]snapshot.RouteMatch{prefixMatch("/marked")}, snapshot.RouteRule{Backends: to(be),
					Filters: ruleMarks(snapshot.ExternalAuth{Backend: authRef, MaxBody: 8})}},
				rule{[]snapshot.RouteMatch{prefixMatch("/down-marked")}, snapshot.RouteRule{Backends: to(be),
					Filters: ruleMarks(snapshot.ExternalAuth{Backend: downRef})}},
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

			if a := get("/listed/x?id=a1"); a.status != 200 || string(a.body) != "ok" {
				t.Errorf("allowed: %d %q, want 200 ok", a.status, a.body)
			}
			q := seenID(t, auth, "a1")
			if q.Method != http.MethodGet || q.Path != "/check/listed/x" || q.Host != "app.b.svc" || q.Header.Get("Authorization") != "Bearer t" ||
				q.Header.Get("X-User") != "u" || q.Header["X-Secret"] != nil || len(q.Body) != 0 {
				t.Errorf("auth server saw %s %s host %q headers %v body %q", q.Method, q.Path, q.Host, q.Header, q.Body)
			}
			q = seenID(t, backend, "a1")
			if q.Path != "/listed/x" || q.Header.Get("X-Auth-User") != "alice" || q.Header["X-Other"] != nil || q.Header.Get("X-Secret") != "s" {
				t.Errorf("backend saw %s with headers %v; want X-Auth-User alone of the auth answer's", q.Path, q.Header)
			}
			if a := post("/listed/x?id=a2", "12345678"); a.status != 200 {
				t.Errorf("body within maxSize: %d %q, want 200", a.status, a.body)
			}
			if q := seenID(t, auth, "a2"); string(q.Body) != "12345678" || q.Header.Get("Content-Length") != "8" {
				t.Errorf("auth server got body %q, Content-Length %q; want the 8 bytes", q.Body, q.Header.Get("Content-Length"))
			}
			if q := seenID(t, backend, "a2"); string(q.Body) != "12345678" {
				t.Errorf("backend got body %q, want the 8 bytes", q.Body)
			}
			// A body of unknown length (chunked, or an h2c stream without
			// content-length) is read up to maxSize too.
			chunked := func(id, body string) answer {
				return send(t, c, newReq(t, http.MethodPost, base+"/listed/x?id="+id, io.MultiReader(strings.NewReader(body))))
			}
			if a := chunked("a4", "1234"); a.status != 200 || string(seenID(t, auth, "a4").Body) != "1234" || string(seenID(t, backend, "a4").Body) != "1234" {
				t.Errorf("body of unknown length within maxSize: %d; auth got %q, backend %q", a.status, seenID(t, auth, "a4").Body, seenID(t, backend, "a4").Body)
			}
			if a := chunked("d5", "123456789"); a.status != http.StatusRequestEntityTooLarge {
				t.Errorf("body of unknown length over maxSize: %d %q, want 413", a.status, a.body)
			}
			if !k.h2c {
				// A client that waits for 100 Continue gets it from the
				// proxy, which reads the body for the auth server.
				rc := e.rawClient(t, routedVIP)
				rc.send("POST /listed/x?id=a5 HTTP/1.1\r\nHost: app.b.svc\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
				if resp, err := rc.tryRead(http.MethodPost); err != nil || resp.StatusCode != http.StatusContinue {
					t.Fatalf("expecting 100 Continue: got %v, %v", resp, err)
				}
				rc.send("abc")
				if resp, _ := rc.read(http.MethodPost); resp.StatusCode != 200 || string(seenID(t, auth, "a5").Body) != "abc" || string(seenID(t, backend, "a5").Body) != "abc" {
					t.Errorf("after 100 Continue: %d; auth got %q, backend %q", resp.StatusCode, seenID(t, auth, "a5").Body, seenID(t, backend, "a5").Body)
				}
			}
			if !k.h2c {
				// An upload still going on is refused once maxSize+1 of it
				// came: the 413 does not wait for the rest.
				rc := e.rawClient(t, routedVIP)
				rc.send("POST /listed/x?id=d6 HTTP/1.1\r\nHost: app.b.svc\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n123456789\r\n")
				if resp, err := rc.tryRead(http.MethodPost); err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
					t.Errorf("upload going on past maxSize: got %v, %v; want 413", resp, err)
				}
			}
			if a := get("/all?id=a3"); a.status != 200 {
				t.Errorf("allowed, all headers: %d %q", a.status, a.body)
			}
			if q := seenID(t, backend, "a3"); q.Header.Get("X-Auth-User") != "alice" || q.Header.Get("X-Other") != "other" || q.Host != "app.b.svc" {
				t.Errorf("backend saw host %q headers %v; want every header of the auth answer", q.Host, q.Header)
			}
			// No body forwarded: a POST's auth request says so, Content-Length
			// 0 (as Envoy's ext_authz); the backend gets the body.
			if a := post("/all?id=a6", "xyz"); a.status != 200 || string(seenID(t, backend, "a6").Body) != "xyz" {
				t.Errorf("post, body not forwarded: %d; backend got %q", a.status, seenID(t, backend, "a6").Body)
			}
			if q := seenID(t, auth, "a6"); q.Header.Get("Content-Length") != "0" || len(q.Body) != 0 {
				t.Errorf("auth request of a POST, body not forwarded: Content-Length %q, body %q; want 0 and none", q.Header.Get("Content-Length"), q.Body)
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
			// A browser's requests from an allowed origin: the page's
			// script reads each answer, the denial's body keeps its type.
			fromPage := func(method, path, body string) answer {
				t.Helper()
				return send(t, c, newReq(t, method, base+path, strings.NewReader(body), "Origin", "https://a.example"))
			}
			wantRuleMarks(t, "denied", fromPage(http.MethodGet, "/marked?id=m1&auth=deny", ""), http.StatusUnauthorized, "text/html; charset=utf-8")
			wantRuleMarks(t, "body over maxSize", fromPage(http.MethodPost, "/marked?id=m2", "123456789"), http.StatusRequestEntityTooLarge, "text/plain; charset=utf-8")
			wantRuleMarks(t, "auth server down", fromPage(http.MethodGet, "/down-marked?id=m3", ""), http.StatusServiceUnavailable, "text/plain; charset=utf-8")
			if a := fromPage(http.MethodGet, "/marked?id=m4&auth=deny", ""); a.header.Get("WWW-Authenticate") != `Bearer realm="mesh"` || string(a.body) != "go away" {
				t.Errorf("denied under the rule's header changes: %q with %v; want the server's body and WWW-Authenticate", a.body, a.header)
			}
			// A denial without a Content-Type goes without one, neither
			// the rule's nor one net/http's server would guess.
			if a := fromPage(http.MethodGet, "/marked?id=m5&auth=deny-untyped", ""); a.status != http.StatusUnauthorized || a.header["Content-Type"] != nil {
				t.Errorf("denied without a Content-Type: %d with Content-Type %q, want 401 with none", a.status, a.header["Content-Type"])
			}
			for id, want := range map[string]int{"a1": 1, "a2": 1, "a3": 1, "a4": 1, "a6": 1, "d1": 0, "d2": 0, "d3": 0, "d4": 0, "d5": 0, "d6": 0,
				"m1": 0, "m2": 0, "m3": 0, "m4": 0, "m5": 0} {
				if got := backend.count(id); got != want {
					t.Errorf("the backend saw %d requests of %s, want %d", got, id, want)
				}
			}
			if got := auth.count("d2"); got != 0 {
				t.Errorf("the auth server saw %d requests of d2 (body over maxSize), want 0", got)
			}
			tooLarge := 4.0 // d2, d5, d6, m2
			if k.h2c {
				tooLarge = 3
			}
			for reason, want := range map[string]float64{"ext_auth_denied": 5, "ext_auth_body_too_large": tooLarge, "ext_auth_error": 3} {
				if got := e.counter("sockmesh_proxy_route_answers_total", map[string]string{"reason": reason}); got != want {
					t.Errorf("route answers{%s} = %v, want %v", reason, got, want)
				}
			}
		})
	}
}

// ruleMarks are the filters of a rule with ExternalAuth a whose answers
// the client must read as the rule's: a ResponseHeaderModifier setting
// X-Rule and a Content-Type of its own, and CORS for https://a.example
// with credentials (a credentialed request gets no CORS header otherwise:
// GEP-1767).
func ruleMarks(a snapshot.ExternalAuth) snapshot.Filters {
	return snapshot.Filters{ExternalAuth: &a, CORS: &snapshot.CORS{AllowOrigins: []string{"https://a.example"}, AllowCredentials: true, MaxAge: 5},
		ResponseHeaders: &snapshot.HeaderModifier{Set: []snapshot.Header{{Name: "X-Rule", Value: "1"}, {Name: "Content-Type", Value: "application/json"}}}}
}

// wantRuleMarks checks a, the answer of status to a request from
// https://a.example under ruleMarks: X-Rule and the CORS headers of the
// origin, and Content-Type ct (its body's, not the rule's).
func wantRuleMarks(t *testing.T, name string, a answer, status int, ct string) {
	t.Helper()
	cors := map[string]string{"Access-Control-Allow-Origin": "https://a.example", "Access-Control-Allow-Credentials": "true", "Vary": "Origin"}
	if a.status != status || a.header.Get("X-Rule") != "1" || !maps.Equal(corsFields(a), cors) || !slices.Equal(a.header["Content-Type"], []string{ct}) {
		t.Errorf("%s: %d with X-Rule %q, CORS %v, Content-Type %q; want %d with \"1\", %v, %q", name, a.status,
			a.header.Get("X-Rule"), corsFields(a), a.header["Content-Type"], status, cors, ct)
	}
}

// extAuthz is an Envoy ext_authz v3 server: "Bearer good" is let on with
// X-Auth-User set, X-Tag added to and Authorization removed; anything
// else is denied 401 with a header and a body. It keeps the requests it
// was asked about, by their id query parameter, and the time each call's
// deadline left it (-1: none).
type extAuthz struct {
	authv3.UnimplementedAuthorizationServer
	mu   sync.Mutex
	seen map[string]*authv3.AttributeContext_HttpRequest
	left map[string]time.Duration
}

func (s *extAuthz) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	h := req.GetAttributes().GetRequest().GetHttp()
	u, _ := url.Parse(h.GetPath())
	s.mu.Lock()
	s.seen[u.Query().Get("id")] = h
	if s.left == nil {
		s.left = map[string]time.Duration{}
	}
	s.left[u.Query().Get("id")] = left
	s.mu.Unlock()
	if h.GetHeaders()["authorization"] != "Bearer good" {
		return &authv3.CheckResponse{Status: &status.Status{Code: int32(codes.PermissionDenied)},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode_Unauthorized},
				Headers: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "www-authenticate", Value: `Bearer realm="mesh"`}},
					{Header: &corev3.HeaderValue{Key: "content-type", Value: "text/html; charset=utf-8"}}},
				Body: "denied",
			}}}, nil
	}
	return &authv3.CheckResponse{Status: &status.Status{Code: int32(codes.OK)},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
			Headers: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-auth-user", Value: "alice"}},
				{Header: &corev3.HeaderValue{Key: "x-tag", Value: "b"}, Append: wrapperspb.Bool(true)}},
			HeadersToRemove: []string{"authorization"},
		}}}, nil
}

func (s *extAuthz) request(id string) *authv3.AttributeContext_HttpRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[id]
}

// deadline is the time the ask about id had left when it came (-1: no
// deadline).
func (s *extAuthz) deadline(id string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.left[id]
}

// TestRouteExternalAuthGRPC: the filter with the GRPC protocol asks a real
// ext_authz server (grpc-go, over TLS) on every L7 front end — the
// CheckRequest holds the method, path and query, host and the allowed
// headers (all when none are listed, never hop-by-hop ones: they went in),
// the pseudo-fields Envoy's filter shows among them too (":authority",
// ":method", ":path", ":scheme", whatever the list: none before)
// and the body up to maxSize; an OK lets
// the request on with the answer's headers set, added and removed; a
// denial reaches the client with the DeniedHttpResponse's status, header
// and body, and never the backend, with the rule's response header changes
// and CORS headers (ruleMarks; none before); a server that does not speak
// gRPC fails the request closed, 503. The server is told the ask's
// deadline (grpc-timeout), as gRPC clients tell theirs.
func TestRouteExternalAuthGRPC(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			az := &extAuthz{seen: map[string]*authv3.AttributeContext_HttpRequest{}}
			srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS(e.pki.server))))
			authv3.RegisterAuthorizationServer(srv, az)
			l := listenLocal(t)
			go srv.Serve(l)
			t.Cleanup(srv.Stop)
			plain := startRecorder(t, nil, nil) // answers HTTP, not gRPC
			backend := startRecorder(t, nil, nil)
			m := &mesh{t: t}
			be := m.backend("app", snapshot.Backend{Endpoints: endpoints(backend.addr)})
			authRef := m.backend("authz", snapshot.Backend{Endpoints: endpoints(l.Addr().(*net.TCPAddr).AddrPort()),
				TLS: tlsPolicy(e), Protocol: snapshot.ProtocolGRPC})
			notGRPC := m.backend("not-grpc", snapshot.Backend{Endpoints: endpoints(plain.addr), Protocol: snapshot.ProtocolH2C})
			authRule := func(prefix string, a snapshot.ExternalAuth) rule {
				return rule{[]snapshot.RouteMatch{prefixMatch(prefix)}, snapshot.RouteRule{Backends: to(be),
					Filters: snapshot.Filters{ExternalAuth: &a}}}
			}
			m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
				authRule("/listed", snapshot.ExternalAuth{Backend: authRef, GRPC: true, AllowedHeaders: []string{"authorization", "x-user"}, MaxBody: 8}),
				authRule("/all", snapshot.ExternalAuth{Backend: authRef, GRPC: true}),
				authRule("/not-grpc", snapshot.ExternalAuth{Backend: notGRPC, GRPC: true}),
				rule{[]snapshot.RouteMatch{prefixMatch("/marked")}, snapshot.RouteRule{Backends: to(be),
					Filters: ruleMarks(snapshot.ExternalAuth{Backend: authRef, GRPC: true})}},
			)))
			e.p.Update(m.snapshot(1))
			c := e.client(routedVIP, k.h2c)
			base := "http://app.b.svc"
			call := func(method, path, body, authorization string) answer {
				t.Helper()
				var r io.Reader
				if body != "" {
					r = strings.NewReader(body)
				}
				return send(t, c, newReq(t, method, base+path, r, "Authorization", authorization, "X-User", "u", "X-Secret", "s", "X-Tag", "a"))
			}

			if a := call(http.MethodPost, "/listed/x?id=g1", "1234", "Bearer good"); a.status != 200 {
				t.Errorf("allowed: %d %q, want 200", a.status, a.body)
			}
			// The ask's deadline is the server's, as a gRPC client tells
			// it: ExternalAuthTimeout (none before).
			if left := az.deadline("g1"); left <= 0 || left > 5*time.Second {
				t.Errorf("ext_authz had %v left of its deadline, want at most ExternalAuthTimeout (5s)", left)
			}
			// The pseudo-fields go whatever the list: they repeat the
			// attributes.
			listed := map[string]string{"authorization": "Bearer good", "x-user": "u",
				":authority": "app.b.svc", ":method": "POST", ":path": "/listed/x?id=g1", ":scheme": "http"}
			h := az.request("g1")
			if h == nil || h.GetMethod() != http.MethodPost || h.GetPath() != "/listed/x?id=g1" || h.GetHost() != "app.b.svc" ||
				h.GetBody() != "1234" || !maps.Equal(h.GetHeaders(), listed) {
				t.Errorf("ext_authz got %v", h)
			}
			if q := seenID(t, backend, "g1"); q.Header.Get("X-Auth-User") != "alice" || strings.Join(q.Header["X-Tag"], ",") != "a,b" ||
				q.Header["Authorization"] != nil || string(q.Body) != "1234" {
				t.Errorf("backend saw headers %v body %q; want X-Auth-User set, X-Tag added, Authorization removed", q.Header, q.Body)
			}
			if a := call(http.MethodGet, "/all?id=g2", "", "Bearer good"); a.status != 200 || az.request("g2").GetHeaders()["x-secret"] != "s" {
				t.Errorf("allowed, all headers: %d; ext_authz got %v", a.status, az.request("g2").GetHeaders())
			}
			// Envoy's header map holds the pseudo-fields, whichever HTTP
			// the app speaks: a policy written for Envoy matches on them.
			pseudo := map[string]string{":authority": "app.b.svc", ":method": "GET", ":path": "/all?id=g2", ":scheme": "http"}
			for f, want := range pseudo {
				if got, ok := az.request("g2").GetHeaders()[f]; got != want {
					t.Errorf("ext_authz got %s: %q (%v), want %q", f, got, ok, want)
				}
			}
			if !k.h2c { // an HTTP/2 client sends no such fields
				// They describe the app's connection to the proxy: the
				// server gets none, as the backend gets none.
				a := send(t, c, newReq(t, http.MethodGet, base+"/all?id=g3", nil, "Authorization", "Bearer good",
					"Connection", "X-Hop", "X-Hop", "1", "Keep-Alive", "timeout=5", "Proxy-Connection", "keep-alive", "Te", "gzip"))
				h := az.request("g3").GetHeaders()
				if a.status != 200 || h["authorization"] != "Bearer good" {
					t.Errorf("allowed, hop-by-hop fields: %d; ext_authz got %v", a.status, h)
				}
				for _, f := range []string{"connection", "x-hop", "keep-alive", "proxy-connection", "te"} {
					if v, ok := h[f]; ok {
						t.Errorf("ext_authz got hop-by-hop %s: %q", f, v)
					}
				}
			}
			if a := call(http.MethodGet, "/listed/x?id=d1", "", "Bearer bad"); a.status != http.StatusUnauthorized ||
				string(a.body) != "denied" || a.header.Get("WWW-Authenticate") != `Bearer realm="mesh"` {
				t.Errorf("denied: %d %q with %v; want the DeniedHttpResponse's 401", a.status, a.body, a.header)
			}
			a := send(t, c, newReq(t, http.MethodGet, base+"/marked?id=m1", nil, "Authorization", "Bearer bad", "Origin", "https://a.example"))
			wantRuleMarks(t, "denied", a, http.StatusUnauthorized, "text/html; charset=utf-8")
			if a.header.Get("WWW-Authenticate") != `Bearer realm="mesh"` || string(a.body) != "denied" {
				t.Errorf("denied under the rule's header changes: %q with %v; want the DeniedHttpResponse's body and WWW-Authenticate", a.body, a.header)
			}
			if a := call(http.MethodPost, "/listed/x?id=d2", "123456789", "Bearer good"); a.status != http.StatusRequestEntityTooLarge {
				t.Errorf("body over maxSize: %d, want 413", a.status)
			}
			if a := call(http.MethodGet, "/not-grpc?id=d3", "", "Bearer good"); a.status != http.StatusServiceUnavailable {
				t.Errorf("server not speaking gRPC: %d %q, want 503", a.status, a.body)
			}
			for id, want := range map[string]int{"g1": 1, "g2": 1, "d1": 0, "d2": 0, "d3": 0, "m1": 0} {
				if got := backend.count(id); got != want {
					t.Errorf("the backend saw %d requests of %s, want %d", got, id, want)
				}
			}
			for reason, want := range map[string]float64{"ext_auth_denied": 2, "ext_auth_body_too_large": 1, "ext_auth_error": 1} {
				if got := e.counter("sockmesh_proxy_route_answers_total", map[string]string{"reason": reason}); got != want {
					t.Errorf("route answers{%s} = %v, want %v", reason, got, want)
				}
			}
		})
	}
}

// TestRouteExternalAuthGRPCApp: a gRPC app's calls under an HTTPRoute rule
// with the filter (GRPC protocol, the body forwarded) are authorized too —
// the ext_authz server gets the call's message, an allowed call reaches
// the backend with the server's metadata, a denied one ends UNAUTHENTICATED
// (the DeniedHttpResponse's 401) without reaching it, as a trailers-only
// status with the server's body as its message and its headers as
// metadata, as Envoy answers (the 401 as the server gave it before: the
// code, and grpc-go's "unexpected HTTP status code" for a message).
func TestRouteExternalAuthGRPCApp(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	az := &extAuthz{seen: map[string]*authv3.AttributeContext_HttpRequest{}}
	as := grpc.NewServer()
	authv3.RegisterAuthorizationServer(as, az)
	al := listenLocal(t)
	go as.Serve(al)
	t.Cleanup(as.Stop)
	calls := make(chan metadata.MD, 2)
	cc := grpcAuthedApp(t, e, func(_ any, st grpc.ServerStream) error {
		if err := st.RecvMsg(new(wrapperspb.BytesValue)); err != nil {
			return err
		}
		md, _ := metadata.FromIncomingContext(st.Context())
		calls <- md
		return st.SendMsg(wrapperspb.Bytes(nil))
	}, al.Addr().(*net.TCPAddr).AddrPort(), 64)
	call := func(method, authorization string) error {
		ctx := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", authorization))
		return cc.Invoke(ctx, method, wrapperspb.Bytes([]byte("ping")), new(wrapperspb.BytesValue))
	}
	if err := call("/svc.A/Get?id=g1", "Bearer good"); err != nil {
		t.Fatalf("allowed call: %v", err)
	}
	if md := <-calls; strings.Join(md.Get("x-auth-user"), ",") != "alice" || md.Get("authorization") != nil {
		t.Errorf("backend got metadata %v; want x-auth-user set and authorization removed", md)
	}
	// The call's one message, as gRPC frames it: uncompressed, its length,
	// the BytesValue.
	msg, _ := proto.Marshal(wrapperspb.Bytes([]byte("ping")))
	if h := az.request("g1"); h == nil || h.GetBody() != string(append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...)) {
		t.Errorf("ext_authz got %v; want the call's message as its body", h)
	}
	var hdr, tlr metadata.MD
	ctx := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer bad"))
	err := cc.Invoke(ctx, "/svc.A/Get?id=d1", wrapperspb.Bytes([]byte("ping")), new(wrapperspb.BytesValue), grpc.Header(&hdr), grpc.Trailer(&tlr))
	if st := grpcstatus.Convert(err); st.Code() != codes.Unauthenticated || st.Message() != "denied" {
		t.Errorf("denied call: %v, want Unauthenticated with the server's body, %q, as its message", err, "denied")
	}
	if got := append(hdr.Get("www-authenticate"), tlr.Get("www-authenticate")...); len(got) == 0 || got[0] != `Bearer realm="mesh"` {
		t.Errorf("denied call's metadata: header %v, trailer %v; want the server's www-authenticate", hdr, tlr)
	}
	if len(calls) != 0 {
		t.Errorf("the backend got a denied call")
	}
	// By the HTTP status it went out with, as the filter's other gRPC
	// answers (TestRouteExternalAuthGRPCAppOwnAnswers).
	if n := e.counter("sockmesh_proxy_requests_total", map[string]string{"code": "401"}); n != 0 {
		t.Errorf("requests_total{code=401} = %v, want 0: the denial went out as a gRPC status", n)
	}
}

// TestRouteExternalAuthGRPCAppOwnAnswers: the filter's own answers to a
// gRPC call are trailers-only gRPC statuses, as the proxy's other answers
// to gRPC are, with the reason as the message — a call whose message is
// over forwardBody.maxSize ends RESOURCE_EXHAUSTED (a 413 gRPC clients read
// as UNKNOWN before), one whose authorization server cannot be asked
// UNAVAILABLE (a 503 before) — and neither reaches the backend.
func TestRouteExternalAuthGRPCAppOwnAnswers(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	reached := make(chan struct{}, 2)
	cc := grpcAuthedApp(t, e, func(_ any, st grpc.ServerStream) error {
		reached <- struct{}{}
		return st.SendMsg(wrapperspb.Bytes(nil))
	}, closedPort(t), 32)
	for _, tt := range []struct {
		name   string
		msg    []byte
		code   codes.Code
		reason string
	}{
		{"over maxSize", bytes.Repeat([]byte("x"), 64), codes.ResourceExhausted, "ext_auth_body_too_large"},
		{"server cannot be asked", []byte("ping"), codes.Unavailable, "ext_auth_error"},
	} {
		err := cc.Invoke(context.Background(), "/svc.A/Get", wrapperspb.Bytes(tt.msg), new(wrapperspb.BytesValue))
		if st := grpcstatus.Convert(err); st.Code() != tt.code || st.Message() != "sockmesh: "+tt.reason {
			t.Errorf("%s: %v, want %v %q", tt.name, err, tt.code, "sockmesh: "+tt.reason)
		}
	}
	if len(reached) != 0 {
		t.Errorf("the backend got a refused call")
	}
	// By the HTTP status they went out with, as the proxy's failures
	// (TestGRPCFailures).
	if all, ok := e.counter("sockmesh_proxy_requests_total", nil), e.counter("sockmesh_proxy_requests_total", map[string]string{"code": "200"}); all != 2 || ok != 2 {
		t.Errorf("requests_total: %v, %v of them code 200; want 2, 2", all, ok)
	}
}

// grpcAuthedApp serves handler as a gRPC backend behind an HTTPRoute rule
// whose ExternalAuth filter asks the gRPC authorization server at auth,
// forwarding up to maxBody bytes, and returns a client of the route's
// Service (closed when the test ends).
func grpcAuthedApp(t *testing.T, e *env, handler grpc.StreamHandler, auth netip.AddrPort, maxBody int32) *grpc.ClientConn {
	bs := grpc.NewServer(grpc.UnknownServiceHandler(handler))
	bl := listenLocal(t)
	go bs.Serve(bl)
	t.Cleanup(bs.Stop)
	m := &mesh{t: t}
	be := m.backend("app", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, Endpoints: endpoints(bl.Addr().(*net.TCPAddr).AddrPort())})
	authRef := m.backend("authz", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, Endpoints: endpoints(auth)})
	m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be), Filters: snapshot.Filters{
			ExternalAuth: &snapshot.ExternalAuth{Backend: authRef, GRPC: true, MaxBody: maxBody}}}},
	)))
	e.p.Update(m.snapshot(1))
	cc := e.grpcClient(t, "app.b.svc:80", routedVIP)
	t.Cleanup(func() { cc.Close() })
	return cc
}

// seenID returns the request r recorded whose query names id (id=...).
func seenID(t *testing.T, r *recorder, id string) recorded {
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

// TestRouteExternalAuthFailover: an authorization Service with one
// endpoint that refuses connections and one that serves is asked on the
// other when the connect fails, as a backend is — every request is
// authorized. The refusing endpoint got its requests 503 before.
func TestRouteExternalAuthFailover(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	auth := startRecorder(t, nil, nil)
	backend := startRecorder(t, nil, nil)
	m := &mesh{t: t}
	be := m.backend("app", snapshot.Backend{Endpoints: endpoints(backend.addr)})
	authRef := m.backend("auth", snapshot.Backend{Endpoints: endpoints(closedPort(t), auth.addr)})
	m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be), Filters: snapshot.Filters{
			ExternalAuth: &snapshot.ExternalAuth{Backend: authRef}}}},
	)))
	e.p.Update(m.snapshot(1))
	c := e.client(routedVIP, false)
	// Round robin: the first two requests ask both endpoints.
	for i := range 4 {
		if a := send(t, c, newReq(t, http.MethodGet, fmt.Sprintf("http://app.b.svc/?id=f%d", i), nil)); a.status != http.StatusOK {
			t.Errorf("request %d: %d %q, want 200 (authorized by the endpoint that serves)", i, a.status, a.body)
		}
	}
}

// TestRouteExternalAuthClientLeaves: on the fast path, an app that leaves
// while its request's authorization server has not answered cancels the
// ask — the server sees its request's context end — with or without a
// body the filter does not forward. The ask went on until
// ExternalAuthTimeout before (here an hour): for a bodiless request until
// the watch came; with a body, until the eighteenth session, as the watch
// stopped at its first byte. An app that stays while the server takes its
// time gets its body to the backend whole: the watch reads none of it.
func TestRouteExternalAuthClientLeaves(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{routing: httpproxy.RoutingConfig{ExternalAuthTimeout: time.Hour}})
	large := strings.Repeat("0123456789abcdef", 4<<10) // 64 KiB: more than the proxy's read buffer
	// id: the request, sent whole before the app leaves
	leaves := map[string]string{
		"l1": "GET /?id=l1 HTTP/1.1\r\nHost: app.b.svc\r\n\r\n",
		"l2": "POST /?id=l2 HTTP/1.1\r\nHost: app.b.svc\r\nContent-Length: 5\r\n\r\nhello",
		"l3": "POST /?id=l3 HTTP/1.1\r\nHost: app.b.svc\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"l4": fmt.Sprintf("POST /?id=l4 HTTP/1.1\r\nHost: app.b.svc\r\nContent-Length: %d\r\n\r\n%s", len(large), large),
	}
	asked, canceled := map[string]chan struct{}{}, map[string]chan struct{}{}
	for id := range leaves {
		asked[id], canceled[id] = make(chan struct{}), make(chan struct{})
	}
	auth := startRecorder(t, nil, func(_ http.ResponseWriter, r *http.Request, _ int) bool {
		id := r.URL.Query().Get("id")
		if asked[id] == nil {
			// The app stays: answer once the watch waits on it, which
			// it does from a second on.
			if !waitGoroutine("sockio.AwaitHangup(") {
				t.Errorf("%s: no watch waited for the app's hangup while its body was held", id)
			}
			return false
		}
		close(asked[id])
		<-r.Context().Done()
		close(canceled[id])
		return true
	})
	backend := startRecorder(t, nil, nil)
	m := &mesh{t: t}
	be := m.backend("app", snapshot.Backend{Endpoints: endpoints(backend.addr)})
	authRef := m.backend("auth", snapshot.Backend{Endpoints: endpoints(auth.addr)})
	m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be), Filters: snapshot.Filters{
			ExternalAuth: &snapshot.ExternalAuth{Backend: authRef}}}},
	)))
	e.p.Update(m.snapshot(1))
	for _, id := range slices.Sorted(maps.Keys(leaves)) {
		rc := e.rawClient(t, routedVIP)
		rc.send(leaves[id])
		<-asked[id]
		rc.c.Close()
		select {
		case <-canceled[id]:
		case <-time.After(hangGuard): // far below the hour
			t.Fatalf("%s: the authorization server's request was not canceled after the app left", id)
		}
		if got := backend.count(id); got != 0 {
			t.Errorf("%s: the backend saw %d requests of an app that left, want 0", id, got)
		}
	}

	rc := e.rawClient(t, routedVIP)
	rc.send(fmt.Sprintf("POST /?id=s1 HTTP/1.1\r\nHost: app.b.svc\r\nContent-Length: %d\r\n\r\n%s", len(large), large))
	if resp, body := rc.read(http.MethodPost); resp.StatusCode != http.StatusOK || body != "ok" {
		t.Errorf("an app that stays: %d %q, want 200 ok", resp.StatusCode, body)
	}
	if got := seenID(t, backend, "s1").Body; string(got) != large {
		t.Errorf("an app that stays: the backend got %d bytes of its body, want the %d sent", len(got), len(large))
	}
}

// waitGoroutine waits, up to hangGuard, for a goroutine with fn
// (package.function and its opening parenthesis) on its stack.
func waitGoroutine(fn string) bool {
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(hangGuard); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if strings.Contains(string(buf[:runtime.Stack(buf, true)]), fn) {
			return true
		}
	}
	return false
}

// TestRouteExternalAuthRequestTimeout: a rule's timeouts.request bounds
// the whole exchange (GEP-1742), its ExternalAuth filter's ask and the
// read of the body the filter forwards included. With 300ms and an
// authorization server that would answer at 1.5s — allow or deny — or
// never, the client gets 504 (a gRPC call on h2c DEADLINE_EXCEEDED) at
// 300ms, the ask is cut then, and the backend never sees the request; so
// does one whose forwarded body is still coming at 300ms, the server
// unasked. The ask's own ExternalAuthTimeout (5s), when it passes first,
// still answers 503 ext_auth_error. Before, the allowed request got its
// 504 at 1.5s (over HTTP/1, after reaching the backend), the denied one
// the server's 403, the unanswered one 503 at 5s, and the stalled body
// was waited for as long as the app took. Time is the synctest bubble's,
// so every duration is exact.
func TestRouteExternalAuthRequestTimeout(t *testing.T) {
	inBubbles(t, testExternalAuthRequestTimeout)
}

func testExternalAuthRequestTimeout(t *testing.T, k clientKind) {
	var pn pipenet.Net
	backendAddr, authAddr := netip.MustParseAddrPort("10.0.0.1:8080"), netip.MustParseAddrPort("10.0.0.2:8080")
	backend := &tryCounter{tries: map[string]int{}}
	// The authorization server answers ?delay=D after D (403 with deny),
	// and notes the asks it got, and those the proxy ended before.
	var mu sync.Mutex
	asked, cut := map[string]bool{}, map[string]bool{}
	auth := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		q := r.URL.Query()
		mu.Lock()
		asked[q.Get("id")] = true
		mu.Unlock()
		delay, _ := time.ParseDuration(q.Get("delay"))
		if !sleepCtx(r.Context(), delay) {
			mu.Lock()
			cut[q.Get("id")] = true
			mu.Unlock()
			return
		}
		if q.Has("deny") {
			w.WriteHeader(http.StatusForbidden)
		}
	})
	servePipe(t, &pn, backendAddr, backend)
	servePipe(t, &pn, authAddr, auth)
	p, reg := pipeProxy(t, &pn, proxy.Config{HTTP1TLS: k.path})
	m := &mesh{t: t}
	be := m.backend("app", snapshot.Backend{Endpoints: endpoints(backendAddr)})
	authRef := m.backend("auth", snapshot.Backend{Endpoints: endpoints(authAddr)})
	authRule := func(prefix string, request time.Duration, maxBody int32) rule {
		return rule{[]snapshot.RouteMatch{prefixMatch(prefix)}, snapshot.RouteRule{Backends: to(be),
			Timeouts: &snapshot.Timeouts{Request: dur(request)},
			Filters:  snapshot.Filters{ExternalAuth: &snapshot.ExternalAuth{Backend: authRef, MaxBody: maxBody}}}}
	}
	ms := time.Millisecond
	m.frontend("app", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		authRule("/short", 300*ms, 0),
		authRule("/body", 300*ms, 64),
		authRule("/long", time.Hour, 0),
	)))
	p.Update(m.snapshot(1))
	client := pipeClient(t, p, k.h2c)

	// do sends a request to path and reads the answer; a hang turns into
	// an error at hangGuard.
	do := func(method, path string, body io.Reader, h http.Header) (*http.Response, time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, method, "http://app.b.svc"+path, body)
		maps.Copy(req.Header, h)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, time.Since(start)
	}
	for _, c := range []struct {
		id, path string
		status   int
		elapsed  time.Duration
		cut      bool // the proxy ended the ask
		reached  int  // requests the backend saw
	}{
		{"a1", "/short?delay=100ms", 200, 100 * ms, false, 1},
		{"a2", "/short?delay=1500ms", 504, 300 * ms, true, 0},
		{"d1", "/short?delay=1500ms&deny", 504, 300 * ms, true, 0},
		{"h1", "/short?delay=1h", 504, 300 * ms, true, 0},
		{"h2", "/long?delay=1h", 503, 5 * time.Second, true, 0}, // ExternalAuthTimeout
	} {
		resp, elapsed := do(http.MethodGet, c.path+"&id="+c.id, nil, nil)
		if resp.StatusCode != c.status || elapsed != c.elapsed {
			t.Errorf("%s: %d after %v, want %d after %v", c.path, resp.StatusCode, elapsed, c.status, c.elapsed)
		}
		synctest.Wait() // the server notices a cut ask
		mu.Lock()
		if cut[c.id] != c.cut {
			t.Errorf("%s: ask ended by the proxy: %v, want %v", c.path, cut[c.id], c.cut)
		}
		mu.Unlock()
		if n := backend.count(c.id); n != c.reached {
			t.Errorf("%s: the backend saw %d requests, want %d", c.path, n, c.reached)
		}
	}

	// A forwarded body still coming at the deadline (the app ends it at
	// 10s): the server is not asked, the backend not reached.
	pr, pw := io.Pipe()
	defer pw.Close()
	time.AfterFunc(10*time.Second, func() { pw.Close() })
	if resp, elapsed := do(http.MethodPost, "/body?id=b1", pr, nil); resp.StatusCode != 504 || elapsed != 300*ms {
		t.Errorf("body still coming: %d after %v, want 504 after 300ms", resp.StatusCode, elapsed)
	}
	if n := backend.count("b1"); n != 0 {
		t.Errorf("body still coming: the backend saw %d requests, want 0", n)
	}
	mu.Lock()
	if asked["b1"] {
		t.Errorf("body still coming: the authorization server was asked")
	}
	mu.Unlock()

	timeouts := 4.0 // a2, d1, h1, b1
	if k.h2c {
		// A gRPC call gets the timeout's DEADLINE_EXCEEDED, as from a
		// forward the timeout ends (failures.md).
		resp, elapsed := do(http.MethodPost, "/short?delay=1500ms&id=g1", strings.NewReader("\x00\x00\x00\x00\x00"),
			http.Header{"Content-Type": {"application/grpc"}, "Te": {"trailers"}})
		if st, msg := resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message"); resp.StatusCode != 200 || st != "4" || msg != "sockmesh: timeout" || elapsed != 300*ms {
			t.Errorf("gRPC call: %d, grpc-status %q %q after %v; want 200, 4 sockmesh: timeout (trailers-only) after 300ms", resp.StatusCode, st, msg, elapsed)
		}
		if n := backend.count("g1"); n != 0 {
			t.Errorf("gRPC call: the backend saw %d requests, want 0", n)
		}
		timeouts++
	}
	if got := counterValue(t, reg, "sockmesh_proxy_request_timeouts_total", "timeout", "request"); got != timeouts {
		t.Errorf("timeouts{request} = %v, want %v", got, timeouts)
	}
	for reason, want := range map[string]float64{"ext_auth_error": 1, "ext_auth_denied": 0} {
		if got := counterValue(t, reg, "sockmesh_proxy_route_answers_total", "reason", reason); got != want {
			t.Errorf("route answers{%s} = %v, want %v", reason, got, want)
		}
	}
}

// TestRouteExternalAuthGRPCWebSocket: an HTTP/2 app's WebSocket (an RFC
// 8441 extended CONNECT) is one request to an ext_authz server as an
// HTTP/1.1 app's Upgrade is, as Envoy's HTTP/2 codec turns the one into
// the other before its filters: the CheckRequest's method GET, its headers
// the same, never the :protocol net/http's server shows among the
// request's fields (the server got ":protocol: websocket" before), and
// its protocol named as Envoy names it, "HTTP/2" ("HTTP/2.0" before);
// both with the "upgrade" and "connection" Envoy keeps for a WebSocket
// (none before) and the pseudo-fields of the GET.
func TestRouteExternalAuthGRPCWebSocket(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{http1TLS: proxy.HTTP1TLSAuto})
	az := &extAuthz{seen: map[string]*authv3.AttributeContext_HttpRequest{}}
	srv := grpc.NewServer()
	authv3.RegisterAuthorizationServer(srv, az)
	l := listenLocal(t)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	m := &mesh{t: t}
	ws := m.echoBackend("ws")
	authRef := m.backend("authz", snapshot.Backend{Endpoints: endpoints(l.Addr().(*net.TCPAddr).AddrPort()), Protocol: snapshot.ProtocolH2C})
	m.frontend("front", routedVIP, ws, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/ws")}, snapshot.RouteRule{Backends: to(ws),
			Filters: snapshot.Filters{ExternalAuth: &snapshot.ExternalAuth{Backend: authRef, GRPC: true}}}},
	)))
	e.p.Update(m.snapshot(1))

	// Both denied (no Authorization): the server was asked all the same.
	c := e.appConn(t, routedVIP)
	io.WriteString(c, "GET /ws?id=h1 HTTP/1.1\r\nHost: svc.b.svc\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("HTTP/1.1 Upgrade: %v, %v; want the server's 401", resp, err)
	}
	if st := connectH2WS(t, e.appConn(t, routedVIP), "websocket", "svc.b.svc", "/ws?id=h2"); st.status != "401" {
		t.Errorf("extended CONNECT: %s, want the server's 401", st.status)
	}
	h1, h2 := az.request("h1"), az.request("h2")
	if h1 == nil || h2 == nil {
		t.Fatalf("ext_authz asked about %v (HTTP/1.1) and %v (HTTP/2), want both", h1, h2)
	}
	if h2.GetMethod() != http.MethodGet || h1.GetMethod() != http.MethodGet {
		t.Errorf("methods %q (HTTP/1.1), %q (HTTP/2), want GET", h1.GetMethod(), h2.GetMethod())
	}
	for id, h := range map[string]*authv3.AttributeContext_HttpRequest{"h1": h1, "h2": h2} {
		want := map[string]string{"upgrade": "websocket", "connection": "Upgrade", ":method": "GET",
			":path": "/ws?id=" + id, ":authority": "svc.b.svc", ":scheme": "http"}
		for f, v := range want {
			if got := h.GetHeaders()[f]; got != v {
				t.Errorf("%s: ext_authz got %s: %q, want %q", id, f, got, v)
			}
		}
	}
	// RFC 8441 §5 drops the handshake's key: the stream is the proof.
	h1Fields, h2Fields := maps.Clone(h1.GetHeaders()), maps.Clone(h2.GetHeaders())
	delete(h1Fields, "sec-websocket-key")
	delete(h1Fields, ":path")
	delete(h2Fields, ":path")
	if !maps.Equal(h1Fields, h2Fields) {
		t.Errorf("headers differ: HTTP/1.1 %v, HTTP/2 %v", h1.GetHeaders(), h2.GetHeaders())
	}
	if h1.GetProtocol() != "HTTP/1.1" || h2.GetProtocol() != "HTTP/2" {
		t.Errorf("protocols %q, %q, want HTTP/1.1 and HTTP/2, as Envoy names them", h1.GetProtocol(), h2.GetProtocol())
	}
}
