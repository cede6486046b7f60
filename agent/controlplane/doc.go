// Package controlplane is the agent's reconcile loop: it waits for a
// config source (and the DNS resolver, and the watch of the node's
// addresses) to signal a change, translates the source's objects, numbers
// and publishes the resulting Snapshot to the data planes, and hands
// translate's status and generated-Service wishes to the writers while this
// agent holds the writer lease.
//
// The writers pass each object's write through a Gate, which retries an
// object whose write failed alone by itself and holds back a resource RBAC
// refuses until an access review allows it; only the API server's own
// trouble holds every write back. Writes reports what the Gate of the
// term under way holds back (sockmeshctl status), Failures the objects whose
// translation panicked at the last translation. A panic in translate or
// in a write is an error, never the agent's end: the agent serves its
// node's proxy too.
//
// Translate judges some objects by the time (a client or CA certificate
// expired or not yet valid); the loop translates again when the earliest
// such judgement flips (Result.ChangesAt), on one timer that each translation
// resets, so status and Snapshot follow the clock though no object
// changes. The same timer translates again after Config.Resync (10
// minutes) with no signal, since the source signals of status alone only
// the removal of sockmesh's entries: one that another party rewrote in
// place comes back.
//
// Versions increase by one with every published Snapshot; a rebuild that
// yields the same Snapshot publishes nothing. Subscribers read the current
// Snapshot by atomic pointer and wait on a channel that is closed when a
// newer one is published.
//
// It must not decide policy (translate does), talk to the data planes
// (they subscribe) or write to the cluster itself (the writers do).
package controlplane
