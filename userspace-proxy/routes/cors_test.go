package routes

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

func corsRule(c snapshot.CORS) *Set {
	r := to(v1)
	r.CORS = &c
	return oneRule(r, snapshot.RouteMatch{Path: prefix("/")})
}

func preflight(origin, method, headers string) *Request {
	req := get("/")
	req.Method = http.MethodOptions
	req.Header.Set("Origin", origin)
	req.Header.Set("Access-Control-Request-Method", method)
	if headers != "" {
		req.Header.Set("Access-Control-Request-Headers", headers)
	}
	return req
}

func fromOrigin(origin string) *Request {
	req := get("/")
	req.Header.Set("Origin", origin)
	return req
}

func TestCORS(t *testing.T) {
	listed := snapshot.CORS{
		AllowOrigins:  []string{"https://www.foo.com", "https://*.bar.com", "http://localhost:8080", "http://*:8081"},
		AllowMethods:  []string{"GET", "OPTIONS"},
		AllowHeaders:  []string{"x-header-1", "x-header-2"},
		ExposeHeaders: []string{"x-header-3", "x-header-4"},
		MaxAge:        3600, AllowCredentials: true,
	}
	wildcards := snapshot.CORS{AllowOrigins: []string{"*"}, AllowMethods: []string{"*"}, AllowHeaders: []string{"*"},
		ExposeHeaders: []string{"*"}, MaxAge: 5}
	listedNoCredentials := listed
	listedNoCredentials.AllowCredentials = false
	wildcardsCredentials := wildcards
	wildcardsCredentials.AllowCredentials = true
	wildcardsCredentials.ExposeHeaders = []string{"*", "x-a"}
	tests := []struct {
		name   string
		cors   snapshot.CORS
		req    *Request
		action Action
		// backend is the backend's answer's header, for a Forward.
		backend http.Header
		want    http.Header
	}{
		{"preflight exact origin", listed, preflight("https://www.foo.com", "GET", "x-header-1, x-header-2"), Preflight, nil, http.Header{
			"Access-Control-Allow-Origin":      {"https://www.foo.com"},
			"Access-Control-Allow-Credentials": {"true"},
			"Access-Control-Allow-Methods":     {"GET, OPTIONS"},
			"Access-Control-Allow-Headers":     {"x-header-1, x-header-2"},
			"Access-Control-Expose-Headers":    {"x-header-3, x-header-4"},
			"Access-Control-Max-Age":           {"3600"},
			"Vary":                             {"Origin"},
		}},
		{"preflight default port written", listed, preflight("https://www.foo.com:443", "GET", ""), Preflight, nil, http.Header{
			"Access-Control-Allow-Origin":      {"https://www.foo.com:443"},
			"Access-Control-Allow-Credentials": {"true"},
			"Access-Control-Allow-Methods":     {"GET, OPTIONS"},
			"Access-Control-Allow-Headers":     {"x-header-1, x-header-2"},
			"Access-Control-Expose-Headers":    {"x-header-3, x-header-4"},
			"Access-Control-Max-Age":           {"3600"},
			"Vary":                             {"Origin"},
		}},
		{"preflight denied origin", listed, preflight("https://foobar.com", "GET", ""), Preflight, nil, http.Header{"Vary": {"Origin"}}},
		{"preflight other port", listed, preflight("https://www.foo.com:8443", "GET", ""), Preflight, nil, http.Header{"Vary": {"Origin"}}},
		{"preflight other scheme", listed, preflight("http://www.foo.com", "GET", ""), Preflight, nil, http.Header{"Vary": {"Origin"}}},
		{"preflight wildcard needs a label", listed, preflight("https://bar.com", "GET", ""), Preflight, nil, http.Header{"Vary": {"Origin"}}},
		{"preflight null origin", listed, preflight("null", "GET", ""), Preflight, nil, http.Header{"Vary": {"Origin"}}},
		{"simple wildcard origin, labels to the left", listed, fromOrigin("https://a.b.bar.com"), Forward, http.Header{}, http.Header{
			"Access-Control-Allow-Origin":      {"https://a.b.bar.com"},
			"Access-Control-Allow-Credentials": {"true"},
			"Access-Control-Expose-Headers":    {"x-header-3, x-header-4"},
			"Vary":                             {"Origin"},
		}},
		{"simple wildcard host with port", listed, fromOrigin("http://anything.example:8081"), Forward, http.Header{}, http.Header{
			"Access-Control-Allow-Origin":      {"http://anything.example:8081"},
			"Access-Control-Allow-Credentials": {"true"},
			"Access-Control-Expose-Headers":    {"x-header-3, x-header-4"},
			"Vary":                             {"Origin"},
		}},
		{"simple port and host case", listed, fromOrigin("http://LOCALHOST:8080"), Forward, http.Header{}, http.Header{
			"Access-Control-Allow-Origin":      {"http://LOCALHOST:8080"},
			"Access-Control-Allow-Credentials": {"true"},
			"Access-Control-Expose-Headers":    {"x-header-3, x-header-4"},
			"Vary":                             {"Origin"},
		}},
		{"simple denied: the backend's CORS headers go", listed, fromOrigin("https://evil.com"), Forward,
			http.Header{"Access-Control-Allow-Origin": {"*"}, "Vary": {"Accept-Encoding"}, "X-Own": {"1"}},
			http.Header{"Vary": {"Accept-Encoding", "Origin"}, "X-Own": {"1"}}},
		{"no Origin: Vary only, once", listed, get("/"), Forward, http.Header{"Vary": {"accept, origin"}},
			http.Header{"Vary": {"accept, origin"}}},
		{"OPTIONS without request method goes on", listed, func() *Request {
			r := fromOrigin("https://www.foo.com")
			r.Method = http.MethodOptions
			return r
		}(), Forward, http.Header{}, http.Header{
			"Access-Control-Allow-Origin":      {"https://www.foo.com"},
			"Access-Control-Allow-Credentials": {"true"},
			"Access-Control-Expose-Headers":    {"x-header-3, x-header-4"},
			"Vary":                             {"Origin"},
		}},
		{"wildcards echo", wildcards, preflight("https://foobar.com:12345", "PUT", "x-a, x-b"), Preflight, nil, http.Header{
			"Access-Control-Allow-Origin":   {"https://foobar.com:12345"},
			"Access-Control-Allow-Methods":  {"PUT"},
			"Access-Control-Allow-Headers":  {"x-a, x-b"},
			"Access-Control-Expose-Headers": {"*"},
			"Access-Control-Max-Age":        {"5"},
			"Vary":                          {"Origin"},
		}},
		{"wildcards, no request headers", wildcards, preflight("https://foobar.com", "PUT", ""), Preflight, nil, http.Header{
			"Access-Control-Allow-Origin":   {"https://foobar.com"},
			"Access-Control-Allow-Methods":  {"PUT"},
			"Access-Control-Expose-Headers": {"*"},
			"Access-Control-Max-Age":        {"5"},
			"Vary":                          {"Origin"},
		}},
		{"wildcards with credentials: echo, no * exposed", wildcardsCredentials, preflight("https://foobar.com", "DELETE", "x-a"), Preflight, nil, http.Header{
			"Access-Control-Allow-Origin":      {"https://foobar.com"},
			"Access-Control-Allow-Credentials": {"true"},
			"Access-Control-Allow-Methods":     {"DELETE"},
			"Access-Control-Allow-Headers":     {"x-a"},
			"Access-Control-Expose-Headers":    {"x-a"},
			"Access-Control-Max-Age":           {"5"},
			"Vary":                             {"Origin"},
		}},
		{"no origins allowed", snapshot.CORS{MaxAge: 5}, preflight("https://foobar.com", "GET", ""), Preflight, nil, http.Header{"Vary": {"Origin"}}},
		// GEP-1767: without allowCredentials, no CORS header answers a
		// credentialed request; with it, the origin is echoed.
		{"cookie without allowCredentials: none", wildcards, credentialed(fromOrigin("https://app.example"), "Cookie", "sid=abc123"), Forward,
			http.Header{"Access-Control-Allow-Origin": {"*"}}, http.Header{"Vary": {"Origin"}}},
		{"basic authorization without allowCredentials: none", wildcards, credentialed(fromOrigin("https://app.example"), "Authorization", "Basic dTpw"), Forward,
			http.Header{}, http.Header{"Vary": {"Origin"}}},
		{"negotiate authorization without allowCredentials: none", listedNoCredentials, credentialed(fromOrigin("https://www.foo.com"), "Authorization", "negotiate YII="), Forward,
			http.Header{}, http.Header{"Vary": {"Origin"}}},
		// A token a script sets is no credential (Fetch: the request goes
		// in credentials mode "same-origin", and the browser reads its
		// answer by Access-Control-Allow-Origin alone).
		{"bearer token without allowCredentials: allowed", wildcards, credentialed(fromOrigin("https://app.example"), "Authorization", "Bearer t"), Forward,
			http.Header{}, http.Header{
				"Access-Control-Allow-Origin":   {"https://app.example"},
				"Access-Control-Expose-Headers": {"*"},
				"Vary":                          {"Origin"},
			}},
		{"custom scheme without allowCredentials: allowed", listedNoCredentials, credentialed(fromOrigin("https://www.foo.com"), "Authorization", "Token abc"), Forward,
			http.Header{}, http.Header{
				"Access-Control-Allow-Origin":   {"https://www.foo.com"},
				"Access-Control-Expose-Headers": {"x-header-3, x-header-4"},
				"Vary":                          {"Origin"},
			}},
		{"cookie with allowCredentials: echoed", wildcardsCredentials, credentialed(fromOrigin("https://app.example"), "Cookie", "sid=abc123"), Forward,
			http.Header{}, http.Header{
				"Access-Control-Allow-Origin":      {"https://app.example"},
				"Access-Control-Allow-Credentials": {"true"},
				"Access-Control-Expose-Headers":    {"x-a"},
				"Vary":                             {"Origin"},
			}},
		{"preflight with a cookie is not credentialed", wildcards, credentialed(preflight("https://app.example", "GET", ""), "Cookie", "sid=abc123"), Preflight, nil, http.Header{
			"Access-Control-Allow-Origin":   {"https://app.example"},
			"Access-Control-Allow-Methods":  {"GET"},
			"Access-Control-Expose-Headers": {"*"},
			"Access-Control-Max-Age":        {"5"},
			"Vary":                          {"Origin"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decide(corsRule(tt.cors), tt.req)
			if d.Action != tt.action {
				t.Fatalf("Decide: action %v, want %v", d.Action, tt.action)
			}
			h := tt.backend
			if d.Action == Preflight {
				if d.Status != http.StatusOK {
					t.Errorf("preflight status %d, want 200", d.Status)
				}
				h = http.Header{}
			}
			d.ApplyResponse(h)
			if !headersEqual(h, tt.want) {
				t.Errorf("ApplyResponse: %v, want %v", h, tt.want)
			}
		})
	}
}

// TestCORSRuleOrder: a preflight is answered before a redirect or the
// pick of a backend, and the rule's response header changes apply to it
// before the CORS headers, which are the filter's.
func TestCORSRuleOrder(t *testing.T) {
	r := snapshot.RouteRule{
		Filters: snapshot.Filters{
			Redirect:        &snapshot.Redirect{Hostname: "example.org", StatusCode: 302},
			ResponseHeaders: &snapshot.HeaderModifier{Set: []snapshot.Header{{Name: "X-Rule", Value: "1"}, {Name: "Access-Control-Max-Age", Value: "1"}}},
			CORS:            &snapshot.CORS{AllowOrigins: []string{"*"}, MaxAge: 7},
		},
	}
	s := oneRule(r, snapshot.RouteMatch{Path: prefix("/")})
	d := decide(s, preflight("https://a.example", "GET", ""))
	h := http.Header{}
	d.ApplyResponse(h)
	want := http.Header{"X-Rule": {"1"}, "Access-Control-Allow-Origin": {"https://a.example"}, "Access-Control-Max-Age": {"7"}, "Vary": {"Origin"}}
	if d.Action != Preflight || !headersEqual(h, want) {
		t.Errorf("preflight: action %v header %v, want Preflight %v", d.Action, h, want)
	}
	d = decide(s, fromOrigin("https://a.example"))
	h = http.Header{}
	d.ApplyResponse(h)
	want = http.Header{"X-Rule": {"1"}, "Access-Control-Allow-Origin": {"https://a.example"}, "Vary": {"Origin"}}
	if d.Action != Redirect || !headersEqual(h, want) {
		t.Errorf("redirect: action %v header %v, want Redirect %v", d.Action, h, want)
	}
}

// TestCORSPreflightMethodMatch: a preflight meets the rules as the request
// it asks about would — a rule with a CORS filter whose match names that
// method (not OPTIONS) answers it, with its own policy — and any other
// OPTIONS request as what it is. The preflight missed such a rule.
func TestCORSPreflightMethodMatch(t *testing.T) {
	withCORS := func(ref snapshot.BackendRef, origin string) snapshot.RouteRule {
		r := to(ref)
		r.CORS = &snapshot.CORS{AllowOrigins: []string{origin}, MaxAge: 5}
		return r
	}
	s := compileSet(80, &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{
			{Rule: 0, Path: prefix("/api"), Method: http.MethodGet},
			{Rule: 1, Path: prefix("/api"), Method: http.MethodPut},
			{Rule: 2, Path: prefix("/api"), Method: http.MethodDelete},
			{Rule: 3, Path: prefix("/")},
		},
		Rules: []snapshot.RouteRule{withCORS(v1, "https://get.example"), withCORS(v2, "https://put.example"), to(v3), to(v1)},
	})
	asking, plainOptions := apiPreflights("https://put.example")
	tests := []struct {
		name   string
		req    *Request
		rule   int
		action Action
		origin string // the Access-Control-Allow-Origin answered
	}{
		{"PUT asked: the PUT rule's policy", asking(http.MethodPut), 1, Preflight, "https://put.example"},
		{"GET asked: the GET rule's policy", asking(http.MethodGet), 0, Preflight, ""},
		{"DELETE asked: its rule has no CORS", asking(http.MethodDelete), 3, Forward, ""},
		{"PATCH asked: no rule for it", asking(http.MethodPatch), 3, Forward, ""},
		{"OPTIONS, no preflight", plainOptions, 3, Forward, ""},
	}
	for _, tt := range tests {
		d := decide(s, tt.req)
		h := http.Header{}
		d.ApplyResponse(h)
		rule := slices.IndexFunc(s.rules, func(r rule) bool { return r.src == d.Rule })
		if got := h.Get("Access-Control-Allow-Origin"); rule != tt.rule || d.Action != tt.action || got != tt.origin {
			t.Errorf("%s: rule %d, %v, origin %q; want rule %d, %v, origin %q", tt.name, rule, d.Action, got, tt.rule, tt.action, tt.origin)
		}
	}
}

