package routes

import (
	"net/http"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// FuzzDecide feeds arbitrary paths, queries and header values: Decide
// must not panic, normalization must be idempotent, and the path index
// must pick what a scan picks.
func FuzzDecide(f *testing.F) {
	for _, s := range []string{"/", "/a/../b", "/%2e%2E/x", "/%", "/a%2Fb/./c", "", "*", "/v1/items/..%2f"} {
		f.Add(s, "a=1&b=%zz", "x")
	}
	rs := &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute, Rules: []snapshot.RouteRule{to(v1), to(v2)}}
	for i, p := range []string{"/a", "/a/b", "/v1", "/v1/items", "/", "/x/y/z", "/%7Euser", "/a%2Fb"} {
		rs.Matches = append(rs.Matches,
			snapshot.RouteMatch{Rule: i % 2, Path: exact(p)},
			snapshot.RouteMatch{Rule: i % 2, Path: prefix(p), QueryParams: []snapshot.StringMatch{{Name: "a", Type: snapshot.MatchExact, Value: "1"}}},
			snapshot.RouteMatch{Rule: i % 2, Path: regex(p + "/[^/]*"), Headers: []snapshot.StringMatch{{Name: "h", Type: snapshot.MatchRegularExpression, Value: "x.*"}}})
	}
	indexed := compileSet(80, rs)
	if indexed.broken || indexed.index == nil {
		f.Fatalf("the seed route set compiled broken (%v) or without an index: the fuzz would compare a scan with itself", indexed.broken)
	}
	scanned := *indexed
	scanned.index = nil
	f.Fuzz(func(t *testing.T, path, query, header string) {
		n := normalizePath(path)
		if again := normalizePath(n); again != n {
			t.Fatalf("normalizePath(%q) = %q, then %q", path, n, again)
		}
		req := &Request{Method: "GET", Path: path, RawQuery: query, Host: header, Header: http.Header{"H": {header}}}
		if a, b := indexed.find(req, n, nil), scanned.find(req, n, nil); a != b {
			t.Fatalf("path %q query %q: index found %d, scan %d", path, query, a, b)
		}
		var d Decision
		indexed.Decide(req, always(7), &d)
		if d.Action == 0 {
			t.Fatalf("no action for %q", path)
		}
	})
}
