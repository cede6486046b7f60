// Package routes decides what happens to one HTTP request sent to a
// captured Service port that mesh routes (GAMMA HTTPRoute, GRPCRoute)
// govern: which rule matches, and then a local answer (404, 500, a
// redirect with its Location, a CORS preflight's) or a forward to a backend chosen by weight
// (or the one a request's session must stay on, Request.Keep),
// with the request and response changes, mirrors, external authorization, timeouts, retry policy
// and session persistence the rule asks for.
//
// It is pure decision logic over a snapshot.Snapshot: no sockets, no
// clock, no goroutines; randomness comes in through Rand. Compile builds a
// Table once per Snapshot (regular expressions are compiled there); the
// per-request path (Lookup, Decide) allocates nothing for a match and a
// forward without rewrites. It must not dial, retry, mirror or time out
// anything itself: the proxy executes a Decision.
//
// Matching follows the Snapshot's order, which translate built from the
// Gateway API's precedence; the first match wins. Paths are compared after
// RFC 3986 normalization (percent-encoded unreserved characters decoded,
// hex digits upper-cased, dot segments removed; an encoded "/" stays
// encoded and never splits a segment), applied alike to the request path
// and to Exact and PathPrefix values, so "/%61dmin" cannot slip past a rule
// for "/admin". Regular expressions are RE2 matching the whole value.
// "OPTIONS *" (RFC 9112 §3.2.4) names the server, not a path: only the "/"
// prefix, the API's default match "of every HTTP request", matches it; it
// is forwarded as "*" (a path rewrite has nothing to change) and a
// redirect's Location names the root. A CORS preflight belongs to the
// rule that would take the request it announces (the method it asks for;
// a header match met by a name it lists too, or by a CORS-safelisted
// header, which a browser does not list), when that rule has a CORS
// filter; otherwise it meets the rules as the OPTIONS it is.
//
// # How the proxy uses it
//
// Per Snapshot: table := Compile(s), published with s. Per request, with
// the frontend f the connection's original destination selects in s and
// the namespace of the client's Workload ("" when unknown):
//
//	set := table.Lookup(f, clientNamespace)
//	if set == nil { /* no route: f.Backend, as without GAMMA */ }
//	req := FromHTTP(r)
//	var d Decision
//	set.Decide(&req, GlobalRand{}, &d)
//
// then by d.Action: Respond writes d.Status with the headers of
// d.ApplyResponse (a gRPC request gets a trailers-only answer with grpc-status
// d.GRPCStatus); Redirect writes
// d.Status with Location d.Location after d.ApplyResponse; Preflight
// writes d.Status with the headers of d.ApplyResponse; Forward sends
// to d.Backend's endpoints (picked with d.SessionPersistence when set,
// else the backend's own), after d.ApplyRequest on the outgoing request,
// copies it to d.Mirrors (responses dropped), bounds the exchange by
// d.Timeouts, retries per d.Retry, and calls d.ApplyResponse on the
// response headers before writing them, or on those of its own answer
// when forwarding failed.
package routes
