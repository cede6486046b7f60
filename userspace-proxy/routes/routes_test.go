package routes

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// randFunc is a Rand whose draws a test chooses.
type randFunc func(n uint64) uint64

func (f randFunc) Uint64N(n uint64) uint64 { return f(n) }

// always draws v (modulo n).
func always(v uint64) Rand { return randFunc(func(n uint64) uint64 { return v % n }) }

var (
	v1 = snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "mesh", Name: "echo-v1", Port: 8080}
	v2 = snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "mesh", Name: "echo-v2", Port: 8080}
	v3 = snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "mesh", Name: "echo-v3", Port: 8080}
)

func prefix(v string) snapshot.PathMatch {
	return snapshot.PathMatch{Type: snapshot.PathPrefix, Value: v}
}
func exact(v string) snapshot.PathMatch {
	return snapshot.PathMatch{Type: snapshot.PathExact, Value: v}
}
func regex(v string) snapshot.PathMatch {
	return snapshot.PathMatch{Type: snapshot.PathRegularExpression, Value: v}
}

// to is a rule forwarding to one backend.
func to(ref snapshot.BackendRef) snapshot.RouteRule {
	return snapshot.RouteRule{Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: ref}}}
}

// oneRule is a set of one rule with the given matches.
func oneRule(rule snapshot.RouteRule, ms ...snapshot.RouteMatch) *Set {
	return compileSet(80, &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute, Matches: ms, Rules: []snapshot.RouteRule{rule}})
}

func get(path string) *Request {
	return &Request{Method: http.MethodGet, Path: path, Host: "echo", Header: http.Header{}}
}

func decide(s *Set, req *Request) Decision {
	var d Decision
	s.Decide(req, always(0), &d)
	return d
}

func TestMatchPath(t *testing.T) {
	tests := []struct {
		match snapshot.PathMatch
		path  string
		want  bool
	}{
		{exact("/abc"), "/abc", true},
		{exact("/abc"), "/abc/", false},
		{exact("/abc"), "/Abc", false},
		{exact("/abc"), "/abcd", false},
		{prefix("/abc"), "/abc", true},
		{prefix("/abc"), "/abc/", true},
		{prefix("/abc"), "/abc/d", true},
		{prefix("/abc"), "/abcd", false},
		{prefix("/abc"), "/ab", false},
		{prefix("/abc/"), "/abc", true}, // a trailing "/" in the value is ignored
		{prefix("/abc/"), "/abcd", false},
		{prefix("/"), "/", true},
		{prefix("/"), "/anything/at/all", true},
		{prefix("/v2"), "/v2example", false}, // conformance MeshHTTPRouteMatching
		{prefix("/v2"), "/foo/v2/example", false},
		{regex("/v[0-9]+"), "/v12", true},
		{regex("/v[0-9]+"), "/v1/x", false}, // the whole path must match
		{regex("/v[0-9]+"), "/xv1", false},
		{regex("/items/.*"), "/items/", true},
		// RFC 3986 normalization, applied to request and value alike.
		{exact("/admin"), "/%61dmin", true},
		{prefix("/admin"), "/a/../admin/x", true},
		{prefix("/admin"), "/%2E%2E/admin", true},
		{prefix("/admin"), "/./admin", true},
		{prefix("/admin"), "/admin/..", false},          // normalizes to "/"
		{prefix("/admin"), "/admin%2Fx", false},         // an encoded "/" never splits a segment
		{exact("/a%2fb"), "/a%2Fb", true},               // hex case does not matter
		{exact("/exact/%7Euser"), "/exact/~user", true}, // encoded unreserved characters are decoded
		{exact("/exact/~user"), "/exact/%7euser", true},
		{regex("/a/b"), "/a/./b", true},
		{exact("/a%zz"), "/a%zz", true}, // not an escape: left alone on both sides
		// "OPTIONS *" names the server: only the "/" prefix matches it.
		{prefix("/"), "*", true},
		{exact("/"), "*", false},
		{prefix("/a"), "*", false},
		{regex(".*"), "*", false},
	}
	for _, tc := range tests {
		s := oneRule(to(v1), snapshot.RouteMatch{Path: tc.match})
		d := decide(s, get(tc.path))
		if got := d.Action == Forward; got != tc.want {
			t.Errorf("%s %q matches %q = %v, want %v", tc.match.Type, tc.match.Value, tc.path, got, tc.want)
		}
	}
}

