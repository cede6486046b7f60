// Package explain answers "what happens when this pod connects to that
// address?" from what one agent holds: its Snapshot (which pods are
// enrolled and why not, which Service ports are captured, what the proxy
// does with each backend), the enroller's view of the pods' network
// namespaces, the datapath's maps and its per-pair decision counters.
//
// Explain is a pure function of a Query and a State: the agent's
// introspection API reads the State and serves the Explanation, and
// sockmeshctl renders it. Backend turns one Snapshot backend into the
// operator's view (protocol, wire, TLS origination, trust, fail-closed
// reason) for explain and for sockmeshctl describe alike.
//
// It must not read the kernel, the network or the clock, and it must not
// decide policy: what is captured and how comes from translate, through
// the Snapshot. Private keys never appear in its output.
package explain
