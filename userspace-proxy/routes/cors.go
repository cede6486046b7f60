package routes

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// corsPolicy is a compiled CORS filter (GEP-1767): origins parsed, and the
// answer's header values built once, shared by every request (never
// modified).
type corsPolicy struct {
	anyOrigin   bool
	origins     []originPattern
	credentials bool
	// anyMethod, anyHeader: "*", answered with what the preflight asks
	// for, which the API requires with credentials and allows without.
	anyMethod, anyHeader bool
	// methods, headers, expose: the header values; nil sends none. "*"
	// exposes every header only without credentials: with them a browser
	// reads it as a header named "*", so the API forbids it.
	methods, headers, expose []string
	maxAge                   []string
}

// originPattern is an allowOrigins entry. host "" matches every host; one
// starting with "." (from "*.") matches hosts of one label or more before
// it.
type originPattern struct {
	scheme, host string
	port         int
}

// The headers a CORS filter answers with; on a rule that has one, they are
// the filter's alone, the backend's dropped.
const (
	headerAllowOrigin      = "Access-Control-Allow-Origin"
	headerAllowCredentials = "Access-Control-Allow-Credentials"
	headerAllowMethods     = "Access-Control-Allow-Methods"
	headerAllowHeaders     = "Access-Control-Allow-Headers"
	headerExposeHeaders    = "Access-Control-Expose-Headers"
	headerMaxAge           = "Access-Control-Max-Age"
)

var corsHeaders = [...]string{headerAllowOrigin, headerAllowCredentials, headerAllowMethods, headerAllowHeaders, headerExposeHeaders, headerMaxAge}

func compileCORS(c *snapshot.CORS) *corsPolicy {
	if c == nil {
		return nil
	}
	out := &corsPolicy{credentials: c.AllowCredentials, maxAge: shared(strconv.Itoa(int(c.MaxAge)))}
	for _, o := range c.AllowOrigins {
		if o == "*" {
			out.anyOrigin = true
			continue
		}
		// An entry that does not parse (translate refuses it) matches
		// nothing: a skew fails closed.
		if scheme, host, port, ok := parseOrigin(o); ok {
			host = strings.TrimPrefix(host, "*")
			out.origins = append(out.origins, originPattern{scheme: scheme, host: host, port: port})
		}
	}
	list := func(vs []string, wildcard *bool) []string {
		if len(vs) == 1 && vs[0] == "*" && wildcard != nil {
			*wildcard = true
			return nil
		}
		if len(vs) == 0 {
			return nil
		}
		return shared(strings.Join(vs, ", "))
	}
	out.methods = list(c.AllowMethods, &out.anyMethod)
	out.headers = list(c.AllowHeaders, &out.anyHeader)
	expose := c.ExposeHeaders
	if c.AllowCredentials {
		expose = nil
		for _, h := range c.ExposeHeaders {
			if h != "*" {
				expose = append(expose, h)
			}
		}
	}
	out.expose = list(expose, nil)
	return out
}

// shared is a header value that an append copies.
func shared(v string) []string { return []string{v}[:1:1] }

// parseOrigin splits an origin, "<scheme>://<host>[:<port>]", with the
// scheme's port when it has none; scheme and host in lower case. Only http
// and https origins parse: those are the only ones allowOrigins can list.
func parseOrigin(o string) (scheme, host string, port int, ok bool) {
	scheme, rest, ok := strings.Cut(o, "://")
	if !ok || rest == "" || strings.ContainsAny(rest, "/?#@[]") {
		return "", "", 0, false
	}
	scheme = strings.ToLower(scheme)
	port = int(wellKnownPort(scheme))
	if port == 0 {
		return "", "", 0, false
	}
	host = rest
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		p, err := strconv.ParseUint(rest[i+1:], 10, 16)
		if err != nil || p == 0 {
			return "", "", 0, false
		}
		host, port = rest[:i], int(p)
	}
	return scheme, strings.ToLower(host), port, host != ""
}