// apiPreflights returns, for origin and the path /api/x, a preflight
// announcing a method, and a plain OPTIONS request.
func apiPreflights(origin string) (asking func(method string) *Request, plainOptions *Request) {
	plainOptions = fromOrigin(origin)
	plainOptions.Method, plainOptions.Path = http.MethodOptions, "/api/x"
	return func(method string) *Request {
		r := preflight(origin, method, "")
		r.Path = "/api/x"
		return r
	}, plainOptions
}

// TestCORSPreflightBeforeOptionsRule: a preflight belongs to the rule that
// would take the request it announces, ahead of a rule matching OPTIONS on
// the same path, which takes other OPTIONS requests and the preflights of
// requests no rule with a CORS filter takes. The OPTIONS rule, first by
// rule order, took the PUT rule's preflights.
func TestCORSPreflightBeforeOptionsRule(t *testing.T) {
	put := to(v2)
	put.CORS = &snapshot.CORS{AllowOrigins: []string{"https://put.example"}, MaxAge: 5}
	s := compileSet(80, &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{
			{Rule: 0, Path: prefix("/api"), Method: http.MethodOptions},
			{Rule: 1, Path: prefix("/api"), Method: http.MethodPut},
		},
		Rules: []snapshot.RouteRule{to(v1), put},
	})
	asking, plainOptions := apiPreflights("https://put.example")
	for _, tt := range []struct {
		name   string
		req    *Request
		rule   int
		action Action
	}{
		{"PUT asked", asking(http.MethodPut), 1, Preflight},
		{"GET asked: no rule takes it", asking(http.MethodGet), 0, Forward},
		{"OPTIONS, no preflight", plainOptions, 0, Forward},
	} {
		d := decide(s, tt.req)
		if rule := slices.IndexFunc(s.rules, func(r rule) bool { return r.src == d.Rule }); rule != tt.rule || d.Action != tt.action {
			t.Errorf("%s: rule %d, %v; want rule %d, %v", tt.name, rule, d.Action, tt.rule, tt.action)
		}
	}
}

