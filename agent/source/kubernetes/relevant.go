package kubernetes

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// Update filters: which updates of a kind may change the Snapshot (the
// relevant func of handler and optionalKind). An update they let through
// signals a rebuild; the others are only cached.

func labelsChanged(old, new any) bool {
	o, n := old.(metav1.Object), new.(metav1.Object)
	return !maps.Equal(o.GetLabels(), n.GetLabels())
}

func specChanged(old, new any) bool {
	o, n := old.(metav1.Object), new.(metav1.Object)
	return o.GetGeneration() != n.GetGeneration() || o.GetUID() != n.GetUID() ||
		!maps.Equal(o.GetLabels(), n.GetLabels()) || !maps.Equal(o.GetAnnotations(), n.GetAnnotations())
}

// policyChanged is specChanged for a policy, or another controller's
// ancestor entries came or went: translate gives the policy's targets only
// the room those leave in its status (PolicyStatus holds 16 ancestors).
// sockmesh's own status writes change neither.
func policyChanged(old, new any) bool {
	return specChanged(old, new) || othersAncestors(old) != othersAncestors(new)
}

func othersAncestors(obj any) int {
	var ancestors []gwv1.PolicyAncestorStatus
	switch o := obj.(type) {
	case *gwv1.BackendTLSPolicy:
		ancestors = o.Status.Ancestors
	case *gwxv1alpha1.XBackendTrafficPolicy:
		ancestors = o.Status.Ancestors
	}
	n := 0
	for _, a := range ancestors {
		if a.ControllerName != translate.ControllerName {
			n++
		}
	}
	return n
}

func podChanged(old, new any) bool {
	o, n := old.(*corev1.Pod), new.(*corev1.Pod)
	return o.UID != n.UID || !maps.Equal(o.Labels, n.Labels) || o.Status.Phase != n.Status.Phase ||
		o.Status.PodIP != n.Status.PodIP || !slices.Equal(o.Status.PodIPs, n.Status.PodIPs) ||
		o.Spec.NodeName != n.Spec.NodeName || o.Spec.HostNetwork != n.Spec.HostNetwork ||
		o.Spec.ServiceAccountName != n.Spec.ServiceAccountName || o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() ||
		sandboxChanged(readyToStart(o), readyToStart(n))
}

// sandboxChanged: the kubelet turns PodReadyToStartContainers False when a
// pod's sandbox goes and True, with a new transition time, once a new one
// has its network — a new network namespace for enrolment to find, while
// the pod's IPs may stay the same.
func sandboxChanged(o, n *corev1.PodCondition) bool {
	if o == nil || n == nil {
		return o != n
	}
	return o.Status != n.Status || !o.LastTransitionTime.Equal(&n.LastTransitionTime)
}

func readyToStart(p *corev1.Pod) *corev1.PodCondition {
	for i, c := range p.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func nodeChanged(old, new any) bool {
	o, n := old.(*corev1.Node), new.(*corev1.Node)
	return !slices.Equal(o.Status.Addresses, n.Status.Addresses) ||
		!slices.Equal(o.Spec.PodCIDRs, n.Spec.PodCIDRs) || o.Spec.PodCIDR != n.Spec.PodCIDR ||
		o.Labels[corev1.LabelTopologyZone] != n.Labels[corev1.LabelTopologyZone]
}
