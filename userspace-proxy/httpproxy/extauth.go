package httpproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/routes"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// ExternalAuth filters (GEP-1494, HTTP protocol): before a request of the
// rule goes on, its authorization server gets a request with the same
// method, the path routes matched (dot segments resolved: routes.Decision.
// RequestPath) after the filter's prefix, the query, Host,
// Authorization and the allowed headers, and the body when the filter
// forwards it (Content-Length then says its size; a body over maxSize is
// refused 413 once maxSize+1 bytes of it came). Its 200 lets the
// request go on with the answer's headers (the allowed ones but
// Content-Length and Transfer-Encoding; none listed: all but Host and the
// answer's own hop-by-hop fields, Content-Length, Content-Type and Date);
// any other answer goes to the client as the server gave it (to a gRPC
// call as the gRPC status its clients read in it, the server's body its
// message: grpcDenial), and the request goes nowhere. A server that cannot be asked (no
// ready endpoint, every one tried refused, TLS failure, no answer within
// RoutingConfig.ExternalAuthTimeout) fails the request closed with 503: the
// fault is the proxy's, not the client's credentials. A gRPC call gets
// those two as gRPC statuses (authRefused). Every answer the
// filter gives carries the rule's response header changes and CORS
// headers, as the rule's other answers do: a browser shows a page's script
// a denial only with the CORS headers (without them, the script cannot
// send its user to log in). The rule's timeouts.request bounds the whole
// exchange from the routing decision (GEP-1742): when it passes first, it
// ends the ask and the read of the body the filter forwards, and the
// client gets its answer, as from a forward it ends (504; a gRPC call
// DEADLINE_EXCEEDED).

