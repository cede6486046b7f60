package routes

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// Set is one compiled route set (a RouteTable's producer or one consumer
// namespace's).
type Set struct {
	grpc    bool
	port    uint16 // the Service port, the default of redirects
	entries []entry
	rules   []rule
	// index finds candidate entries by path in large sets; nil in small
	// ones, where a scan is faster.
	index *pathIndex
	// cors: a rule has a CORS filter, so a preflight first meets the rules
	// as the request it announces (Set.preflightEntry).
	cors bool
	// broken: the set did not compile; every request gets 500.
	broken bool
}

// indexFrom is the set size from which Decide looks entries up by path
// rather than scanning them all (a scan is cheaper below it).
const indexFrom = 16

type pathKind uint8

const (
	pathExact pathKind = iota
	pathPrefix
	pathRegex
)

// entry is one compiled match.
type entry struct {
	rule int32
	kind pathKind
	// path is the normalized Exact value, or the normalized PathPrefix
	// value without its trailing "/" ("" for "/").
	path    string
	re      *regexp.Regexp
	method  string
	headers []valueMatch
	queries []valueMatch
}

// valueMatch compares a header (key canonical) or a query parameter.
type valueMatch struct {
	key  string
	host bool // the "Host" header: the request's authority
	// upgrade: the "Upgrade" header, which an extended CONNECT carries as
	// its :protocol (Request.Upgrade).
	upgrade bool
	exact   string
	// binary: exact is a gRPC binary header's snapshot.BinaryValue form,
	// compared with the request's.
	binary bool
	// unannounced: a header a request may carry without its CORS
	// preflight listing it (a CORS-safelisted one), so the preflight meets
	// the match unseen.
	unannounced bool
	re          *regexp.Regexp
}

type rule struct {
	src      *snapshot.RouteRule
	invalid  bool
	filters  filters
	backends []backend
	total    uint64 // sum of the backends' weights
}

type backend struct {
	weight  uint64
	ref     snapshot.BackendRef
	invalid bool
	filters filters
}

type filters struct {
	reqHeaders, respHeaders *headerMods
	redirect                *snapshot.Redirect
	rewrite                 *snapshot.Rewrite
	mirrors                 []mirror
	cors                    *corsPolicy // rules only
}

type mirror struct {
	ref      snapshot.BackendRef
	num, den uint64
}

func compileSet(port uint16, rs *snapshot.RouteSet) *Set {
	s := &Set{grpc: rs.Kind == snapshot.KindGRPCRoute, port: port}
	s.rules = make([]rule, len(rs.Rules))
	for i := range rs.Rules {
		s.rules[i] = compileRule(&rs.Rules[i])
	}
	s.entries = make([]entry, 0, len(rs.Matches))
	for _, m := range rs.Matches {
		e, ok := compileEntry(m, s.grpc)
		if !ok || m.Rule < 0 || m.Rule >= len(s.rules) {
			return &Set{grpc: s.grpc, port: port, broken: true}
		}
		if e.kind != pathPrefix && s.rules[m.Rule].replacesPrefix() {
			// translate allows ReplacePrefixMatch only on a rule with one
			// PathPrefix match; without it there is no prefix to replace.
			s.rules[m.Rule].invalid = true
		}
		s.cors = s.cors || s.rules[m.Rule].filters.cors != nil
		s.entries = append(s.entries, e)
	}
	if len(s.entries) >= indexFrom {
		s.index = newPathIndex(s.entries)
	}
	return s
}

func compileEntry(m snapshot.RouteMatch, grpc bool) (entry, bool) {
	e := entry{rule: int32(m.Rule), method: m.Method}
	switch m.Path.Type {
	case snapshot.PathExact:
		e.kind, e.path = pathExact, normalizePath(m.Path.Value)
	case snapshot.PathPrefix:
		e.kind, e.path = pathPrefix, strings.TrimRight(normalizePath(m.Path.Value), "/")
	case snapshot.PathRegularExpression:
		e.kind = pathRegex
		if e.re = compileRegex(m.Path.Value); e.re == nil {
			return e, false
		}
	default:
		return e, false
	}
	var ok bool
	if e.headers, ok = compileValues(m.Headers, true, grpc); !ok {
		return e, false
	}
	e.queries, ok = compileValues(m.QueryParams, false, false)
	return e, ok
}

