package httpproxy

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http/httpguts"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/relay"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstreamtls"
)

// Config configures a Handler. The zero value is usable.
type Config struct {
	// Buffers lends the copy buffers for bodies and WebSocket relays; nil
	// means a pool of the Handler's own.
	Buffers *relay.Pool
	// ReadHeaderTimeout bounds reading a request's headers on the HTTP/1
	// fast path (ServeHTTP1); 0 means 30 s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes fast-path client connections that wait this long
	// for their next request; 0 means 5 min.
	IdleTimeout time.Duration
	// ParkAfter is how long a fast-path connection waits for its next
	// request on the goroutine that served it before it parks: it waits on
	// in a goroutine of its own, whose stack is a quarter of the other's
	// (ServeHTTP1); 0 means DefaultParkAfter, negative never.
	ParkAfter time.Duration
	// StallTimeout ends a request whose app leaves a read of its body or
	// a write of its answer under way this long with no byte through
	// (stallWatch); 0 means 60 s, nginx's client_body_timeout and
	// send_timeout.
	StallTimeout time.Duration
	// MaxHeaderBytes bounds a fast-path request's header block; 0 means
	// 1 MiB, net/http's default.
	MaxHeaderBytes int
	// Routing says how route rules are executed where they leave it to
	// the proxy (default timeouts, retry backoff, body replay, mirrors).
	Routing RoutingConfig
	// FailureLogEvery is how often a failure of one kind (service,
	// backend, reason) is logged at most; the others go to Debug and are
	// counted on the next line. 0 means 10 s.
	FailureLogEvery time.Duration
	// Panics reports the panics the Handler recovers: in its requests and
	// in the goroutines they start (a body writer, a relay, a mirror).
	Panics *contain.Reporter
}

// DefaultParkAfter is Config.ParkAfter's default.
const DefaultParkAfter = 5 * time.Second

// Handler forwards requests; one per proxy, safe for concurrent use.
type Handler struct {
	cfg  Config
	log  *slog.Logger
	bufs *relay.Pool
	m    *metrics
	h1   h1State
	// mirrorSlots bounds the mirrored requests in flight, and counts them
	// (sockmesh_proxy_mirrored_requests_in_flight); mirrorCtx ends them
	// when the Handler drains.
	mirrorSlots chan struct{}
	mirrorCtx   context.Context
	stopMirrors context.CancelFunc
	// failures sets the level of "request failed" lines (report).
	failures *upstream.FailureLog
}

// New returns a Handler.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Handler, error) {
	if cfg.Buffers == nil {
		cfg.Buffers = relay.NewPool()
	}
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = 30 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = 60 * time.Second
	}
	if cfg.ParkAfter == 0 {
		cfg.ParkAfter = DefaultParkAfter
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = http.DefaultMaxHeaderBytes
	}
	if cfg.FailureLogEvery <= 0 {
		cfg.FailureLogEvery = 10 * time.Second
	}
	cfg.Routing.setDefaults()
	mirrorSlots := make(chan struct{}, cfg.Routing.MaxMirrors)
	m, err := newMetrics(reg, mirrorSlots)
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, log: log, bufs: cfg.Buffers, m: m, mirrorSlots: mirrorSlots,
		failures: upstream.NewFailureLog(cfg.FailureLogEvery)}
	h.mirrorCtx, h.stopMirrors = context.WithCancel(context.Background())
	h.h1.init()
	return h, nil
}

// contain reports a panic of a request on net/http's server, which would
// otherwise recover it with no more than a debug line, and ends the request
// as net/http does (the stream reset, or the connection closed). The
// handler's own aborts (http.ErrAbortHandler) pass as they are.
func (h *Handler) contain(r *http.Request) {
	v := recover()
	if v == nil {
		return
	}
	if v != http.ErrAbortHandler {
		h.cfg.Panics.Report(v, "request", "host", r.Host, "path", r.URL.Path)
	}
	panic(http.ErrAbortHandler)
}

