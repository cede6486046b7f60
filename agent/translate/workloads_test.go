package translate

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEnrolledOnceAddressed: the CNI handover's word is workloads' rules
// without the address, for a pod whose sandbox is being made (Pending, no
// address published).
func TestEnrolledOnceAddressed(t *testing.T) {
	pod := func(name string, labels map[string]string, hostNetwork bool, phase corev1.PodPhase, ip string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name, Labels: labels},
			Spec:       corev1.PodSpec{HostNetwork: hostNetwork},
			Status:     corev1.PodStatus{Phase: phase, PodIP: ip},
		}
	}
	disabled := map[string]string{LabelCapture: "disabled"}
	for _, tc := range []struct {
		pod  *corev1.Pod
		want bool
	}{
		{pod("unaddressed", nil, false, corev1.PodPending, ""), true},
		{pod("addressed", nil, false, corev1.PodRunning, "10.0.0.1"), true},
		{pod("opted-out", disabled, false, corev1.PodPending, ""), false},
		{pod("host-network", nil, true, corev1.PodPending, ""), false},
		{pod("host-network-opted-in", map[string]string{LabelCapture: "enabled"}, true, corev1.PodPending, ""), true},
		{pod("finished", nil, false, corev1.PodSucceeded, ""), false},
		{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "quiet", Name: "in-opted-out-namespace"},
			Status: corev1.PodStatus{Phase: corev1.PodPending}}, false},
	} {
		in := Input{
			Pods:       []*corev1.Pod{tc.pod},
			Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "quiet", Labels: disabled}}},
		}
		ws := workloads(in)
		if len(ws) != 1 {
			t.Fatalf("%s: workloads = %+v, want one", tc.pod.Name, ws)
		}
		if got := EnrolledOnceAddressed(ws[0]); got != tc.want {
			t.Errorf("EnrolledOnceAddressed(%s) = %v (not enrolled: %q), want %v", tc.pod.Name, got, ws[0].NotEnrolled, tc.want)
		}
	}
}
