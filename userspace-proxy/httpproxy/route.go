package httpproxy

import (
	"context"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/routes"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// GAMMA routes on the L7 paths. A frontend without routes costs one nil
// check per request: everything here runs only when fe.Routes is set.

// RoutingConfig says how the proxy executes route rules where the rule
// leaves a setting to the implementation. The zero value is usable.
type RoutingConfig struct {
	// RequestTimeout bounds routed requests whose rule sets no
	// timeouts.request; 0 means none, as without a route (streams, SSE and
	// long polls must not be cut by a default they never asked for).
	RequestTimeout time.Duration
	// BackendRequestTimeout is likewise for timeouts.backendRequest; 0
	// means none.
	BackendRequestTimeout time.Duration
	// RetryBackoff is the base interval between retries when a rule's
	// retry sets no backoff; 0 means 25 ms (Envoy's default). Retry n waits
	// a random time between half and all of base·2ⁿ⁻¹, capped at
	// max(10·base, 1 s): jitter keeps retrying clients from moving in step.
	RetryBackoff time.Duration
	// ReplayBytes bounds the request body kept in memory so that a retry
	// can send it again and mirrors get a copy; 0 means 64 KiB. A body
	// that is larger or expects 100 Continue is streamed instead: such a
	// request is retried only when no byte of it reached a backend (a
	// connect error). A body of unknown length (chunked, every gRPC call)
	// streams too, recorded as it goes (teeBody): retries and mirrors get
	// it until it passes ReplayBytes; other streamed bodies are not
	// mirrored.
	ReplayBytes int
	// MaxMirrors bounds the mirrored requests in flight; 0 means 64. A
	// mirror beyond it is dropped (and counted), never queued: mirrors
	// must not slow the requests they copy.
	MaxMirrors int
	// MirrorTimeout bounds one mirrored request, response included; 0
	// means 10 s.
	MirrorTimeout time.Duration
	// ExternalAuthTimeout bounds the authorization request of an
	// ExternalAuth filter, answer included; 0 means 5 s. Past it the
	// request fails closed (503).
	ExternalAuthTimeout time.Duration
}

func (c *RoutingConfig) setDefaults() {
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = 25 * time.Millisecond
	}
	if c.ReplayBytes <= 0 {
		c.ReplayBytes = 64 << 10
	}
	if c.MaxMirrors <= 0 {
		c.MaxMirrors = 64
	}
	if c.MirrorTimeout <= 0 {
		c.MirrorTimeout = 10 * time.Second
	}
	if c.ExternalAuthTimeout <= 0 {
		c.ExternalAuthTimeout = 5 * time.Second
	}
	c.RequestTimeout = max(c.RequestTimeout, 0)
	c.BackendRequestTimeout = max(c.BackendRequestTimeout, 0)
}

// routed is what a request to a frontend with routes carries beyond its
// exchange: the decision, the retry and timeout policy, and the body kept
// for replay.
type routed struct {
	d   routes.Decision
	pol policy
	// body is the request body read ahead (replayable); nil when the
	// request has none or it is streamed.
	body []byte
	// kept says body holds the whole request body.
	kept bool
}

// clientNamespace is the namespace of the request's client: the in-pod
// listener's pod, else the local workload with the client's address; ""
// when unknown, which selects the producer routes.
func (x *exchange) clientNamespace() string {
	if p := x.v.Snapshot.ClientPod(x.t.ClientAddr.Addr(), x.t.ClientPod); p != nil {
		return p.Namespace
	}
	return ""
}

