// Package apply hands every Snapshot the control plane publishes to the
// node's data planes, in an order that never opens a gap: no connection
// the datapath redirects finds the proxy without its frontend, and the
// proxy knows the pod of every client still enrolled. The proxy first
// gets a cover: the new Snapshot plus what the one it served has and the
// new one drops (a Service deleted or no longer captured, a pod no longer
// enrolled), as it was, since the datapath and the enrolments redirect to
// and from those until their own steps run. Then the datapath's captured
// services, then the enrolments, then the proxy the new Snapshot. A
// Service the new Snapshot adds or changes is thus known to the proxy,
// with its new properties, before connections to it arrive. When nothing
// is dropped the cover is the new Snapshot and the proxy gets it once;
// otherwise the cover carries the served Snapshot's version: it is not
// the new Snapshot, and nothing that compares versions (the proxy's
// metrics and logs) may take it for one.
//
// A failed step is retried with the same Snapshot until it succeeds or a
// newer one arrives; until then the proxy keeps the cover, and the next
// cover extends it, since the failed step may have left part of what it
// was to remove in place. Services the datapath's full map leaves out
// (datapath.ErrServicesLeftOut) fail no step: the map holds the rest of
// the Snapshot, whole, and nothing else; the next Snapshot tries them.
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
// It must not decide what a Snapshot holds (the control plane does; a
// cover only joins two it published) or what a data plane does with one.
package apply
