package kubernetes

import (
	"fmt"
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

// statusChanged is specChanged, or the status changed in a way translate
// or the status writer must answer: another controller's entries came or
// went (translate gives out the room they leave: a policy's 16 ancestors,
// a route's 32 parents), or an entry of sockmesh's is gone, or a condition
// of an XMesh of sockmesh's (another party removed it or replaced the whole
// list, which the writer must put back). sockmesh's own writes add and
// update its entries and conditions, which signal nothing; one that removes
// an entry translate no longer wants, after the change that made it so,
// brings one more translation, which writes nothing. Another party's
// rewrite of an entry of sockmesh's in place is no removal: the next
// translation after a signal, or the control plane's resync, writes it
// back.
func statusChanged(old, new any) bool {
	if specChanged(old, new) {
		return true
	}
	oldOthers, oldOurs := statusEntries(old)
	newOthers, newOurs := statusEntries(new)
	if oldOthers != newOthers {
		return true
	}
	for k := range oldOurs {
		if !newOurs[k] {
			return true
		}
	}
	return false
}

// statusEntries counts the other controllers' entries in obj's status and
// keys sockmesh's: a policy's or XBackend's ancestors, a route's parents,
// and an XMesh's condition types when its controllerName is sockmesh's.
func statusEntries(obj any) (others int, ours map[string]bool) {
	ours = map[string]bool{}
	add := func(ctrl gwv1.GatewayController, ref gwv1.ParentReference) {
		if ctrl != translate.ControllerName {
			others++
			return
		}
		ours[entryKey(ref)] = true
	}
	switch o := obj.(type) {
	case *gwv1.BackendTLSPolicy:
		for _, a := range o.Status.Ancestors {
			add(a.ControllerName, a.AncestorRef)
		}
	case *gwxv1alpha1.XBackendTrafficPolicy:
		for _, a := range o.Status.Ancestors {
			add(a.ControllerName, a.AncestorRef)
		}
	case *gwxv1alpha1.XBackend:
		for _, a := range o.Status.Ancestors {
			add(a.ControllerName, a.AncestorRef)
		}
	case *gwv1.HTTPRoute:
		for _, p := range o.Status.Parents {
			add(p.ControllerName, p.ParentRef)
		}
	case *gwv1.GRPCRoute:
		for _, p := range o.Status.Parents {
			add(p.ControllerName, p.ParentRef)
		}
	case *gwxv1alpha1.XMesh:
		if o.Spec.ControllerName == translate.ControllerName {
			for _, c := range o.Status.Conditions {
				ours[c.Type] = true
			}
		}
	}
	return others, ours
}

// entryKey identifies an entry's reference as written.
func entryKey(r gwv1.ParentReference) string {
	var port int32
	if r.Port != nil {
		port = int32(*r.Port)
	}
	return fmt.Sprintf("%s/%s/%s/%s/%s/%d", deref(r.Group), deref(r.Kind), deref(r.Namespace), r.Name, deref(r.SectionName), port)
}

func deref[T ~string](p *T) string {
	if p == nil {
		return ""
	}
	return string(*p)
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
