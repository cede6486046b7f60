package snapshot

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"
)

// RouteTable is the GAMMA routing of one captured Service port: the
// HTTPRoutes or GRPCRoutes whose parentRef is that Service (group "", kind
// Service), on every port or on this one (parentRef port or sectionName).
//
// Which set applies depends on the client's namespace (GEP-1294): a
// consumer set (routes in the client's own namespace naming a Service in
// another namespace) replaces the producer set (routes in the Service's
// namespace) for clients in that namespace. With neither, the connection
// goes to Frontend.Backend as if no route existed.
type RouteTable struct {
	// Producer holds the routes in the Service's own namespace; nil when
	// none attaches to this port.
	Producer *RouteSet `json:"producer,omitempty"`
	// Consumers are the consumer sets, sorted by Namespace, each namespace
	// once.
	Consumers []ConsumerRoutes `json:"consumers,omitempty"`
}

// ConsumerRoutes is the route set for clients in one namespace.
type ConsumerRoutes struct {
	// Namespace is the clients' (and the routes') namespace.
	Namespace string   `json:"namespace"`
	Routes    RouteSet `json:"routes"`
}

// RouteKind is the kind of route a RouteSet holds.
type RouteKind string

const (
	KindHTTPRoute RouteKind = "HTTPRoute"
	// KindGRPCRoute: when HTTPRoutes and GRPCRoutes attach to the same port
	// and role, the GRPCRoutes govern (GEP-1294 route type specificity).
	KindGRPCRoute RouteKind = "GRPCRoute"
)

// RouteSet is the merged rules of every route of one kind and role attached
// to a Service port.
type RouteSet struct {
	Kind RouteKind `json:"kind"`
	// Matches are in precedence order across all routes of the set (the
	// Gateway API's order, as translate documents it): the first that
	// matches a request selects its rule. A request matching none gets 404.
	// GRPCRoute matches are expressed as paths ("/service/method").
	Matches []RouteMatch `json:"matches,omitempty"`
	// Rules are what Matches select, by index. A rule without a valid
	// match is not listed.
	Rules []RouteRule `json:"rules,omitempty"`
}

// RouteMatch is one match of a rule: every condition must hold.
type RouteMatch struct {
	// Rule indexes RouteSet.Rules.
	Rule int       `json:"rule"`
	Path PathMatch `json:"path"`
	// Method, when set, is the request method that must match (upper case).
	Method string `json:"method,omitempty"`
	// Headers must all match; names are case-insensitive and unique.
	Headers []StringMatch `json:"headers,omitempty"`
	// QueryParams must all match (the first value of a repeated
	// parameter); names are exact and unique.
	QueryParams []StringMatch `json:"queryParams,omitempty"`
}

// PathMatchType says how a PathMatch compares the request path.
type PathMatchType string

const (
	// PathExact: the path equals Value, case-sensitive.
	PathExact PathMatchType = "Exact"
	// PathPrefix: the path starts with Value element by element ("/abc"
	// matches "/abc", "/abc/" and "/abc/d", not "/abcd"); a trailing "/" in
	// Value is ignored.
	PathPrefix PathMatchType = "PathPrefix"
	// PathRegularExpression: Value, an RE2 expression, matches the whole
	// path.
	PathRegularExpression PathMatchType = "RegularExpression"
)

// PathMatch compares the request's decoded path.
type PathMatch struct {
	Type  PathMatchType `json:"type"`
	Value string        `json:"value"`
}

// MatchType says how a StringMatch compares a value.
type MatchType string

const (
	MatchExact MatchType = "Exact"
	// MatchRegularExpression: Value, an RE2 expression, matches the whole
	// value.
	MatchRegularExpression MatchType = "RegularExpression"
)

