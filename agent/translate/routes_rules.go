package translate

import (
	"cmp"
	"encoding/base64"
	"fmt"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"time"
	"unicode"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/pkg/utils"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// routeMatch is a converted match with what orders it among the matches of
// every route attached to the same Service port.
type routeMatch struct {
	m   snapshot.RouteMatch // m.Rule indexes routeEval.rules
	key matchKey
}

// matchKey holds a match's precedence. HTTPRoute (spec order): an Exact
// path; then PathPrefix and RegularExpression paths by length, longest
// first — the Gateway API leaves regular expressions' place to
// implementations, and ranking them by length beside prefixes (as Contour
// does) keeps a catch-all "/" prefix from hiding them — with PathPrefix
// first on equal length; then a method match; then more header matches;
// then more query param matches. GRPCRoute: more characters of service,
// then of method, then more header matches; exact and regex stay false.
// A regular expression's length leaves its anchors out (regexChars).
type matchKey struct {
	exact    bool
	pathLen  int // HTTP: path length (prefix without its trailing "/"); gRPC: service characters
	regex    bool
	method   int // HTTP: 1 with a method match; gRPC: method characters
	headers  int
	queries  int
	position int // the match's index in its rule
}

func compareMatchKeys(a, b matchKey) int {
	return cmp.Or(compareBool(b.exact, a.exact), cmp.Compare(b.pathLen, a.pathLen), compareBool(a.regex, b.regex),
		cmp.Compare(b.method, a.method), cmp.Compare(b.headers, a.headers), cmp.Compare(b.queries, a.queries))
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// ruleBuild is one rule being converted.
type ruleBuild struct {
	matches []routeMatch
	// drop, when set, says why the rule's matches are invalid: the rule
	// cannot be matched, so it is left out.
	drop string
	// bad lists why the rule cannot be honoured although its matches are
	// valid: it stays, answering 500.
	bad          []string
	incompatible bool
	// xbackends are the XBackends the rule leads to.
	xbackends []*xbackendEval
}

func (b *ruleBuild) badf(format string, args ...any) {
	b.bad = append(b.bad, fmt.Sprintf(format, args...))
}

// addMatches converts a rule's matches with conv; none means the CRD's
// default, a zero match (for HTTPRoute a PathPrefix "/" match, for
// GRPCRoute every request). The first unusable match drops the rule.
func addMatches[M any](b *ruleBuild, ms []M, conv func(M) (routeMatch, string)) {
	if len(ms) > 64 {
		b.drop = fmt.Sprintf("%d matches, more than 64", len(ms))
		return
	}
	if len(ms) == 0 {
		ms = make([]M, 1)
	}
	for j, m := range ms {
		rm, problem := conv(m)
		if problem != "" {
			b.drop = fmt.Sprintf("matches[%d]: %s", j, problem)
			return
		}
		rm.key.position = j
		b.matches = append(b.matches, rm)
	}
}

func httpMatch(m gwv1.HTTPRouteMatch) (routeMatch, string) {
	var rm routeMatch
	path := snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/"}
	if m.Path != nil {
		if m.Path.Type != nil {
			path.Type = snapshot.PathMatchType(*m.Path.Type)
		}
		if m.Path.Value != nil {
			path.Value = *m.Path.Value
		}
	}
	switch path.Type {
	case snapshot.PathExact, snapshot.PathPrefix:
		if problem := pathValueProblem(path.Value); problem != "" {
			return rm, "path: " + problem
		}
		rm.key.exact = path.Type == snapshot.PathExact
		if !rm.key.exact {
			rm.key.pathLen = len(strings.TrimRight(path.Value, "/"))
		}
	case snapshot.PathRegularExpression:
		if problem := regexProblem(path.Value, 1024); problem != "" {
			return rm, "path: " + problem
		}
		rm.key.regex = true
		rm.key.pathLen = regexChars(path.Value)
	default:
		return rm, fmt.Sprintf("path.type %q is not Exact, PathPrefix or RegularExpression", path.Type)
	}
	rm.m.Path = path
	headers := make([]stringMatchIn, len(m.Headers))
	for i, h := range m.Headers {
		// The experimental CRD's pattern, for Exact and RegularExpression
		// values alike (a GRPCRoute's header matches have none).
		if !validHeaderValue(h.Value) {
			return rm, fmt.Sprintf("headers[%d].value %q %s", i, h.Value, headerValueRule)
		}
		headers[i] = stringMatchIn{typ: (*string)(h.Type), name: string(h.Name), value: h.Value}
	}
	var problem string
	if rm.m.Headers, problem = stringMatches("headers", headers, true, 4096); problem != "" {
		return rm, problem
	}
	queries := make([]stringMatchIn, len(m.QueryParams))
	for i, q := range m.QueryParams {
		queries[i] = stringMatchIn{typ: (*string)(q.Type), name: string(q.Name), value: q.Value}
	}
	if rm.m.QueryParams, problem = stringMatches("queryParams", queries, false, 1024); problem != "" {
		return rm, problem
	}
	if m.Method != nil {
		if !slices.Contains(httpMethods, *m.Method) {
			return rm, fmt.Sprintf("method %q is not one of %v", *m.Method, httpMethods)
		}
		rm.m.Method = string(*m.Method)
		rm.key.method = 1
	}
	rm.key.headers, rm.key.queries = len(rm.m.Headers), len(rm.m.QueryParams)
	return rm, ""
}

var httpMethods = []gwv1.HTTPMethod{gwv1.HTTPMethodGet, gwv1.HTTPMethodHead, gwv1.HTTPMethodPost, gwv1.HTTPMethodPut,
	gwv1.HTTPMethodDelete, gwv1.HTTPMethodConnect, gwv1.HTTPMethodOptions, gwv1.HTTPMethodTrace, gwv1.HTTPMethodPatch}

// grpcMatch converts a GRPCRoute match into a path match: a gRPC
// request's path is "/<service>/<method>".
func grpcMatch(m gwv1.GRPCRouteMatch) (routeMatch, string) {
	var rm routeMatch
	rm.m.Path = snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/"}
	if mm := m.Method; mm != nil {
		typ, service, method := gwv1.GRPCMethodMatchExact, deref(mm.Service), deref(mm.Method)
		if mm.Type != nil {
			typ = *mm.Type
		}
		if service == "" && method == "" {
			return rm, "method: at least one of service and method must be set"
		}
		switch typ {
		case gwv1.GRPCMethodMatchExact:
			// The CRD's patterns: a value that is set, even empty, must be
			// a gRPC service (dotted) or method name.
			for _, v := range []struct {
				field string
				value *string
				re    *regexp.Regexp
			}{{"service", mm.Service, grpcServiceName}, {"method", mm.Method, grpcMethodName}} {
				if v.value != nil && (len(*v.value) > 1024 || !v.re.MatchString(*v.value)) {
					return rm, fmt.Sprintf("method.%s: exact value %q must match %s", v.field, *v.value, v.re)
				}
			}
			// The CRD lets a service be written fully qualified, as protobuf
			// does (".pkg.Svc"); gRPC paths never carry that dot, so it
			// names the same service as "pkg.Svc".
			service = strings.TrimPrefix(service, ".")
			rm.key.pathLen, rm.key.method = len(service), len(method)
			switch {
			case method == "":
				// Every gRPC path of the service: "/service" element by element.
				rm.m.Path = snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/" + service}
			case service == "":
				rm.m.Path = snapshot.PathMatch{Type: snapshot.PathRegularExpression, Value: "/[^/]+/" + regexp.QuoteMeta(method)}
			default:
				rm.m.Path = snapshot.PathMatch{Type: snapshot.PathExact, Value: "/" + service + "/" + method}
			}
		case gwv1.GRPCMethodMatchRegularExpression:
			// Each expression is checked alone first, so that one cannot
			// close the other's group when they are joined.
			parts := [2]string{"[^/]+", "[^/]+"}
			for i, v := range []string{service, method} {
				if v == "" {
					continue
				}
				if problem := regexProblem(v, 1024); problem != "" {
					return rm, "method: " + problem
				}
				expr, problem := segmentRegex(v)
				if problem != "" {
					return rm, fmt.Sprintf("method.%s: %s", []string{"service", "method"}[i], problem)
				}
				parts[i] = "(?:" + expr + ")"
			}
			rm.m.Path = snapshot.PathMatch{Type: snapshot.PathRegularExpression, Value: "/" + parts[0] + "/" + parts[1]}
			rm.key.pathLen, rm.key.method = regexChars(service), regexChars(method)
		default:
			return rm, fmt.Sprintf("method.type %q is not Exact or RegularExpression", typ)
		}
	}
	headers := make([]stringMatchIn, len(m.Headers))
	for i, h := range m.Headers {
		headers[i] = stringMatchIn{typ: (*string)(h.Type), name: string(h.Name), value: h.Value}
	}
	var problem string
	if rm.m.Headers, problem = stringMatches("headers", headers, true, 4096); problem != "" {
		return rm, problem
	}
	for _, h := range rm.m.Headers {
		// The proxy compares a binary header's bytes, which gRPC sends in
		// base64: a value that is not can match no gRPC client.
		if _, ok := snapshot.BinaryValue(h.Value); !ok && h.Type == snapshot.MatchExact && snapshot.IsBinaryHeader(h.Name) {
			return rm, fmt.Sprintf("headers: %s value %q is not base64, as gRPC sends a binary header's", h.Name, h.Value)
		}
	}
	rm.key.headers = len(rm.m.Headers)
	return rm, ""
}

// segmentRegex rewrites expr, an RE2 expression that matches a whole
// gRPC service or method, for its place inside the path expression
// "/service/method", where it must match that segment and nothing more:
//   - "^" and "$" (\A, \z; with (?m), line anchors) where they start or
//     end the expression hold there by definition, and are removed: at
//     the value's edges they are what users write, and left in, the path
//     expression could never meet them. An anchor elsewhere ("a*^b")
//     could hold at the value's start or end only through empty matches
//     around it, which no path expression can say: it is refused.
//   - It matches only the values it matched that hold no "/"
//     (withinSegment), so a service expression cannot reach into the
//     method, nor either span more segments than gRPC paths have
//     (unconfined, service "foo.*" with method "Bar" matched
//     "/foo.Svc/Extra/Bar"). One that matched only values with a "/"
//     ("foo/Bar", "[/]") can match no service or method: it is refused,
//     as the CRD refuses "/" in Exact values. The rule is on what the
//     expression matches, not how "/" is spelt: Go's parser folds "a|/"
//     and "ab|a/" into classes ("[/a]", "a[/b]"), so no rule on the
//     parsed syntax could tell a "/" written alone from one a class
//     spans ("[.-0]", "\W").
//   - One that matches nothing at all, "/" or not (matchesNothing:
//     "[^\s\S]", "\P{Any}/Get"), is refused for that, first: blamed on
//     its "/", it would send the app team after the wrong fault.
//
// Word boundaries need nothing: "/" and the path's end are no word
// characters, as the value's edges are not. expr comes back as written
// when neither rewrite changes it.
func segmentRegex(expr string) (string, string) {
	re, err := syntax.Parse(expr, syntax.Perl) // as regexp.Compile parses
	if err != nil {
		return expr, "" // regexProblem has refused it
	}
	anchored := anyNode(re, isAnchor)
	if anchored {
		re = trimAnchors(re, true)
		re = trimAnchors(re, false)
		if anyNode(re, isAnchor) {
			return "", fmt.Sprintf("regular expression %q has an anchor (^, $, \\A, \\z) inside: anchors may only start or end it", expr)
		}
	}
	if matchesNothing(re) {
		return "", fmt.Sprintf(`regular expression %q matches nothing at all: it requires a character of an empty class (such as [^\s\S] or \P{Any})`, expr)
	}
	re, confined := withinSegment(re)
	if re.Op == syntax.OpNoMatch {
		return "", fmt.Sprintf("regular expression %q matches only values with a \"/\", which no gRPC service or method holds", expr)
	}
	if !confined && !anchored {
		return expr, ""
	}
	return re.String(), ""
}

// trimAnchors removes the anchors that start (leading) or end re: those at
// its edge, in either branch of an alternation and through groups.
func trimAnchors(re *syntax.Regexp, leading bool) *syntax.Regexp {
	switch re.Op {
	case syntax.OpBeginText, syntax.OpBeginLine:
		if leading {
			return &syntax.Regexp{Op: syntax.OpEmptyMatch}
		}
	case syntax.OpEndText, syntax.OpEndLine:
		if !leading {
			return &syntax.Regexp{Op: syntax.OpEmptyMatch}
		}
	case syntax.OpAlternate:
		for i, sub := range re.Sub {
			re.Sub[i] = trimAnchors(sub, leading)
		}
	case syntax.OpCapture:
		re.Sub[0] = trimAnchors(re.Sub[0], leading)
	case syntax.OpConcat:
		i := 0
		if !leading {
			i = len(re.Sub) - 1
		}
		if re.Sub[i] = trimAnchors(re.Sub[i], leading); re.Sub[i].Op == syntax.OpEmptyMatch && len(re.Sub) > 1 {
			re.Sub = slices.Delete(re.Sub, i, i+1) // no "(?:)" in what the snapshot shows
		}
	}
	return re
}

// withinSegment returns an expression that matches what re matches less
// the values holding a "/" (OpNoMatch if none is left), built from re in
// place: "." (with (?s), any character) and character classes lose "/",
// a literal holding one matches nothing, and so does a concatenation,
// "+" or group of such a part, while an alternation loses the branch and
// "*" or "?" of it match only "" (which a concatenation drops). It
// reports whether re changed.
func withinSegment(re *syntax.Regexp) (*syntax.Regexp, bool) {
	switch re.Op {
	case syntax.OpLiteral:
		if slices.Contains(re.Rune, '/') {
			return noMatch(), true
		}
		return re, false
	case syntax.OpAnyChar:
		return classWithoutSlash([]rune{0, unicode.MaxRune}), true
	case syntax.OpAnyCharNotNL:
		return classWithoutSlash([]rune{0, '\n' - 1, '\n' + 1, unicode.MaxRune}), true
	case syntax.OpCharClass:
		if !classHas(re.Rune, '/') {
			return re, false
		}
		return classWithoutSlash(re.Rune), true
	}
	changed := false
	for i, sub := range re.Sub {
		var c bool
		re.Sub[i], c = withinSegment(sub)
		changed = changed || c
	}
	if !changed {
		return re, false
	}
	switch re.Op {
	case syntax.OpAlternate:
		re.Sub = slices.DeleteFunc(re.Sub, matchesNothing)
		switch len(re.Sub) {
		case 0:
			return noMatch(), true
		case 1:
			return re.Sub[0], true
		}
	case syntax.OpConcat:
		if slices.ContainsFunc(re.Sub, matchesNothing) {
			return noMatch(), true
		}
		// No "(?:)" left where a "/?" was, in what the snapshot shows.
		re.Sub = slices.DeleteFunc(re.Sub, func(sub *syntax.Regexp) bool { return sub.Op == syntax.OpEmptyMatch })
		switch len(re.Sub) {
		case 0:
			return &syntax.Regexp{Op: syntax.OpEmptyMatch}, true
		case 1:
			return re.Sub[0], true
		}
	case syntax.OpCapture, syntax.OpPlus:
		if matchesNothing(re.Sub[0]) {
			return noMatch(), true
		}
	case syntax.OpStar, syntax.OpQuest, syntax.OpRepeat:
		if matchesNothing(re.Sub[0]) {
			if re.Min > 0 { // "{n,}" or "{n,m}", n > 0: one at least
				return noMatch(), true
			}
			return &syntax.Regexp{Op: syntax.OpEmptyMatch}, true // zero of them
		}
	}
	return re, true
}

// classWithoutSlash is the character class of ranges (pairs, lo and hi)
// less "/"; a class left empty matches nothing.
func classWithoutSlash(ranges []rune) *syntax.Regexp {
	out := make([]rune, 0, len(ranges)+2)
	for i := 0; i < len(ranges); i += 2 {
		lo, hi := ranges[i], ranges[i+1]
		if lo < '/' {
			out = append(out, lo, min(hi, '/'-1))
		}
		if hi > '/' {
			out = append(out, max(lo, '/'+1), hi)
		}
	}
	if len(out) == 0 {
		return noMatch()
	}
	return &syntax.Regexp{Op: syntax.OpCharClass, Rune: out}
}

func noMatch() *syntax.Regexp { return &syntax.Regexp{Op: syntax.OpNoMatch} }

// matchesNothing reports whether re can match no value at all, by its
// shape: Go's parser keeps an empty class ("[^\s\S]", "\P{Any}") as a
// class of no character, which a match needs when it is part of a
// concatenation, every branch of an alternation, or in a group, a "+" or
// a repeat of at least one. (An expression that matches nothing for other
// reasons, as "a\bb" does, passes: RE2 tells no more without running it.)
func matchesNothing(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpNoMatch:
		return true
	case syntax.OpCharClass:
		return len(re.Rune) == 0
	case syntax.OpConcat:
		return slices.ContainsFunc(re.Sub, matchesNothing)
	case syntax.OpAlternate:
		for _, sub := range re.Sub {
			if !matchesNothing(sub) {
				return false
			}
		}
		return true
	case syntax.OpCapture, syntax.OpPlus:
		return matchesNothing(re.Sub[0])
	case syntax.OpRepeat:
		return re.Min > 0 && matchesNothing(re.Sub[0])
	}
	return false
}

// classHas reports whether the class ranges (pairs, lo and hi) hold r.
func classHas(ranges []rune, r rune) bool {
	for i := 0; i < len(ranges); i += 2 {
		if ranges[i] <= r && r <= ranges[i+1] {
			return true
		}
	}
	return false
}

// anyNode reports whether f holds for re or a node below it.
func anyNode(re *syntax.Regexp, f func(*syntax.Regexp) bool) bool {
	return f(re) || slices.ContainsFunc(re.Sub, func(sub *syntax.Regexp) bool { return anyNode(sub, f) })
}

func isAnchor(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpBeginText, syntax.OpEndText, syntax.OpBeginLine, syntax.OpEndLine:
		return true
	}
	return false
}

