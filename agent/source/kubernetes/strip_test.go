package kubernetes

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestStripForCache checks that what the caches keep of each kind is
// exactly what translate reads, and that the rest is dropped.
func TestStripForCache(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	meta := func(annotations map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "ns", Name: "x", UID: "uid-1", Labels: map[string]string{translate.LabelCapture: "disabled"},
			Annotations: annotations, ManagedFields: managed}
	}
	kept := func(annotations map[string]string) metav1.ObjectMeta {
		m := meta(annotations)
		m.ManagedFields = nil
		return m
	}
	// Fresh for each case: stripping changes the map in place.
	otherAnnotations := func() map[string]string {
		return map[string]string{corev1.LastAppliedConfigAnnotation: "{...}", "example.com/lb": "internal"}
	}
	own := map[string]string{translate.AnnotationXBackend: "xb", translate.AnnotationFailurePolicy: "FailClosed"}
	withOwn := map[string]string{translate.AnnotationXBackend: "xb", translate.AnnotationFailurePolicy: "FailClosed", "example.com/lb": "internal"}
	yes, no := true, false
	zone, node, host := "z1", "n1", "h1"
	port := int32(8443)
	sandboxTime := metav1.Date(2026, 4, 1, 10, 0, 0, 0, time.UTC)
	ports := []corev1.ServicePort{{Name: "https", Port: 443, AppProtocol: ptr("kubernetes.io/h2c")}}

	for _, tc := range []struct {
		name    string
		in, out any
	}{
		{
			name: "Service keeps its spec, sockmesh.io annotations and load-balancer IPs",
			in: &corev1.Service{ObjectMeta: meta(withOwn),
				Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Ports: ports, Type: corev1.ServiceTypeLoadBalancer},
				Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
					{IP: "192.0.2.1", IPMode: ptr(corev1.LoadBalancerIPModeProxy), Ports: []corev1.PortStatus{{Port: 443, Protocol: corev1.ProtocolTCP}}},
					{Hostname: "lb.example"},
				}}}},
			out: &corev1.Service{ObjectMeta: kept(own),
				Spec:   corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Ports: ports, Type: corev1.ServiceTypeLoadBalancer},
				Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}}}},
		},
		{
			name: "Service without own annotations",
			in:   &corev1.Service{ObjectMeta: meta(otherAnnotations())},
			out:  &corev1.Service{ObjectMeta: kept(nil)},
		},
		{
			name: "EndpointSlice keeps addresses, conditions, zone, node, topology hints and the target's name",
			in: &discoveryv1.EndpointSlice{ObjectMeta: meta(map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"}),
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints: append(make([]discoveryv1.Endpoint, 0, 8), discoveryv1.Endpoint{
					Addresses:  []string{"10.244.0.5"},
					Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
					Hostname:   &host, NodeName: &node, Zone: &zone,
					TargetRef:          &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "p", UID: "pod-uid", ResourceVersion: "7"},
					DeprecatedTopology: map[string]string{"kubernetes.io/hostname": "n1"},
					Hints:              &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}},
				}),
				Ports: []discoveryv1.EndpointPort{{Name: ptr("https"), Port: &port}}},
			out: &discoveryv1.EndpointSlice{ObjectMeta: kept(nil),
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints: []discoveryv1.Endpoint{{
					Addresses:  []string{"10.244.0.5"},
					Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
					NodeName:   &node, Zone: &zone,
					TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "p"},
					Hints:     &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}},
				}},
				Ports: []discoveryv1.EndpointPort{{Name: ptr("https"), Port: &port}}},
		},
		{
			name: "Pod keeps what enrolment reads",
			in: &corev1.Pod{ObjectMeta: meta(otherAnnotations()),
				Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "sa", HostNetwork: true,
					Containers: []corev1.Container{{Name: "c", Image: "i", Env: []corev1.EnvVar{{Name: "A", Value: "B"}}}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.5", PodIPs: []corev1.PodIP{{IP: "10.244.0.5"}},
					Conditions: []corev1.PodCondition{
						{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
						{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: sandboxTime},
						{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
					ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Ready: true}}}},
			out: &corev1.Pod{ObjectMeta: kept(nil),
				Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "sa", HostNetwork: true},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.5", PodIPs: []corev1.PodIP{{IP: "10.244.0.5"}},
					Conditions: []corev1.PodCondition{{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: sandboxTime}}}},
		},
		{
			name: "Node keeps addresses, pod CIDRs and labels",
			in: &corev1.Node{ObjectMeta: meta(otherAnnotations()),
				Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24"}, ProviderID: "p"},
				Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.7"}},
					Images: []corev1.ContainerImage{{Names: []string{"registry/image:tag"}, SizeBytes: 1 << 20}}}},
			out: &corev1.Node{ObjectMeta: kept(nil),
				Spec:   corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24"}},
				Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.7"}}}},
		},
		{
			name: "Namespace loses only managed fields and last-applied",
			in:   &corev1.Namespace{ObjectMeta: meta(otherAnnotations())},
			out:  &corev1.Namespace{ObjectMeta: kept(map[string]string{"example.com/lb": "internal"})},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := stripForCache(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.out, got); diff != "" {
				t.Errorf("stripForCache (-want +got):\n%s", diff)
			}
		})
	}
	// The endpoints are copied to their exact length.
	es := &discoveryv1.EndpointSlice{Endpoints: append(make([]discoveryv1.Endpoint, 0, 8), discoveryv1.Endpoint{}, discoveryv1.Endpoint{})}
	stripObject(es)
	if cap(es.Endpoints) != 2 {
		t.Errorf("cap(endpoints) = %d after stripping, want 2", cap(es.Endpoints))
	}
}
