// Package upstreamtls turns a backend's snapshot.TLS into the crypto/tls
// client configuration the proxy originates with: SNI, trust roots (a PEM
// bundle or the system pool), subjectAltName verification (Hostname and URI
// SANs replace the hostname check), the client certificate for mutual TLS
// (sent, and its sessions resumed, only within its validity; a
// handshake's watch tells whether the server asked for one),
// version/cipher/curve options, ALPN per wire protocol, and a session cache
// per endpoint so resumption works when a backend has several pods.
//
// Configs are built once per backend per snapshot (New), never per
// connection. Anything that cannot be honoured is an error from New: the
// caller must fail closed on it, never fall back to cleartext. When a
// backend's settings change, a Keeper re-verifies under the new ones what a
// connection's handshake settled, each distinct certificate chain once,
// so that only the connections they no longer accept are closed. This package does no I/O and knows nothing of
// HTTP beyond ALPN names.
package upstreamtls
