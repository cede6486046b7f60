package routes

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// benchSet is a set of n rules as a Service with many tenants might have:
// rule i matches PathPrefix /svc/<i> with a header and a query match, in
// precedence order, and a catch-all last.
func benchSet(n int) *Set {
	rs := &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute}
	for i := range n {
		rs.Rules = append(rs.Rules, snapshot.RouteRule{Backends: []snapshot.WeightedBackend{{Weight: 9, Backend: v1}, {Weight: 1, Backend: v2}}})
		rs.Matches = append(rs.Matches, snapshot.RouteMatch{
			Rule:        i,
			Path:        prefix(fmt.Sprintf("/svc/%d", i)),
			Headers:     []snapshot.StringMatch{{Name: "x-tenant", Type: snapshot.MatchExact, Value: "t"}},
			QueryParams: []snapshot.StringMatch{{Name: "tenant", Type: snapshot.MatchExact, Value: "t"}},
		})
	}
	return compileSet(80, rs)
}

// BenchmarkDecide measures Decide on sets of 1, 100 and 1,000 rules for a
// request matching the last rule (the whole set scanned without the path
// index) and one matching none.
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		s := benchSet(n)
		last := &Request{Method: "GET", Path: fmt.Sprintf("/svc/%d/items/42", n-1), RawQuery: "page=2&tenant=t", Host: "echo",
			Header: http.Header{"X-Tenant": {"t"}, "Accept": {"*/*"}}}
		miss := &Request{Method: "GET", Path: "/other/items/42", Host: "echo", Header: http.Header{"Accept": {"*/*"}}}
		for _, c := range []struct {
			name string
			req  *Request
			want Action
		}{{"last", last, Forward}, {"miss", miss, Respond}} {
			b.Run(fmt.Sprintf("rules=%d/%s", n, c.name), func(b *testing.B) {
				var d Decision
				b.ReportAllocs()
				for b.Loop() {
					s.Decide(c.req, GlobalRand{}, &d)
				}
				if d.Action != c.want {
					b.Fatalf("action %v, want %v", d.Action, c.want)
				}
			})
		}
	}
}

// BenchmarkDecideScan is BenchmarkDecide's 1,000 rules without the path
// index, to show what it saves.
func BenchmarkDecideScan(b *testing.B) {
	s := benchSet(1000)
	s.index = nil
	req := &Request{Method: "GET", Path: "/svc/999/items/42", RawQuery: "tenant=t", Host: "echo", Header: http.Header{"X-Tenant": {"t"}}}
	var d Decision
	b.ReportAllocs()
	for b.Loop() {
		s.Decide(req, GlobalRand{}, &d)
	}
}
