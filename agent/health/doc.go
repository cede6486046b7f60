// Package health answers the kubelet's probes. /healthz says the process
// serves HTTP (liveness: restarting an agent that answers would not help);
// /readyz runs every registered readiness check and answers 200 only when
// all pass, naming each check and, for a failing one, why, in the style of
// the kube-apiserver's /readyz?verbose.
//
// It only reports what the checks return. It must not decide what "ready"
// means for a component (the caller registers the checks) or start
// servers.
package health
