package translate

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// workloads lists the pods on this node (Input.Node.Name; every pod when it
// is empty) and decides which are enrolled:
//   - a pod with IPs whose phase is Pending or Running is enrolled — Pending
//     too, so that capture is in place before the app's first connection;
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
		}
		label := p.Labels[LabelCapture]
		live := p.Status.Phase == corev1.PodPending || p.Status.Phase == corev1.PodRunning
		w.Enrolled = live && len(w.IPs) > 0 && label != "disabled" && !disabledNS[p.Namespace] &&
			(!w.HostNetwork || label == "enabled")
		out = append(out, w)
	}
	return out
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