func TestNormalizePath(t *testing.T) {
	tests := map[string]string{
		"/":                "/",
		"/a/b":             "/a/b",
		"/a/./b":           "/a/b",
		"/a/../b":          "/b",
		"/../../b":         "/b",
		"/a/..":            "/",
		"/a/.":             "/a/",
		"/a/b/..":          "/a/",
		"/%61%62%2F%2f%20": "/ab%2F%2F%20",
		"/a.b/..c/.d":      "/a.b/..c/.d",
		"/%2e%2E/x":        "/x",
		"/%":               "/%25", // a stray % (net/http refuses it) is encoded
		"/%%370":           "/%2570",
	}
	for in, want := range tests {
		if got := normalizePath(in); got != want {
			t.Errorf("normalizePath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMatchConditions(t *testing.T) {
	m := snapshot.RouteMatch{
		Path:   prefix("/"),
		Method: "POST",
		Headers: []snapshot.StringMatch{
			{Name: "x-version", Type: snapshot.MatchExact, Value: "v1"},
			{Name: "X-Env", Type: snapshot.MatchRegularExpression, Value: "prod|staging"},
		},
		QueryParams: []snapshot.StringMatch{
			{Name: "animal", Type: snapshot.MatchExact, Value: "whale"},
			{Name: "page", Type: snapshot.MatchRegularExpression, Value: "[0-9]{1,3}"},
		},
	}
	s := oneRule(to(v1), m)
	good := func() *Request {
		return &Request{Method: "POST", Path: "/", RawQuery: "animal=whale&page=7",
			Header: http.Header{"X-Version": {"v1"}, "X-Env": {"prod"}}}
	}
	tests := []struct {
		name   string
		change func(*Request)
		want   bool
	}{
		{"all hold", func(*Request) {}, true},
		{"method", func(r *Request) { r.Method = "GET" }, false},
		{"header missing", func(r *Request) { delete(r.Header, "X-Version") }, false},
		{"header value case", func(r *Request) { r.Header["X-Version"] = []string{"V1"} }, false},
		{"header regex", func(r *Request) { r.Header["X-Env"] = []string{"staging"} }, true},
		{"header regex whole", func(r *Request) { r.Header["X-Env"] = []string{"preprod"} }, false},
		{"repeated header joined", func(r *Request) { r.Header["X-Version"] = []string{"v1", "v2"} }, false},
		{"query missing", func(r *Request) { r.RawQuery = "page=7" }, false},
		{"query other order", func(r *Request) { r.RawQuery = "page=12&x=1&animal=whale" }, true},
		{"query first value counts", func(r *Request) { r.RawQuery = "animal=dolphin&animal=whale&page=1" }, false},
		{"query prefix of name", func(r *Request) { r.RawQuery = "animals=whale&page=1" }, false},
		{"query value not prefix", func(r *Request) { r.RawQuery = "animal=whaledolphin&page=1" }, false},
		{"query escaped", func(r *Request) { r.RawQuery = "%61nimal=wh%61le&page=1" }, true},
		{"query regex whole", func(r *Request) { r.RawQuery = "animal=whale&page=1234" }, false},
		{"query bad escape", func(r *Request) { r.RawQuery = "animal=%zz&page=1" }, false},
	}
	for _, tc := range tests {
		req := good()
		tc.change(req)
		if got := decide(s, req).Action == Forward; got != tc.want {
			t.Errorf("%s: matched = %v, want %v", tc.name, got, tc.want)
		}
	}

	joined := oneRule(to(v1), snapshot.RouteMatch{Path: prefix("/"), Headers: []snapshot.StringMatch{{Name: "Accept", Type: snapshot.MatchExact, Value: "a,b"}}})
	if d := decide(joined, &Request{Method: "GET", Path: "/", Header: http.Header{"Accept": {"a", "b"}}}); d.Action != Forward {
		t.Errorf("repeated header a, b did not match \"a,b\" (RFC 9110 §5.3)")
	}
	host := oneRule(to(v1), snapshot.RouteMatch{Path: prefix("/"), Headers: []snapshot.StringMatch{{Name: "host", Type: snapshot.MatchRegularExpression, Value: "echo(:80)?"}}})
	for authority, want := range map[string]bool{"echo": true, "echo:80": true, "echo-v2": false} {
		if got := decide(host, &Request{Method: "GET", Path: "/", Host: authority, Header: http.Header{}}).Action == Forward; got != want {
			t.Errorf("Host match on authority %q = %v, want %v", authority, got, want)
		}
	}
	plus := oneRule(to(v1), snapshot.RouteMatch{Path: prefix("/"), QueryParams: []snapshot.StringMatch{{Name: "q", Type: snapshot.MatchExact, Value: "a b"}}})
	if d := decide(plus, &Request{Method: "GET", Path: "/", RawQuery: "q=a+b", Header: http.Header{}}); d.Action != Forward {
		t.Errorf("query q=a+b did not match \"a b\"")
	}
}

// TestFirstMatchWins: the Snapshot's order is the precedence; later
// entries are reached only when earlier ones do not match.
func TestFirstMatchWins(t *testing.T) {
	rs := &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{
			{Rule: 1, Path: exact("/v2")},
			{Rule: 0, Path: prefix("/v2"), Headers: []snapshot.StringMatch{{Name: "version", Type: snapshot.MatchExact, Value: "two"}}},
			{Rule: 1, Path: prefix("/v2")},
			{Rule: 0, Path: prefix("/")},
		},
		Rules: []snapshot.RouteRule{to(v1), to(v2)},
	}
	s := compileSet(80, rs)
	tests := []struct {
		req  *Request
		want snapshot.BackendRef
	}{
		{get("/v2"), v2},
		{&Request{Method: "GET", Path: "/v2/x", Header: http.Header{"Version": {"two"}}}, v1},
		{get("/v2/x"), v2},
		{get("/"), v1},
		{get("/v2example"), v1},
	}
	for _, tc := range tests {
		if d := decide(s, tc.req); d.Action != Forward || d.Backend != tc.want {
			t.Errorf("Decide(%s) = %v %v, want %v", tc.req.Path, d.Action, d.Backend, tc.want)
		}
	}
	if d := decide(compileSet(80, &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute, Matches: rs.Matches[:3], Rules: rs.Rules}), get("/other")); d.Action != Respond || d.Status != 404 || d.Reason != ReasonNoMatch || d.Rule != nil {
		t.Errorf("no match: %+v, want Respond 404 no_match", d)
	}
}

// TestIndexAgreesWithScan compares the path index against the plain scan
// on random tables and requests.
func TestIndexAgreesWithScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	segs := []string{"a", "b", "api", "v1", "v2", "items", "x"}
	randPath := func() string {
		p := ""
		for range rng.IntN(4) {
			p += "/" + segs[rng.IntN(len(segs))]
		}
		if p == "" || rng.IntN(5) == 0 {
			p += "/"
		}
		return p
	}
	for table := range 50 {
		rs := &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute, Rules: []snapshot.RouteRule{to(v1)}}
		for range indexFrom + rng.IntN(60) {
			m := snapshot.RouteMatch{}
			switch rng.IntN(3) {
			case 0:
				m.Path = exact(randPath())
			case 1:
				m.Path = prefix(randPath())
			default:
				m.Path = regex(randPath() + ".*")
			}
			if rng.IntN(3) == 0 {
				m.Method = "POST"
			}
			rs.Matches = append(rs.Matches, m)
		}
		indexed := compileSet(80, rs)
		if indexed.index == nil {
			t.Fatalf("table %d with %d entries has no index", table, len(indexed.entries))
		}
		scanned := *indexed
		scanned.index = nil
		for range 200 {
			req := get(randPath())
			if rng.IntN(10) == 0 {
				req.Path = "*"
			}
			if rng.IntN(2) == 0 {
				req.Method = "POST"
			}
			if a, b := indexed.find(req, req.Path, nil), scanned.find(req, req.Path, nil); a != b {
				t.Fatalf("table %d, %s %s: index found entry %d, scan %d", table, req.Method, req.Path, a, b)
			}
		}
	}
}

