// Package balance picks the endpoint a connection or request goes to: ready
// endpoints only, round robin, and, under session persistence (the
// backend's own, or a route rule's in its place), the endpoint a session
// cookie or header names, until the session's absolute or idle timeout
// (Gateway API sessionPersistence).
//
// A Picker is built per backend per snapshot and is safe for concurrent use.
// It must not dial, never reads the clock (callers pass the time), and never
// returns an endpoint that is not ready.
package balance