// StringMatch compares a named header or query parameter. A header
// repeated in a request is compared as its values joined with ","
// (RFC 9110 §5.3); "Host" names the request's authority. Under a
// GRPCRoute, an Exact match of a binary header (a name ending in "-bin")
// compares bytes: the BinaryValue forms of Value and the request's.
type StringMatch struct {
	Name  string    `json:"name"`
	Type  MatchType `json:"type"`
	Value string    `json:"value"`
}

// BinaryValue is v, the value of a gRPC binary header, in the one form
// that compares its bytes: each comma-separated value base64 without
// padding. gRPC sends binary values in base64 (RFC 4648 §4), which
// receivers must take padded and unpadded alike (gRPC's PROTOCOL-HTTP2):
// grpc-go sends them unpadded, other clients pad. ok is false when a value
// is not base64.
func BinaryValue(v string) (form string, ok bool) {
	parts := strings.Split(v, ",")
	for i, p := range parts {
		parts[i] = strings.TrimRight(strings.TrimSpace(p), "=")
		// Strict: no other text than the unpadded form has its bytes.
		if _, err := base64.RawStdEncoding.Strict().DecodeString(parts[i]); err != nil {
			return "", false
		}
	}
	return strings.Join(parts, ","), true
}

// IsBinaryHeader reports whether name, in any case, names a gRPC binary
// header.
func IsBinaryHeader(name string) bool {
	return len(name) >= len("-bin") && strings.EqualFold(name[len(name)-len("-bin"):], "-bin")
}

// RouteRule is what a matching request gets.
type RouteRule struct {
	// Route is the HTTPRoute or GRPCRoute (Kind set) the rule comes from;
	// Index is its position in the route's rules and Name its optional
	// name (sectionName).
	Route ObjectRef `json:"route"`
	Index int       `json:"index"`
	Name  string    `json:"name,omitempty"`
	// Invalid is set when the rule's matches are valid but something else
	// in it cannot be honoured (an unsupported filter, a bad timeout...):
	// requests it matches get 500 (gRPC: UNAVAILABLE), because a filter is
	// never skipped. Nothing else in the rule is set then.
	Invalid *Invalid `json:"invalid,omitempty"`
	// Filters apply to every request the rule matches. A rule with
	// Filters.Redirect answers with the redirect and has no Backends.
	Filters `json:",inline"`
	// Backends share the rule's requests by weight. A rule without
	// backends (and without a redirect), or whose weights are all 0,
	// answers 500 (gRPC: UNAVAILABLE).
	Backends []WeightedBackend `json:"backends,omitempty"`
	// Timeouts, Retry: HTTPRoute rules only; nil when unset.
	Timeouts *Timeouts `json:"timeouts,omitempty"`
	Retry    *Retry    `json:"retry,omitempty"`
	// SessionPersistence is the rule's own (deprecated route-inline form,
	// GEP-1619); nil leaves the chosen backend's.
	SessionPersistence *SessionPersistence `json:"sessionPersistence,omitempty"`
}

// Filters are the request and response changes of a rule or backendRef,
// applied rule first, then backendRef.
type Filters struct {
	RequestHeaders  *HeaderModifier `json:"requestHeaders,omitempty"`
	ResponseHeaders *HeaderModifier `json:"responseHeaders,omitempty"`
	// Redirect answers the request; never set together with Rewrite.
	Redirect *Redirect `json:"redirect,omitempty"`
	Rewrite  *Rewrite  `json:"rewrite,omitempty"`
	// Mirrors receive copies of the request; their responses are dropped.
	Mirrors []Mirror `json:"mirrors,omitempty"`
	// CORS answers the rule's preflight requests and marks its responses
	// for browsers; HTTPRoute rules only, never a backendRef's.
	CORS *CORS `json:"cors,omitempty"`
	// ExternalAuth asks an authorization server about each of the rule's
	// requests before it goes on; HTTPRoute rules only.
	ExternalAuth *ExternalAuth `json:"externalAuth,omitempty"`
}

