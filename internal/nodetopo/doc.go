// Package nodetopo builds the one-node topology the agent's command tests
// and the demo run on: a "node" network namespace (standing in for a
// node's root namespace) holding the node IP on lo, a client pod and a
// backend pod, each on a veth to the node with a default route through it.
//
// Addresses come from 10.<octet>.0.0/16 for an octet the caller owns
// alone in the repository, so that concurrent tests never make a pod
// address ambiguous; New claims the range on the machine (a second run of
// the same tests, from another checkout, waits rather than give the same
// pod addresses to a second set of namespaces). It builds on
// internal/sandbox, whose cleanups remove everything; it must not start
// processes or touch the host's namespaces.
package nodetopo
