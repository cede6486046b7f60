package routes

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// headerMods is a compiled HeaderModifier: canonical keys, and value
// slices built once and shared by every request (never modified).
type headerMods struct {
	set, add []headerValue
	remove   []string
	// host: set or add holds "Host", which sets a request's authority.
	host bool
}

type headerValue struct {
	key    string
	values []string // one element, capacity one: an append copies
}

func compileHeaderMods(m *snapshot.HeaderModifier) *headerMods {
	if m == nil {
		return nil
	}
	out := &headerMods{}
	conv := func(hs []snapshot.Header) []headerValue {
		var vs []headerValue
		for _, h := range hs {
			vs = append(vs, headerValue{key: http.CanonicalHeaderKey(h.Name), values: []string{h.Value}[:1:1]})
		}
		return vs
	}
	out.set, out.add = conv(m.Set), conv(m.Add)
	isHost := func(v headerValue) bool { return v.key == "Host" }
	out.host = slices.ContainsFunc(out.set, isHost) || slices.ContainsFunc(out.add, isHost)
	for _, r := range m.Remove {
		out.remove = append(out.remove, http.CanonicalHeaderKey(r))
	}
	return out
}

// apply changes h. With host non-nil (a request), "Host" in set or add
// sets the authority, which net/http keeps outside the header map, and a
// removal of Host is ignored (a request always has an authority). A
// removed field stays in h with a nil value: the proxy's writers send
// none, and net/http's add none of their own in its place, as they do for
// a missing one (a request's User-Agent, an answer's Date and Content-Type).
func (m *headerMods) apply(h http.Header, host *string) {
	if m == nil {
		return
	}
	for _, v := range m.set {
		if host != nil && v.key == "Host" {
			*host = v.values[0]
			continue
		}
		h[v.key] = v.values
	}
	for _, v := range m.add {
		if host != nil && v.key == "Host" {
			*host = v.values[0]
			continue
		}
		if old, ok := h[v.key]; ok {
			h[v.key] = append(old[:len(old):len(old)], v.values[0])
		} else {
			h[v.key] = v.values
		}
	}
	for _, k := range m.remove {
		if host == nil || k != "Host" {
			h[k] = nil
		}
	}
}

// rewrite fills d's path and authority rewrite: the backendRef's URLRewrite
// overrides the rule's, field by field. e is the match that selected the
// rule; its prefix is what ReplacePrefixMatch replaces.
func rewrite(d *Decision, path string, e *entry, rule, be *snapshot.Rewrite) {
	for _, rw := range [2]*snapshot.Rewrite{rule, be} {
		if rw == nil {
			continue
		}
		if rw.Hostname != "" {
			d.Host, d.RewriteHost = rw.Hostname, true
		}
		// "*" has no path to rewrite: OPTIONS * goes on as it came.
		if rw.Path != nil && path != asterisk {
			d.Path, d.RewritePath = modifyPath(path, e, rw.Path), true
		}
	}
}

// modifyPath applies a path modifier to the normalized request path.
func modifyPath(path string, e *entry, m *snapshot.PathModifier) string {
	if m.Type == snapshot.ReplaceFullPath {
		return m.Value
	}
	return replacePrefix(path, e.path, m.Value)
}

// escapedModifier returns m with its value percent-encoded as a URL path.
// The API's value is any string (the CRD has no pattern), and a space, "?",
// "#" or non-ASCII byte written as it is would break the Location or the
// request target, or end the path there; percent-encodings already in the
// value are kept, as in path match values.
func escapedModifier(m *snapshot.PathModifier) *snapshot.PathModifier {
	if m == nil {
		return nil
	}
	var b strings.Builder
	for i := 0; i < len(m.Value); i++ {
		c := m.Value[i]
		if pathByte(c) || c == '%' && i+2 < len(m.Value) && isHex(m.Value[i+1]) && isHex(m.Value[i+2]) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return &snapshot.PathModifier{Type: m.Type, Value: b.String()}
}

// pathByte reports whether c may stand in a URL path as it is: a pchar
// of RFC 3986 §3.3 other than a percent-encoding, or "/".
func pathByte(c byte) bool {
	return unreserved(c) || c == '/' || c == ':' || c == '@' || strings.IndexByte("!$&'()*+,;=", c) >= 0
}

// replacePrefix replaces prefix (a PathPrefix match without its trailing
// "/", which matched path element by element) with replacement, as the
// table in the API's ReplacePrefixMatch documentation has it: a trailing
// "/" of the replacement is dropped, "/foo/" with prefix "/foo" keeps its
// trailing "/", and an empty result is "/".
func replacePrefix(path, prefix, replacement string) string {
	out := strings.TrimRight(replacement, "/") + path[len(prefix):]
	if out == "" {
		return "/"
	}
	return out
}

// redirect fills d with the redirect rd asks for (the API's
// HTTPRequestRedirectFilter): scheme, hostname and path default to the
// request's; the port to the scheme's well-known one when the filter sets
// a scheme, else to the Service port; ports 80 for http and 443 for https
// are left out of Location. The query is kept.
func (s *Set) redirect(d *Decision, req *Request, path string, e *entry, rd *snapshot.Redirect) {
	d.Action, d.Status = Redirect, rd.StatusCode
	if path == asterisk {
		// A Location cannot say "*": it names the server by its root.
		path = "/"
	}
	scheme := "http"
	if req.TLS {
		scheme = "https"
	}
	port := rd.Port
	if rd.Scheme != "" {
		scheme = rd.Scheme
		if port == 0 {
			port = wellKnownPort(scheme)
		}
	}
	if port == 0 {
		port = s.port
	}
	host := rd.Hostname
	if host == "" {
		host = hostOnly(req.Host)
	}
	if rd.Path != nil {
		path = modifyPath(path, e, rd.Path)
	}
	var b strings.Builder
	if host != "" {
		b.WriteString(scheme)
		b.WriteString("://")
		if strings.Contains(host, ":") {
			b.WriteString("[" + host + "]")
		} else {
			b.WriteString(host)
		}
		if port != wellKnownPort(scheme) {
			b.WriteString(":" + strconv.Itoa(int(port)))
		}
	}
	// Without a Host, Location is the path alone, which RFC 9110 §10.2.2
	// allows: the client resolves it against its request. The proxy's
	// front ends never leave one out (an HTTP/1.0 request without Host is
	// given the Service's name first: httpproxy's nameService), so that a
	// scheme or port the filter sets is kept.
	b.WriteString(path)
	if req.RawQuery != "" {
		b.WriteString("?" + req.RawQuery)
	}
	d.Location = b.String()
}

func wellKnownPort(scheme string) uint16 {
	switch scheme {
	case "http":
		return 80
	case "https":
		return 443
	}
	return 0
}

// hostOnly strips the port from an authority; IPv6 literals lose their
// brackets.
func hostOnly(authority string) string {
	if strings.HasPrefix(authority, "[") {
		if i := strings.IndexByte(authority, ']'); i > 0 {
			return authority[1:i]
		}
		return authority
	}
	if i := strings.LastIndexByte(authority, ':'); i >= 0 && strings.IndexByte(authority, ':') == i {
		return authority[:i]
	}
	return authority
}

// unescapePath decodes a percent-encoded path; one that does not decode is
// used as it is.
func unescapePath(p string) string {
	u, err := url.PathUnescape(p)
	if err != nil {
		return p
	}
	return u
}
