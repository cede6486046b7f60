package main

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/internal/must"
)

const (
	// agentUser is who the agent is: RBAC, not system:masters, decides
	// what it may write.
	agentUser = "system:serviceaccount:sockmesh-system:sockmesh"
	// heldNS holds the objects whose writes the agent holds back.
	heldNS = "held"
)

// agentKubeconfig returns e.kubeconfig impersonating agentUser, whom RBAC
// allows what the agent does (as daemonset/rbac.yaml) but BackendTLSPolicy
// status outside namespace app.
func (e *env) agentKubeconfig(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	rbac := e.api.Kube.RbacV1()
	subjects := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: agentUser}}
	role := func(name string, rules ...rbacv1.PolicyRule) rbacv1.RoleRef {
		must.Succeed(t)(rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules},
			metav1.CreateOptions{}))
		return rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}
	}
	everywhere := role("sockmeshctl-test-agent",
		rbacv1.PolicyRule{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}},
		rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "update"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"create", "update", "delete"}},
		rbacv1.PolicyRule{APIGroups: []string{gwv1.GroupName}, Resources: []string{"httproutes/status", "grpcroutes/status"}, Verbs: []string{"patch"}},
		rbacv1.PolicyRule{APIGroups: []string{"gateway.networking.x-k8s.io"}, Resources: []string{"*/status"}, Verbs: []string{"patch"}})
	must.Succeed(t)(rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: everywhere.Name}, RoleRef: everywhere, Subjects: subjects}, metav1.CreateOptions{}))
	// The agent's rule names no BackendTLSPolicy status: app grants it.
	policies := role("sockmeshctl-test-policies", rbacv1.PolicyRule{APIGroups: []string{gwv1.GroupName},
		Resources: []string{"backendtlspolicies/status"}, Verbs: []string{"patch"}})
	must.Succeed(t)(rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policies.Name}, RoleRef: policies, Subjects: subjects}, metav1.CreateOptions{}))

	cfg, err := clientcmd.LoadFromFile(e.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range cfg.AuthInfos {
		u.Impersonate, u.ImpersonateGroups = agentUser, []string{"system:authenticated"}
	}
	path := filepath.Join(t.TempDir(), "kubeconfig-agent")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// holdWrites makes two writes the agent must hold back, in namespace
// held: BackendTLSPolicy status, which RBAC refuses there (asAgent), and
// HTTPRoute status, which a validating webhook (failurePolicy Fail) that
// is down makes the API server fail (500). The Service both name is
// captured.
func (e *env) holdWrites(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	kube, gw := e.api.Kube, e.api.Gateway
	down := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusInternalServerError)
	}))
	t.Cleanup(down.Close)
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	url := down.URL + "/validate"
	must.Succeed(t)(kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "sockmeshctl-test-down"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "down.example.com",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url,
				CABundle: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: down.Certificate().Raw})},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{gwv1.GroupName}, APIVersions: []string{"*"},
					Resources: []string{"httproutes/status"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": heldNS}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{}))

	must.Succeed(t)(kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: heldNS}}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.CoreV1().Services(heldNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: heldNS},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.CoreV1().ConfigMaps(heldNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "web-ca", Namespace: heldNS}, Data: map[string]string{"ca.crt": string(e.ca.CertPEM)},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(gw.GatewayV1().BackendTLSPolicies(heldNS).Create(ctx, &gwv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: heldNS},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{
				Kind: "Service", Name: "web"}}},
			Validation: gwv1.BackendTLSPolicyValidation{Hostname: "web.held.svc",
				CACertificateRefs: []gwv1.LocalObjectReference{{Kind: "ConfigMap", Name: "web-ca"}}},
		},
	}, metav1.CreateOptions{}))
	port := gwv1.PortNumber(80)
	must.Succeed(t)(gw.GatewayV1().HTTPRoutes(heldNS).Create(ctx, &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "hooked", Namespace: heldNS},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")),
				Name: "web", Port: &port}}},
			Rules: []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{
				BackendObjectReference: gwv1.BackendObjectReference{Name: "web", Port: &port}}}}}},
		},
	}, metav1.CreateOptions{}))
}