// regexChars is the length of expr, an RE2 expression, less its anchors
// (^, $, \A, \z): its characters, as a precedence counts them. The proxy
// matches every expression against the whole path or value, and translate
// removes a GRPCRoute expression's edge anchors anyway (segmentRegex), so
// "^foo$" and "foo" mean the same and must rank alike. A "^" that negates
// a class ("[^/]", "[[:^alpha:]]", "\p{^Greek}"), a "$" in one and
// escaped ones ("\^", "\Q$\E") are characters.
func regexChars(expr string) int {
	n, inClass := len(expr), false
	for i := 0; i < len(expr); i++ {
		rest := expr[i+1:]
		switch c := expr[i]; {
		case c == '\\' && rest != "":
			if rest[0] == 'A' || rest[0] == 'z' {
				n -= 2
			}
			i += escapeLen(rest)
		case inClass && c == '[' && strings.HasPrefix(rest, ":"):
			if end := strings.Index(rest, ":]"); end > 0 {
				i += end + 2 // a POSIX class, "[:^alpha:]"
			}
		case inClass:
			inClass = c != ']'
		case c == '[':
			// A "^" first negates; a "]" first (after it) is a character.
			inClass = true
			i += len(rest) - len(strings.TrimPrefix(strings.TrimPrefix(rest, "^"), "]"))
		case c == '^' || c == '$':
			n--
		}
	}
	return n
}