// Retain drops the request counts of the Services s does not capture, and
// counts requests of theirs still under way nowhere; the proxy calls it
// with each new snapshot, before requests start on it.
func (h *Handler) Retain(s *snapshot.Snapshot) { h.m.retain(s) }

// StreamResent counts a stream an HTTP/2 backend refused that net/http's
// Transport sent again (upstream.Config.StreamResent): a retry for
// reason refused_stream.
func (h *Handler) StreamResent() { h.m.retries.WithLabelValues("refused_stream").Inc() }

// ServeHTTP forwards r to the backend of the connection's Target, or
// answers it as the frontend's route says.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer h.contain(r)
	t, _ := r.Context().Value(targetKey{}).(*Target)
	if t == nil {
		// Only the proxy's own server calls this handler, always with a
		// Target; refuse rather than guess.
		http.Error(w, "no target", http.StatusInternalServerError)
		return
	}
	if r.Method == http.MethodConnect && !isExtendedConnect(r) {
		// As on the fast path: a tunnel through a Service address is not a
		// mesh request, and an extended CONNECT for another protocol than
		// WebSocket has no HTTP/1.1 form (RFC 8441 §4) — forwarded as a
		// CONNECT, a backend's 200 read as the tunnel's success.
		if r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		http.Error(w, "405 Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	if !httpguts.ValidHeaderFieldName(r.Method) || strings.IndexByte(r.RequestURI, ' ') >= 0 || !validTarget(r.RequestURI) {
		// An HTTP/2 app's :method and :path may hold what no HTTP/1.1
		// request line can (RFC 9112 §3: a method is a token, as a field
		// name is; a target has no space), and net/http's server takes
		// them: sent as they came, "GET /admin /a HTTP/1.1" gave the
		// backend another target or version to read than the one routed.
		// nginx refuses them alike. A fragment: see validTarget.
		http.Error(w, "400 Bad Request", http.StatusBadRequest)
		return
	}
	t.nameService(r)
	v, fe := t.view()
	x := &exchange{t: t, v: v, fe: fe, grpc: grpcCallOf(r)}
	if fe == nil {
		// The proxy only hands over connections whose Start view captures
		// OrigDst; this cannot happen, and must not relay if it does.
		h.fail(w, r, x, upstream.ReasonNoEndpoints, upstream.ErrNoEndpoints)
		return
	}
	if lastHop(r) {
		leaveBody(w, r)
		writeAnswer(w, h.finalAnswer(x, r))
		return
	}
	x.mcp = balance.CutMCPSession(r.Header)
	ref := fe.Backend
	if fe.Routes != nil {
		var forward bool
		ref, forward = h.route(x, r, new(routed))
		if x.r != nil {
			// A rule's body may be read by the proxy itself (readBody).
			h.watchApp(w, r, x)
			defer x.stall.end()
		}
		if x.r != nil && !x.r.pol.deadline.IsZero() {
			x.app = http.NewResponseController(w) // readBody's, needed only then
		}
		if x.r != nil && x.r.d.ExternalAuth != nil {
			if a, ok, err := h.authorize(x, r, nil); !ok {
				leaveBody(w, r)
				switch {
				case err != nil:
					h.bodyFailed(w, r, x, err)
				case a.status == 0:
					panic(http.ErrAbortHandler) // the app left: as fail's canceled
				default:
					writeAnswer(w, a)
				}
				return
			}
		}
		if !forward {
			h.answerLocally(w, r, x)
			return
		}
	}
	x.be = v.Backends.Get(ref)
	if x.be == nil {
		h.fail(w, r, x, upstream.ReasonNoEndpoints, upstream.ErrNoEndpoints)
		return
	}
	if x.be.Err != nil {
		h.fail(w, r, x, upstream.ReasonInvalidPolicy, x.be.Err)
		return
	}
	if err := t.relayFailed(x.be); err != nil {
		if errors.Is(err, upstream.ErrNotHTTP2) {
			// net/http's server then sends a GOAWAY: the app's next
			// connection meets the relay's check again, and is relayed
			// once the backend speaks HTTP/2, rather than stay on this
			// path, which terminates HTTP/2, for as long as it lives.
			w.Header().Set("Connection", "close")
		}
		h.fail(w, r, x, upstream.Classify(err), err)
		return
	}
	choice := x.pick(r)
	if choice == nil {
		h.fail(w, r, x, upstream.ReasonNoEndpoints, upstream.ErrNoEndpoints)
		return
	}
	if isExtendedConnect(r) {
		h.bridgeWebSocket(w, r, x, choice)
		return
	}
	h.forward(w, r, x, choice)
}

