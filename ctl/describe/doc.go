// Package describe computes what sockmeshctl describe shows: the effective
// backend properties of a Service, and what a BackendTLSPolicy, XBackend
// or HTTPRoute does, like gwctl shows effective policies — which policy
// won a conflict and why, which ports are captured, what the proxy will
// do.
//
// Load lists the objects translate reads from the API server (of
// ConfigMaps and Secrets, those internal/tlsrefs lists, as the agent
// does); Service, BackendTLSPolicy, XBackend and HTTPRoute run the agent's
// own pure translate over them and read its Result. It must not hold policy logic
// of its own: every decision (capture, precedence, validity) is
// translate's, every message is translate's status.
package describe