// route decides where r goes. Without routes (or without a set for this
// client) that is the frontend's own backend; otherwise the route set
// decides into rt, which x keeps. forward is false when the decision is a
// local answer (Respond, Redirect, Preflight).
func (h *Handler) route(x *exchange, r *http.Request, rt *routed) (ref snapshot.BackendRef, forward bool) {
	set := x.v.Routes.Lookup(x.fe, x.clientNamespace())
	if set == nil {
		return x.fe.Backend, true
	}
	req := routes.FromHTTP(r)
	if x.mcp != "" {
		req.Keep = x.issuedMCP
	}
	set.Decide(&req, routes.GlobalRand{}, &rt.d)
	// A local answer has no timeouts: authorize reads pol, which the
	// fast path's routed keeps from the request before.
	rt.body, rt.kept, rt.pol = nil, false, policy{}
	x.r = rt
	if rt.d.Action != routes.Forward {
		return snapshot.BackendRef{}, false
	}
	rt.pol = h.policyFor(&rt.d)
	return rt.d.Backend, true
}

// issuedMCP reports whether ref leads to the endpoint that issued the
// request's MCP session (x.mcp) while it serves: a rule that splits by
// weight keeps the session there (routes.Request.Keep), a backendRef of
// weight 0 included, as another backend's replicas do not know it; its new
// sessions follow the weights.
func (x *exchange) issuedMCP(ref snapshot.BackendRef) bool {
	be := x.v.Backends.Get(ref)
	return be != nil && be.Err == nil && be.Picker.MCPEndpoint(x.mcp, time.Time{}) != nil
}

// sessionFor is the session persistence in force: the route rule's when it
// sets one (GEP-1619 route-inline), else the backend's own.
func (x *exchange) sessionFor() *snapshot.SessionPersistence {
	if x.r != nil && x.r.d.SessionPersistence != nil {
		return x.r.d.SessionPersistence
	}
	return x.be.Spec.SessionPersistence
}

// applyRoute changes out, the request to send upstream, as a Forward
// decision says, keeps its body when retries or mirrors need it, and
// starts the mirrors. host is the app's own authority, which rewrites and
// mirrors start from; expects says the body waits for 100 Continue (it is
// then streamed, not kept). It fails when the body to keep could not be
// read (bodyFailed answers it).
func (h *Handler) applyRoute(x *exchange, out *http.Request, host string, expects, websocket bool) error {
	d := &x.r.d
	out.Host = host
	d.ApplyRequest(out)
	if d.RewritePath {
		// The target is the URL's then, with the rewritten path (the
		// fast path writes RequestURI as it came otherwise).
		out.RequestURI, out.URL.Opaque = "", ""
	}
	if err := h.keepBody(x, out, expects); err != nil {
		return err
	}
	h.mirror(x, out, websocket)
	externalAuthority(out, x.be, d)
	return nil
}

// externalAuthority gives r, bound for be (the route's backend or a
// mirror's), be's own name as authority when be is an ExternalHostname,
// unless a filter of the rule set one (a URLRewrite hostname, a Host header
// change): the API makes that the Host sent upstream. Its TLS server name
// stays the backend's.
func externalAuthority(r *http.Request, be *upstream.Backend, d *routes.Decision) {
	if be.Authority != "" && !d.SetsAuthority() {
		r.Host = be.Authority
	}
}

// localAnswer is a route's own answer: its status, the headers beyond the
// framing, and the body.
type localAnswer struct {
	status int
	header http.Header
	body   []byte
	// grpc: a trailers-only gRPC answer (status 200, grpc-status in the
	// headers, no body).
	grpc bool
}

// answerFor builds the answer to a Respond, Redirect or Preflight decision. A gRPC
// request, under a GRPCRoute or an HTTPRoute, gets a trailers-only answer
// with the gRPC status the GRPCRoute API asks for (UNIMPLEMENTED without a
// match, UNAVAILABLE for an invalid rule or backend), which every gRPC
// client reads as that code; an HTTP/1 client cannot read trailers and
// gets the HTTP status. A Respond carries the rule's response header
// changes and CORS headers, under its own fields, as the proxy's other
// answers to a rule's request do.
func answerFor(d *routes.Decision, r *http.Request) localAnswer {
	h := http.Header{}
	d.ApplyResponse(h)
	switch {
	case d.Action == routes.Redirect:
		h["Location"] = []string{d.Location}
		return localAnswer{status: d.Status, header: h}
	case d.Action == routes.Preflight:
		return localAnswer{status: d.Status, header: h}
	case d.GRPCStatus != 0 && grpcAnswers(r):
		maps.Copy(h, grpcHeader(d.GRPCStatus, string(d.Reason)))
		return localAnswer{status: http.StatusOK, grpc: true, header: h}
	}
	plainText(h)
	return localAnswer{status: d.Status, header: h, body: routeBodies[d.Reason]}
}