// leaveBody has net/http's HTTP/1 server close the connection after the
// answer to r, whose body may be left unread (one over an ExternalAuth
// filter's maxSize, an upload going on, one the request timeout cut), as
// the fast path's does: the server would read up to 256 KiB of it before
// it sent the answer.
func leaveBody(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 && r.Body != http.NoBody {
		w.Header().Set("Connection", "close")
	}
}

// exchange is what one request resolved to.
type exchange struct {
	t   *Target
	v   *View
	fe  *snapshot.Frontend
	be  *upstream.Backend // nil until routed
	now time.Time         // when the request was routed (sessions)
	// pinned says the request's session chose its endpoint
	// (Picker.PickRequest): a retry does not move it; a failed connect
	// does (unpin).
	pinned bool
	// setSession says the answer carries the session (Picker.SetSession).
	setSession bool
	// mcp is the token of the endpoint that issued the request's MCP
	// session (balance.CutMCPSession); "" without one.
	mcp string
	// tee is the request's streamed body as its tries read it, recorded
	// for retries and mirrors (keepBody) or a stream an HTTP/2 backend
	// refused (resend), or only so that a try whose connect failed can go
	// again (roundTrip); cut once the exchange is over on the fast path,
	// which never closes it.
	tee *teeBody
	// retried counts the rule's retries on the net/http paths
	// (roundTrip), each one of its attempts, sent or not (settleRetry).
	retried int
	// retry is the retry the current try is, until its connection is
	// known (settleRetry).
	retry pendingRetry
	// counted says countRequest counted the request in its backend's
	// retry budget: one the fast path hands to roundTrip counts once.
	counted bool
	// tried holds the endpoints the request's tries went to, or failed
	// to connect to, before the current one, which its retries and its
	// connects' failovers avoid (repick, failover).
	tried balance.Tried
	// r is the route decision when the frontend has routes that apply
	// to this client; nil otherwise.
	r *routed
	// cd bounds the fast path's current attempt on its pooled connection
	// (route timeouts); nil without.
	cd *connDeadline
	// grpc is the gRPC call over HTTP/2 the request is, on the net/http
	// path; nil for other requests.
	grpc *grpcCall
	// stall watches the app on net/http's paths, answer is its answer
	// written under it (watchApp), conn its HTTP/1.x connection (Target's),
	// whose progress it counts; stalls is the watch of the exchange: stall
	// once readied, or the fast path's connection's.
	stall  stallWatch
	answer stalledResponse
	conn   net.Conn
	stalls *stallWatch
	// body is the app's request body as the transports read it
	// (watchStalls): it tells the app's broken body from the backend's
	// failure (refuseBrokenBody).
	body stalledReader
	// app sets the deadline of reads from the app's side, which a rule's
	// request timeout bounds while the proxy reads the body itself
	// (readBody): the fast path's connection, net/http's
	// ResponseController (set only under such a timeout).
	app interface{ SetReadDeadline(time.Time) error }
}

// pick returns the endpoint for r, routed to x.be: the one that issued its
// MCP session while it serves, else the one session persistence or
// balancing picks (Picker.PickRequest); nil when none is ready.
func (x *exchange) pick(r *http.Request) *balance.Choice {
	sp := x.sessionFor()
	if sp != nil {
		x.now = time.Now() // sessions time out; other requests need no clock
	}
	if c := x.be.Picker.MCPEndpoint(x.mcp, x.now); c != nil {
		x.pinned = true
		return c
	}
	var c *balance.Choice
	c, x.pinned, x.setSession = x.be.Picker.PickRequest(r, x.t.clientKey(), x.now, sp)
	return c
}

