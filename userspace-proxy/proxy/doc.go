// Package proxy is sockmesh's per-node proxy: the object the agent builds
// once and feeds. It accepts redirected connections, recovers their original
// destination, looks it up in the current Snapshot, sniffs the first bytes
// and sends the connection down one of these paths:
//
//   - passthrough: the app already speaks TLS; its bytes go to an endpoint
//     untouched (never TLS inside TLS);
//   - L4: opaque TCP, cleartext HTTP that needs nothing, and HTTP/2 apps
//     whose backend takes h2 as is; bytes are relayed with pooled buffers,
//     wrapped in TLS when the backend asks, with session resumption;
//   - http1 (package httpproxy, ServeHTTP1): HTTP/1.x apps whose backend
//     needs TLS origination or anything L7 (GAMMA routes, fail-closed 503s,
//     session persistence, protocol translation, WebSocket): requests
//     forwarded one by one over pooled upstream connections, by default;
//   - L7 (package httpproxy through net/http's server): HTTP/2 apps that
//     need L7 (routes, h2c to h2, extended CONNECT bridged to a WebSocket
//     Upgrade).
//
// On a port with routes, HTTP takes an L7 path; the app's own TLS and
// other bytes go to the Service's own backend as without routes.
//
// Which path wins where was measured with test/bench/proxy; HTTP1TLSAuto
// and ListenConfig say why.
//
// Lifecycle, as the agent uses it:
//
//	p, err := proxy.New(cfg, logger, registerer)
//	p.Update(snap)                  // on every new snapshot (atomic swap)
//	go p.Serve(nodeListener)        // node-IP mode: client found by source IP
//	go p.ServePod(podListener, pod) // in-pod mode: the listener knows its pod
//	p.Shutdown(ctx)                 // drain, then force-close at ctx's end
//
// The process must start with GODEBUG containing http2xconnect=1 for HTTP/2
// clients to open WebSockets (RFC 8441): net/http reads it once at init.
//
// The proxy never relays a connection without a recorded original
// destination, never dials a Service address (only endpoints from the
// snapshot), and never sends cleartext to a backend whose TLS settings are
// invalid.
package proxy