func TestRedirect(t *testing.T) {
	redirectTo := func(rd snapshot.Redirect) snapshot.RouteRule {
		if rd.StatusCode == 0 {
			rd.StatusCode = 302
		}
		return snapshot.RouteRule{Filters: snapshot.Filters{Redirect: &rd}}
	}
	full := func(v string) *snapshot.PathModifier {
		return &snapshot.PathModifier{Type: snapshot.ReplaceFullPath, Value: v}
	}
	pfx := func(v string) *snapshot.PathModifier {
		return &snapshot.PathModifier{Type: snapshot.ReplacePrefixMatch, Value: v}
	}
	tests := []struct {
		name       string
		port       uint16 // the Service port
		match      snapshot.PathMatch
		rd         snapshot.Redirect
		host, path string
		query      string
		tls        bool
		status     int
		location   string
	}{
		// Conformance MeshHTTPRouteRedirectHostAndStatus.
		{"hostname", 80, prefix("/hostname-redirect"), snapshot.Redirect{Hostname: "example.org"}, "echo", "/hostname-redirect", "", false, 302, "http://example.org/hostname-redirect"},
		{"hostname and status", 80, prefix("/host-and-status"), snapshot.Redirect{Hostname: "example.org", StatusCode: 301}, "echo", "/host-and-status", "", false, 301, "http://example.org/host-and-status"},
		// MeshHTTPRouteRedirectPath.
		{"prefix", 80, prefix("/original-prefix"), snapshot.Redirect{Path: pfx("/replacement-prefix")}, "echo", "/original-prefix/lemon", "", false, 302, "http://echo/replacement-prefix/lemon"},
		{"full path", 80, prefix("/full"), snapshot.Redirect{Path: full("/full-path-replacement")}, "echo", "/full/path/original", "", false, 302, "http://echo/full-path-replacement"},
		{"path and host", 80, prefix("/path-and-host"), snapshot.Redirect{Hostname: "example.org", Path: pfx("/replacement-prefix")}, "echo", "/path-and-host", "", false, 302, "http://example.org/replacement-prefix"},
		{"path and status", 80, prefix("/path-and-status"), snapshot.Redirect{Path: pfx("/replacement-prefix"), StatusCode: 301}, "echo", "/path-and-status", "", false, 301, "http://echo/replacement-prefix"},
		// MeshHTTPRouteRedirectPort.
		{"port", 80, prefix("/port"), snapshot.Redirect{Port: 8083}, "echo", "/port", "", false, 302, "http://echo:8083/port"},
		{"port and host", 80, prefix("/port-and-host"), snapshot.Redirect{Hostname: "example.org", Port: 8083}, "echo", "/port-and-host", "", false, 302, "http://example.org:8083/port-and-host"},
		// MeshHTTPRouteSchemeRedirect: the scheme's well-known port, left out.
		{"scheme", 80, prefix("/scheme"), snapshot.Redirect{Scheme: "https"}, "echo", "/scheme", "", false, 302, "https://echo/scheme"},
		{"scheme on another port", 8080, prefix("/scheme"), snapshot.Redirect{Scheme: "https"}, "echo:8080", "/scheme", "", false, 302, "https://echo/scheme"},
		{"scheme and port", 80, prefix("/s"), snapshot.Redirect{Scheme: "https", Port: 8443}, "echo", "/s", "", false, 302, "https://echo:8443/s"},
		{"https to http", 443, prefix("/s"), snapshot.Redirect{Scheme: "http"}, "echo", "/s", "", true, 302, "http://echo/s"},
		{"port 443 on http kept", 80, prefix("/s"), snapshot.Redirect{Port: 443}, "echo", "/s", "", false, 302, "http://echo:443/s"},
		{"port 80 on https kept", 80, prefix("/s"), snapshot.Redirect{Scheme: "https", Port: 80}, "echo", "/s", "", false, 302, "https://echo:80/s"},
		// No scheme and no port: the Service port, which the Host header may not name.
		{"service port", 8080, prefix("/"), snapshot.Redirect{Hostname: "example.org"}, "echo", "/x", "", false, 302, "http://example.org:8080/x"},
		{"host port dropped", 80, prefix("/"), snapshot.Redirect{}, "echo:80", "/x", "", false, 302, "http://echo/x"},
		// 303/307/308 (MeshHTTPRoute303Redirect etc.): the path and query are kept.
		{"303", 80, prefix("/redirect"), snapshot.Redirect{StatusCode: 303}, "echo", "/redirect", "", false, 303, "http://echo/redirect"},
		{"307 query", 80, prefix("/temporary"), snapshot.Redirect{StatusCode: 307}, "echo", "/temporary", "a=1&b=%20", false, 307, "http://echo/temporary?a=1&b=%20"},
		{"308", 80, prefix("/"), snapshot.Redirect{StatusCode: 308}, "echo", "/x", "", false, 308, "http://echo/x"},
		{"ipv6 host", 80, prefix("/"), snapshot.Redirect{Port: 81}, "[fd00::1]:80", "/x", "", false, 302, "http://[fd00::1]:81/x"},
		{"ipv6 host default port", 80, prefix("/"), snapshot.Redirect{}, "[fd00::1]", "/x", "", false, 302, "http://[fd00::1]/x"},
		{"no host", 80, prefix("/"), snapshot.Redirect{}, "", "/x", "q=1", false, 302, "/x?q=1"},
		{"prefix root", 80, prefix("/"), snapshot.Redirect{Path: pfx("/new")}, "echo", "/a/b", "", false, 302, "http://echo/new/a/b"},
		{"prefix trailing slash", 80, prefix("/foo/"), snapshot.Redirect{Path: pfx("/xyz/")}, "echo", "/foo/", "", false, 302, "http://echo/xyz/"},
		{"encoded path kept", 80, prefix("/a"), snapshot.Redirect{Hostname: "example.org"}, "echo", "/a/b%2Fc%20d", "", false, 302, "http://example.org/a/b%2Fc%20d"},
		// The filter's path is a path: what a URL path cannot hold as it is gets percent-encoded.
		{"full path encoded", 80, prefix("/"), snapshot.Redirect{Path: full("/a b?c#d/é%/%2F")}, "echo", "/x", "q=1", false, 302, "http://echo/a%20b%3Fc%23d/%C3%A9%25/%2F?q=1"},
		{"prefix encoded", 80, prefix("/old"), snapshot.Redirect{Path: pfx("/new docs?")}, "echo", "/old/x%20y", "", false, 302, "http://echo/new%20docs%3F/x%20y"},
	}
	for _, tc := range tests {
		s := compileSet(tc.port, &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute,
			Matches: []snapshot.RouteMatch{{Path: tc.match}}, Rules: []snapshot.RouteRule{redirectTo(tc.rd)}})
		d := decide(s, &Request{Method: "GET", Path: tc.path, RawQuery: tc.query, Host: tc.host, Header: http.Header{}, TLS: tc.tls})
		if d.Action != Redirect || d.Status != tc.status || d.Location != tc.location {
			t.Errorf("%s: Decide(%s%s) = %v %d %q, want Redirect %d %q", tc.name, tc.host, tc.path, d.Action, d.Status, d.Location, tc.status, tc.location)
		}
	}
}