// decorate adds to h, the header of the answer to r from c's endpoint,
// what the proxy adds to every answer it passes on, a WebSocket's 101 (or
// its RFC 8441 200) included: the route rule's response header changes,
// the MCP session ID that names c (Picker.MCPSession), then the session
// the answer starts (setSession).
func (x *exchange) decorate(h http.Header, r *http.Request, c *balance.Choice) {
	if x.r != nil {
		x.r.d.ApplyResponse(h)
	}
	x.be.Picker.MCPSession(h, c)
	if x.setSession {
		x.be.Picker.SetSession(h, r, c, x.now, x.sessionFor())
	}
}

// WireFor decides the HTTP version toward the backend for a request of
// HTTP major version protoMajor: what the backend's protocol demands, else
// what the app speaks. A WebSocket goes over HTTP/1.1 (kubernetes.io/ws,
// kubernetes.io/wss, XBackend WSS, HTTP and undeclared protocols: an
// Upgrade) unless the backend declared HTTP/2, which it then gets as an
// RFC 8441 extended CONNECT (upstream.Backend.WebSocketH2): XBackend's
// "MUST include the protocol set here in the negotiation options" has an
// H2C, HTTP2 or GRPC backend (and kubernetes.io/h2c, the same
// prior-knowledge h2c) offered HTTP/2 first; one whose SETTINGS refuse
// extended CONNECT gets the HTTP/1.1 Upgrade then. A TLS policy whose
// ALPN list has h2 and not http/1.1 declares HTTP/2 where the protocol
// does not. An HTTP/2 app's requests to a TLS backend that declared no
// HTTP version offer both by ALPN: they stay HTTP/2 where the backend
// speaks it and become HTTP/1.1 where it does not (or has no ALPN). A
// cleartext MCP backend gets HTTP/1.1; one over TLS is offered both
// whatever the app speaks (fastWire too).
func WireFor(be *upstream.Backend, protoMajor int, websocket bool) upstream.Wire {
	switch be.Spec.Protocol {
	case snapshot.ProtocolH2C, snapshot.ProtocolHTTP2, snapshot.ProtocolGRPC:
		return upstream.WireH2
	case snapshot.ProtocolHTTP11, snapshot.ProtocolWS, snapshot.ProtocolWSS:
		return upstream.WireH1
	case snapshot.ProtocolMCP:
		// XBackend's MCP names no HTTP version, and MCP servers (the
		// TypeScript and Python SDKs', Go's net/http) speak HTTP/1.1 alone
		// in cleartext: an HTTP/2 app's requests in h2c met a 502. In TLS,
		// ALPN tells, for every app: a server may speak h2 alone (an
		// HTTP/1.1 app's handshake offering http/1.1 alone failed), and
		// over h2 a session's open event streams share connections, where
		// each held one of the pool's over HTTP/1.1.
		if !be.TLS() {
			return upstream.WireH1
		}
	}
	switch {
	case onlyH2(be.Spec.TLS):
		return upstream.WireH2
	case websocket:
		return upstream.WireH1
	case be.TLS() && (be.Spec.Protocol == snapshot.ProtocolHTTP || be.Spec.Protocol == snapshot.ProtocolMCP || protoMajor == 2):
		return upstream.WireNegotiate
	case protoMajor == 2:
		return upstream.WireH2
	}
	return upstream.WireH1
}

// fastWire is the wire the fast path takes for an HTTP/1.1 app's request
// to be where WireFor says w. Negotiating becomes HTTP/1.1 — for HTTP/1.1
// apps an HTTP/1.1 pool beat h2 upstreams on every proxy measured
// (../shared/BENCH.md) — but toward an MCP backend (WireFor says why) and
// one that refused http/1.1 alone lately (SpeaksH2Only; learnt by
// h1Conn.forward's connect).
func fastWire(be *upstream.Backend, w upstream.Wire) upstream.Wire {
	if w == upstream.WireNegotiate && be.Spec.Protocol != snapshot.ProtocolMCP && !be.SpeaksH2Only() {
		return upstream.WireH1
	}
	return w
}