// escapeLen is how many bytes of rest, what follows a "\", its escape
// takes: "\Q...\E" up to its "\E" (or the end), "\p{...}" up to its "}",
// any other one character.
func escapeLen(rest string) int {
	switch {
	case rest[0] == 'Q':
		if end := strings.Index(rest, `\E`); end >= 0 {
			return end + 2
		}
		return len(rest)
	case (rest[0] == 'p' || rest[0] == 'P') && strings.HasPrefix(rest[1:], "{"):
		if end := strings.IndexByte(rest, '}'); end >= 0 {
			return end + 1
		}
	}
	return 1
}

// grpcServiceName and grpcMethodName are the GRPCMethodMatch CRD's
// patterns for Exact values.
var (
	grpcServiceName = regexp.MustCompile(`^(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$`)
	grpcMethodName  = regexp.MustCompile(`^[A-Za-z_][A-Za-z_0-9]*$`)
)

// stringMatchIn is a header or query param match of either route kind.
type stringMatchIn struct {
	typ         *string
	name, value string
}

// stringMatches converts header (fold: names are case-insensitive) or
// query param matches. Of entries with equivalent names only the first
// counts, as the API says.
func stringMatches(field string, in []stringMatchIn, fold bool, maxLen int) ([]snapshot.StringMatch, string) {
	if len(in) > 16 {
		return nil, fmt.Sprintf("%d %s, more than 16", len(in), field)
	}
	var out []snapshot.StringMatch
	for i, s := range in {
		if !validHeaderName(s.name) {
			return nil, fmt.Sprintf("%s[%d].name %q is not a valid name", field, i, s.name)
		}
		if slices.ContainsFunc(out, func(o snapshot.StringMatch) bool {
			return o.Name == s.name || fold && strings.EqualFold(o.Name, s.name)
		}) {
			continue
		}
		sm := snapshot.StringMatch{Name: s.name, Type: snapshot.MatchExact, Value: s.value}
		if s.typ != nil {
			sm.Type = snapshot.MatchType(*s.typ)
		}
		switch sm.Type {
		case snapshot.MatchExact:
			if s.value == "" || len(s.value) > maxLen || hasControl(s.value) {
				return nil, fmt.Sprintf("%s[%d].value must be 1-%d characters without control characters", field, i, maxLen)
			}
		case snapshot.MatchRegularExpression:
			if problem := regexProblem(s.value, maxLen); problem != "" {
				return nil, fmt.Sprintf("%s[%d]: %s", field, i, problem)
			}
		default:
			return nil, fmt.Sprintf("%s[%d].type %q is not Exact or RegularExpression", field, i, sm.Type)
		}
		out = append(out, sm)
	}
	return out, ""
}

