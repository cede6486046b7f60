package httpproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/routes"
)

// ExternalAuth filters with the GRPC protocol speak Envoy's ext_authz v3
// (envoy.service.auth.v3.Authorization/Check) as one unary call over the
// backend's own pool and TLS: the CheckRequest holds the request's method,
// path (as routes matched it: dot segments resolved) and query, host,
// scheme (http: an app's TLS is passed through, never
// seen here), protocol ("HTTP/1.1", "HTTP/2"), its headers as Envoy's
// filter shows them (checkHeaders: the pseudo-fields among them; the
// allowed ones; none listed: all) and the body when
// the filter forwards it. An OK lets the request on with OkHttpResponse's
// headers (set, or added where append is true; not Host, Content-Length or
// Transfer-Encoding, the request's own) and without its
// headers_to_remove; another status is denied with DeniedHttpResponse's
// status (403 when unset), headers and body. A call that fails (any gRPC
// status but the answer's own, a message that does not decode) fails
// closed as an HTTP server that cannot be asked does.

const checkPath = "/envoy.service.auth.v3.Authorization/Check"

// askGRPC asks ea's ext_authz server about r.
func (h *Handler) askGRPC(ctx context.Context, x *exchange, r *http.Request, ea *snapshot.ExternalAuth, body []byte) (denied *localAnswer, err error) {
	// The path as routes matched it (askHTTP), then the query as sent.
	path := x.r.d.RequestPath
	if r.URL.RawQuery != "" || r.URL.ForceQuery {
		path += "?" + r.URL.RawQuery
	}
	method := routes.MethodOf(r)
	headers := checkHeaders(r, method, path, ea.AllowedHeaders)
	msg, err := proto.Marshal(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Method: method, Path: path, Host: r.Host, Scheme: checkScheme,
			Protocol: protocolName(r), Headers: headers, Body: string(body), Size: int64(len(body))},
	}}})
	if err != nil {
		return nil, fmt.Errorf("external auth check request: %w", err)
	}
	// A gRPC message: uncompressed (0), its length, the message.
	frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Routing.ExternalAuthTimeout)
	defer cancel()
	ar, err := http.NewRequestWithContext(ctx, http.MethodPost, checkPath, bytes.NewReader(append(frame, msg...)))
	if err != nil {
		return nil, fmt.Errorf("external auth check request: %w", err)
	}
	ar.Header["Content-Type"], ar.Header["Te"] = []string{"application/grpc"}, teTrailers
	// The deadline, as gRPC clients (Envoy's ext_authz among them) send
	// theirs: the server stops where the proxy gives up on the ask.
	dl, _ := ctx.Deadline()
	ar.Header["Grpc-Timeout"] = []string{encodeGRPCTimeout(time.Until(dl))}
	resp, answer, err := h.sendAuth(x, ea, ar, 2)
	if err != nil {
		return nil, err
	}
	var out authv3.CheckResponse
	if err := decodeCheckResponse(resp, answer, &out); err != nil {
		return nil, fmt.Errorf("external auth backend %s: %w", ea.Backend, err)
	}
	return checkAnswer(r, &out), nil
}

// checkHeaders is the CheckRequest's headers for r, asked about as method
// and path (the query with it): the header map Envoy's ext_authz filter
// shows, so that a server written for Envoy finds what it matches on (an
// OPA policy on ":path") — r's fields as they go on, lowercased, values
// joined by ",", beside the pseudo-fields Envoy's map holds whichever HTTP
// the app speaks (":authority" for Host, which it never holds, ":method",
// ":path", ":scheme"). Those of the app's connection to the proxy go (TE
// but "trailers"), as from the forwarded request, but a WebSocket's
// "upgrade" and "connection", which go on with it: Envoy keeps an HTTP/1.1
// Upgrade's, and its HTTP/2 codec makes an extended CONNECT the GET of
// one before its filters, so an HTTP/2 app's is asked about as an HTTP/1.1
// app's, without the ":protocol" net/http's server shows among its
// fields. When the filter lists headers, only those of r go: the
// pseudo-fields always do (they repeat attributes every CheckRequest
// holds), where Envoy's gRPC filter would send them only when listed —
// the API's names are tokens (translate refuses ":path", as the
// HeaderName pattern would), so a list would leave a policy on them
// nothing to match.
func checkHeaders(r *http.Request, method, path string, allowed []string) map[string]string {
	upgrade := ""
	switch {
	case isWebSocketUpgrade(r):
		upgrade = r.Header.Get("Upgrade")
	case isExtendedConnect(r):
		upgrade = r.Header.Get(":protocol")
	}
	fields := r.Header.Clone()
	removeHopByHop(fields)
	delete(fields, ":protocol")
	if upgrade != "" {
		// As the backend gets them (outgoing, h1Conn.prepare).
		fields["Connection"], fields["Upgrade"] = connectionUpgrade, []string{upgrade}
	}
	headers := make(map[string]string, len(fields)+4)
	for k, vv := range fields {
		if len(allowed) == 0 || containsFold(allowed, k) {
			headers[strings.ToLower(k)] = strings.Join(vv, ",")
		}
	}
	if r.Host != "" { // an HTTP/1.0 request may name none
		headers[":authority"] = r.Host
	}
	headers[":method"], headers[":path"], headers[":scheme"] = method, path, checkScheme
	return headers
}

