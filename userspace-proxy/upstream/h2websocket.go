package upstream

import (
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sockmesh/sockmesh/userspace-proxy/h2connect"
)

// WebSocketH2 returns the RoundTripper of WebSocket upgrades toward b over
// HTTP/2 (WireH2): the HTTP/1.1 Upgrade request it is given (GET with
// Connection: Upgrade, Upgrade: websocket and a Sec-WebSocket-Key) goes
// out as an RFC 8441 extended CONNECT on a connection of its own, h2c with
// prior knowledge or h2 by ALPN over TLS, and the backend's answer comes
// back as an HTTP/1.1 one: a 2xx as the 101 Switching Protocols that key
// asked for (RFC 6455 §4.2.2), whose Body is the stream, an
// io.ReadWriteCloser that half-closes (CloseWrite: END_STREAM); another
// status as it is, its body the stream's DATA. Envoy's HTTP/2 codec turns
// an HTTP/1.1 upgrade into extended CONNECT and back the same way. A
// backend whose SETTINGS do not enable extended CONNECT gets the HTTP/1.1
// Upgrade instead (h1Fallback), and its endpoint gets the WebSockets of
// the next refusedFor so, without an HTTP/2 connection to ask again.
func (b *Backend) WebSocketH2() http.RoundTripper { return webSocketH2{b} }

// ErrNoExtendedConnect marks a WebSocket toward an HTTP/2 backend whose
// SETTINGS do not carry SETTINGS_ENABLE_CONNECT_PROTOCOL=1 (RFC 8441 §3)
// and that did not take its HTTP/1.1 Upgrade either (ReasonProtocol).
var ErrNoExtendedConnect = h2connect.ErrNotSupported

type webSocketH2 struct{ b *Backend }

func (t webSocketH2) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.b.Err != nil {
		return nil, t.b.Err
	}
	key := req.Header.Get("Sec-WebSocket-Key")
	if key == "" || !httpguts.HeaderValuesContainsToken(req.Header["Upgrade"], "websocket") {
		return nil, errors.New("websocket over http/2: not a websocket upgrade")
	}
	picked, err := endpointFor(req.Context(), req.URL.Host)
	if err != nil {
		return nil, err
	}
	if at, ok := t.b.w.noXConnect.refused(picked.Endpoint.Addr); ok {
		return t.h1Fallback(req, fmt.Errorf("%w (its SETTINGS at %s)", h2connect.ErrNotSupported, at.Format(time.RFC3339)))
	}
	start := time.Now()
	conn, err := t.b.w.dialH2(req.Context(), picked, WireH2)
	if err != nil {
		return nil, err
	}
	authority := req.Host
	if authority == "" {
		authority = req.URL.Host
	}
	resp, err := h2connect.Open(req.Context(), conn, &h2connect.Request{Protocol: "websocket", Scheme: req.URL.Scheme,
		Authority: authority, Path: req.URL.RequestURI(), Header: connectFields(req.Header)}, t.b.w.p.connectConfig())
	switch {
	case errors.Is(err, h2connect.ErrNotSupported):
		t.b.w.noXConnect.remember(picked.Endpoint.Addr)
		return t.h1Fallback(req, err)
	case errors.Is(err, h2connect.ErrNoSettings) && req.Context().Err() == nil:
		// As a TLS handshake that does not end (dial): the endpoint's
		// kernel took the connection, but nothing serves it. No byte of
		// the request went: another endpoint may serve, and it is ejected.
		err = fmt.Errorf("websocket over http/2 to %s: %w", picked.Endpoint.Addr, err)
		t.b.w.eject(picked.Endpoint, start, err)
		return nil, &dialError{err: err}
	case err != nil:
		return nil, fmt.Errorf("websocket over http/2: %w", err)
	}
	resp.Request = req
	if resp.StatusCode < http.StatusOK || resp.StatusCode >= http.StatusMultipleChoices {
		return resp, nil
	}
	// The 101 carries the 2xx's fields (the subprotocol and extensions
	// chosen, cookies) and HTTP/1.1's own.
	resp.Status, resp.StatusCode = "101 Switching Protocols", http.StatusSwitchingProtocols
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	resp.Header.Del("Content-Length")
	resp.Header["Connection"] = []string{"Upgrade"}
	resp.Header["Upgrade"] = []string{"websocket"}
	resp.Header["Sec-Websocket-Accept"] = []string{WebSocketAccept(key)}
	return resp, nil
}