func TestReplacePrefix(t *testing.T) {
	// The table in the API's HTTPPathModifier.ReplacePrefixMatch docs.
	tests := []struct{ path, match, replacement, want string }{
		{"/foo/bar", "/foo", "/xyz", "/xyz/bar"},
		{"/foo/bar", "/foo", "/xyz/", "/xyz/bar"},
		{"/foo/bar", "/foo/", "/xyz", "/xyz/bar"},
		{"/foo/bar", "/foo/", "/xyz/", "/xyz/bar"},
		{"/foo", "/foo", "/xyz", "/xyz"},
		{"/foo/", "/foo", "/xyz", "/xyz/"},
		{"/foo/bar", "/foo", "", "/bar"},
		{"/foo/", "/foo", "", "/"},
		{"/foo", "/foo", "", "/"},
		{"/foo/", "/foo", "/", "/"},
		{"/foo", "/foo", "/", "/"},
		// Conformance MeshHTTPRouteRewritePath.
		{"/prefix/one/two", "/prefix/one", "/one", "/one/two"},
		{"/strip-prefix/three", "/strip-prefix", "/", "/three"},
		{"/strip-prefix", "/strip-prefix", "/", "/"},
		{"/prefix/rewrite-path-and-modify-headers/one", "/prefix/rewrite-path-and-modify-headers", "/prefix", "/prefix/one"},
	}
	for _, tc := range tests {
		rule := snapshot.RouteRule{
			Filters:  snapshot.Filters{Rewrite: &snapshot.Rewrite{Path: &snapshot.PathModifier{Type: snapshot.ReplacePrefixMatch, Value: tc.replacement}}},
			Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: v1}},
		}
		d := decide(oneRule(rule, snapshot.RouteMatch{Path: prefix(tc.match)}), get(tc.path))
		if d.Action != Forward || !d.RewritePath || d.Path != tc.want {
			t.Errorf("%s with prefix %q replaced by %q = %v %q, want %q", tc.path, tc.match, tc.replacement, d.Action, d.Path, tc.want)
		}
	}
}