// TestCORSPreflightHeaderMatch: a preflight meets a rule's header matches
// with the header names its Access-Control-Request-Headers lists (any
// case, in any of its fields), the values being unknown, or with its
// headers as sent; a header it neither lists nor carries misses. A rule
// matching a header its requests carry (a token) never saw its preflights,
// which carry none.
func TestCORSPreflightHeaderMatch(t *testing.T) {
	token := to(v2)
	token.CORS = &snapshot.CORS{AllowOrigins: []string{"https://a.example"}, MaxAge: 5}
	s := compileSet(80, &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{
			{Rule: 0, Path: prefix("/api"), Headers: []snapshot.StringMatch{{Name: "X-Token", Type: snapshot.MatchExact, Value: "secret"}}},
			{Rule: 1, Path: prefix("/")},
		},
		Rules: []snapshot.RouteRule{token, to(v1)},
	})
	asking := func(headers ...string) *Request {
		r := preflight("https://a.example", http.MethodPut, "")
		r.Path = "/api/x"
		r.Header["Access-Control-Request-Headers"] = headers
		return r
	}
	carrying := asking("content-type")
	carrying.Header.Set("X-Token", "secret")
	notPreflight := asking("x-token")
	notPreflight.Header.Del("Access-Control-Request-Method")
	for _, tt := range []struct {
		name   string
		req    *Request
		rule   int
		action Action
	}{
		{"listed", asking("content-type, x-token"), 0, Preflight},
		{"listed in another field, another case", asking("content-type", "X-TOKEN"), 0, Preflight},
		{"carried", carrying, 0, Preflight},
		{"neither", asking("content-type, x-token-2"), 1, Forward},
		{"listed, not a preflight", notPreflight, 1, Forward},
	} {
		d := decide(s, tt.req)
		if rule := slices.IndexFunc(s.rules, func(r rule) bool { return r.src == d.Rule }); rule != tt.rule || d.Action != tt.action {
			t.Errorf("%s: rule %d, %v; want rule %d, %v", tt.name, rule, d.Action, tt.rule, tt.action)
		}
	}
}