// ExternalAuth is an HTTPRoute rule's ExternalAuth filter (GEP-1494): the
// authorization server at Backend lets a request go on, by a 200 (HTTP)
// or an OK to Envoy's ext_authz Check (GRPC). userspace-proxy/httpproxy
// says what it is sent.
type ExternalAuth struct {
	Backend BackendRef `json:"backend"`
	// GRPC: the server speaks ext_authz v3; else plain HTTP.
	GRPC bool `json:"grpc,omitempty"`
	// PathPrefix goes before the request's path in the authorization
	// request (HTTP).
	PathPrefix string `json:"pathPrefix,omitempty"`
	// AllowedHeaders are the request headers sent: HTTP, beyond Host,
	// Method, Path, Content-Length and Authorization; GRPC, all when none
	// are listed.
	AllowedHeaders []string `json:"allowedHeaders,omitempty"`
	// AllowedResponseHeaders are the headers of the server's 200 copied
	// into the request; none listed: all but Host and the answer's own
	// Content-Length, Content-Type and Date (HTTP).
	AllowedResponseHeaders []string `json:"allowedResponseHeaders,omitempty"`
	// MaxBody is the largest request body sent to the server (a larger
	// one is refused, 413); 0 sends none.
	MaxBody int32 `json:"maxBody,omitempty"`
}

// CORS is an HTTPRoute rule's CORS filter (GEP-1767). Lists are as the
// route wrote them; userspace-proxy/routes says how each is answered.
type CORS struct {
	// AllowOrigins are "*" alone, or origins "<scheme>://<host>[:<port>]"
	// whose host may start with "*" (any labels to its left) or be "*".
	AllowOrigins     []string `json:"allowOrigins,omitempty"`
	AllowCredentials bool     `json:"allowCredentials,omitempty"`
	// AllowMethods are methods, or "*" alone.
	AllowMethods []string `json:"allowMethods,omitempty"`
	// AllowHeaders are header names, or "*" alone.
	AllowHeaders []string `json:"allowHeaders,omitempty"`
	// ExposeHeaders are header names; "*" among them exposes all.
	ExposeHeaders []string `json:"exposeHeaders,omitempty"`
	// MaxAge is how long a browser may keep a preflight's answer, in
	// seconds; at least 1.
	MaxAge int32 `json:"maxAge"`
}

// HeaderModifier sets, adds and removes headers; each name (case-
// insensitive) appears in one action only.
type HeaderModifier struct {
	// Set replaces every value of the header.
	Set []Header `json:"set,omitempty"`
	// Add appends a value, keeping the existing ones.
	Add []Header `json:"add,omitempty"`
	// Remove deletes the headers by name.
	Remove []string `json:"remove,omitempty"`
}

// Header is one header name and value.
type Header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// PathModifierType says how a redirect or rewrite changes the path.
type PathModifierType string

const (
	// ReplaceFullPath replaces the whole path with Value.
	ReplaceFullPath PathModifierType = "ReplaceFullPath"
	// ReplacePrefixMatch replaces the part of the path that the rule's
	// (single, PathPrefix) match matched with Value.
	ReplacePrefixMatch PathModifierType = "ReplacePrefixMatch"
)

// PathModifier changes a request path.
type PathModifier struct {
	Type  PathModifierType `json:"type"`
	Value string           `json:"value"`
}

// Redirect answers a request with a redirection. Empty fields keep the
// request's own value; see userspace-proxy/routes for the Location rules.
type Redirect struct {
	// Scheme is "http" or "https".
	Scheme   string        `json:"scheme,omitempty"`
	Hostname string        `json:"hostname,omitempty"`
	Path     *PathModifier `json:"path,omitempty"`
	// Port 0 derives the port from Scheme, or else uses the Service port.
	Port uint16 `json:"port,omitempty"`
	// StatusCode is 301, 302, 303, 307 or 308.
	StatusCode int `json:"statusCode"`
}