// authorize asks x's authorization server about r. It reports whether r
// may go on (with the server's headers added); if not, a is the client's
// answer, unless err says the rule's request timeout passed first, or the
// read of a body the server is to get failed (a stall, the app left or
// broke it off): the caller then fails r with it (bodyFailed), as a
// forward it ends; the server was not asked. a is the zero answer when the
// app left while the server was asked (reported canceled): nobody to
// answer. watch, when not nil,
// watches the client while the server is asked, until the stop it
// returns: a client that leaves cancels the ask (the fast path's, whose
// requests have no context; net/http's cancel theirs). held tells it the
// request's body is unread, kept for the backend: the filter forwards
// none.
func (h *Handler) authorize(x *exchange, r *http.Request, watch func(cancel context.CancelFunc, held bool) (stop func())) (a localAnswer, ok bool, err error) {
	ea := x.r.d.ExternalAuth
	body, err := authBody(x, r, ea.MaxBody)
	switch {
	case errors.Is(err, errAuthBodyTooLarge):
		return h.authRefused(x, r, "ext_auth_body_too_large", http.StatusRequestEntityTooLarge, grpcResourceExhausted, err), false, nil
	case err != nil:
		// Not ext_auth_error: the server was never asked.
		return localAnswer{}, false, err
	}
	// The fast path's requests name no client: the ask counts as r's
	// client's in the upstream pools.
	ctx := upstream.WithClient(r.Context(), x.t.poolClient())
	if d := x.r.pol.deadline; !d.IsZero() {
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(ctx, d)
		defer stop()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if watch != nil {
		defer watch(cancel, body == nil && r.Body != nil && r.Body != http.NoBody)()
	}
	ask := h.askHTTP
	if ea.GRPC {
		ask = h.askGRPC
	}
	denied, err := ask(ctx, x, r, ea, body)
	switch {
	case err != nil && x.r.pol.expired(time.Now()):
		// First: the deadline ends ctx too.
		return localAnswer{}, false, timeoutError(true, err)
	case err != nil && ctx.Err() != nil: // the client left: nobody to answer
		h.report(ctx, x, upstream.ReasonCanceled, err)
		return localAnswer{}, false, nil
	case err != nil:
		return h.authRefused(x, r, "ext_auth_error", http.StatusServiceUnavailable, routes.GRPCUnavailable, err), false, nil
	case denied != nil:
		h.m.routeAnswers.WithLabelValues("ext_auth_denied").Inc()
		ruleDenial(&x.r.d, denied.header)
		if grpcAnswers(r) {
			grpcDenial(denied)
		}
		h.m.request(x.fe, denied.status, "none")
		return *denied, false, nil
	}
	return localAnswer{}, true, nil
}

// ruleDenial gives h, the header of the server's denial, the rule's
// response header changes and CORS headers, as a backend's answer gets
// them (a field both set is the rule's), but for Content-Type: the body is
// the server's, and its type (or none) stays the server's.
func ruleDenial(d *routes.Decision, h http.Header) {
	ct := h["Content-Type"]
	d.ApplyResponse(h)
	// The server's own, or none (nil: net/http's server would guess one
	// from the body, where the fast path writes none).
	h["Content-Type"] = ct
}

// grpcDenial makes a, the authorization server's denial of a gRPC call, a
// trailers-only gRPC answer, as Envoy makes its local replies to gRPC
// calls: the status gRPC reads in a's HTTP status (grpcCodeOfHTTP), the
// server's body as the message, and the server's headers. Passed on as
// the server gave it, a gRPC client found the code but no reason: neither
// a text body nor a reason phrase is read by it (grpc-go's message was
// "unexpected HTTP status code received from server").
func grpcDenial(a *localAnswer) {
	msg := strings.TrimSpace(string(a.body[:min(len(a.body), grpcMessageLimit)]))
	if msg == "" {
		msg = "sockmesh: ext_auth_denied"
	}
	a.header["Content-Type"] = grpcContentType
	a.header["Grpc-Status"] = []string{strconv.Itoa(grpcCodeOfHTTP(a.status))}
	a.header["Grpc-Message"] = []string{encodeGRPCMessage(msg)}
	a.status, a.grpc, a.body = http.StatusOK, true, nil
}

// grpcMessageLimit bounds the part of a denial's body that becomes its
// gRPC message, a header: a reason, not a page.
const grpcMessageLimit = 1024

// grpcCodeOfHTTP is the gRPC status a gRPC client reads in an HTTP status
// without one (grpc's doc/http-grpc-status-mapping.md, as grpc-go and
// Envoy map it).
func grpcCodeOfHTTP(status int) int {
	switch status {
	case http.StatusBadRequest:
		return int(codes.Internal)
	case http.StatusUnauthorized:
		return int(codes.Unauthenticated)
	case http.StatusForbidden:
		return int(codes.PermissionDenied)
	case http.StatusNotFound:
		return int(codes.Unimplemented)
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return int(codes.Unavailable)
	}
	return int(codes.Unknown)
}

// encodeGRPCMessage percent-encodes msg as gRPC's grpc-message field asks
// (PROTOCOL-HTTP2.md): every byte outside printable ASCII, and '%'.
func encodeGRPCMessage(msg string) string {
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < ' ' || c > '~' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// authRefused counts, logs and answers r, a request the filter refuses
// without the server's word: a text answer of the proxy's own with status,
// or to a gRPC call a trailers-only answer with grpcCode (gRPC's reading
// of status, which gRPC clients would not make of a 413: UNKNOWN), as the
// proxy's other answers to gRPC are (answerFor); either with the rule's
// response header changes and CORS headers.
func (h *Handler) authRefused(x *exchange, r *http.Request, reason string, status, grpcCode int, err error) localAnswer {
	h.log.Debug("external auth failed", "service", x.fe.Service.String(), "reason", reason, "err", err)
	h.m.routeAnswers.WithLabelValues(reason).Inc()
	hdr := http.Header{}
	x.r.d.ApplyResponse(hdr)
	if grpcAnswers(r) {
		maps.Copy(hdr, grpcHeader(grpcCode, reason))
		h.m.request(x.fe, http.StatusOK, "none")
		return localAnswer{status: http.StatusOK, grpc: true, header: hdr}
	}
	h.m.request(x.fe, status, "none")
	plainText(hdr)
	return localAnswer{status: status, header: hdr, body: []byte("sockmesh: " + reason + "\n")}
}

// authBody reads r, x's request, for the authorization server when the
// filter forwards its body (maxSize > 0), under the rule's request
// deadline (readBody), and gives r the same bytes again.
func authBody(x *exchange, r *http.Request, maxSize int32) ([]byte, error) {
	if maxSize == 0 || r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > int64(maxSize) {
		return nil, errAuthBodyTooLarge
	}
	var buf []byte
	if err := x.readBody(r.Body, func(body io.Reader) (err error) {
		buf, err = io.ReadAll(io.LimitReader(body, int64(maxSize)+1))
		return err
	}); err != nil {
		return nil, err
	}
	if len(buf) > int(maxSize) {
		return nil, errAuthBodyTooLarge
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{bytes.NewReader(buf), r.Body}
	return buf, nil
}

// errAuthBodyTooLarge: the request body is over forwardBody.maxSize, which
// the API has the filter refuse (413).
var errAuthBodyTooLarge = errors.New("request body larger than the external auth filter's forwardBody.maxSize")

// askHTTP asks ea's HTTP authorization server about r: on its 200, r gets
// the answer's headers; another answer is the client's (denied).
func (h *Handler) askHTTP(ctx context.Context, x *exchange, r *http.Request, ea *snapshot.ExternalAuth, body []byte) (denied *localAnswer, err error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Routing.ExternalAuthTimeout)
	defer cancel()
	// The method routes matched: a WebSocket's GET, whichever HTTP the
	// app speaks.
	ar, err := http.NewRequestWithContext(ctx, routes.MethodOf(r), "/", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("external auth request: %w", err)
	}
	// The path as routes matched it (and the GRPC protocol's CheckRequest
	// has it): encoded as the app encoded it — decoded, "/a%2Fb" reached
	// the server as "/a/b", another path than the one routed and
	// forwarded — its dot segments resolved.
	path := ea.PathPrefix + x.r.d.RequestPath
	ar.URL.Path, ar.URL.RawPath = path, path
	if p, err := url.PathUnescape(path); err == nil {
		ar.URL.Path = p
	}
	ar.URL.RawQuery, ar.Host = r.URL.RawQuery, r.Host
	for _, k := range ea.AllowedHeaders {
		k = http.CanonicalHeaderKey(k)
		if vv, ok := r.Header[k]; ok {
			ar.Header[k] = vv
		}
	}
	if vv, ok := r.Header["Authorization"]; ok {
		ar.Header["Authorization"] = vv
	}
	removeHopByHop(ar.Header)
	resp, answer, err := h.sendAuth(x, ea, ar, r.ProtoMajor)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		copyAuthHeaders(r.Header, resp.Header, ea.AllowedResponseHeaders)
		return nil, nil
	}
	removeHopByHop(resp.Header)
	delete(resp.Header, "Content-Length")
	return &localAnswer{status: resp.StatusCode, header: resp.Header, body: answer}, nil
}

// sendAuth sends ar, whose URL holds the path and query, to an endpoint
// of ea's backend, in HTTP version protoMajor unless the backend demands
// one, and returns the answer with its body read (up to authAnswerLimit).
func (h *Handler) sendAuth(x *exchange, ea *snapshot.ExternalAuth, ar *http.Request, protoMajor int) (*http.Response, []byte, error) {
	be := x.v.Backends.Get(ea.Backend)
	switch {
	case be == nil:
		return nil, nil, fmt.Errorf("external auth backend %s: %w", ea.Backend, upstream.ErrNoEndpoints)
	case be.Err != nil:
		return nil, nil, fmt.Errorf("external auth backend %s: %w", ea.Backend, be.Err)
	}
	c := be.Picker.Pick()
	if c == nil {
		return nil, nil, fmt.Errorf("external auth backend %s: %w", ea.Backend, upstream.ErrNoEndpoints)
	}
	rt := be.RoundTripper(WireFor(be, protoMajor, false))
	resp, err := rt.RoundTrip(authTo(ar, be, c))
	// As for a backend (Handler.roundTripAny): a failed connect sent
	// nothing, so endpoints the ask has not tried are tried, three in all
	// (balance.Tried says why ejection does not suffice).
	var tried balance.Tried
	tries := be.Picker.Tries(c)
	for i := 1; err != nil && i < tries && upstream.NoConnection(err); i++ {
		tried.Add(c.Endpoint.Addr)
		c = be.Picker.Untried(tried, be.Picker.Pick)
		resp, err = rt.RoundTrip(authTo(ar, be, c))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("external auth backend %s: %w", ea.Backend, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, authAnswerLimit+1))
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("external auth backend %s: read answer: %w", ea.Backend, err)
	case len(answer) > authAnswerLimit:
		return nil, nil, fmt.Errorf("external auth backend %s: answer body over %d bytes", ea.Backend, authAnswerLimit)
	}
	return resp, answer, nil
}

