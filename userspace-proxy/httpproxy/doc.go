// Package httpproxy is the proxy's L7 path: it forwards each request from a
// redirected client connection to a backend endpoint
// over the wire the backend's properties ask for — HTTP/1.1 or HTTP/2 over
// TLS by ALPN, h2c with prior knowledge, gRPC with trailers and streaming,
// WebSocket (HTTP/1.1 Upgrade relayed, and RFC 8441 extended CONNECT from
// HTTP/2 clients bridged to an HTTP/1.1 Upgrade; toward a backend declared
// HTTP/2, either as an extended CONNECT: WireFor), server-sent events streamed
// without buffering — and maps failures to the statuses users can act on
// (for gRPC requests, a trailers-only UNAVAILABLE — DEADLINE_EXCEEDED for a
// route's timeout — whose message names the reason, which gRPC clients show
// where an HTTP 503 would be "unexpected content-type"; for a call whose
// stream the backend resets, the status
// gRPC maps the reset's code to, as a client of the backend would read it:
// grpcstatus.go).
//
// Requests to a Service port with GAMMA routes (HTTPRoute, GRPCRoute with a
// Service parent) follow the decision of package routes, for the client's
// namespace, after the rule's ExternalAuth server let the request go on
// (extauth.go, extauth_grpc.go): a local answer (404, 500, a redirect, a CORS preflight's 200;
// trailers-only gRPC statuses for gRPC clients) or a forward to the chosen
// backend with the rule's header changes, CORS headers, rewrites, mirrors
// (mirror.go), session persistence, timeouts and retries (policy.go). A
// port without routes pays one nil check per request for all of it.
// Before routes, a TRACE or OPTIONS request whose Max-Forwards is 0 is
// answered by the proxy as its final recipient (maxforwards.go).
//
// It has two front ends sharing routing, header rules, failure answers and
// metrics: Handler.ServeHTTP, an http.Handler behind net/http's server (HTTP/2
// apps), which reads the connection's Target from the connection context
// and sends requests through upstream.Backend.RoundTripper (HTTP/1.1 over
// the pool the fast path uses, HTTP/2 over net/http's Transport);
// and Handler.ServeHTTP1, the HTTP/1 fast path, which serves one HTTP/1.x
// client connection in one goroutine over pooled upstream HTTP/1.1
// connections (net/http's Transport only for h2/h2c backends).
//
// net/http parses HTTP (ReadRequest, ReadResponse, Request.Write, the
// server and the Transport); the fast path writes only the framing of what
// they parsed, but for heads of the common shape (bodiless GET and HEAD
// requests, others with one Content-Length, answers with one
// Content-Length), which it checks and forwards
// as they came when it needs none of their fields but an MCP session ID,
// rewritten in place (h1head.go: what it
// takes, net/http reads alike — FuzzPlainRequest, FuzzPlainAnswer). It must not dial anything but the
// endpoints upstream.Backend hands out, and never answers a fail-closed
// backend with anything but 503 (UNAVAILABLE for gRPC).
package httpproxy
