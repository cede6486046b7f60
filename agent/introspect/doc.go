// Package introspect gathers what an operator asks a running agent — the
// Snapshot it serves and since when, which pods are enrolled and where
// their proxy listens, what the datapath holds (captured services,
// enrolments, per-decision counters, other programs on its hooks) and the
// recent warnings and errors of every component — into one Report that the
// agent's introspection API (sockmeshctl, issue 7) serves.
//
// Recent errors come from the logs: Events.Handler wraps the agent's slog
// handler and keeps the last warnings and errors, so no component needs a
// second error channel.
//
// It only reads. It must not change the agent's state or serve anything
// over the network itself.
package introspect