func compileValues(ms []snapshot.StringMatch, header, grpc bool) ([]valueMatch, bool) {
	out := make([]valueMatch, 0, len(ms))
	safelisted := 0 // the CORS-safelisted values' bytes a request meeting ms carries at least
	for _, m := range ms {
		v := valueMatch{key: m.Name}
		if header {
			v.key = http.CanonicalHeaderKey(m.Name)
			v.host, v.upgrade = v.key == "Host", v.key == "Upgrade"
		}
		switch m.Type {
		case snapshot.MatchExact:
			v.exact = m.Value
			if v.binary = grpc && header && snapshot.IsBinaryHeader(m.Name); v.binary {
				var ok bool
				if v.exact, ok = snapshot.BinaryValue(m.Value); !ok {
					return nil, false
				}
			}
		case snapshot.MatchRegularExpression:
			if v.re = compileRegex(m.Value); v.re == nil {
				return nil, false
			}
		default:
			return nil, false
		}
		if header {
			if size := corsSafelistedSize(v.key, &m); size >= 0 {
				v.unannounced, safelisted = true, safelisted+size
			}
		}
		out = append(out, v)
	}
	if safelisted > maxSafelistedSize {
		// A browser lists every safelisted name once their values exceed
		// the limit (Fetch standard), so a preflight must list them.
		for i := range out {
			out[i].unannounced = false
		}
	}
	return out, true
}

// compileRegex compiles expr to match whole values; nil if it is not RE2.
func compileRegex(expr string) *regexp.Regexp {
	re, err := regexp.Compile("^(?:" + expr + ")$")
	if err != nil {
		return nil
	}
	return re
}

func compileRule(r *snapshot.RouteRule) rule {
	out := rule{src: r, invalid: r.Invalid != nil, filters: compileFilters(&r.Filters)}
	for _, wb := range r.Backends {
		b := backend{weight: uint64(wb.Weight), ref: wb.Backend, invalid: wb.Invalid != nil, filters: compileFilters(&wb.Filters)}
		out.total += b.weight
		out.backends = append(out.backends, b)
	}
	return out
}

func compileFilters(f *snapshot.Filters) filters {
	out := filters{
		reqHeaders:  compileHeaderMods(f.RequestHeaders),
		respHeaders: compileHeaderMods(f.ResponseHeaders),
		cors:        compileCORS(f.CORS),
	}
	if rd := f.Redirect; rd != nil {
		c := *rd
		c.Path = escapedModifier(rd.Path)
		out.redirect = &c
	}
	if rw := f.Rewrite; rw != nil {
		c := *rw
		c.Path = escapedModifier(rw.Path)
		out.rewrite = &c
	}
	for _, m := range f.Mirrors {
		out.mirrors = append(out.mirrors, mirror{ref: m.Backend, num: uint64(m.Numerator), den: max(uint64(m.Denominator), 1)})
	}
	return out
}

func (r *rule) replacesPrefix() bool {
	if replacesPrefix(&r.filters) {
		return true
	}
	for i := range r.backends {
		if replacesPrefix(&r.backends[i].filters) {
			return true
		}
	}
	return false
}

func replacesPrefix(f *filters) bool {
	prefix := func(p *snapshot.PathModifier) bool { return p != nil && p.Type == snapshot.ReplacePrefixMatch }
	return f.redirect != nil && prefix(f.redirect.Path) || f.rewrite != nil && prefix(f.rewrite.Path)
}