// TestCORSPreflightSafelistedHeaderMatch: a preflight meets a match on a
// CORS-safelisted header (Fetch standard: Accept, Accept-Language,
// Content-Language, Content-Type, Range) without listing it — a browser
// never lists such a header when its value is safe — unless the match's
// exact value is unsafe, which a browser would have listed. A rule
// matching "Accept: application/json" never saw its preflights, which fell
// to the next rule.
func TestCORSPreflightSafelistedHeaderMatch(t *testing.T) {
	withCORS := func(ref snapshot.BackendRef) snapshot.RouteRule {
		r := to(ref)
		r.CORS = &snapshot.CORS{AllowOrigins: []string{"https://a.example"}, MaxAge: 5}
		return r
	}
	header := func(name string, typ snapshot.MatchType, value string) []snapshot.StringMatch {
		return []snapshot.StringMatch{{Name: name, Type: typ, Value: value}}
	}
	s := compileSet(80, &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{
			{Rule: 0, Path: prefix("/accept"), Method: http.MethodPut, Headers: header("Accept", snapshot.MatchExact, "application/json")},
			{Rule: 1, Path: prefix("/json"), Method: http.MethodPut, Headers: header("content-type", snapshot.MatchExact, "application/json")},
			{Rule: 2, Path: prefix("/lang"), Method: http.MethodPut, Headers: header("Content-Language", snapshot.MatchRegularExpression, "de|fr")},
			{Rule: 3, Path: prefix("/")},
		},
		Rules: []snapshot.RouteRule{withCORS(v1), withCORS(v2), withCORS(v3), to(v1)},
	})
	asking := func(path, headers string) *Request {
		r := preflight("https://a.example", http.MethodPut, headers)
		r.Path = path
		r.Header.Set("Accept", "*/*") // what a browser's preflight carries
		return r
	}
	plainOptions := fromOrigin("https://a.example")
	plainOptions.Method, plainOptions.Path = http.MethodOptions, "/accept"
	for _, tt := range []struct {
		name   string
		req    *Request
		rule   int
		action Action
	}{
		{"Accept, safe exact value, not listed", asking("/accept", ""), 0, Preflight},
		{"Content-Type, unsafe exact value, listed", asking("/json", "content-type"), 1, Preflight},
		{"Content-Type, unsafe exact value, not listed", asking("/json", "x-other"), 3, Forward},
		{"Content-Language, regular expression, not listed", asking("/lang", ""), 2, Preflight},
		{"OPTIONS, no preflight", plainOptions, 3, Forward},
	} {
		d := decide(s, tt.req)
		if rule := slices.IndexFunc(s.rules, func(r rule) bool { return r.src == d.Rule }); rule != tt.rule || d.Action != tt.action {
			t.Errorf("%s: rule %d, %v; want rule %d, %v", tt.name, rule, d.Action, tt.rule, tt.action)
		}
	}
}

