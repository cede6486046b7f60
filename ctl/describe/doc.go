// Package describe computes what sockmeshctl describe shows: the effective
// backend properties of a Service, and what a BackendTLSPolicy, XBackend,
// HTTPRoute or GRPCRoute does, like gwctl shows effective policies — which
// policy won a conflict and why, which ports are captured, what the proxy
// will do.
//
// Load lists the objects translate reads from the API server (of
// ConfigMaps and Secrets, those internal/tlsrefs lists, as the agent
// does); New runs the agent's own pure translate over them once, and
// Service, BackendTLSPolicy, XBackend, HTTPRoute and GRPCRoute read its
// Result. It must not hold policy logic of its own: every decision
// (capture, precedence, validity) is translate's, every message is
// translate's status.
package describe
