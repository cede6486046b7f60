package daemonset_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	kubesource "github.com/sockmesh/sockmesh/agent/source/kubernetes"
	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/test/apiserver"
)

const (
	agentSA     = "system:serviceaccount:sockmesh-system:sockmesh"
	agentNS     = "sockmesh-system"
	referenceNS = "smt-app"
	// otherSA is a ServiceAccount no binding names: what it may do, every
	// one may.
	otherSA = "system:serviceaccount:sockmesh-system:smt-nobody"
)

var agentGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + agentNS, "system:authenticated"}

// TestRBACAgainstAPIServer applies rbac.yaml to a real kube-apiserver and
// checks, as the agent's ServiceAccount, that the agent's source comes up
// with every kind watched (a BackendTLSPolicy's CA ConfigMap included,
// through its single-object reference watch), and that the API server
// allows exactly the verbs of agentRights and leaseRights on each of their
// resources: every read and write the agent sends, and none it does not.
func TestRBACAgainstAPIServer(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	objs := objects(t)
	for _, ns := range typed[corev1.Namespace](t, objs, "Namespace") {
		must.Succeed(t)(env.Kube.CoreV1().Namespaces().Create(ctx, &ns, metav1.CreateOptions{}))
	}
	for _, sa := range typed[corev1.ServiceAccount](t, objs, "ServiceAccount") {
		must.Succeed(t)(env.Kube.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, &sa, metav1.CreateOptions{}))
	}
	rbac := env.Kube.RbacV1()
	for _, o := range typed[rbacv1.ClusterRole](t, objs, "ClusterRole") {
		must.Succeed(t)(rbac.ClusterRoles().Create(ctx, &o, metav1.CreateOptions{}))
	}
	for _, o := range typed[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding") {
		must.Succeed(t)(rbac.ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{}))
	}
	for _, o := range typed[rbacv1.Role](t, objs, "Role") {
		must.Succeed(t)(rbac.Roles(o.Namespace).Create(ctx, &o, metav1.CreateOptions{}))
	}
	for _, o := range typed[rbacv1.RoleBinding](t, objs, "RoleBinding") {
		must.Succeed(t)(rbac.RoleBindings(o.Namespace).Create(ctx, &o, metav1.CreateOptions{}))
	}
	createReferenced(t, env)

	t.Run("source", func(t *testing.T) {
		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: agentSA, Groups: agentGroups}
		kube, gw, err := kubesource.NewClients(cfg)
		if err != nil {
			t.Fatal(err)
		}
		s, err := kubesource.New(kubesource.Config{NodeName: "smt-node"}, kube, gw, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(runCtx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
		// A kind the role does not let it list is reported Forbidden and
		// never watched; the referenced ConfigMap arrives only through a
		// reference watch the API server allowed.
		timeout := time.After(30 * time.Second)
		for {
			kinds := s.Kinds()
			all := len(kinds) > 0 && !slices.ContainsFunc(kinds, func(k kubesource.KindStatus) bool { return !k.Watched })
			if all && len(s.Input().ConfigMaps) == 1 {
				break
			}
			select {
			case <-s.Changed():
			case <-time.After(100 * time.Millisecond):
			case <-timeout:
				t.Fatalf("as the agent: kinds %+v, ConfigMaps %d; want every kind watched and the CA ConfigMap", kinds, len(s.Input().ConfigMaps))
			}
		}
	})

	t.Run("access", func(t *testing.T) {
		allVerbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
		for _, rights := range []struct {
			ns   string
			want map[string][]string
		}{{referenceNS, agentRights}, {agentNS, leaseRights}} {
			for key, verbs := range rights.want {
				group, resource, _ := strings.Cut(key, "/")
				resource, sub, _ := strings.Cut(resource, "/")
				for _, v := range allVerbs {
					got, want := allowed(t, env, agentSA, rights.ns, v, group, resource, sub), slices.Contains(verbs, v)
					// The API server's default roles give every service
					// account some reads (get on ClusterTrustBundles):
					// not rbac.yaml's doing.
					if got != want && (want || !allowed(t, env, otherSA, rights.ns, v, group, resource, sub)) {
						t.Errorf("agent may %s %s in %s = %v, want %v", v, key, rights.ns, got, want)
					}
				}
			}
		}
		// Nothing of what matters beyond them.
		for _, c := range []struct{ ns, verb, group, resource, sub string }{
			{"kube-system", "update", "coordination.k8s.io", "leases", ""},
			{referenceNS, "create", "", "events", ""},
			{referenceNS, "create", "", "pods", "exec"},
			{referenceNS, "create", "", "serviceaccounts", "token"},
			{referenceNS, "patch", "", "services", "status"},
			{"", "list", gwv1.GroupName, "gateways", ""},
			{"", "create", "rbac.authorization.k8s.io", "clusterrolebindings", ""},
		} {
			if allowed(t, env, agentSA, c.ns, c.verb, c.group, c.resource, c.sub) {
				t.Errorf("agent may %s %s/%s/%s in %q", c.verb, c.group, c.resource, c.sub, c.ns)
			}
		}
	})
}

