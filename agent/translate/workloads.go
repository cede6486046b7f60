package translate

import (
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// workloads lists the pods on this node (Input.Node.Name; every pod when it
// is empty) and decides which are enrolled:
//   - a pod with IPs whose phase is Pending or Running is enrolled — Pending
//     too, so that capture starts as soon as the kubelet publishes an
//     address, which it may do only after the first container started: a
//     pod's first connections can go uncaptured (docs/failures.md);
//     succeeded, failed and unknown pods are not;
//   - LabelCapture "disabled" on the pod or its namespace opts it out (an
//     opt-out on either wins);
//   - a hostNetwork pod shares the node's network namespace, so enrolling it
//     captures every host process: only LabelCapture "enabled" on the pod
//     itself opts it in.
func workloads(in Input) []snapshot.Workload {
	disabledNS := map[string]bool{}
	for _, ns := range in.Namespaces {
		if ns != nil && ns.Labels[LabelCapture] == "disabled" {
			disabledNS[ns.Name] = true
		}
	}
	var out []snapshot.Workload
	seen := map[snapshot.ObjectRef]bool{}
	for _, p := range sortedObjects(in.Pods) {
		if in.Node.Name != "" && p.Spec.NodeName != in.Node.Name {
			continue
		}
		ref := snapshot.ObjectRef{Namespace: p.Namespace, Name: p.Name}
		if seen[ref] {
			continue
		}
		seen[ref] = true
		w := snapshot.Workload{
			Pod:            ref,
			UID:            string(p.UID),
			ServiceAccount: p.Spec.ServiceAccountName,
			IPs:            podIPs(p),
			HostNetwork:    p.Spec.HostNetwork,
			SandboxReady:   sandboxReady(p),
		}
		w.NotEnrolled = notEnrolled(p, disabledNS[p.Namespace], len(w.IPs) > 0)
		w.Enrolled = w.NotEnrolled == ""
		out = append(out, w)
	}
	return out
}

// notAddressed is why a pod every other rule enrols is not enrolled: the
// API server has no address for it yet.
const notAddressed = "the pod has no IP address yet"

// EnrolledOnceAddressed reports whether w, a workload Translate listed, is
// enrolled, or will be once the API server publishes the pod's address:
// every rule of workloads holds but that one. The agent enrols the network
// namespace the CNI plugin hands over while the pod's sandbox is made on
// this word, before the address is published.
func EnrolledOnceAddressed(w snapshot.Workload) bool {
	return w.Enrolled || w.NotEnrolled == notAddressed
}

// notEnrolled says why the pod is not enrolled, or "" when it is (the rules
// of workloads, in the order an operator would look; the address last, for
// EnrolledOnceAddressed).
func notEnrolled(p *corev1.Pod, namespaceDisabled, hasIPs bool) string {
	label := p.Labels[LabelCapture]
	switch {
	case label == "disabled":
		return "the pod has the label " + LabelCapture + "=disabled"
	case namespaceDisabled:
		return "its namespace has the label " + LabelCapture + "=disabled"
	case p.Spec.HostNetwork && label != "enabled":
		return "a hostNetwork pod shares the node's network namespace; only the label " + LabelCapture + "=enabled on the pod enrols it"
	case p.Status.Phase != corev1.PodPending && p.Status.Phase != corev1.PodRunning:
		phase := string(p.Status.Phase)
		if phase == "" {
			phase = "unknown"
		}
		return "the pod's phase is " + phase + " (only Pending and Running pods are enrolled)"
	case !hasIPs:
		return notAddressed
	}
	return ""
}

// sandboxReady is when the kubelet last set the pod's
// PodReadyToStartContainers condition True: when its sandbox was created and
// its network configured. A sandbox the kubelet recreates (after the pause
// container died, or the container runtime restarted) turns the condition
// False and then True again, with a new transition time, while the pod's IPs
// may stay the same (KEP-3085, story 4).
func sandboxReady(p *corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// podIPs reads status.podIPs (status.podIP when the list is empty), in
// order, skipping what does not parse.
func podIPs(p *corev1.Pod) []netip.Addr {
	raw := make([]string, 0, len(p.Status.PodIPs))
	for _, ip := range p.Status.PodIPs {
		raw = append(raw, ip.IP)
	}
	if len(raw) == 0 && p.Status.PodIP != "" {
		raw = append(raw, p.Status.PodIP)
	}
	var out []netip.Addr
	for _, s := range raw {
		a, err := netip.ParseAddr(s)
		if err != nil || slices.Contains(out, a.Unmap()) {
			continue
		}
		out = append(out, a.Unmap())
	}
	return out
}
