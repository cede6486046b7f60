// Package upstream is the proxy's side toward backends: for each backend of a
// snapshot it holds the endpoint picker, the TLS origination built once from
// the backend's policy, and the bounded connection pools that requests
// share: the HTTP/1.1 pool (package pool) that the proxy's fast path takes
// connections from (GetH1) and every other HTTP/1.1 request goes through
// (RoundTripper), and net/http's Transports for HTTP/2 multiplexing, which
// dial an endpoint one connection at a time, and whose connections are
// each set aside (h2drain.Upstream: no new request, closed
// once the last ends) when the certificate chain it verified expires, or
// when a snapshot retires its wire. A request such a Transport would send
// again (its stream refused, which the backend never processed) it sends
// again at once, up to MaxResends times, where the Transport backs off.
//
// A Set is built per snapshot; a backend whose wire settings (protocol, TLS)
// did not change keeps its pools and TLS session caches across snapshots, so
// an endpoint update does not cost every client a fresh handshake. When only
// its TLS settings changed, its pooled connections that the new settings
// still verify (upstreamtls.Keeper) stay, idle HTTP/1.1 ones and net/http's
// HTTP/2 Transports with theirs; an HTTP/2 one they do not verify is set
// aside with a GOAWAY slipped into what the Transport reads
// (h2drain.Upstream), to close once its requests end.
//
// Errors are classified here, once, into the reasons and HTTP statuses users
// see (Classify); a TLS 1.3 handshake whose backend judges the client
// certificate after it is settled by the connection's first read or failed
// write, on every path (Settle), so that a refusal is a handshake's. It must never dial anything but a backend's endpoints, and
// never fall back to cleartext when TLS cannot be honoured.
package upstream