// Rewrite changes a request before it is forwarded.
type Rewrite struct {
	// Hostname replaces the Host header (the authority).
	Hostname string        `json:"hostname,omitempty"`
	Path     *PathModifier `json:"path,omitempty"`
}

// Mirror sends a copy of Numerator/Denominator of the requests to Backend.
type Mirror struct {
	Backend BackendRef `json:"backend"`
	// Denominator is > 0 and Numerator <= Denominator.
	Numerator   uint32 `json:"numerator"`
	Denominator uint32 `json:"denominator"`
}

// WeightedBackend is one backendRef of a rule.
type WeightedBackend struct {
	// Weight is relative to the rule's other backends; 0 gets no request.
	Weight uint32 `json:"weight"`
	// Backend is zero when Invalid is set.
	Backend BackendRef `json:"backend,omitzero"`
	// Invalid is set when the backendRef cannot be used (not found, not
	// permitted, an unsupported kind or filter): requests picked for it get
	// 500 (gRPC: UNAVAILABLE).
	Invalid *Invalid `json:"invalid,omitempty"`
	// Filters apply only to requests sent to this backend.
	Filters `json:",inline"`
}

// Timeouts bound an HTTPRoute rule's requests (GEP-1742). A nil field is
// unset (the proxy's default applies); 0 disables the timeout.
type Timeouts struct {
	// Request bounds the whole exchange, retries included, until the
	// response is complete.
	Request *Duration `json:"request,omitempty"`
	// BackendRequest bounds each attempt toward a backend.
	BackendRequest *Duration `json:"backendRequest,omitempty"`
}

// Retry is an HTTPRoute rule's retry policy (GEP-1731): a request is
// retried when no connection could be made, when the backend refused the
// request before processing it, or when it answered with one of Codes.
type Retry struct {
	// Attempts is the number of retries after the first try; 0 disables
	// retries.
	Attempts int `json:"attempts"`
	// Codes are HTTP statuses (400-599) that are retried.
	Codes []int `json:"codes,omitempty"`
	// Backoff is the base interval between attempts; nil leaves the
	// proxy's default.
	Backoff *Duration `json:"backoff,omitempty"`
}

// Duration is a time.Duration that marshals as Go duration text ("1.5s").
type Duration time.Duration

// MarshalText writes d as time.Duration.String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads what MarshalText writes.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("parse duration %q: %w", b, err)
	}
	*d = Duration(v)
	return nil
}

// Sets calls fn for every route set of the table.
func (t *RouteTable) Sets(fn func(*RouteSet)) {
	if t.Producer != nil {
		fn(t.Producer)
	}
	for i := range t.Consumers {
		fn(&t.Consumers[i].Routes)
	}
}

// checkRoutes reports a route set that refers to a rule or backend that is
// not there.
func (s *Snapshot) checkRoutes(f *Frontend) error {
	var err error
	f.Routes.Sets(func(rs *RouteSet) {
		for _, m := range rs.Matches {
			if m.Rule < 0 || m.Rule >= len(rs.Rules) {
				err = fmt.Errorf("frontend %s port %d: match names rule %d of %d", f.Service, f.Port, m.Rule, len(rs.Rules))
			}
		}
		for _, r := range rs.Rules {
			refs := mirrorRefs(nil, r.Mirrors)
			if a := r.ExternalAuth; a != nil {
				refs = append(refs, a.Backend)
			}
			for _, wb := range r.Backends {
				if wb.Invalid == nil {
					refs = append(refs, wb.Backend)
				}
				refs = mirrorRefs(refs, wb.Mirrors)
			}
			for _, ref := range refs {
				if _, ok := s.byBackend[ref]; !ok {
					err = fmt.Errorf("frontend %s port %d: route %s: backend %s missing", f.Service, f.Port, r.Route, ref)
				}
			}
		}
	})
	return err
}

func mirrorRefs(refs []BackendRef, ms []Mirror) []BackendRef {
	for _, m := range ms {
		refs = append(refs, m.Backend)
	}
	return refs
}