// announced is the request a CORS preflight announces: the method of its
// Access-Control-Request-Method, and the header names its
// Access-Control-Request-Headers lists. A browser sends none of those
// headers on the preflight, so a header match is met by a listed name: the
// value the request will carry cannot be known. A CORS-safelisted header
// the request may carry unlisted meets its match too
// (valueMatch.unannounced).
type announced struct {
	method  string
	headers []string // the field's values, comma-separated lists
}

// lists reports whether a lists the header key.
func (a *announced) lists(key string) bool {
	for _, v := range a.headers {
		for name := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(name), key) {
				return true
			}
		}
	}
	return false
}

// preflightEntry is the entry a CORS preflight belongs to: the one that
// would take the request it announces, when that entry's rule has a CORS
// filter, which answers it. Matched as the OPTIONS it is, the preflight
// would miss that rule's method and header matches and fall to another
// rule — one matching OPTIONS, forwarding it — or 404 (Envoy Gateway, too,
// lets such a rule answer it). It is -1 when req is no preflight, or that rule has
// no CORS filter: the preflight then meets the rules as what it is.
func (s *Set) preflightEntry(req *Request, path string) int {
	if !s.cors {
		return -1
	}
	a := announced{method: preflightMethod(req)}
	if a.method == "" {
		return -1
	}
	a.headers = req.Header.Values("Access-Control-Request-Headers")
	i := s.find(req, path, &a)
	if i >= 0 && s.rules[s.entries[i].rule].filters.cors == nil {
		return -1
	}
	return i
}

// find is the first entry, by precedence, that matches req, or the
// request a preflight announces when a is not nil; -1 when none does.
func (s *Set) find(req *Request, path string, a *announced) int {
	if s.index == nil {
		for i := range s.entries {
			if s.entries[i].matches(req, path, a) {
				return i
			}
		}
		return -1
	}
	return s.index.find(s.entries, req, path, a)
}

func (e *entry) matches(req *Request, path string, a *announced) bool {
	switch e.kind {
	case pathExact:
		if path != e.path {
			return false
		}
	case pathPrefix:
		// "*" names the server, not a path: only the "/" prefix, which the
		// Gateway API says matches every HTTP request, matches it.
		if !hasPathPrefix(path, e.path) && (path != asterisk || e.path != "") {
			return false
		}
	case pathRegex:
		if path == asterisk || !e.re.MatchString(path) {
			return false
		}
	}
	method := req.Method
	if a != nil {
		method = a.method
	}
	if e.method != "" && method != e.method {
		return false
	}
	for i := range e.headers {
		h := &e.headers[i]
		if !h.matchHeader(req) && (a == nil || !h.unannounced && !a.lists(h.key)) {
			return false
		}
	}
	for i := range e.queries {
		if !e.queries[i].matchQuery(req.RawQuery) {
			return false
		}
	}
	return true
}

// asterisk is the request target of "OPTIONS *" (RFC 9112 §3.2.4): the
// server as a whole, which no path names.
const asterisk = "*"

// hasPathPrefix reports whether prefix (without a trailing "/") matches
// path element by element: "/abc" matches "/abc", "/abc/" and "/abc/d",
// not "/abcd".
func hasPathPrefix(path, prefix string) bool {
	return strings.HasPrefix(path, prefix) && (len(path) == len(prefix) || path[len(prefix)] == '/')
}

func (v *valueMatch) matchHeader(req *Request) bool {
	var value string
	switch vs := req.Header[v.key]; {
	case v.host:
		value = req.Host
	case v.upgrade && req.Upgrade != "":
		value = req.Upgrade
	case len(vs) == 0:
		return false
	case len(vs) == 1:
		value = vs[0]
	default:
		// RFC 9110 §5.3: a repeated field is the values joined by commas.
		value = strings.Join(vs, ",")
	}
	return v.compare(value)
}