// TestSafelistedValue: the values that keep a safelisted header name a
// CORS-safelisted request-header, after the Fetch standard.
func TestSafelistedValue(t *testing.T) {
	for _, tt := range []struct {
		key, value string
		want       bool
	}{
		{"Accept", "application/json", true},
		{"Accept", "text/html;q=0.9, */*;q=0.8", true},
		{"Accept", `text/html; a="b"`, false},
		{"Accept", strings.Repeat("a", 128), true},
		{"Accept", strings.Repeat("a", 129), false},
		{"Accept-Language", "de-DE,en;q=0.9", true},
		{"Content-Language", "de(x)", false},
		{"Content-Type", "text/plain; charset=utf-8", true},
		{"Content-Type", " Multipart/Form-Data ; boundary=x", true},
		{"Content-Type", "application/x-www-form-urlencoded", true},
		{"Content-Type", "application/json", false},
		{"Content-Type", "text/plain; charset=\"utf-8\"", false},
		{"Range", "bytes=0-", true},
		{"Range", "bytes=10-99", true},
		{"Range", "bytes=5-5", true},
		{"Range", "bytes=9-10", true},
		{"Range", "bytes=0010-10", true},
		{"Range", "bytes=10-9", false},
		{"Range", "bytes=2-10", true},
		{"Range", "bytes=100-099", false},
		{"Range", "bytes=-500", false},
		{"Range", "bytes=0-1,3-4", false},
		{"Range", "items=0-1", false},
	} {
		if got := safelistedValue(tt.key, tt.value); got != tt.want {
			t.Errorf("safelistedValue(%s, %q) = %v, want %v", tt.key, tt.value, got, tt.want)
		}
	}
}

