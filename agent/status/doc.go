// Package status writes the status translate returned into the Gateway API
// objects it judged: BackendTLSPolicy and XBackendTrafficPolicy ancestors,
// XBackend ancestors, HTTPRoute and GRPCRoute parents, and XMesh conditions
// and supported features.
//
// Entries are keyed by (ancestor or parent reference, controllerName), as
// the Gateway API requires: the Writer replaces, adds and removes only the
// entries under translate.ControllerName and never touches another
// controller's, so agents that restart or take over leadership never
// duplicate an entry. A condition keeps its lastTransitionTime while its
// status stays the same (a new reason or message is written under the old
// time, as metav1.Condition defines it). Within an entry of sockmesh's,
// conditions of a domain-prefixed type other than sockmesh's own
// (another party's extensions) stay where they are: the Gateway API forbids removing or reordering
// conditions a controller is not responsible for. An object whose merged status
// equals what it has is not written at all, so a rebuild that changes
// nothing costs the API server nothing. Writes are JSON merge patches of the
// status subresource carrying the resourceVersion the merge started from:
// a concurrent change makes the API server refuse the patch, and the Writer
// merges again on the fresh object. Within a leader term the Writer
// remembers the version each write left, so the same (cached, now stale)
// objects handed again, as on a retry of the pass, are merged against
// what was written and cost nothing once written. Each object's write goes
// through the control plane's Gate, which holds back the objects whose
// write failed alone and the resources RBAC refused.
//
// It writes only what it is given. It must not decide conditions (translate
// does) or decide whether this agent may write (the caller holds the
// leader lease).
package status
