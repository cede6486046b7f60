package e2ecluster

import (
	"testing"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestAgentRBAC asks the API server what the agent's ServiceAccount may do
// once daemonset/'s RBAC is applied: everything the agent needs, and
// nothing else that matters (spec writes, pods, Secret writes, Leases
// outside its namespace, token requests, RBAC itself).
func TestAgentRBAC(t *testing.T) {
	n := cluster(t)
	var objs []*unstructured.Unstructured
	for _, o := range manifests(t) {
		if o.GetKind() != "DaemonSet" {
			objs = append(objs, o)
		}
	}
	apply(t, n, objs...)

	const (
		gw  = "gateway.networking.k8s.io"
		gwx = "gateway.networking.x-k8s.io"
	)
	for _, tc := range []struct {
		verb, group, resource, sub, ns string
		allowed                        bool
	}{
		// What it watches.
		{"list", "", "services", "", "", true},
		{"watch", "discovery.k8s.io", "endpointslices", "", "", true},
		{"list", "", "pods", "", "", true},
		{"watch", "", "nodes", "", "", true},
		{"list", "", "namespaces", "", "", true},
		{"watch", "", "configmaps", "", "app", true},
		{"watch", "", "secrets", "", "app", true},
		{"list", "certificates.k8s.io", "clustertrustbundles", "", "", true},
		{"watch", "networking.k8s.io", "servicecidrs", "", "", true},
		{"watch", gw, "backendtlspolicies", "", "", true},
		{"watch", gw, "httproutes", "", "", true},
		{"watch", gw, "grpcroutes", "", "", true},
		{"watch", gw, "referencegrants", "", "", true},
		{"watch", gwx, "xbackends", "", "", true},
		{"watch", gwx, "xbackendtrafficpolicies", "", "", true},
		{"watch", gwx, "xmeshes", "", "", true},
		// What it writes.
		{"patch", gw, "backendtlspolicies", "status", "app", true},
		{"patch", gw, "httproutes", "status", "app", true},
		{"patch", gw, "grpcroutes", "status", "app", true},
		{"patch", gwx, "xbackends", "status", "app", true},
		{"patch", gwx, "xmeshes", "status", "", true},
		{"create", "", "services", "", "app", true},
		{"update", "", "services", "", "app", true},
		{"delete", "", "services", "", "app", true},
		{"create", "coordination.k8s.io", "leases", "", "sockmesh-system", true},
		{"update", "coordination.k8s.io", "leases", "", "sockmesh-system", true},
		// What it must not.
		{"update", gw, "httproutes", "status", "app", false},
		{"create", "", "events", "", "app", false},
		{"update", gw, "backendtlspolicies", "", "app", false},
		{"patch", gwx, "xbackends", "", "app", false},
		{"delete", gw, "httproutes", "", "app", false},
		{"list", gw, "gateways", "", "", false},
		{"create", "", "pods", "", "app", false},
		{"delete", "", "pods", "", "app", false},
		{"create", "", "pods", "exec", "app", false},
		{"update", "", "secrets", "", "app", false},
		{"create", "", "secrets", "", "app", false},
		{"update", "", "configmaps", "", "app", false},
		{"patch", "", "services", "status", "app", false},
		{"update", "", "nodes", "", "", false},
		{"create", "", "serviceaccounts", "token", "app", false},
		{"create", "coordination.k8s.io", "leases", "", "kube-system", false},
		{"update", "coordination.k8s.io", "leases", "", "kube-node-lease", false},
		{"update", "discovery.k8s.io", "endpointslices", "", "app", false},
		{"create", "rbac.authorization.k8s.io", "clusterrolebindings", "", "", false},
		{"delete", "", "namespaces", "", "", false},
	} {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:sockmesh-system:sockmesh",
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:sockmesh-system", "system:authenticated"},
			ResourceAttributes: &authzv1.ResourceAttributes{
				Verb: tc.verb, Group: tc.group, Resource: tc.resource, Subresource: tc.sub, Namespace: tc.ns,
			},
		}}
		got, err := n.Kube.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != tc.allowed {
			t.Errorf("agent may %s %s/%s/%s in %q = %v, want %v (%s)", tc.verb, tc.group, tc.resource, tc.sub, tc.ns, got.Status.Allowed, tc.allowed, got.Status.Reason)
		}
	}
}
