// Package apply hands every Snapshot the control plane publishes to the
// node's data planes, in an order that never opens a gap: the proxy first
// (so it knows a Service before connections to it arrive), then the
// datapath's captured services, then the enrolments. A failed step is
// retried with the same Snapshot until it succeeds or a newer one arrives.
//
// Once the first Snapshot is in place it writes the datapath heartbeat,
// which tells the eBPF programs that the proxy is alive: fail-open
// Services are redirected only while it is fresh. It stops when Run
// returns, so a stopped agent's fail-open Services go direct after
// datapath.Config.HeartbeatMaxAge, while fail-closed ones keep refusing.
//
// The empty Snapshot (version 0) is never applied: an agent that restarts
// keeps the capture its predecessor pinned until its own first Snapshot.
//
// It must not build Snapshots (the control plane does) or decide what a
// data plane does with one.
package apply