// TestStatusRBACAgainstAPIServer applies the component's roles and
// operators.example.yaml to a real kube-apiserver and checks that an
// operator in the example's group may do exactly what `sockmeshctl status
// --all-nodes` and `explain --agent-port` do to reach the agents: list
// the Nodes and get one, and list pods in sockmesh-system only; nothing
// else, not even get or watch on those pods. cmd/sockmeshctl's
// TestStatusAllNodesOperator and TestExplainAgentPortOperator run the
// commands with these rights.
func TestStatusRBACAgainstAPIServer(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	must.Succeed(t)(env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNS}}, metav1.CreateOptions{}))
	must.Succeed(t)(env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: referenceNS}}, metav1.CreateOptions{}))
	objs := append(componentRoles(t), operatorBindings(t)...)
	rbac := env.Kube.RbacV1()
	for _, o := range typed[rbacv1.ClusterRole](t, objs, "ClusterRole") {
		must.Succeed(t)(rbac.ClusterRoles().Create(ctx, &o, metav1.CreateOptions{}))
	}
	for _, o := range typed[rbacv1.Role](t, objs, "Role") {
		must.Succeed(t)(rbac.Roles(o.Namespace).Create(ctx, &o, metav1.CreateOptions{}))
	}
	for _, o := range typed[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding") {
		must.Succeed(t)(rbac.ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{}))
	}
	var operatorGroup string
	for _, o := range typed[rbacv1.RoleBinding](t, objs, "RoleBinding") {
		must.Succeed(t)(rbac.RoleBindings(o.Namespace).Create(ctx, &o, metav1.CreateOptions{}))
		operatorGroup = o.Subjects[0].Name
	}
	// An operator of the example's group, and one of no group: what the
	// second may do, every authenticated user may (the API server's
	// default roles), not the component's doing.
	operator, groups := "smt-operator", []string{operatorGroup, "system:authenticated"}
	nobody := []string{"system:authenticated"}
	allVerbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	for _, c := range []struct {
		ns, resource string
		want         []string
	}{
		{"", "nodes", operatorNodeRights["/nodes"]},
		{agentNS, "pods", operatorPodRights["/pods"]},
		// Listing pods cluster-wide would show every pod's spec.
		{"", "pods", nil},
		{referenceNS, "pods", nil},
		{agentNS, "secrets", nil},
		{agentNS, "pods/exec", nil},
	} {
		resource, sub, _ := strings.Cut(c.resource, "/")
		for _, v := range allVerbs {
			got, want := allowedIn(t, env, operator, groups, c.ns, v, "", resource, sub), slices.Contains(c.want, v)
			if got != want && (want || !allowedIn(t, env, "smt-nobody", nobody, c.ns, v, "", resource, sub)) {
				t.Errorf("operator may %s %s in %q = %v, want %v", v, c.resource, c.ns, got, want)
			}
		}
	}
}

// createReferenced creates a BackendTLSPolicy whose CA ConfigMap the
// source then watches by name.
func createReferenced(t *testing.T, env *apiserver.Env) {
	ctx := t.Context()
	must.Succeed(t)(env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: referenceNS}}, metav1.CreateOptions{}))
	must.Succeed(t)(env.Kube.CoreV1().ConfigMaps(referenceNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "web-ca"}, Data: map[string]string{"ca.crt": "unused"},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(env.Gateway.GatewayV1().BackendTLSPolicies(referenceNS).Create(ctx, &gwv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{
				Kind: "Service", Name: "web"}}},
			Validation: gwv1.BackendTLSPolicyValidation{Hostname: "web.smt-app.svc",
				CACertificateRefs: []gwv1.LocalObjectReference{{Kind: "ConfigMap", Name: "web-ca"}}},
		},
	}, metav1.CreateOptions{}))
}

// allowed asks the API server whether ServiceAccount user, a member of
// agentGroups, may send the request.
func allowed(t *testing.T, env *apiserver.Env, user, ns, verb, group, resource, sub string) bool {
	t.Helper()
	return allowedIn(t, env, user, agentGroups, ns, verb, group, resource, sub)
}

// allowedIn asks the API server whether user, a member of groups, may send
// the request.
func allowedIn(t *testing.T, env *apiserver.Env, user string, groups []string, ns, verb, group, resource, sub string) bool {
	t.Helper()
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: user, Groups: groups,
		ResourceAttributes: &authzv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: resource, Subresource: sub},
	}}
	got, err := env.Kube.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Status.Allowed
}