// authTo readies ar, whose URL holds the path and query, for endpoint c
// of be, with a body of its own (ar's bytes, unread).
func authTo(ar *http.Request, be *upstream.Backend, c *balance.Choice) *http.Request {
	o := ar.WithContext(upstream.WithEndpoint(ar.Context(), c))
	o.URL = upstreamURL(ar.URL, be.Scheme(), c.Host)
	o.Body, _ = ar.GetBody() // a bytes.Reader's: never fails
	return o
}

// authAnswerLimit bounds the authorization server's answer body the proxy
// holds to pass on.
const authAnswerLimit = 64 << 10

// copyAuthHeaders copies the headers of the server's 200 into the request
// to the backend: those allowed but the framing fields (framingField) and
// Host, or all but Host and the answer's own hop-by-hop, framing and Date
// fields, which would misdescribe the request. Host is the request's
// authority, which net/http keeps outside the header map: copied, the fast
// path sent it as a second Host line, which a backend must refuse (RFC
// 9112 §3.2); the GRPC protocol's answers cannot set it either
// (applyHeaderOptions).
func copyAuthHeaders(dst, src http.Header, allowed []string) {
	if len(allowed) > 0 {
		for _, k := range allowed {
			k = http.CanonicalHeaderKey(k)
			if vv, ok := src[k]; ok && !framingField(k) && k != "Host" {
				dst[k] = vv
			}
		}
		return
	}
	removeHopByHop(src)
	for k, vv := range src {
		switch k {
		case "Host", "Content-Length", "Content-Type", "Date":
			continue
		}
		dst[k] = vv
	}
}

// framingField reports whether k (canonical) frames a message's body
// (RFC 9112 §6): the proxy writes those of a request from its own body,
// never from an authorization server's answer. Copied, the server's
// Content-Length went out on a bodiless request written by the fast path,
// and the backend read the next request on the connection as its body.
func framingField(k string) bool { return k == "Content-Length" || k == "Transfer-Encoding" }