func TestApplyRequest(t *testing.T) {
	rule := snapshot.RouteRule{
		Filters: snapshot.Filters{
			Rewrite: &snapshot.Rewrite{Hostname: "rewritten.example.org", Path: &snapshot.PathModifier{Type: snapshot.ReplaceFullPath, Value: "/test"}},
			RequestHeaders: &snapshot.HeaderModifier{
				Set:    []snapshot.Header{{Name: "X-Header-Set", Value: "set-overwrites-values"}},
				Add:    []snapshot.Header{{Name: "X-Header-Add", Value: "header-val-1"}, {Name: "X-Header-Add-Append", Value: "header-val-2"}},
				Remove: []string{"X-Header-Remove"},
			},
		},
		Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: v1, Filters: snapshot.Filters{
			RequestHeaders: &snapshot.HeaderModifier{Set: []snapshot.Header{{Name: "x-backend", Value: "v1"}}},
		}}},
	}
	s := oneRule(rule, snapshot.RouteMatch{Path: prefix("/full/rewrite-path-and-modify-headers")})
	// Conformance MeshHTTPRouteRewritePath, lower-case names as in
	// MeshHTTPRouteRequestHeaderModifier's case-insensitivity case.
	for range 2 { // twice: shared header values must survive the first request
		r := &http.Request{Method: "GET", Host: "echo", URL: &url.URL{Path: "/full/rewrite-path-and-modify-headers/test"},
			Header: http.Header{}}
		r.Header.Set("x-header-remove", "remove-val")
		r.Header.Set("x-header-add-append", "append-val-1")
		r.Header.Set("x-header-set", "set-val")
		req := FromHTTP(r)
		var d Decision
		s.Decide(&req, always(0), &d)
		d.ApplyRequest(r)
		r.Header.Add("X-Header-Add", "appended-later") // must not reach the shared value
		want := http.Header{
			"X-Header-Set":        {"set-overwrites-values"},
			"X-Header-Add":        {"header-val-1", "appended-later"},
			"X-Header-Add-Append": {"append-val-1", "header-val-2"},
			"X-Backend":           {"v1"},
			"X-Header-Remove":     nil, // net/http's writers then add none of their own
		}
		if !headersEqual(r.Header, want) {
			t.Errorf("headers after ApplyRequest = %v, want %v", r.Header, want)
		}
		if r.URL.Path != "/test" || r.URL.EscapedPath() != "/test" || r.Host != "rewritten.example.org" {
			t.Errorf("rewrite: path %q host %q, want /test rewritten.example.org", r.URL.Path, r.Host)
		}
	}

	// An encoded rewrite result keeps its encoding on the wire.
	enc := oneRule(snapshot.RouteRule{
		Filters:  snapshot.Filters{Rewrite: &snapshot.Rewrite{Path: &snapshot.PathModifier{Type: snapshot.ReplacePrefixMatch, Value: "/new"}}},
		Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: v1}},
	}, snapshot.RouteMatch{Path: prefix("/old")})
	r := &http.Request{Method: "GET", URL: &url.URL{Path: "/old/a/b", RawPath: "/old/a%2Fb"}, Header: http.Header{}}
	req := FromHTTP(r)
	d := decide(enc, &req)
	d.ApplyRequest(r)
	if got := r.URL.EscapedPath(); got != "/new/a%2Fb" {
		t.Errorf("rewritten escaped path = %q, want /new/a%%2Fb", got)
	}

	// A replacement that is no valid URL path is encoded, and the
	// request's own encoding survives beside it.
	spaced := oneRule(snapshot.RouteRule{
		Filters:  snapshot.Filters{Rewrite: &snapshot.Rewrite{Path: &snapshot.PathModifier{Type: snapshot.ReplacePrefixMatch, Value: "/my docs"}}},
		Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: v1}},
	}, snapshot.RouteMatch{Path: prefix("/old")})
	r = &http.Request{Method: "GET", URL: &url.URL{Path: "/old/a/b", RawPath: "/old/a%2Fb"}, Header: http.Header{}}
	req = FromHTTP(r)
	d = decide(spaced, &req)
	d.ApplyRequest(r)
	if got := r.URL.RequestURI(); d.Path != "/my%20docs/a%2Fb" || got != "/my%20docs/a%2Fb" {
		t.Errorf("rewrite to %q: Decision.Path %q, request target %q, want /my%%20docs/a%%2Fb", "/my docs", d.Path, got)
	}

	// A "Host" header change sets the authority; its removal is ignored.
	host := oneRule(snapshot.RouteRule{
		Filters:  snapshot.Filters{RequestHeaders: &snapshot.HeaderModifier{Set: []snapshot.Header{{Name: "host", Value: "h.example"}}, Remove: []string{"host"}}},
		Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: v1}},
	}, snapshot.RouteMatch{Path: prefix("/")})
	r = &http.Request{Method: "GET", Host: "echo", URL: &url.URL{Path: "/"}, Header: http.Header{}}
	req = FromHTTP(r)
	d = decide(host, &req)
	d.ApplyRequest(r)
	if r.Host != "h.example" || len(r.Header) != 0 {
		t.Errorf("Host set: authority %q headers %v, want h.example and none", r.Host, r.Header)
	}
}

func TestApplyResponse(t *testing.T) {
	rule := snapshot.RouteRule{
		Filters: snapshot.Filters{ResponseHeaders: &snapshot.HeaderModifier{Set: []snapshot.Header{{Name: "X-Header-Set", Value: "set"}}}},
		Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: v1, Filters: snapshot.Filters{
			ResponseHeaders: &snapshot.HeaderModifier{Add: []snapshot.Header{{Name: "x-b", Value: "2"}}, Remove: []string{"server"}},
		}}},
	}
	d := decide(oneRule(rule, snapshot.RouteMatch{Path: prefix("/")}), get("/"))
	h := http.Header{"X-Header-Set": {"upstream"}, "X-B": {"1"}, "Server": {"echo"}}
	d.ApplyResponse(h)
	want := http.Header{"X-Header-Set": {"set"}, "X-B": {"1", "2"}, "Server": nil}
	if !headersEqual(h, want) {
		t.Errorf("response headers = %v, want %v", h, want)
	}

	// A redirect answer gets the rule's response header changes too.
	red := snapshot.RouteRule{Filters: snapshot.Filters{
		Redirect:        &snapshot.Redirect{StatusCode: 302, Hostname: "example.org"},
		ResponseHeaders: &snapshot.HeaderModifier{Set: []snapshot.Header{{Name: "X-R", Value: "r"}}},
	}}
	d = decide(oneRule(red, snapshot.RouteMatch{Path: prefix("/")}), get("/"))
	h = http.Header{}
	d.ApplyResponse(h)
	if d.Action != Redirect || h.Get("X-R") != "r" {
		t.Errorf("redirect: %v, headers %v; want Redirect with X-R", d.Action, h)
	}
}

func headersEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func TestWeights(t *testing.T) {
	invalid := &snapshot.Invalid{Reason: "BackendNotFound"}
	tests := []struct {
		name     string
		backends []snapshot.WeightedBackend
		draws    []uint64              // one per request
		want     []any                 // a BackendRef, or the Reason of a Respond
		keep     []snapshot.BackendRef // Request.Keep accepts these
	}{
		{"70/30 split at the boundary", []snapshot.WeightedBackend{{Weight: 70, Backend: v1}, {Weight: 30, Backend: v2}},
			[]uint64{0, 69, 70, 99}, []any{v1, v1, v2, v2}, nil},
		{"weight 0 gets nothing", []snapshot.WeightedBackend{{Weight: 0, Backend: v1}, {Weight: 5, Backend: v2}, {Weight: 0, Invalid: invalid}},
			[]uint64{0, 4}, []any{v2, v2}, nil},
		{"invalid share gets 500", []snapshot.WeightedBackend{{Weight: 1, Backend: v1}, {Weight: 1, Invalid: invalid}},
			[]uint64{0, 1}, []any{v1, ReasonInvalidBackend}, nil},
		{"all invalid", []snapshot.WeightedBackend{{Weight: 3, Invalid: invalid}}, []uint64{2}, []any{ReasonInvalidBackend}, nil},
		{"all weights zero", []snapshot.WeightedBackend{{Weight: 0, Backend: v1}, {Weight: 0, Backend: v2}}, []uint64{0}, []any{ReasonNoBackend}, nil},
		{"no backends", nil, []uint64{0}, []any{ReasonNoBackend}, nil},
		{"three", []snapshot.WeightedBackend{{Weight: 1, Backend: v1}, {Weight: 2, Backend: v2}, {Weight: 1, Backend: v3}},
			[]uint64{0, 1, 2, 3}, []any{v1, v2, v2, v3}, nil},
		{"kept whatever the draw", []snapshot.WeightedBackend{{Weight: 70, Backend: v1}, {Weight: 30, Backend: v2}},
			[]uint64{0, 99}, []any{v2, v2}, []snapshot.BackendRef{v2}},
		{"kept by the first accepted", []snapshot.WeightedBackend{{Weight: 1, Backend: v1}, {Weight: 1, Backend: v2}, {Weight: 1, Backend: v3}},
			[]uint64{0, 2}, []any{v2, v2}, []snapshot.BackendRef{v3, v2}},
		{"kept by none: drawn", []snapshot.WeightedBackend{{Weight: 70, Backend: v1}, {Weight: 30, Backend: v2}},
			[]uint64{0, 70}, []any{v1, v2}, []snapshot.BackendRef{v3}},
		{"weight 0 keeps what it accepts", []snapshot.WeightedBackend{{Weight: 5, Backend: v2}, {Weight: 0, Backend: v1}},
			[]uint64{0, 4}, []any{v1, v1}, []snapshot.BackendRef{v1}},
		{"weight 0 is never drawn", []snapshot.WeightedBackend{{Weight: 0, Backend: v1}, {Weight: 5, Backend: v2}},
			[]uint64{0, 4}, []any{v2, v2}, []snapshot.BackendRef{v3}},
		{"all weights zero keep nothing", []snapshot.WeightedBackend{{Weight: 0, Backend: v1}, {Weight: 0, Backend: v2}},
			[]uint64{0}, []any{ReasonNoBackend}, []snapshot.BackendRef{v1}},
	}
	for _, tc := range tests {
		s := oneRule(snapshot.RouteRule{Backends: tc.backends}, snapshot.RouteMatch{Path: prefix("/")})
		for i, draw := range tc.draws {
			var d Decision
			req := get("/")
			if tc.keep != nil {
				req.Keep = func(ref snapshot.BackendRef) bool { return slices.Contains(tc.keep, ref) }
			}
			s.Decide(req, always(draw), &d)
			var got any = d.Backend
			if d.Action == Respond {
				got = d.Reason
				if d.Status != 500 {
					t.Errorf("%s: draw %d: status %d, want 500", tc.name, draw, d.Status)
				}
			}
			if got != tc.want[i] {
				t.Errorf("%s: draw %d = %v, want %v", tc.name, draw, got, tc.want[i])
			}
		}
	}
}

// TestWeightDistribution draws from a seeded source: every backend gets
// its share over many requests.
func TestWeightDistribution(t *testing.T) {
	s := oneRule(snapshot.RouteRule{Backends: []snapshot.WeightedBackend{{Weight: 70, Backend: v1}, {Weight: 30, Backend: v2}, {Weight: 0, Backend: v3}}},
		snapshot.RouteMatch{Path: prefix("/")})
	rnd := rand.New(rand.NewPCG(7, 7))
	counts := map[snapshot.BackendRef]int{}
	const n = 100000
	for range n {
		var d Decision
		s.Decide(get("/"), rnd, &d)
		counts[d.Backend]++
	}
	if counts[v3] != 0 || counts[v1] < n*68/100 || counts[v1] > n*72/100 || counts[v1]+counts[v2] != n {
		t.Errorf("counts %v, want about 70/30/0 of %d", counts, n)
	}
}

func TestMirrors(t *testing.T) {
	m1 := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "mesh", Name: "mirror-1", Port: 80}
	m2 := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "mesh", Name: "mirror-2", Port: 80}
	m3 := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "mesh", Name: "mirror-3", Port: 80}
	rule := snapshot.RouteRule{
		Filters: snapshot.Filters{Mirrors: []snapshot.Mirror{
			{Backend: m1, Numerator: 100, Denominator: 100},
			{Backend: m2, Numerator: 25, Denominator: 100},
			{Backend: m3, Numerator: 0, Denominator: 100},
		}},
		Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: v1, Filters: snapshot.Filters{
			Mirrors: []snapshot.Mirror{{Backend: m3, Numerator: 1, Denominator: 3}},
		}}},
	}
	s := oneRule(rule, snapshot.RouteMatch{Path: prefix("/")})
	// always(draw) draws draw%100 for the rule's fractions and draw%3 for
	// the backendRef's 1/3.
	for draw, want := range map[uint64][]snapshot.BackendRef{
		0:  {m1, m2, m3},
		24: {m1, m2, m3},
		25: {m1},
		98: {m1},
		99: {m1, m3},
	} {
		var d Decision
		s.Decide(get("/"), always(draw), &d)
		if !slices.Equal(d.Mirrors, want) {
			t.Errorf("draw %d: mirrors %v, want %v", draw, d.Mirrors, want)
		}
	}
}