// onlyH2 reports whether t's ALPN list offers h2 and not http/1.1. An
// HTTP/1.1 connection would offer that list as is and refuse the h2 the
// backend picks: every HTTP/1.1 request to such a backend got 502.
func onlyH2(t *snapshot.TLS) bool {
	return t != nil && slices.Contains(t.ALPN, upstreamtls.ALPNH2) && !slices.Contains(t.ALPN, upstreamtls.ALPNHTTP11)
}

// outgoing builds the request to send upstream. It shares r's header map,
// from which hop-by-hop fields are removed in place: r is done with them
// (net/http decided keep-alive when it read the request), and a copy per
// request is the proxy's largest avoidable allocation.
func outgoing(r *http.Request, be *upstream.Backend, c *balance.Choice, websocket bool) *http.Request {
	keepTrailers(r) // before out shares r.Trailer
	ctx := upstream.WithEndpoint(r.Context(), c)
	out := r.WithContext(ctx)
	out.URL = upstreamURL(r.URL, be.Scheme(), c.Host)
	out.URL.Opaque = sentPath(r.RequestURI)
	out.RequestURI = ""
	out.Close = false
	if be.Authority != "" {
		out.Host = be.Authority
	}
	if r.ContentLength == 0 {
		out.Body = nil // Transport then sends no body and can retry
		if _, ok := r.Header["Content-Length"]; ok {
			// As the app sent it (RFC 9110 §8.6; some servers answer 411
			// without): Request.Write sends "Content-Length: 0" for POST,
			// PUT and PATCH only, and for other methods with a non-nil
			// empty body sent as "identity".
			out.Body, out.TransferEncoding = http.NoBody, identity
		}
	}
	upgrade := ""
	if websocket {
		upgrade = r.Header.Get("Upgrade")
	}
	removeHopByHop(out.Header)
	keepUserAgent(out) // the Transport would add its own
	if upgrade != "" {
		out.Header["Connection"] = connectionUpgrade
		out.Header["Upgrade"] = []string{upgrade}
	}
	return out
}

var (
	connectionUpgrade      = []string{"Upgrade"}
	connectionCloseUpgrade = []string{"close, Upgrade"}
	identity               = []string{"identity"}
)

// upstreamURL is u, a request's URL, addressed to host. The transports
// write u.RequestURI() as the request target: the path as u.Opaque holds
// it, and an empty query ("/p?", ForceQuery) as the app sent it.
func upstreamURL(u *url.URL, scheme, host string) *url.URL {
	return &url.URL{Scheme: scheme, Host: host, Opaque: u.Opaque, Path: u.Path, RawPath: u.RawPath,
		ForceQuery: u.ForceQuery, RawQuery: u.RawQuery}
}

// sentPath is the path of the request target an app sent, for URL.Opaque:
// URL.RequestURI would otherwise write the path escaped again from
// URL.Path wherever the app's own spelling is not one URL.EscapedPath
// keeps ({, |, ^, bytes past ASCII: /p{x} became /p%7Bx%7D). "" for a
// target not in origin form (absolute-form, "*": the URL's path is
// written) and for a path starting with "//", which RequestURI would
// write as an authority.
func sentPath(target string) string {
	if !strings.HasPrefix(target, "/") || strings.HasPrefix(target, "//") {
		return ""
	}
	if i := strings.IndexByte(target, '?'); i >= 0 {
		return target[:i]
	}
	return target
}

// hopByHop are the RFC 9110 §7.6.1 connection-specific fields (plus the
// non-standard Proxy-Connection), TE apart.
var hopByHop = [...]string{"Connection", "Proxy-Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Trailer"}

var teTrailers = []string{"trailers"}

