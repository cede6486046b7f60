package routes

import (
	"math/rand/v2"
	"net/http"
	"strings"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// Table is one Snapshot's compiled route tables. It is immutable and safe
// for concurrent use.
type Table struct {
	frontends map[*snapshot.Frontend]*frontendSets
}

type frontendSets struct {
	producer  *Set
	consumers map[string]*Set
}

// Compile compiles the route tables of s's frontends. It never fails: a
// set whose regular expression does not compile, or whose rules disagree
// with their matches (translate rules both out, so only a version skew
// could cause it), answers every request 500 rather than guess.
func Compile(s *snapshot.Snapshot) *Table {
	t := &Table{frontends: map[*snapshot.Frontend]*frontendSets{}}
	for i := range s.Frontends {
		f := &s.Frontends[i]
		if f.Routes == nil {
			continue
		}
		fs := &frontendSets{}
		if f.Routes.Producer != nil {
			fs.producer = compileSet(f.Port, f.Routes.Producer)
		}
		if len(f.Routes.Consumers) > 0 {
			fs.consumers = make(map[string]*Set, len(f.Routes.Consumers))
			for j := range f.Routes.Consumers {
				c := &f.Routes.Consumers[j]
				fs.consumers[c.Namespace] = compileSet(f.Port, &c.Routes)
			}
		}
		t.frontends[f] = fs
	}
	return t
}

// Lookup returns the route set for requests from a client in
// clientNamespace to f, which must come from the Snapshot the Table was
// compiled from (Snapshot.Frontend). A consumer set of the client's
// namespace replaces the producer set (GEP-1294); a client whose namespace
// is unknown ("", e.g. not an enrolled pod) gets the producer set. nil
// means no route applies: the request goes to f.Backend as without GAMMA.
func (t *Table) Lookup(f *snapshot.Frontend, clientNamespace string) *Set {
	if f == nil || f.Routes == nil || t == nil {
		return nil
	}
	fs := t.frontends[f]
	if fs == nil {
		return nil
	}
	if s := fs.consumers[clientNamespace]; s != nil {
		return s
	}
	return fs.producer
}

// Request is what Decide looks at in an HTTP request.
type Request struct {
	Method string
	// Path is the path as sent, percent-encoded (url.URL.EscapedPath).
	Path     string
	RawQuery string
	// Host is the authority (http.Request.Host), with its port if sent.
	Host   string
	Header http.Header
	// Upgrade is the protocol an RFC 8441 extended CONNECT asks for (its
	// :protocol): the request stands for an HTTP/1.1 GET with that
	// Upgrade field (MethodOf), which an Upgrade header match sees.
	Upgrade string
	// TLS reports that the client spoke https to the proxy. The L7 path
	// sees plaintext requests only, so it is false there.
	TLS bool
	// Keep, when set, accepts the backendRefs the request must stay on
	// whatever the weights (an MCP session lives in the server that
	// issued it): Decide forwards to the first of the matching rule's
	// backendRefs that Keep accepts, one of weight 0 included, and draws
	// by weight only when it accepts none. A rule whose weights are all 0
	// keeps nothing: it answers 500.
	Keep func(snapshot.BackendRef) bool
}

// FromHTTP returns r's Request. It shares r's header map.
func FromHTTP(r *http.Request) Request {
	req := Request{Method: r.Method, Path: r.URL.EscapedPath(), RawQuery: r.URL.RawQuery, Host: r.Host, Header: r.Header,
		TLS: r.TLS != nil, Upgrade: extendedProtocol(r)}
	if req.Upgrade != "" {
		req.Method = http.MethodGet // MethodOf
	}
	return req
}

// MethodOf is the method r stands for: its own, but GET for an RFC 8441
// extended CONNECT (net/http's HTTP/2 server shows its :protocol as a
// header field), the HTTP/2 form of an HTTP/1.1 Upgrade, which is a GET:
// a WebSocket is one request whichever HTTP its app speaks, and a rule's
// method match, like an ExternalAuth server, must see it so (Envoy turns
// the one into the other before it routes; Request.Upgrade).
func MethodOf(r *http.Request) string {
	if extendedProtocol(r) != "" {
		return http.MethodGet
	}
	return r.Method
}

// extendedProtocol is the :protocol of r when r is an RFC 8441 extended
// CONNECT, "" otherwise.
func extendedProtocol(r *http.Request) string {
	if r.ProtoMajor != 2 || r.Method != http.MethodConnect {
		return ""
	}
	return r.Header.Get(":protocol")
}

// Rand is where Decide draws weighted picks and mirror fractions from.
// *rand.Rand of math/rand/v2 satisfies it; GlobalRand is the process-wide
// source.
type Rand interface {
	// Uint64N returns a number in [0, n); n > 0.
	Uint64N(n uint64) uint64
}

// GlobalRand draws from math/rand/v2's top-level functions, which are safe
// for concurrent use.
type GlobalRand struct{}

// Uint64N implements Rand.
func (GlobalRand) Uint64N(n uint64) uint64 { return rand.Uint64N(n) }

// Action is what a Decision asks the proxy to do.
type Action uint8

const (
	// Forward the request to Decision.Backend.
	Forward Action = iota + 1
	// Redirect: answer Decision.Status with Location, and the response
	// header changes (ApplyResponse).
	Redirect
	// Respond: answer Decision.Status (a gRPC call: GRPCStatus) with no
	// body from the backend.
	Respond
	// Preflight: answer a CORS preflight, Decision.Status (200) with no
	// body and the headers of ApplyResponse.
	Preflight
)

// Reason says why a Decision is Respond, as a metric label.
type Reason string

const (
	// ReasonNoMatch: no rule matches (404; gRPC UNIMPLEMENTED).
	ReasonNoMatch Reason = "no_match"
	// ReasonInvalidRule: the matching rule cannot be honoured (500; gRPC
	// UNAVAILABLE).
	ReasonInvalidRule Reason = "invalid_rule"
	// ReasonNoBackend: the rule has no backend with a weight (500; gRPC
	// UNAVAILABLE).
	ReasonNoBackend Reason = "no_backend"
	// ReasonInvalidBackend: the weighted pick fell on a backendRef that
	// does not resolve (500; gRPC UNAVAILABLE), the share the API asks to
	// fail.
	ReasonInvalidBackend Reason = "invalid_backend"
	// ReasonInvalidTable: the set did not compile (500; gRPC UNAVAILABLE).
	ReasonInvalidTable Reason = "invalid_table"
)

// gRPC status codes (google.golang.org/grpc/codes) the proxy answers gRPC
// requests with: a gRPC set's own answers, and failures to forward.
const (
	GRPCUnimplemented = 12
	GRPCUnavailable   = 14
)

// Decision is the outcome of Decide. The zero value is unused; Decide
// fills every field it sets from scratch, so one Decision may be reused.
// Pointers into the Snapshot are shared and read-only.
type Decision struct {
	Action Action
	// Rule is the matching rule; nil when none matched.
	Rule *snapshot.RouteRule

	// Status is the HTTP status of Respond and Redirect. Respond also
	// carries GRPCStatus, to answer gRPC clients trailers-only; for a
	// gRPC set, Status is the HTTP status that grpc-go maps to the same
	// code (503 UNAVAILABLE, 404 UNIMPLEMENTED).
	Status     int
	GRPCStatus int
	Reason     Reason

	// Location is the Redirect target.
	Location string
	// RequestPath is the request's path as the rules matched it:
	// Request.Path normalized (RFC 3986 §6.2.2, "/a/../b" is "/b"; an
	// absolute-form target's empty path is "/"), percent-encoded.
	// An ExternalAuth server is asked about it: a server shown
	// "/public/../admin" for a request the "/admin" rule took would judge
	// another resource than the one routed.
	RequestPath string

	// Backend is where Forward sends the request.
	Backend snapshot.BackendRef
	// Path (percent-encoded) replaces the request path when RewritePath;
	// Host replaces the authority when RewriteHost. ApplyRequest does both.
	Path        string
	RewritePath bool
	Host        string
	RewriteHost bool
	// Mirrors are the backends that get a copy of this request (fractions
	// already drawn); a new slice per Decide, allocated only when a
	// request is mirrored.
	Mirrors []snapshot.BackendRef
	// Timeouts, Retry and SessionPersistence are the rule's; nil when
	// unset (SessionPersistence nil: the backend's own applies).
	Timeouts           *snapshot.Timeouts
	Retry              *snapshot.Retry
	SessionPersistence *snapshot.SessionPersistence
	// ExternalAuth is the rule's ExternalAuth filter: an authorization
	// server must let the request go on (Forward) or be answered
	// (Redirect, Respond) first; nil for a CORS preflight.
	ExternalAuth *snapshot.ExternalAuth

	reqMods, respMods [2]*headerMods // rule, then backendRef
	// cors is the rule's CORS filter; origin the request's Origin, and
	// requestMethod, requestHeaders what a preflight asks for.
	cors                                  *corsPolicy
	origin, requestMethod, requestHeaders string
	// credentialed: the request carries credentials (carriesCredentials; a
	// preflight never does).
	credentialed bool
}

// Decide matches req against the set and fills d. rnd draws the backend
// and mirrors.
func (s *Set) Decide(req *Request, rnd Rand, d *Decision) {
	*d = Decision{}
	if s.broken {
		s.respond(d, ReasonInvalidTable)
		return
	}
	path := normalizePath(req.Path)
	if path == "" && req.Method != http.MethodConnect {
		// An absolute-form target without a path ("GET http://echo"),
		// which the backend gets as "/" (RFC 9110 §4.2.3: the same URI).
		path = "/"
	}
	d.RequestPath = path
	i := s.preflightEntry(req, path)
	if i < 0 {
		i = s.find(req, path, nil)
	}
	if i < 0 {
		s.respond(d, ReasonNoMatch)
		return
	}
	e := &s.entries[i]
	r := &s.rules[e.rule]
	d.Rule = r.src
	if r.invalid {
		s.respond(d, ReasonInvalidRule)
		return
	}
	// The rule's response header changes apply to every answer of a
	// request it took, the proxy's own too (as Envoy's route-level
	// response_headers_to_add do to its local replies).
	d.respMods[0] = r.filters.respHeaders
	if r.filters.cors != nil && corsPreflight(d, req, r) {
		return
	}
	// A preflight carries no credentials (a browser's never does); every
	// other request of the rule is authorized, whatever the rule answers.
	d.ExternalAuth = r.src.ExternalAuth
	if r.filters.redirect != nil {
		s.redirect(d, req, path, e, r.filters.redirect)
		return
	}
	if r.total == 0 {
		s.respond(d, ReasonNoBackend)
		return
	}
	b := r.kept(req.Keep)
	if b == nil {
		n := rnd.Uint64N(r.total)
		for j := range r.backends {
			if n < r.backends[j].weight {
				b = &r.backends[j]
				break
			}
			n -= r.backends[j].weight
		}
	}
	if b.invalid {
		s.respond(d, ReasonInvalidBackend)
		return
	}
	d.respMods[1] = b.filters.respHeaders
	if b.filters.redirect != nil {
		s.redirect(d, req, path, e, b.filters.redirect)
		return
	}
	d.Action = Forward
	d.Backend = b.ref
	d.reqMods = [2]*headerMods{r.filters.reqHeaders, b.filters.reqHeaders}
	rewrite(d, path, e, r.filters.rewrite, b.filters.rewrite)
	d.drawMirrors(rnd, r.filters.mirrors)
	d.drawMirrors(rnd, b.filters.mirrors)
	d.Timeouts, d.Retry, d.SessionPersistence = r.src.Timeouts, r.src.Retry, r.src.SessionPersistence
}

// kept returns the first of r's backendRefs that resolves and keep
// accepts (Request.Keep); nil when there is none, or no choice to make. A
// backendRef of weight 0 keeps what it accepts, as the draw never picks it:
// setting a weight to 0 is how an operator drains a backend, and it must
// not end the MCP sessions it serves at once.
func (r *rule) kept(keep func(snapshot.BackendRef) bool) *backend {
	if keep == nil || len(r.backends) < 2 {
		return nil
	}
	for j := range r.backends {
		if b := &r.backends[j]; !b.invalid && keep(b.ref) {
			return b
		}
	}
	return nil
}

// corsPreflight notes r's CORS filter and the request's Origin in d, and
// reports whether req is a preflight (OPTIONS with Origin and
// Access-Control-Request-Method), which the proxy answers itself: a
// backend's answer would say what its own CORS handling, not the route's,
// allows.
func corsPreflight(d *Decision, req *Request, r *rule) bool {
	d.cors, d.origin = r.filters.cors, req.Header.Get("Origin")
	method := preflightMethod(req)
	if method == "" {
		d.credentialed = carriesCredentials(req.Header)
		return false
	}
	d.Action, d.Status = Preflight, http.StatusOK
	d.requestMethod = method
	d.requestHeaders = strings.Join(req.Header.Values("Access-Control-Request-Headers"), ", ")
	return true
}

// preflightMethod is the method a CORS preflight (OPTIONS with Origin and
// Access-Control-Request-Method) asks for; "" when req is none.
func preflightMethod(req *Request) string {
	if req.Method != http.MethodOptions || req.Header.Get("Origin") == "" {
		return ""
	}
	return req.Header.Get("Access-Control-Request-Method")
}

// respond sets a local answer. A gRPC call gets the API's GRPCRoute
// statuses whichever kind of route carries it: an HTTPRoute's 500 would
// reach it as UNKNOWN.
func (s *Set) respond(d *Decision, why Reason) {
	d.Action, d.Reason = Respond, why
	switch {
	case why == ReasonNoMatch:
		d.Status, d.GRPCStatus = http.StatusNotFound, GRPCUnimplemented
	case s.grpc:
		// The API asks GRPCRoutes for UNAVAILABLE where HTTPRoutes get 500.
		d.Status, d.GRPCStatus = http.StatusServiceUnavailable, GRPCUnavailable
	default:
		d.Status, d.GRPCStatus = http.StatusInternalServerError, GRPCUnavailable
	}
}

func (d *Decision) drawMirrors(rnd Rand, ms []mirror) {
	for _, m := range ms {
		if m.num >= m.den || m.num > 0 && rnd.Uint64N(m.den) < m.num {
			d.Mirrors = append(d.Mirrors, m.ref)
		}
	}
}

// ApplyRequest rewrites out, the request to send upstream, as a Forward
// decision says: path, authority, then the rule's and the backendRef's
// request header changes. Call it once per request, not per attempt:
// "add" appends. A "Host" header in the changes sets the authority. A
// removed field is left with a nil value, so that net/http's clients send
// no User-Agent of their own. Values are shared with the Table and must
// not be modified.
func (d *Decision) ApplyRequest(out *http.Request) {
	if d.RewritePath {
		out.URL.Path, out.URL.RawPath = unescapePath(d.Path), d.Path
	}
	if d.RewriteHost {
		out.Host = d.Host
	}
	for _, m := range d.reqMods {
		m.apply(out.Header, &out.Host)
	}
}

// SetsAuthority reports whether ApplyRequest sets the authority: a
// URLRewrite hostname, or "Host" in a request header change.
func (d *Decision) SetsAuthority() bool {
	for _, m := range d.reqMods {
		if m != nil && m.host {
			return true
		}
	}
	return d.RewriteHost
}

// ApplyResponse changes the headers of a Forward's response, of a
// Redirect or Preflight answer, and of the proxy's own answers to a
// request a rule took — a Respond for an invalid backendRef, a Forward
// that failed (no endpoint, refused, timed out) — as the rule and
// backendRef say: their header changes, then the rule's CORS headers (a
// browser shows the page's script the status of an answer only when the
// answer passes its CORS check, and reports a CORS error otherwise). A
// removed field is left with a nil value, so that net/http's server adds
// no Date or Content-Type of its own.
func (d *Decision) ApplyResponse(h http.Header) {
	for _, m := range d.respMods {
		m.apply(h, nil)
	}
	if d.cors != nil {
		d.cors.apply(h, d)
	}
}
