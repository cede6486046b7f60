// Package introspect is the agent's read-only introspection API: what an
// operator asks a running agent, answered from what it holds — the
// Snapshot it serves and since when, which pods are enrolled and where
// their proxy listens, what the datapath holds (hooks, programs, links and
// pins, captured services, enrolments, decision counters node-wide and per
// pod and Service, other programs on its hooks), the proxy's load, the
// recent warnings and errors of every component, an explanation of one
// pod's connections to one destination (agent/explain), which optional
// kinds the kubernetes source watches, what the leader's status and
// generated-Service writes hold back (agent/controlplane's Writes), the
// objects whose translation panicked (its Failures), and the agent's
// metrics with their catalog.
//
// Sources says where each part comes from; the agent fills it once, and
// its methods (Report, Status, Snapshot, Counters, Explain) read them at
// call time. Package httpapi serves them to sockmeshctl. Private keys are
// redacted from every answer.
//
// Recent errors come from the logs: Events.Handler wraps the agent's slog
// handler and keeps the last warnings and errors, so no component needs a
// second error channel. Catalog is the agent's metrics registry, which
// remembers every metric registered on it (docs/metrics.md is checked
// against it).
//
// It only reads: nothing here changes the agent's state, and it must not
// serve anything over the network itself (httpapi does).
package introspect