// regexProblem checks a regular expression the way the data plane uses it:
// RE2 (Go's regexp), matching a whole value.
func regexProblem(expr string, maxLen int) string {
	if expr == "" || len(expr) > maxLen {
		return fmt.Sprintf("regular expression must be 1-%d characters", maxLen)
	}
	if _, err := regexp.Compile("^(?:" + expr + ")$"); err != nil {
		return fmt.Sprintf("regular expression %q is not valid RE2: %v", expr, err)
	}
	return ""
}

// pathValueProblem applies the CRD's rules for Exact and PathPrefix values.
func pathValueProblem(v string) string {
	switch {
	case !strings.HasPrefix(v, "/"):
		return fmt.Sprintf("value %q must be an absolute path starting with \"/\"", v)
	case len(v) > 1024:
		return "value must be at most 1024 characters"
	case strings.Contains(v, "//"), strings.Contains(v, "/./"), strings.Contains(v, "/../"),
		strings.HasSuffix(v, "/.."), strings.HasSuffix(v, "/."):
		return fmt.Sprintf("value %q must not contain \"//\", \"/./\" or \"/../\", nor end with \"/.\" or \"/..\"", v)
	case strings.Contains(strings.ToLower(v), "%2f"), strings.Contains(v, "#"):
		return fmt.Sprintf("value %q must not contain \"%%2f\" or \"#\"", v)
	case !pathChars.MatchString(v):
		return fmt.Sprintf("value %q has characters outside RFC 3986 path characters", v)
	}
	return ""
}

var pathChars = regexp.MustCompile(`^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$`)

// validHeaderName: an RFC 7230 token of 1-256 characters (the API's
// HeaderName pattern).
func validHeaderName(s string) bool {
	return len(s) > 0 && len(s) <= 256 && headerNameChars.MatchString(s)
}

