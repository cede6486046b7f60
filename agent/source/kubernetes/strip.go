package kubernetes

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// stripForCache drops what nothing in the agent reads, before an object
// enters a cache: managed fields, and kubectl's copy of the whole object in
// an annotation, from every kind; and from the kinds a cluster has many of,
// or that are large, what translate does not look at (see stripObject). At
// 10,000 Services and their EndpointSlices that is most of the agent's
// memory. The informer owns the freshly decoded object it passes in; no one
// else holds it yet, so it is changed in place.
func stripForCache(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
		if a := m.GetAnnotations(); a[corev1.LastAppliedConfigAnnotation] != "" {
			delete(a, corev1.LastAppliedConfigAnnotation)
		}
	}
	stripObject(obj)
	return obj, nil
}

// stripObject keeps, of the kinds below, only the fields translate and the
// update filters here read; a change to translate that reads another field
// of these kinds must keep it here too (the source's tests check the kept
// fields survive). Gateway API objects keep everything: the status writer
// reads their status.
func stripObject(obj any) {
	switch o := obj.(type) {
	case *corev1.Service:
		// translate reads only sockmesh.io/ annotations; the rest (load
		// balancer settings, Helm's bookkeeping) is dropped, and of the
		// status only the load-balancer IPs are kept, which external
		// hostnames may not resolve to.
		o.Annotations = ownAnnotations(o.Annotations)
		var ingress []corev1.LoadBalancerIngress
		for _, ing := range o.Status.LoadBalancer.Ingress {
			if ing.IP != "" {
				ingress = append(ingress, corev1.LoadBalancerIngress{IP: ing.IP})
			}
		}
		o.Status = corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: ingress}}
	case *discoveryv1.EndpointSlice:
		// Every slice the EndpointSlice controller writes carries a
		// trigger-time annotation; every endpoint a targetRef with the
		// pod's UID and resourceVersion. translate reads addresses,
		// conditions, zone, nodeName, topology hints and the targetRef's
		// kind, namespace and name.
		o.Annotations = nil
		// The decoder grows the endpoints by appending: five endpoints
		// sit in room for eight. An exact copy saves a third of a
		// slice's memory.
		o.Endpoints = slices.Clone(o.Endpoints)
		for i := range o.Endpoints {
			ep := &o.Endpoints[i]
			ep.Hostname, ep.DeprecatedTopology = nil, nil
			if r := ep.TargetRef; r != nil {
				ep.TargetRef = &corev1.ObjectReference{Kind: r.Kind, Namespace: r.Namespace, Name: r.Name}
			}
		}
	case *corev1.Pod:
		// Enrolment needs the pod's labels, node, service account, host
		// networking, phase, addresses and PodReadyToStartContainers
		// condition (a new sandbox); not its containers, volumes,
		// container statuses or other conditions.
		o.Annotations = nil
		o.Spec = corev1.PodSpec{NodeName: o.Spec.NodeName, ServiceAccountName: o.Spec.ServiceAccountName, HostNetwork: o.Spec.HostNetwork}
		var conds []corev1.PodCondition
		if c := readyToStart(o); c != nil {
			conds = []corev1.PodCondition{*c}
		}
		o.Status = corev1.PodStatus{Phase: o.Status.Phase, PodIP: o.Status.PodIP, PodIPs: o.Status.PodIPs, Conditions: conds}
	case *corev1.Node:
		// Of its Node the agent reads addresses, pod CIDRs and the zone
		// label; a Node's status also lists every image on it.
		o.Annotations = nil
		o.Spec = corev1.NodeSpec{PodCIDR: o.Spec.PodCIDR, PodCIDRs: o.Spec.PodCIDRs}
		o.Status = corev1.NodeStatus{Addresses: o.Status.Addresses}
	}
}

// ownAnnotations returns the sockmesh.io/ annotations of a, or nil.
func ownAnnotations(a map[string]string) map[string]string {
	var own map[string]string
	for k, v := range a {
		if strings.HasPrefix(k, annotationPrefix) {
			if own == nil {
				own = map[string]string{}
			}
			own[k] = v
		}
	}
	return own
}

// annotationPrefix is the prefix of the annotations translate reads
// (translate.AnnotationXBackend, translate.AnnotationFailurePolicy).
const annotationPrefix = "sockmesh.io/"