func TestRuleSettings(t *testing.T) {
	sec := snapshot.Duration(10e9)
	rule := to(v1)
	rule.Timeouts = &snapshot.Timeouts{Request: &sec}
	rule.Retry = &snapshot.Retry{Attempts: 2, Codes: []int{503}}
	rule.SessionPersistence = &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "X-Session"}
	d := decide(oneRule(rule, snapshot.RouteMatch{Path: prefix("/")}), get("/"))
	if d.Timeouts != rule.Timeouts || d.Retry != rule.Retry || d.SessionPersistence != rule.SessionPersistence {
		t.Errorf("decision settings %+v %+v %+v, want the rule's", d.Timeouts, d.Retry, d.SessionPersistence)
	}
	if d.Rule == nil || d.Rule.Retry != rule.Retry {
		t.Errorf("decision Rule = %v, want the matching rule", d.Rule)
	}
}

func TestInvalid(t *testing.T) {
	bad := snapshot.RouteRule{Invalid: &snapshot.Invalid{Reason: "UnsupportedValue", Message: "filter type CORS is not supported"}}
	if d := decide(oneRule(bad, snapshot.RouteMatch{Path: prefix("/")}), get("/")); d.Action != Respond || d.Status != 500 || d.Reason != ReasonInvalidRule {
		t.Errorf("invalid rule: %+v, want Respond 500 invalid_rule", d)
	}
	broken := oneRule(to(v1), snapshot.RouteMatch{Path: regex("(")})
	if d := decide(broken, get("/")); d.Action != Respond || d.Status != 500 || d.Reason != ReasonInvalidTable {
		t.Errorf("uncompilable regex: %+v, want Respond 500 invalid_table", d)
	}
	unknown := oneRule(to(v1), snapshot.RouteMatch{Path: snapshot.PathMatch{Type: "Glob", Value: "/*"}})
	if d := decide(unknown, get("/")); d.Reason != ReasonInvalidTable {
		t.Errorf("unknown path type: %+v, want invalid_table", d)
	}
	// ReplacePrefixMatch needs a PathPrefix match to know what to replace.
	noPrefix := snapshot.RouteRule{Filters: snapshot.Filters{Redirect: &snapshot.Redirect{StatusCode: 302,
		Path: &snapshot.PathModifier{Type: snapshot.ReplacePrefixMatch, Value: "/x"}}}}
	if d := decide(oneRule(noPrefix, snapshot.RouteMatch{Path: exact("/a")}), get("/a")); d.Reason != ReasonInvalidRule {
		t.Errorf("ReplacePrefixMatch on an Exact match: %+v, want invalid_rule", d)
	}
}

func TestGRPC(t *testing.T) {
	rs := &snapshot.RouteSet{Kind: snapshot.KindGRPCRoute,
		Matches: []snapshot.RouteMatch{
			{Rule: 0, Path: exact("/grpc.health.v1.Health/Check")},
			{Rule: 1, Path: prefix("/grpc.health.v1.Health")},
			{Rule: 2, Path: regex("/[^/]+/Watch")},
			{Rule: 3, Path: regex("/(?:grpc\\.reflection\\..*)/(?:Server.*)"), Headers: []snapshot.StringMatch{{Name: "x-env", Type: snapshot.MatchExact, Value: "prod"}}},
		},
		Rules: []snapshot.RouteRule{to(v1), to(v2), to(v3), {Backends: []snapshot.WeightedBackend{{Weight: 1, Invalid: &snapshot.Invalid{Reason: "BackendNotFound"}}}}},
	}
	s := compileSet(7070, rs)
	post := func(path string, h http.Header) *Request {
		if h == nil {
			h = http.Header{}
		}
		h.Set("Content-Type", "application/grpc")
		return &Request{Method: "POST", Path: path, Host: "echo:7070", Header: h}
	}
	tests := []struct {
		req        *Request
		action     Action
		backend    snapshot.BackendRef
		status     int
		grpcStatus int
	}{
		{post("/grpc.health.v1.Health/Check", nil), Forward, v1, 0, 0},
		{post("/grpc.health.v1.Health/List", nil), Forward, v2, 0, 0},
		{post("/grpc.health.v1.HealthX/Check", nil), Respond, snapshot.BackendRef{}, 404, GRPCUnimplemented},
		{post("/any.Service/Watch", nil), Forward, v3, 0, 0},
		{post("/any.Service/WatchAll", nil), Respond, snapshot.BackendRef{}, 404, GRPCUnimplemented},
		{post("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", http.Header{"X-Env": {"prod"}}), Respond, snapshot.BackendRef{}, 503, GRPCUnavailable},
		{post("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", nil), Respond, snapshot.BackendRef{}, 404, GRPCUnimplemented},
	}
	for _, tc := range tests {
		d := decide(s, tc.req)
		if d.Action != tc.action || d.Backend != tc.backend || d.Status != tc.status || d.GRPCStatus != tc.grpcStatus {
			t.Errorf("Decide(%s) = %v %v %d/%d, want %v %v %d/%d", tc.req.Path, d.Action, d.Backend, d.Status, d.GRPCStatus,
				tc.action, tc.backend, tc.status, tc.grpcStatus)
		}
	}
}