// removeHopByHop removes h's hop-by-hop fields, and those its Connection
// names. TE is one (RFC 9110 §10.1.4), but a client that accepts trailers
// goes on as "TE: trailers", the one value HTTP/2 allows (RFC 9113
// §8.2.2): gRPC asks for it of every call, and an HTTP/1.1 client
// that lists TE in Connection, as it must (curl, gRPC-Web shims), would
// otherwise lose it.
func removeHopByHop(h http.Header) {
	trailers := headerHasToken(h["Te"], "trailers")
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				delete(h, http.CanonicalHeaderKey(f))
			}
		}
	}
	for _, k := range hopByHop {
		delete(h, k)
	}
	if trailers {
		h["Te"] = teTrailers
	} else {
		delete(h, "Te")
	}
}

// upgradeRequired returns the Upgrade field of resp when it is a 426 to
// an HTTP/1.1 app, which must keep it: a 426 MUST carry one (RFC 9110
// §15.5.22), where removeHopByHop removes it from every other answer. nil
// otherwise: an HTTP/1.0 app ignores Upgrade (§7.8), and an HTTP/2 app may
// get no connection-specific field (RFC 9113 §8.2.2).
func upgradeRequired(r *http.Request, resp *http.Response) []string {
	if resp.StatusCode != http.StatusUpgradeRequired || r.ProtoMajor != 1 || r.ProtoMinor < 1 {
		return nil
	}
	return resp.Header["Upgrade"]
}