var headerNameChars = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+\\-.^_`|~]+$")

// validHeaderValue applies the experimental CRD's HTTPHeader and
// HTTPHeaderMatch value rules.
func validHeaderValue(s string) bool {
	return len(s) <= 4096 && headerValueChars.MatchString(s)
}

var headerValueChars = regexp.MustCompile(`^[!-~]+([\t ]?[!-~]+)*$`)

const headerValueRule = "must be 1-4096 printable US-ASCII characters, single spaces or tabs between them"

func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f })
}

// filterIn is an HTTPRoute or GRPCRoute filter, whichever kind.
type filterIn struct {
	typ                     string
	reqHeaders, respHeaders *gwv1.HTTPHeaderFilter
	redirect                *gwv1.HTTPRequestRedirectFilter
	rewrite                 *gwv1.HTTPURLRewriteFilter
	mirror                  *gwv1.HTTPRequestMirrorFilter
	cors                    *gwv1.HTTPCORSFilter
	extAuth                 *gwv1.HTTPExternalAuthFilter
	// set counts the filter's configuration fields that are set; the API
	// allows exactly the one its type names.
	set int
}

func httpFilters(fs []gwv1.HTTPRouteFilter) []filterIn {
	out := make([]filterIn, len(fs))
	for i, f := range fs {
		out[i] = filterIn{typ: string(f.Type), reqHeaders: f.RequestHeaderModifier, respHeaders: f.ResponseHeaderModifier,
			redirect: f.RequestRedirect, rewrite: f.URLRewrite, mirror: f.RequestMirror, cors: f.CORS, extAuth: f.ExternalAuth,
			set: count(f.RequestHeaderModifier != nil, f.ResponseHeaderModifier != nil, f.RequestRedirect != nil,
				f.URLRewrite != nil, f.RequestMirror != nil, f.CORS != nil, f.ExternalAuth != nil, f.ExtensionRef != nil)}
	}
	return out
}

func grpcFilters(fs []gwv1.GRPCRouteFilter) []filterIn {
	out := make([]filterIn, len(fs))
	for i, f := range fs {
		out[i] = filterIn{typ: string(f.Type), reqHeaders: f.RequestHeaderModifier, respHeaders: f.ResponseHeaderModifier,
			mirror: f.RequestMirror,
			set:    count(f.RequestHeaderModifier != nil, f.ResponseHeaderModifier != nil, f.RequestMirror != nil, f.ExtensionRef != nil)}
	}
	return out
}

// configured reports whether the field of type typ is set.
func (f *filterIn) configured(typ gwv1.HTTPRouteFilterType) bool {
	switch typ {
	case gwv1.HTTPRouteFilterRequestHeaderModifier:
		return f.reqHeaders != nil
	case gwv1.HTTPRouteFilterResponseHeaderModifier:
		return f.respHeaders != nil
	case gwv1.HTTPRouteFilterRequestRedirect:
		return f.redirect != nil
	case gwv1.HTTPRouteFilterURLRewrite:
		return f.rewrite != nil
	case gwv1.HTTPRouteFilterRequestMirror:
		return f.mirror != nil
	case gwv1.HTTPRouteFilterCORS:
		return f.cors != nil
	case gwv1.HTTPRouteFilterExternalAuth:
		return f.extAuth != nil
	}
	return false
}

func count(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// filters converts the filters of a rule or backendRef (where names it in
// messages). Problems make the rule answer 500: a filter is never skipped.
// Mirrors whose backendRef does not resolve are dropped and reported in
// ResolvedRefs, as the API asks.
func (rb *routeBuilder) filters(b *ruleBuild, where string, fs []filterIn) snapshot.Filters {
	var out snapshot.Filters
	if len(fs) > 16 {
		b.badf("%d %sfilters, more than 16", len(fs), where)
	}
	seen := map[string]bool{}
	for i, f := range fs {
		at := fmt.Sprintf("%sfilters[%d]", where, i)
		if f.typ != string(gwv1.HTTPRouteFilterRequestMirror) && f.typ != string(gwv1.HTTPRouteFilterExtensionRef) {
			if seen[f.typ] {
				b.badf("%s: filter type %s must not repeat", at, f.typ)
				continue
			}
			seen[f.typ] = true
		}
		typ := gwv1.HTTPRouteFilterType(f.typ)
		switch {
		case typ == gwv1.HTTPRouteFilterExtensionRef:
			b.badf("%s: filter type %s is not supported by sockmesh", at, typ)
		case !knownFilter(rb.kind, typ):
			b.badf("%s: filter type %q is not a %s filter", at, typ, rb.kind)
		case f.set != 1 || !f.configured(typ):
			b.badf("%s: type %s needs its own configuration field and no other", at, typ)
		case typ == gwv1.HTTPRouteFilterCORS && where != "":
			// The API makes it Extended there, but a backendRef's filters
			// run only for requests forwarded to it, and a preflight is
			// answered, never forwarded (GEP-1767); answered with the
			// weighted pick's filter, it could allow what the actual
			// request's pick refuses. Istio and Envoy Gateway refuse it too.
			b.badf("%s: filter type CORS is supported by sockmesh in the rule's filters, not a backendRef's: "+
				"the proxy answers a preflight itself, before any backendRef is picked, so a backendRef's CORS "+
				"could not answer it (move the filter to the rule)", at)
		case typ == gwv1.HTTPRouteFilterExternalAuth && where != "":
			// The API makes it Extended there; a request is authorized before
			// any backend is picked, so sockmesh keeps it to rules.
			b.badf("%s: filter type %s is supported by sockmesh on rules, not on a backendRef", at, typ)
		case typ == gwv1.HTTPRouteFilterExternalAuth:
			out.ExternalAuth = rb.externalAuth(b, at+".externalAuth", f.extAuth)
		case typ == gwv1.HTTPRouteFilterCORS:
			out.CORS = cors(b, at+".cors", f.cors)
		case typ == gwv1.HTTPRouteFilterRequestHeaderModifier:
			out.RequestHeaders = headerModifier(b, at+".requestHeaderModifier", f.reqHeaders, rb.kind, true)
		case typ == gwv1.HTTPRouteFilterResponseHeaderModifier:
			out.ResponseHeaders = headerModifier(b, at+".responseHeaderModifier", f.respHeaders, rb.kind, false)
		case typ == gwv1.HTTPRouteFilterRequestRedirect:
			out.Redirect = redirect(b, at+".requestRedirect", f.redirect)
		case typ == gwv1.HTTPRouteFilterURLRewrite:
			out.Rewrite = rewrite(b, at+".urlRewrite", f.rewrite)
		case typ == gwv1.HTTPRouteFilterRequestMirror:
			if m, ok := rb.mirror(b, at+".requestMirror", f.mirror); ok {
				out.Mirrors = append(out.Mirrors, m)
			}
		}
	}
	if out.Redirect != nil && out.Rewrite != nil {
		b.incompatible = true
		b.badf("%sfilters: RequestRedirect and URLRewrite cannot be combined", where)
	}
	return out
}

// knownFilter reports whether sockmesh applies filters of type typ on
// routes of kind.
func knownFilter(kind snapshot.RouteKind, typ gwv1.HTTPRouteFilterType) bool {
	switch typ {
	case gwv1.HTTPRouteFilterRequestHeaderModifier, gwv1.HTTPRouteFilterResponseHeaderModifier, gwv1.HTTPRouteFilterRequestMirror:
		return true
	case gwv1.HTTPRouteFilterRequestRedirect, gwv1.HTTPRouteFilterURLRewrite, gwv1.HTTPRouteFilterCORS, gwv1.HTTPRouteFilterExternalAuth:
		return kind == snapshot.KindHTTPRoute
	}
	return false
}

// headerModifier converts a header filter of a route of kind. Each name
// may appear in one action only (the API calls other filters invalid);
// names set or added must be header names, and values printable, so no
// filter can inject a header line; the framing and connection-specific
// fields are the proxy's alone (proxyOwnedHeaders). A request's Host is
// its authority (set or added, it replaces it), which no request is
// without (RFC 9112 §3.2, RFC 9113 §8.3.1): a request filter may not
// remove it, as Envoy refuses too. A GRPCRoute's headers are gRPC
// metadata, whose binary ("-bin") values must be base64.
func headerModifier(b *ruleBuild, at string, f *gwv1.HTTPHeaderFilter, kind snapshot.RouteKind, request bool) *snapshot.HeaderModifier {
	out := &snapshot.HeaderModifier{}
	names := map[string]bool{}
	// name reports whether n may be changed; remove says it is to be
	// removed, where the CRD takes any string: one that is no header name
	// names no header a request or response can carry, nothing to remove
	// (listed twice, it is refused as the CRD does).
	name := func(n string, remove bool) bool {
		key := strings.ToLower(n)
		switch {
		case names[key]:
			b.badf("%s: header %q appears in more than one action", at, n)
		case !validHeaderName(n):
			names[key] = true
			if !remove {
				b.badf("%s: header name %q is not valid", at, n)
			}
		case proxyOwnedHeaders[key] != "":
			names[key] = true
			b.badf("%s: header %q %s and may not be changed by a filter", at, n, proxyOwnedHeaders[key])
		default:
			names[key] = true
			return true
		}
		return false
	}
	headers := func(action string, hs []gwv1.HTTPHeader) []snapshot.Header {
		var out []snapshot.Header
		for _, h := range hs {
			if !name(string(h.Name), false) {
				continue
			}
			if !validHeaderValue(h.Value) {
				b.badf("%s.%s: value of %q %s", at, action, h.Name, headerValueRule)
				continue
			}
			if kind == snapshot.KindGRPCRoute && snapshot.IsBinaryHeader(string(h.Name)) && !grpcBinaryValue(h.Value) {
				b.badf("%s.%s: value of binary metadata %q is not base64 (comma-separated values, padded or not, no spaces): "+
					"gRPC receivers would fail every call INTERNAL", at, action, h.Name)
				continue
			}
			out = append(out, snapshot.Header{Name: string(h.Name), Value: h.Value})
		}
		return out
	}
	for i, n := range []int{len(f.Set), len(f.Add), len(f.Remove)} {
		if n > 16 {
			b.badf("%s.%s: %d headers, more than 16", at, []string{"set", "add", "remove"}[i], n)
		}
	}
	out.Set = headers("set", f.Set)
	out.Add = headers("add", f.Add)
	for _, n := range f.Remove {
		if request && strings.EqualFold(n, "host") {
			b.badf("%s.remove: header %q is the request's authority, which every request has: a filter may set it, not remove it", at, n)
			continue
		}
		if name(n, true) {
			out.Remove = append(out.Remove, n)
		}
	}
	return out
}

// proxyOwnedHeaders are the fields (lower case) the proxy writes for each
// hop itself, so no header filter may set, add or remove them, each with
// why. Content-Length, Transfer-Encoding and Trailer frame the message
// (RFC 9112 §6, RFC 9110 §6.6.2): the proxy writes them for the body it
// sends, and a filter's would have the peer read the body short, long or
// as the next message. Connection and the fields it names by habit are
// connection-specific (RFC 9110 §7.6.1: a proxy removes them before
// forwarding), and the proxy's hops differ in what they allow: HTTP/2
// forbids them all but "TE: trailers" (RFC 9113 §8.2.2), so net/http's
// Transport refused the request (502) where an HTTP/1.1 backend took it,
// and net/http's server took a Connection: close for the app's whole
// HTTP/2 connection. A rule means the same on every wire, or nothing.
var proxyOwnedHeaders = map[string]string{
	"content-length": framesMessage, "transfer-encoding": framesMessage, "trailer": framesMessage,
	"connection": connectionSpecific, "keep-alive": connectionSpecific, "proxy-connection": connectionSpecific,
	"te": connectionSpecific, "upgrade": connectionSpecific,
}

const (
	framesMessage      = "frames the message"
	connectionSpecific = "is connection-specific (RFC 9110 §7.6.1)"
)

// grpcBinaryValue reports whether gRPC receivers decode v, a binary
// header's value: comma-separated base64, each padded to a multiple of 4
// or not at all (PROTOCOL-HTTP2.md; grpc-go takes nothing else, spaces
// included). snapshot.BinaryValue is laxer, as befits reading a client's.
func grpcBinaryValue(v string) bool {
	for p := range strings.SplitSeq(v, ",") {
		enc := base64.RawStdEncoding
		if len(p)%4 == 0 {
			enc = base64.StdEncoding
		}
		if _, err := enc.DecodeString(p); err != nil {
			return false
		}
	}
	return true
}

// cors converts a CORS filter, with the CRD's rules: lists are sets of at
// most 64 entries (methods: 9) in which "*" stands alone (exposeHeaders
// excepted), origins match its pattern, methods are the API's, and maxAge
// is at least 1, 5 when unset.
func cors(b *ruleBuild, at string, f *gwv1.HTTPCORSFilter) *snapshot.CORS {
	out := &snapshot.CORS{AllowCredentials: f.AllowCredentials != nil && *f.AllowCredentials, MaxAge: cmp.Or(f.MaxAge, 5)}
	list := func(field string, vs []string, maxItems int, wildcardAlone bool, valid func(string) bool, rule string) []string {
		if len(vs) > maxItems {
			b.badf("%s.%s: %d entries, more than %d", at, field, len(vs), maxItems)
		}
		if wildcardAlone && len(vs) > 1 && slices.Contains(vs, "*") {
			b.badf("%s.%s: \"*\" must be the only entry", at, field)
		}
		for i, v := range vs {
			switch {
			case !valid(v):
				b.badf("%s.%s[%d] %q %s", at, field, i, v, rule)
			case slices.Contains(vs[:i], v):
				b.badf("%s.%s[%d] %q is listed more than once", at, field, i, v)
			}
		}
		return vs
	}
	out.AllowOrigins = list("allowOrigins", strs(f.AllowOrigins), 64, true, validCORSOrigin,
		"is not \"*\" or http(s)://host[:port] (host \"*\" or \"*.domain\" allowed)")
	out.AllowMethods = list("allowMethods", strs(f.AllowMethods), 9, true, func(m string) bool {
		return m == "*" || slices.Contains(httpMethods, gwv1.HTTPMethod(m))
	}, fmt.Sprintf("is not \"*\" or one of %v", httpMethods))
	out.AllowHeaders = list("allowHeaders", strs(f.AllowHeaders), 64, true, validHeaderName, "is not a header name")
	out.ExposeHeaders = list("exposeHeaders", strs(f.ExposeHeaders), 64, false, validHeaderName, "is not a header name")
	if out.MaxAge < 1 {
		b.badf("%s.maxAge %d is less than 1", at, out.MaxAge)
	}
	return out
}

// externalAuth converts an ExternalAuth filter (HTTP or GRPC), with the CRD's rules: the
// protocol names the one configuration set, http.path matches its pattern,
// header lists are sets of at most 64, forwardBody.maxSize is not
// negative. Its backendRef resolves as a mirror's; one that does not
// fails the rule (500): its requests must not go unauthorized.
func (rb *routeBuilder) externalAuth(b *ruleBuild, at string, f *gwv1.HTTPExternalAuthFilter) *snapshot.ExternalAuth {
	out := &snapshot.ExternalAuth{}
	switch p := f.ExternalAuthProtocol; {
	case p == gwv1.HTTPRouteExternalAuthGRPCProtocol && (f.GRPCAuthConfig == nil || f.HTTPAuthConfig != nil):
		b.badf("%s: protocol GRPC needs grpc and no http", at)
	case p == gwv1.HTTPRouteExternalAuthGRPCProtocol:
		out.GRPC = true
		out.AllowedHeaders = headerSet(b, at+".grpc.allowedHeaders", f.GRPCAuthConfig.AllowedRequestHeaders)
	case p != gwv1.HTTPRouteExternalAuthHTTPProtocol:
		b.badf("%s.protocol %q is not HTTP or GRPC", at, p)
	case f.HTTPAuthConfig == nil || f.GRPCAuthConfig != nil:
		b.badf("%s: protocol HTTP needs http and no grpc", at)
	default:
		h := f.HTTPAuthConfig
		if h.Path != "" && (len(h.Path) > 1024 || !authPath.MatchString(h.Path)) {
			b.badf("%s.http.path %q is not a path prefix the API allows", at, h.Path)
		}
		out.PathPrefix = h.Path
		out.AllowedHeaders = headerSet(b, at+".http.allowedHeaders", h.AllowedRequestHeaders)
		out.AllowedResponseHeaders = headerSet(b, at+".http.allowedResponseHeaders", h.AllowedResponseHeaders)
	}
	if fb := f.ForwardBody; fb != nil {
		if fb.MaxSize < 0 {
			b.badf("%s.forwardBody.maxSize %d is negative", at, fb.MaxSize)
		}
		out.MaxBody = max(fb.MaxSize, 0)
	}
	failed := len(b.bad)
	ref, ok := rb.filterBackend(b, "externalAuth", "the rule's requests are refused", f.BackendRef, out.GRPC)
	if !ok && len(b.bad) == failed {
		// ResolvedRefs says why it does not resolve; a reference the CRD
		// refuses has failed the rule already, saying why.
		b.badf("%s.backendRef does not resolve", at)
	}
	out.Backend = ref
	return out
}

// headerSet checks a list of header names that the CRD makes a set of at
// most 64.
func headerSet(b *ruleBuild, at string, vs []string) []string {
	if len(vs) > 64 {
		b.badf("%s: %d entries, more than 64", at, len(vs))
	}
	for i, v := range vs {
		switch {
		case !validHeaderName(v):
			b.badf("%s[%d] %q is not a header name", at, i, v)
		case slices.Contains(vs[:i], v):
			b.badf("%s[%d] %q is listed more than once", at, i, v)
		}
	}
	return vs
}

var authPath = regexp.MustCompile(`^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$`)

// validCORSOrigin applies the CORSOrigin CRD's pattern and length.
func validCORSOrigin(o string) bool { return len(o) <= 253 && corsOrigin.MatchString(o) }

var corsOrigin = regexp.MustCompile(`^(\*|https?://((\*\.)?([a-zA-Z0-9-]+\.)*[a-zA-Z0-9-]+|\*)(:[0-9]{1,5})?)$`)

// strs converts a list of a string type.
func strs[S ~string](vs []S) []string {
	if vs == nil {
		return nil
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

func redirect(b *ruleBuild, at string, f *gwv1.HTTPRequestRedirectFilter) *snapshot.Redirect {
	out := &snapshot.Redirect{StatusCode: 302}
	if f.Scheme != nil {
		if *f.Scheme != "http" && *f.Scheme != "https" {
			b.badf("%s.scheme %q is not http or https", at, *f.Scheme)
		}
		out.Scheme = *f.Scheme
	}
	if f.Hostname != nil {
		out.Hostname = string(*f.Hostname)
		if !validPreciseHostname(out.Hostname) {
			b.badf("%s.hostname %q is not a DNS name", at, out.Hostname)
		}
	}
	if f.Port != nil {
		if !validPort(*f.Port) {
			b.badf("%s.port %d is not a port number", at, *f.Port)
		}
		out.Port = uint16(*f.Port)
	}
	if f.StatusCode != nil {
		switch *f.StatusCode {
		case 301, 302, 303, 307, 308:
		default:
			b.badf("%s.statusCode %d is not 301, 302, 303, 307 or 308", at, *f.StatusCode)
		}
		out.StatusCode = *f.StatusCode
	}
	out.Path = pathModifier(b, at+".path", f.Path)
	return out
}

func rewrite(b *ruleBuild, at string, f *gwv1.HTTPURLRewriteFilter) *snapshot.Rewrite {
	out := &snapshot.Rewrite{}
	if f.Hostname != nil {
		out.Hostname = string(*f.Hostname)
		if !validPreciseHostname(out.Hostname) {
			b.badf("%s.hostname %q is not a DNS name", at, out.Hostname)
		}
	}
	out.Path = pathModifier(b, at+".path", f.Path)
	return out
}

func pathModifier(b *ruleBuild, at string, p *gwv1.HTTPPathModifier) *snapshot.PathModifier {
	if p == nil {
		return nil
	}
	out := &snapshot.PathModifier{Type: snapshot.PathModifierType(p.Type)}
	switch out.Type {
	case snapshot.ReplaceFullPath:
		if p.ReplaceFullPath == nil || p.ReplacePrefixMatch != nil {
			b.badf("%s: type ReplaceFullPath needs replaceFullPath and no replacePrefixMatch", at)
			return out
		}
		out.Value = *p.ReplaceFullPath
		if !strings.HasPrefix(out.Value, "/") {
			b.badf("%s.replaceFullPath %q must start with \"/\"", at, out.Value)
		}
	case snapshot.ReplacePrefixMatch:
		if p.ReplacePrefixMatch == nil || p.ReplaceFullPath != nil {
			b.badf("%s: type ReplacePrefixMatch needs replacePrefixMatch and no replaceFullPath", at)
			return out
		}
		out.Value = *p.ReplacePrefixMatch
		if out.Value != "" && !strings.HasPrefix(out.Value, "/") {
			b.badf("%s.replacePrefixMatch %q must be empty or start with \"/\"", at, out.Value)
		}
	default:
		b.badf("%s.type %q is not ReplaceFullPath or ReplacePrefixMatch", at, p.Type)
		return out
	}
	if len(out.Value) > 1024 || hasControl(out.Value) {
		b.badf("%s: value must be at most 1024 characters without control characters", at)
	}
	return out
}

var preciseHostname = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func validPreciseHostname(h string) bool { return len(h) <= 253 && preciseHostname.MatchString(h) }

// prefixReplaced reports whether fs replace a prefix match (redirect or
// rewrite), which the API allows only in a rule with exactly one match, a
// PathPrefix one: that match's value is the prefix replaced.
func prefixReplaced(fs *snapshot.Filters) bool {
	isPrefix := func(p *snapshot.PathModifier) bool { return p != nil && p.Type == snapshot.ReplacePrefixMatch }
	return fs.Redirect != nil && isPrefix(fs.Redirect.Path) || fs.Rewrite != nil && isPrefix(fs.Rewrite.Path)
}

// timeouts converts GEP-1742 timeouts ("0s" disables one).
func timeouts(b *ruleBuild, t *gwv1.HTTPRouteTimeouts) *snapshot.Timeouts {
	if t == nil {
		return nil
	}
	out := &snapshot.Timeouts{
		Request:        duration(b, "timeouts.request", t.Request),
		BackendRequest: duration(b, "timeouts.backendRequest", t.BackendRequest),
	}
	if r, br := out.Request, out.BackendRequest; r != nil && br != nil && *r != 0 && *br > *r {
		b.badf("timeouts.backendRequest %s is longer than timeouts.request %s", time.Duration(*br), time.Duration(*r))
	}
	return out
}

// retry converts a GEP-1731 retry stanza; attempts defaults to 1 as the
// CRD does.
func retry(b *ruleBuild, r *gwv1.HTTPRouteRetry) *snapshot.Retry {
	if r == nil {
		return nil
	}
	out := &snapshot.Retry{Attempts: 1, Backoff: duration(b, "retry.backoff", r.Backoff)}
	if r.Attempts != nil {
		out.Attempts = *r.Attempts
		if out.Attempts < 0 {
			b.badf("retry.attempts %d is negative", out.Attempts)
		}
	}
	for _, c := range r.Codes {
		switch {
		case c < 400 || c > 599:
			b.badf("retry.codes: %d is not an HTTP status 400-599", c)
		case slices.Contains(out.Codes, int(c)):
			// The CRD refuses it (a set), so a manifest from the file
			// source must not route with it.
			b.badf("retry.codes: %d is listed more than once", c)
		default:
			out.Codes = append(out.Codes, int(c))
		}
	}
	slices.Sort(out.Codes)
	return out
}

// duration parses a GEP-2257 duration.
func duration(b *ruleBuild, field string, d *gwv1.Duration) *snapshot.Duration {
	if d == nil {
		return nil
	}
	v, err := utils.ParseDuration(string(*d))
	if err != nil {
		b.badf("%s %q is not a Gateway API duration (GEP-2257, e.g. 1h30m or 500ms)", field, *d)
		return nil
	}
	sd := snapshot.Duration(*v)
	return &sd
}