// TestGRPCBinaryHeader: under a GRPCRoute, an Exact match of a binary
// header compares bytes, whichever base64 padding the route and the client
// wrote (grpc-go sends none); as text under an HTTPRoute and for a
// RegularExpression.
func TestGRPCBinaryHeader(t *testing.T) {
	bin := func(v string) snapshot.StringMatch {
		return snapshot.StringMatch{Name: "x-token-bin", Type: snapshot.MatchExact, Value: v}
	}
	grpc, http1 := snapshot.KindGRPCRoute, snapshot.KindHTTPRoute
	tests := []struct {
		kind  snapshot.RouteKind
		m     snapshot.StringMatch
		sent  []string
		match bool
	}{
		{grpc, bin("AAEC/w=="), []string{"AAEC/w"}, true},
		{grpc, bin("AAEC/w"), []string{"AAEC/w=="}, true},
		{grpc, bin("AAEC/w"), []string{"AAEC/w"}, true},
		{grpc, bin("AAE=,AgM"), []string{"AAE", "AgM="}, true},
		{grpc, bin("AAEC/w=="), []string{"AAEC_w"}, false}, // the URL alphabet is not gRPC's
		{grpc, bin("AAEC/w=="), []string{"AAEC/x"}, false},
		{grpc, snapshot.StringMatch{Name: "x-token-bin", Type: snapshot.MatchRegularExpression, Value: "AAEC/w"}, []string{"AAEC/w=="}, false},
		{http1, bin("AAEC/w=="), []string{"AAEC/w"}, false},
	}
	for _, tc := range tests {
		s := compileSet(7070, &snapshot.RouteSet{Kind: tc.kind, Rules: []snapshot.RouteRule{to(v1)},
			Matches: []snapshot.RouteMatch{{Path: prefix("/"), Headers: []snapshot.StringMatch{tc.m}}}})
		req := get("/svc.A/Get")
		req.Header["X-Token-Bin"] = tc.sent
		d := decide(s, req)
		if got := d.Action == Forward && d.Backend == v1; got != tc.match {
			t.Errorf("%s %s %q, sent %q: matched %v, want %v", tc.kind, tc.m.Type, tc.m.Value, tc.sent, got, tc.match)
		}
	}
}

func TestLookup(t *testing.T) {
	set := func(ref snapshot.BackendRef) snapshot.RouteSet {
		return snapshot.RouteSet{Kind: snapshot.KindHTTPRoute, Matches: []snapshot.RouteMatch{{Path: prefix("/")}}, Rules: []snapshot.RouteRule{to(ref)}}
	}
	producer := set(v1)
	svc := snapshot.ObjectRef{Namespace: "mesh", Name: "echo"}
	frontends := []snapshot.Frontend{
		{Service: svc, Port: 80, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Backend: v1,
			Routes: &snapshot.RouteTable{Producer: &producer, Consumers: []snapshot.ConsumerRoutes{{Namespace: "consumer", Routes: set(v2)}}}},
		{Service: svc, Port: 8080, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Backend: v1,
			Routes: &snapshot.RouteTable{Consumers: []snapshot.ConsumerRoutes{{Namespace: "consumer", Routes: set(v3)}}}},
		{Service: svc, Port: 9090, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Backend: v1},
	}
	s, err := snapshot.New(1, frontends, []snapshot.Backend{{Ref: v1}, {Ref: v2}, {Ref: v3}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	table := Compile(s)
	fe := func(port uint16) *snapshot.Frontend {
		f, ok := s.Frontend(netip.AddrPortFrom(netip.MustParseAddr("10.96.0.1"), port))
		if !ok {
			t.Fatalf("no frontend on port %d", port)
		}
		return f
	}
	tests := []struct {
		port      uint16
		namespace string
		want      *snapshot.BackendRef // nil: no route applies
	}{
		{80, "mesh", &v1},     // the producer route
		{80, "consumer", &v2}, // the consumer route replaces it
		{80, "", &v1},         // unknown client namespace: producer
		{80, "other", &v1},
		{8080, "consumer", &v3},
		{8080, "mesh", nil}, // only a consumer route: others go to the frontend's backend
		{9090, "consumer", nil},
	}
	for _, tc := range tests {
		set := table.Lookup(fe(tc.port), tc.namespace)
		switch {
		case tc.want == nil && set != nil:
			t.Errorf("Lookup(:%d, %q) = a set, want none", tc.port, tc.namespace)
		case tc.want != nil && set == nil:
			t.Errorf("Lookup(:%d, %q) = none, want a set", tc.port, tc.namespace)
		case tc.want != nil:
			if d := decide(set, get("/")); d.Backend != *tc.want {
				t.Errorf("Lookup(:%d, %q) routes to %v, want %v", tc.port, tc.namespace, d.Backend, *tc.want)
			}
		}
	}
	if (*Table)(nil).Lookup(fe(80), "mesh") != nil || table.Lookup(nil, "mesh") != nil {
		t.Errorf("nil table or frontend: want no set")
	}
	// A frontend of another Snapshot is not this Table's.
	other := frontends[0]
	if table.Lookup(&other, "mesh") != nil {
		t.Errorf("foreign frontend: want no set")
	}
}

// TestDecideAllocs: matching and a plain forward allocate nothing, on a
// scanned and an indexed set, also with header and query matches.
func TestDecideAllocs(t *testing.T) {
	for _, n := range []int{4, 1000} {
		s := benchSet(n)
		req := &Request{Method: "GET", Path: fmt.Sprintf("/svc/%d/items", n-1), RawQuery: "a=1&tenant=t", Host: "echo",
			Header: http.Header{"X-Tenant": {"t"}}}
		var d Decision
		allocs := testing.AllocsPerRun(200, func() { s.Decide(req, GlobalRand{}, &d) })
		if d.Action != Forward || allocs != 0 {
			t.Errorf("%d rules: action %v, %v allocations per Decide, want Forward and 0", n, d.Action, allocs)
		}
		miss := get("/nowhere")
		allocs = testing.AllocsPerRun(200, func() { s.Decide(miss, GlobalRand{}, &d) })
		if d.Action != Respond || allocs != 0 {
			t.Errorf("%d rules, no match: action %v, %v allocations, want Respond and 0", n, d.Action, allocs)
		}
	}
}