// connectConfig bounds an extended CONNECT's connection as the pools'
// other connections are: its SETTINGS within HandshakeTimeout, as a TLS
// handshake (both are the connection's setup, before a byte of the
// request), its silences as the HTTP/2 Transport's (H2PingAfter,
// H2PingTimeout). The answer's wait is the request context's, as an
// HTTP/1.1 Upgrade's 101 is, with the connection's PINGs.
func (p *Pools) connectConfig() h2connect.Config {
	return h2connect.Config{SettingsTimeout: p.cfg.HandshakeTimeout, PingAfter: p.cfg.H2PingAfter,
		PingTimeout: p.cfg.H2PingTimeout, Panics: p.cfg.Panics}
}

// h1Fallback sends req, a WebSocket's Upgrade, over HTTP/1.1 to the
// endpoint whose HTTP/2 SETTINGS said it takes no extended CONNECT: what
// every WebSocket to such a backend got before sockmesh spoke RFC 8441.
// Such backends — Go's net/http server without GODEBUG=http2xconnect=1,
// nginx — mostly serve HTTP/1.1 on the same port, and a WebSocket they
// served must not start failing because the backend also declared HTTP/2;
// the declared protocol was offered first, as the XBackend API asks. One
// that does not take the Upgrade either fails with both reasons.
func (t webSocketH2) h1Fallback(req *http.Request, h2err error) (*http.Response, error) {
	resp, err := h1Transport(t).RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("websocket over http/2: %w; over http/1.1: %w", h2err, err)
	}
	return resp, nil
}

// refusedFor is how long an endpoint whose SETTINGS refused extended
// CONNECT gets WebSockets as HTTP/1.1 Upgrades without being asked again,
// as long as an endpoint that declined h2 by ALPN is taken to speak
// HTTP/1.1 (h1OnlyFor): asking costs the endpoint an HTTP/2 connection
// (preface, SETTINGS) per WebSocket, a reconnecting client's included;
// asking again after a while notices a backend upgraded in place (its pod
// keeping its address) to take RFC 8441. A new pod, or changed protocol or
// TLS settings (a new wireState), is asked at once.
const refusedFor = time.Minute

// refusals remembers when each endpoint's SETTINGS last refused extended
// CONNECT. It holds only those that did within refusedFor: each refusal
// it is told of first forgets those older, so endpoints that came and
// went take no memory past that. The zero value is empty, on the wall
// clock.
type refusals struct {
	mu sync.Mutex
	at map[netip.AddrPort]time.Time
	// now is the clock; nil means time.Now (tests set it).
	now func() time.Time
}

func (r *refusals) clock() time.Time {
	if r.now == nil {
		return time.Now()
	}
	return r.now()
}

// refused reports whether ep refused within refusedFor, and when.
func (r *refusals) refused(ep netip.AddrPort) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.at[ep]
	return at, ok && r.clock().Sub(at) < refusedFor
}

// remember records that ep refused now.
func (r *refusals) remember(ep netip.AddrPort) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock()
	maps.DeleteFunc(r.at, func(_ netip.AddrPort, at time.Time) bool { return now.Sub(at) >= refusedFor })
	if r.at == nil {
		r.at = make(map[netip.AddrPort]time.Time)
	}
	r.at[ep] = now
}

// connectFields are an Upgrade request's fields as an extended CONNECT
// carries them: without HTTP/1.1's connection-specific ones, which HTTP/2
// forbids (RFC 9113 §8.2.2), Host (the :authority), and the handshake's
// key, which RFC 8441 §5 drops (the stream is the proof).
func connectFields(h http.Header) http.Header {
	out := h.Clone()
	for _, k := range []string{"Connection", "Upgrade", "Host", "Sec-Websocket-Key", "Keep-Alive",
		"Proxy-Connection", "Transfer-Encoding", "Te"} {
		delete(out, k)
	}
	return out
}

// WebSocketAccept is RFC 6455 §4.2.2's Sec-WebSocket-Accept for key.
func WebSocketAccept(key string) string {
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(sum[:])
}