// allows reports whether origin, a request's Origin, is allowed.
func (c *corsPolicy) allows(origin string) bool {
	if origin == "" {
		return false
	}
	if c.anyOrigin {
		return true
	}
	scheme, host, port, ok := parseOrigin(origin)
	if !ok {
		return false
	}
	for _, p := range c.origins {
		if p.scheme == scheme && p.port == port && p.matchesHost(host) {
			return true
		}
	}
	return false
}

func (p *originPattern) matchesHost(host string) bool {
	if strings.HasPrefix(p.host, ".") {
		return len(host) > len(p.host) && strings.HasSuffix(host, p.host)
	}
	return p.host == "" || p.host == host
}

// apply writes the CORS headers of d's answer, a preflight's or any other
// of the rule's, into h. Every answer of the rule varies with Origin, one
// that allows none included: a cache must not hand it to another origin.
func (c *corsPolicy) apply(h http.Header, d *Decision) {
	for _, k := range corsHeaders {
		delete(h, k)
	}
	addVary(h, "Origin")
	// A credentialed request gets no CORS header unless credentials are
	// allowed (GEP-1767): the browser refuses the answer either way.
	if !c.allows(d.origin) || d.credentialed && !c.credentials {
		return
	}
	// The origin is echoed, never "*", whether or not credentials are
	// allowed: one answer shape for both.
	h[headerAllowOrigin] = []string{d.origin}
	if c.credentials {
		h[headerAllowCredentials] = trueValue
	}
	if c.expose != nil {
		h[headerExposeHeaders] = c.expose
	}
	if d.Action != Preflight {
		return
	}
	switch {
	case c.anyMethod:
		h[headerAllowMethods] = []string{d.requestMethod}
	case c.methods != nil:
		h[headerAllowMethods] = c.methods
	}
	switch {
	case c.anyHeader && d.requestHeaders != "":
		h[headerAllowHeaders] = []string{d.requestHeaders}
	case c.headers != nil:
		h[headerAllowHeaders] = c.headers
	}
	h[headerMaxAge] = c.maxAge
}

var trueValue = shared("true")

// carriesCredentials reports whether a request carries credentials (GEP-1767:
// "cookies, TLS client certificates, or authentication headers containing
// a username and password"; Fetch: cookies and HTTP authentication
// entries), which a browser sends cross-origin only in credentials mode
// "include": a Cookie, which no script may set, or an Authorization in a
// scheme the browser itself answers challenges with. A token a script
// sets (Authorization: Bearer) is a request header like any other, sent
// in the default mode, whose answer the browser reads with
// Access-Control-Allow-Origin alone: counted, every such call of a
// single-page app whose rule leaves allowCredentials unset lost its CORS
// headers, and the browser refused the answer.
func carriesCredentials(h http.Header) bool {
	if h.Get("Cookie") != "" {
		return true
	}
	for _, v := range h.Values("Authorization") {
		scheme, _, _ := strings.Cut(strings.TrimSpace(v), " ")
		for _, s := range browserAuthSchemes {
			if strings.EqualFold(scheme, s) {
				return true
			}
		}
	}
	return false
}

// browserAuthSchemes are the HTTP authentication schemes browsers keep
// entries for and answer on their own (Basic and Digest carry a user name,
// Negotiate and NTLM the user's login).
var browserAuthSchemes = [...]string{"Basic", "Digest", "Negotiate", "NTLM"}

// addVary lists name in h's Vary unless it is there, or "*" is.
func addVary(h http.Header, name string) {
	old := h["Vary"]
	for _, v := range old {
		for t := range strings.SplitSeq(v, ",") {
			if t = strings.TrimSpace(t); t == "*" || strings.EqualFold(t, name) {
				return
			}
		}
	}
	h["Vary"] = append(old[:len(old):len(old)], name)
}