// isWebSocketUpgrade reports an HTTP/1.1 WebSocket upgrade. An HTTP/1.0
// request's Upgrade is ignored (RFC 9110 §7.8: a server MUST), and goes
// with the other hop-by-hop fields.
func isWebSocketUpgrade(r *http.Request) bool {
	return r.ProtoMajor == 1 && r.ProtoMinor >= 1 && headerHasToken(r.Header["Connection"], "upgrade") &&
		strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// isExtendedConnect reports an RFC 8441 WebSocket bootstrap: net/http's
// HTTP/2 server exposes the :protocol pseudo-header as a header field.
func isExtendedConnect(r *http.Request) bool {
	return r.ProtoMajor == 2 && r.Method == http.MethodConnect && strings.EqualFold(r.Header.Get(":protocol"), "websocket")
}

func headerHasToken(vv []string, token string) bool {
	for _, v := range vv {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

// fail answers a request that could not be forwarded and records why; a
// routed one's answer carries its rule's response header changes and
// CORS headers. A canceled one gets no answer: its request or stream is
// aborted, as the fast path closes the connection. Returning would have
// net/http's server send a clean, empty 200 in its stead, which an HTTP/1.x
// app that half-closed in the middle of its body (the server reads that as
// the app leaving: it cancels the request's context) took for the backend's.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, x *exchange, reason upstream.Reason, err error) {
	if reason == upstream.ReasonAppStalled {
		h.stalled(x, err)
		resetApp(w, r)
	}
	code := h.report(r.Context(), x, reason, err)
	if reason == upstream.ReasonCanceled {
		panic(http.ErrAbortHandler)
	}
	if x.r != nil {
		x.r.d.ApplyResponse(w.Header())
	}
	if x.grpc != nil {
		// A gRPC client reads HTTP 502/503/504 as UNAVAILABLE with a
		// message about the content type; a trailers-only answer with the
		// same code carries the reason, as a route's own answers do. A
		// backend's reset has its own code.
		maps.Copy(w.Header(), grpcHeader(x.grpc.failStatus(err, reason)))
		w.WriteHeader(http.StatusOK)
		return
	}
	plainText(w.Header())
	w.WriteHeader(code)
	// The body names the reason class only; details are in the proxy log.
	w.Write(reasonBodies[reason])
}

// report logs and counts a request that could not be forwarded, and
// returns the status its client gets (none when canceled: its app left):
// reason's, but a gRPC call's, whose failure is a trailers-only HTTP 200
// (fail) that requests_total counts as it counts the proxy's other
// answers to gRPC (a route's, an ExternalAuth refusal): by the status on
// the wire. A fail-closed backend is logged with its policy and reason
// once per snapshot, other failures once per FailureLogEvery and kind (at
// Debug otherwise), so that a broken policy or backend cannot flood the
// log.
func (h *Handler) report(ctx context.Context, x *exchange, reason upstream.Reason, err error) int {
	be := x.be
	code := reason.Status()
	if x.grpc != nil {
		code = http.StatusOK
	}
	lvl := slog.LevelDebug // an app that left: nothing to act on
	var held uint64
	if reason != upstream.ReasonCanceled {
		k := upstream.FailureKey{Reason: reason}
		if x.fe != nil {
			k.Service = x.fe.Service
		}
		if be != nil {
			k.Backend = be.Spec.Ref
		}
		lvl, held = h.failures.Level(k, be, err)
	}
	if h.log.Enabled(ctx, lvl) {
		attrs := []slog.Attr{
			slog.String("orig_dst", x.t.OrigDst.String()),
			slog.String("reason", string(reason)),
			slog.Int("code", code),
			slog.Any("client", x.t.client()),
			slog.Uint64("snapshot_version", x.v.Snapshot.Version),
			slog.Any("err", err),
		}
		attrs = append(attrs, upstream.PolicyAttrs(be, reason, err)...)
		if x.fe != nil {
			attrs = append(attrs, slog.String("service", x.fe.Service.String()))
		}
		if be != nil {
			attrs = append(attrs, slog.String("backend", be.Spec.Ref.String()))
		}
		if x.grpc != nil {
			st, _ := x.grpc.failStatus(err, reason)
			attrs = append(attrs, slog.Int("grpc_status", st))
		}
		if held > 0 {
			attrs = append(attrs, slog.Uint64("suppressed", held))
		}
		h.log.LogAttrs(ctx, lvl, "request failed", attrs...)
	}
	h.m.failures.WithLabelValues(string(reason)).Inc()
	switch {
	case errors.Is(err, errRequestTimeout):
		h.m.timeouts.WithLabelValues("request").Inc()
	case errors.Is(err, errBackendTimeout):
		h.m.timeouts.WithLabelValues("backend_request").Inc()
	}
	if reason != upstream.ReasonCanceled { // nobody got an answer to count
		h.m.request(x.fe, code, protocolOf(be))
	}
	return code
}

// stalled counts an exchange its stall watch ended, and logs it at debug:
// the app stopped, nothing an operator can act on. Its connection or
// stream is reset; an answer begun was counted (requests) as it began.
func (h *Handler) stalled(x *exchange, err error) {
	h.m.failures.WithLabelValues(string(upstream.ReasonAppStalled)).Inc()
	service := "" // a request the fast path refused was routed nowhere
	if x.fe != nil {
		service = x.fe.Service.String()
	}
	h.log.Debug("request failed", "reason", upstream.ReasonAppStalled, "service", service, "client", x.t.client(), "err", err)
}

var reasonBodies = func() map[upstream.Reason][]byte {
	m := make(map[upstream.Reason][]byte)
	for _, r := range []upstream.Reason{upstream.ReasonInvalidPolicy, upstream.ReasonNoEndpoints, upstream.ReasonRefused,
		upstream.ReasonDialFailed, upstream.ReasonTLSVerify, upstream.ReasonTLSHandshake, upstream.ReasonProtocol,
		upstream.ReasonCanceled, upstream.ReasonUpstream, upstream.ReasonTimeout, upstream.ReasonRetryBudget, upstream.ReasonRefusedStream, upstream.ReasonPoolBusy} {
		m[r] = []byte("sockmesh: " + string(r) + "\n")
	}
	return m
}()

// protocolOf is the metric label of be's protocol; the common ones are
// constants so that counting a request allocates nothing.
func protocolOf(be *upstream.Backend) string {
	if be == nil {
		return "auto"
	}
	switch be.Spec.Protocol {
	case snapshot.ProtocolAuto:
		return "auto"
	case snapshot.ProtocolHTTP:
		return "http"
	case snapshot.ProtocolHTTP11:
		return "http11"
	case snapshot.ProtocolHTTP2:
		return "http2"
	case snapshot.ProtocolH2C:
		return "h2c"
	case snapshot.ProtocolGRPC:
		return "grpc"
	}
	return strings.ToLower(string(be.Spec.Protocol))
}
