// Package balance picks the endpoint a connection or request goes to: ready
// endpoints (or, when none is, those serving while terminating), round
// robin, passing over those whose connect failed lately (Health) — and
// over those topology hints left to other nodes or zones
// (snapshot.Endpoint.Fallback) while any of a lower level is not passed
// over — keeping
// each client on one endpoint under a Service's sessionAffinity ClientIP
// (Affinity), and, under session persistence (the backend's own, or a route
// rule's in its place), the endpoint a session cookie or header names,
// until the session's absolute timeout (Gateway API
// sessionPersistence) — and, for an MCP backend, the endpoint that issued
// a request's MCP session ID, which the answer that carried it prefixed
// with the endpoint's token (Picker.MCPSession; CutMCPSession takes the
// prefix off before the request is routed, Picker.MCPEndpoint names the
// endpoint).
//
// A pick that takes an ejected endpoint's probe (Health) gets a Choice of
// its own that names the probe, which the caller passes on to where its
// connection's outcome is known: a hand-back (Health.Reused, Canceled,
// FailedHere) returns that probe only, once, so that one from a pick that
// took none, or of a probe handed back or lost before, lets no second
// probe out. Other picks share the Picker's Choices. What settles an
// ejection is told by time, not by probe: a failed connect counts only
// when it started after the ejection ended (the probe's, or one riding
// along it), so a slow one started before settles nothing; a connect that
// reaches the endpoint ends the ejection, whichever request made it, and
// one that started before such a success (the endpoint ejected then or
// not) and fails after settles nothing either.
//
// A Picker is built per backend per snapshot and is safe for concurrent use.
// It must not dial, reads the clock only while an endpoint is ejected or
// clients are pinned (callers pass the time sessions need), and never
// returns an endpoint that is neither ready nor serving.
package balance