// matchQuery compares the first value of the parameter named v.key.
func (v *valueMatch) matchQuery(rawQuery string) bool {
	for rawQuery != "" {
		var pair string
		pair, rawQuery, _ = strings.Cut(rawQuery, "&")
		name, value, _ := strings.Cut(pair, "=")
		if strings.ContainsAny(name, "%+") {
			n, err := url.QueryUnescape(name)
			if err != nil {
				continue
			}
			name = n
		}
		if name != v.key {
			continue
		}
		if strings.ContainsAny(value, "%+") {
			u, err := url.QueryUnescape(value)
			if err != nil {
				return false
			}
			value = u
		}
		return v.compare(value)
	}
	return false
}

func (v *valueMatch) compare(value string) bool {
	if v.re != nil {
		return v.re.MatchString(value)
	}
	if v.binary {
		form, ok := snapshot.BinaryValue(value)
		return ok && form == v.exact
	}
	return value == v.exact
}

// pathIndex finds the entries a path can match without scanning them
// all: Exact entries by value, PathPrefix entries by prefix (one lookup per
// "/" in the path), regular expressions always. Each list is in
// precedence order.
type pathIndex struct {
	exact, prefix map[string][]int32
	regex         []int32
}

func newPathIndex(entries []entry) *pathIndex {
	x := &pathIndex{exact: map[string][]int32{}, prefix: map[string][]int32{}}
	for i, e := range entries {
		switch e.kind {
		case pathExact:
			x.exact[e.path] = append(x.exact[e.path], int32(i))
		case pathPrefix:
			x.prefix[e.path] = append(x.prefix[e.path], int32(i))
		case pathRegex:
			x.regex = append(x.regex, int32(i))
		}
	}
	return x
}

func (x *pathIndex) find(entries []entry, req *Request, path string, a *announced) int {
	best := int32(-1)
	first := func(list []int32) {
		for _, i := range list {
			if best >= 0 && i >= best {
				return
			}
			if entries[i].matches(req, path, a) {
				best = i
				return
			}
		}
	}
	first(x.exact[path])
	first(x.prefix[""])
	for i := 1; i < len(path); i++ {
		if path[i] == '/' {
			first(x.prefix[path[:i]])
		}
	}
	first(x.prefix[path])
	first(x.regex)
	return int(best)
}

// normalizePath applies RFC 3986 §6.2.2 to an absolute, percent-encoded
// path: percent-encoded unreserved characters are decoded, other
// percent-encodings get upper-case hex digits, and "." and ".." segments
// are removed (§5.2.4). A '%' that starts no encoding (net/http refuses
// such paths) becomes "%25", so that normalizing twice changes nothing
// ("%%370" would otherwise give "%70", then "p"). It returns p itself,
// without allocating, when p is already normal.
func normalizePath(p string) string {
	if !strings.Contains(p, "%") && !hasDotSegment(p) {
		return p
	}
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]) {
			d := unhex(p[i+1])<<4 | unhex(p[i+2])
			if unreserved(d) {
				b.WriteByte(d)
			} else {
				b.WriteByte('%')
				b.WriteByte(upper(p[i+1]))
				b.WriteByte(upper(p[i+2]))
			}
			i += 2
			continue
		}
		if c == '%' {
			b.WriteString("%25")
			continue
		}
		b.WriteByte(c)
	}
	return removeDotSegments(b.String())
}

// hasDotSegment reports whether p has a "." or ".." segment.
func hasDotSegment(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] != '.' || i > 0 && p[i-1] != '/' {
			continue
		}
		j := i + 1
		if j < len(p) && p[j] == '.' {
			j++
		}
		if j == len(p) || p[j] == '/' {
			return true
		}
	}
	return false
}

// removeDotSegments is RFC 3986 §5.2.4 for a path without "%2E" left.
func removeDotSegments(p string) string {
	if !hasDotSegment(p) {
		return p
	}
	var out []string
	segs := strings.Split(p, "/")
	for i, seg := range segs {
		last := i == len(segs)-1
		switch seg {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 1 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, seg)
		}
	}
	r := strings.Join(out, "/")
	if !strings.HasPrefix(r, "/") {
		r = "/" + r
	}
	return r
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

func upper(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}

// unreserved: RFC 3986 §2.3.
func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}