// TestSafelistedSize: the fewest bytes a browser counts toward the 1024 for
// a value that may be several header-list entries joined with ", ", each
// CORS-safelisted and at most 128 bytes (Fetch standard).
func TestSafelistedSize(t *testing.T) {
	long := strings.Repeat("a", 100)
	for _, tt := range []struct {
		key, value string
		want       int
	}{
		{"Accept", "application/json", 16},
		{"Accept", "text/html, */*", 12},
		{"Accept", "", 0},
		{"Accept", long + ", " + long, 200},
		{"Accept", strings.Repeat("a", 129), -1},
		{"Accept", long + ",  " + long, -1}, // " aaa…" is no entry: values are trimmed
		{"Accept", "a, (b)", -1},
		{"Content-Type", "text/plain, text/plain", 20},
		{"Content-Type", "text/plain, application/json", -1},
		{"Range", "bytes=0-1, bytes=5-9", 18},
		{"Range", "bytes=0-1, bytes=9-5", -1},
	} {
		if got := safelistedSize(tt.key, tt.value); got != tt.want {
			t.Errorf("safelistedSize(%s, %q) = %d, want %d", tt.key, tt.value, got, tt.want)
		}
	}
}

// TestCORSPreflightSafelistedLimit: once the CORS-safelisted values a
// request carries total more than 1024 bytes, a browser lists their names
// after all (Fetch standard, "CORS-unsafe request-header names"), so a
// preflight meets such a match only by listing it — every safelisted name
// of the match, the small ones too — and one listing none belongs to the
// next rule. At the limit it still meets them unlisted.
func TestCORSPreflightSafelistedLimit(t *testing.T) {
	withCORS := func(ref snapshot.BackendRef) snapshot.RouteRule {
		r := to(ref)
		r.CORS = &snapshot.CORS{AllowOrigins: []string{"https://a.example"}, MaxAge: 5}
		return r
	}
	// entries is n 126-byte Accept entries joined as a browser sends them.
	entries := func(n int) string {
		return strings.TrimSuffix(strings.Repeat(strings.Repeat("a", 126)+", ", n), ", ")
	}
	exact := func(name, value string) snapshot.StringMatch {
		return snapshot.StringMatch{Name: name, Type: snapshot.MatchExact, Value: value}
	}
	s := compileSet(80, &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{
			// 8×126 + 16 = 1024: at the limit.
			{Rule: 0, Path: prefix("/at"), Method: http.MethodPut, Headers: []snapshot.StringMatch{
				exact("Accept", entries(8)), exact("Content-Language", strings.Repeat("d", 16))}},
			// 8×126 + 17 = 1025: past it.
			{Rule: 1, Path: prefix("/past"), Method: http.MethodPut, Headers: []snapshot.StringMatch{
				exact("Accept", entries(8)), exact("Content-Language", strings.Repeat("d", 17))}},
			{Rule: 2, Path: prefix("/")},
		},
		Rules: []snapshot.RouteRule{withCORS(v1), withCORS(v2), to(v3)},
	})
	asking := func(path, headers string) *Request {
		r := preflight("https://a.example", http.MethodPut, headers)
		r.Path = path
		return r
	}
	for _, tt := range []struct {
		name   string
		req    *Request
		rule   int
		action Action
	}{
		{"at the limit, not listed", asking("/at", ""), 0, Preflight},
		{"past the limit, listed", asking("/past", "accept,content-language"), 1, Preflight},
		{"past the limit, not listed", asking("/past", ""), 2, Forward},
		{"past the limit, one listed", asking("/past", "accept"), 2, Forward},
	} {
		d := decide(s, tt.req)
		if rule := slices.IndexFunc(s.rules, func(r rule) bool { return r.src == d.Rule }); rule != tt.rule || d.Action != tt.action {
			t.Errorf("%s: rule %d, %v; want rule %d, %v", tt.name, rule, d.Action, tt.rule, tt.action)
		}
	}
}

// credentialed adds the credential header key: value to r.
func credentialed(r *Request, key, value string) *Request {
	r.Header.Set(key, value)
	return r
}