// checkScheme is every request's scheme in a CheckRequest: apps speak
// cleartext to the proxy (their TLS is passed through, never seen here).
const checkScheme = "http"

// protocolName is r's HTTP version as Envoy names it in a CheckRequest
// (AttributeContext.HttpRequest.protocol): "HTTP/1.0", "HTTP/1.1",
// "HTTP/2", where net/http says "HTTP/2.0".
func protocolName(r *http.Request) string {
	if r.ProtoMajor == 2 {
		return "HTTP/2"
	}
	return r.Proto
}

// checkAnswer applies out, the server's answer about r: on OK, r gets its
// headers and loses those it removes (nil); otherwise it returns the
// client's answer.
func checkAnswer(r *http.Request, out *authv3.CheckResponse) (denied *localAnswer) {
	if codes.Code(out.GetStatus().GetCode()) == codes.OK {
		ok := out.GetOkResponse()
		applyHeaderOptions(r.Header, ok.GetHeaders())
		for _, k := range ok.GetHeadersToRemove() {
			r.Header.Del(k)
		}
		return nil
	}
	d := out.GetDeniedResponse()
	a := &localAnswer{status: http.StatusForbidden, header: http.Header{}, body: []byte(d.GetBody())}
	if code := int(d.GetStatus().GetCode()); code >= 200 && code <= 599 {
		a.status = code
	}
	applyHeaderOptions(a.header, d.GetHeaders())
	removeHopByHop(a.header)
	delete(a.header, "Content-Length")
	return a
}

// decodeCheckResponse reads a unary call's answer: grpc-status 0 (in the
// trailers, or the headers of a trailers-only answer) and one
// uncompressed message.
func decodeCheckResponse(resp *http.Response, answer []byte, out *authv3.CheckResponse) error {
	st := resp.Trailer.Get("Grpc-Status")
	if st == "" {
		st = resp.Header.Get("Grpc-Status")
	}
	switch {
	case resp.StatusCode != http.StatusOK || !isGRPCType(resp.Header):
		return fmt.Errorf("check answered HTTP %d %q, not gRPC", resp.StatusCode, resp.Header.Get("Content-Type"))
	case st != "0":
		return fmt.Errorf("check failed: grpc-status %q: %s", st, resp.Trailer.Get("Grpc-Message")+resp.Header.Get("Grpc-Message"))
	case len(answer) < 5 || answer[0] != 0 || int(binary.BigEndian.Uint32(answer[1:5])) != len(answer)-5:
		return errors.New("check answer is not one uncompressed gRPC message")
	}
	if err := proto.Unmarshal(answer[5:], out); err != nil {
		return fmt.Errorf("decode check response: %w", err)
	}
	return nil
}

// applyHeaderOptions applies ext_authz header options to h: a value set,
// or added where append is true (ext_authz makes false its default). The
// framing fields are the proxy's to write (framingField), and Host is the
// request's authority.
func applyHeaderOptions(h http.Header, opts []*corev3.HeaderValueOption) {
	for _, o := range opts {
		k, v := http.CanonicalHeaderKey(o.GetHeader().GetKey()), o.GetHeader().GetValue()
		if v == "" {
			v = string(o.GetHeader().GetRawValue())
		}
		switch {
		case k == "" || k == "Host" || framingField(k):
		//lint:ignore SA1019 ext_authz servers (Envoy's own filter too) still say append with it; its successor, append_action, defaults to appending where ext_authz's append defaults to setting
		case o.GetAppend().GetValue():
			h[k] = append(h[k], v)
		default:
			h[k] = []string{v}
		}
	}
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}
