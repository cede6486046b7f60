// Package echo is sockmesh's test backend: one HTTP server that speaks
// HTTP/1.1, h2 (over TLS), h2c (prior knowledge), gRPC (an Echo service and
// the standard health service), WebSocket and server-sent events, plus a raw
// TCP echo, and answers every HTTP request with a JSON Report of what it saw
// (method, path, host, headers, protocol, the pod it claims to be, and the
// TLS details: SNI, ALPN, version, client certificate subjects and URIs).
//
// Tests, the e2e harness and benchmarks run it in-process (Server) or as the
// sockmesh-echo binary. It is test code: no limits beyond what the tests
// need, and it must never be part of the product.
package echo