// corsSafelistedSize is what a request carrying the header key (canonical)
// with a value the match m accepts, its preflight not listing key in
// Access-Control-Request-Headers, adds at least to the size of its
// CORS-safelisted values; -1 when no such request exists. A browser lists
// only the CORS-unsafe request-header names (Fetch standard), leaving out a
// CORS-safelisted request-header — Accept, Accept-Language,
// Content-Language, Content-Type and Range with a value the standard deems
// safe — as long as those values total at most maxSafelistedSize bytes. A
// regular expression may accept a short safe value (0); an exact value
// must be made of safe ones (safelistedSize).
func corsSafelistedSize(key string, m *snapshot.StringMatch) int {
	switch key {
	case "Accept", "Accept-Language", "Content-Language", "Content-Type", "Range":
	default:
		return -1
	}
	if m.Type == snapshot.MatchRegularExpression {
		return 0
	}
	return safelistedSize(key, m.Value)
}

// maxSafelistedSize is the most bytes a request's CORS-safelisted values
// may total before a browser lists their names after all (Fetch standard,
// "CORS-unsafe request-header names": the values' lengths, not the names').
const maxSafelistedSize = 1024

// safelistedSize is the fewest value bytes a browser counts for a request
// carrying key: value when every header-list entry that makes it up is
// CORS-safelisted; -1 when no split of value gives only safelisted entries.
// A script may append the header several times; the browser sends the
// entries joined with ", " and counts each entry's length, so a value split
// at more ", " counts 2 bytes fewer per split, and its entries are each
// checked, at most 128 bytes apiece. An entry never starts or ends with
// whitespace (Fetch normalizes header values).
func safelistedSize(key, value string) int {
	starts := []int{0} // where an entry may start: 0 and after each ", "
	for i := 0; ; {
		j := strings.Index(value[i:], ", ")
		if j < 0 {
			break
		}
		i += j + 2
		starts = append(starts, i)
	}
	// least[a]: the fewest bytes of entries covering value[:starts[a]].
	least := make([]int, len(starts)+1)
	for a := 1; a < len(least); a++ {
		least[a] = -1
	}
	for a, start := range starts {
		if least[a] < 0 {
			continue
		}
		for b := a + 1; b <= len(starts); b++ {
			end := len(value)
			if b < len(starts) {
				end = starts[b] - 2
			}
			entry := value[start:end]
			if len(entry) > 128 {
				break
			}
			if strings.Trim(entry, " \t") != entry || !safelistedValue(key, entry) {
				continue
			}
			if n := least[a] + len(entry); least[b] < 0 || n < least[b] {
				least[b] = n
			}
		}
	}
	return least[len(starts)]
}

// safelistedValue reports whether value makes the header key (one of the
// CORS-safelisted names) a CORS-safelisted request-header (Fetch standard).
func safelistedValue(key, value string) bool {
	if len(value) > 128 {
		return false
	}
	switch key {
	case "Accept-Language", "Content-Language":
		return strings.Trim(value, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz *,-.;=") == ""
	case "Range":
		// One byte range with a start: "bytes=<start>-[<end>]", the start
		// not past the end (Fetch: "parse a single range header value").
		spec, bytes := strings.CutPrefix(value, "bytes=")
		start, end, dash := strings.Cut(spec, "-")
		return bytes && dash && digits(start) && (end == "" || digits(end) && !decimalLess(end, start))
	}
	// Accept and Content-Type: no CORS-unsafe request-header byte.
	for i := range len(value) {
		if c := value[i]; c < 0x20 && c != '\t' || c == 0x7f || strings.IndexByte(`"():<>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	if key == "Content-Type" {
		essence, _, _ := strings.Cut(value, ";")
		switch strings.ToLower(strings.TrimSpace(essence)) {
		case "application/x-www-form-urlencoded", "multipart/form-data", "text/plain":
		default:
			return false
		}
	}
	return true
}

// decimalLess reports whether the decimal number a is less than b, both
// ASCII digits of any length.
func decimalLess(a, b string) bool {
	a, b = strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// digits reports whether s is one or more ASCII digits.
func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}
