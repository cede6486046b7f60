// Package h2connect opens one RFC 8441 extended CONNECT stream (WebSocket
// over HTTP/2) on an HTTP/2 connection of its own, and carries its bytes
// both ways with HTTP/2's flow control: the proxy's side toward a backend
// that declared HTTP/2 (h2c with prior knowledge, or h2 by ALPN over TLS),
// to which an HTTP/1.1 Upgrade cannot go.
//
// It exists because net/http's HTTP/2 client, which speaks RFC 8441 inside,
// refuses the :protocol pseudo-header its callers would have to set (its
// header check rejects the field name: go.dev/issue/53208), and
// golang.org/x/net/http2's Transport now wraps it. It uses x/net/http2's
// Framer and HPACK for the wire; it parses nothing itself.
//
// The backend is untrusted input: what it may hold in the proxy is bounded
// by the windows the proxy grants (256 KiB of DATA) and the head's limit
// (1 MiB, 1xx answers included); a breach of RFC 9113 or RFC 8441 — a
// frame out of place, a setting out of range, DATA past a window, a window
// past 2^31-1 — ends the connection with a GOAWAY carrying its code
// (ErrProtocol), as Go's HTTP/2 client does. The wait for its SETTINGS is
// bounded (Config.SettingsTimeout), its answer's by Open's context, and a
// silence of the connection's by a PING (Config.PingAfter, PingTimeout),
// as net/http's HTTP/2 client pings: a backend gone with its node ends the
// stream rather than holding it until TCP gives up.
//
// It must not multiplex: one connection carries one stream, as an
// HTTP/1.1 connection carries one upgraded WebSocket, so a stream's end or
// reset ends its connection and nothing else.
package h2connect