// plainText gives h, the header of a text answer of the proxy's own, that
// text's fields, over the ones a rule's response header changes (applied
// first) may have set: the body is the proxy's, and so is its type.
func plainText(h http.Header) {
	h["Content-Type"], h["X-Content-Type-Options"] = textPlain, nosniff
}

var (
	grpcContentType = []string{"application/grpc"}
	textPlain       = []string{"text/plain; charset=utf-8"}
	nosniff         = []string{"nosniff"}
	routeBodies     = func() map[routes.Reason][]byte {
		m := map[routes.Reason][]byte{}
		for _, r := range []routes.Reason{routes.ReasonNoMatch, routes.ReasonInvalidRule, routes.ReasonNoBackend,
			routes.ReasonInvalidBackend, routes.ReasonInvalidTable} {
			m[r] = []byte("sockmesh: " + string(r) + "\n")
		}
		return m
	}()
)

// grpcHeader is the header of a trailers-only gRPC answer: status code,
// and the reason as the message a gRPC client shows.
func grpcHeader(code int, reason string) http.Header {
	return http.Header{
		"Content-Type": grpcContentType,
		"Grpc-Status":  []string{strconv.Itoa(code)},
		"Grpc-Message": []string{"sockmesh: " + reason},
	}
}

// grpcAnswers reports whether the proxy's own answer to r is a gRPC status:
// r is gRPC over HTTP/2, whose client reads trailers.
func grpcAnswers(r *http.Request) bool { return r.ProtoMajor == 2 && isGRPC(r) }

// isGRPC reports a gRPC request (application/grpc, +proto, ...; not
// gRPC-Web, which is plain HTTP to a proxy).
func isGRPC(r *http.Request) bool { return isGRPCType(r.Header) }

func isGRPCType(h http.Header) bool {
	ct := h.Get("Content-Type")
	return strings.HasPrefix(ct, "application/grpc") && !strings.HasPrefix(ct, "application/grpc-web")
}

// answerLocally writes a route's own answer on the net/http path.
func (h *Handler) answerLocally(w http.ResponseWriter, r *http.Request, x *exchange) {
	a := answerFor(&x.r.d, r)
	writeAnswer(w, a)
	h.countLocal(r.Context(), x, a.status)
}

// writeAnswer writes a on the net/http path.
func writeAnswer(w http.ResponseWriter, a localAnswer) {
	hdr := w.Header()
	for k, v := range a.header {
		hdr[k] = v
	}
	w.WriteHeader(a.status)
	w.Write(a.body)
}

// countLocal logs and counts a route's own answer.
func (h *Handler) countLocal(ctx context.Context, x *exchange, status int) {
	d := &x.r.d
	reason := string(d.Reason)
	switch d.Action {
	case routes.Redirect:
		reason = "redirect"
	case routes.Preflight:
		reason = "cors_preflight"
	}
	h.m.routeAnswers.WithLabelValues(reason).Inc()
	h.m.request(x.fe, status, "none") // no backend answered
	if d.Action == routes.Respond && d.Reason != routes.ReasonNoMatch && h.log.Enabled(ctx, slog.LevelDebug) {
		attrs := []slog.Attr{slog.String("service", x.fe.Service.String()), slog.String("reason", reason),
			slog.Int("code", status), slog.Any("client", x.t.client()), slog.Uint64("snapshot_version", x.v.Snapshot.Version)}
		if d.Rule != nil {
			attrs = append(attrs, slog.String("route", d.Rule.Route.String()), slog.Int("rule", d.Rule.Index))
		}
		h.log.LogAttrs(ctx, slog.LevelDebug, "route answered", attrs...)
	}
}
