package controlplane_test

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/dnsserver"
)

// createPolicies creates namespace (labelled) and in it n Services web-<i>,
// each with a BackendTLSPolicy tls-<i>.
func createPolicies(t *testing.T, env *apiserver.Env, namespace string, labels map[string]string, n int) {
	t.Helper()
	ctx := t.Context()
	must.Succeed(t)(env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: labels}}, metav1.CreateOptions{}))
	for i := range n {
		must.Succeed(t)(env.Kube.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("web-", i), Namespace: namespace},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
		}, metav1.CreateOptions{}))
		must.Succeed(t)(env.Gateway.GatewayV1().BackendTLSPolicies(namespace).Create(ctx, &gwv1.BackendTLSPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("tls-", i), Namespace: namespace},
			Spec: gwv1.BackendTLSPolicySpec{
				TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{
					LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Kind: "Service", Name: gwv1.ObjectName(fmt.Sprint("web-", i))},
				}},
				Validation: gwv1.BackendTLSPolicyValidation{
					WellKnownCACertificates: ptr(gwv1.WellKnownCACertificatesSystem), Hostname: "web.example.com"},
			},
		}, metav1.CreateOptions{}))
	}
}

// ourGeneration returns the observedGeneration of sockmesh's Accepted
// condition on the policy, 0 if it has none.
func ourGeneration(t *testing.T, env *apiserver.Env, namespace, name string) (int64, error) {
	p, err := env.Gateway.GatewayV1().BackendTLSPolicies(namespace).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	for _, a := range ourAncestors(p) {
		if c := findCondition(a.Conditions, "Accepted"); c != nil {
			return c.ObservedGeneration, nil
		}
	}
	return 0, nil
}

// webhook is an admission webhook server that fails (HTTP 500) while down
// and allows everything otherwise.
type webhook struct {
	*httptest.Server
	down  atomic.Bool
	calls atomic.Int64
}

func startWebhook(t *testing.T) *webhook {
	wh := &webhook{}
	wh.down.Store(true)
	wh.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wh.calls.Add(1)
		if wh.down.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "no admission review", http.StatusBadRequest)
			return
		}
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		review.Request = nil
		_ = json.NewEncoder(w).Encode(review)
	}))
	t.Cleanup(wh.Close)
	return wh
}

// TestWebhookDownHoldsBackItsObjectsOnly: a validating webhook
// (failurePolicy Fail) on BackendTLSPolicy status in one namespace cannot
// be called, so the API server answers 500 for those objects alone. The
// other namespace's policy gets its new status at once, though the retry
// interval is an hour (before, the whole loop backed off and nothing was
// written until the retry); and with a short interval the refused policy is
// written by its own retries once the webhook is back, with no change of
// any object.
func TestWebhookDownHoldsBackItsObjectsOnly(t *testing.T) {
	env := apiserver.Start(t)
	dns := dnsserver.Start(t).Addr
	ctx := t.Context()
	const hooked = "cp-hooked"
	createPolicies(t, env, ns, nil, 1)
	createPolicies(t, env, hooked, map[string]string{"sockmesh-test/webhook": "on"}, 1)
	wh := startWebhook(t)
	must.Succeed(t)(env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "check-status"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "check.example.com",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr(wh.URL + "/validate"),
				CABundle: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: wh.Certificate().Raw})},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{gwv1.GroupName}, APIVersions: []string{"*"},
					Resources: []string{"backendtlspolicies/status"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"sockmesh-test/webhook": "on"}},
			FailurePolicy:           ptr(admissionregistrationv1.Fail),
			SideEffects:             ptr(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr(int32(2)),
		}},
	}, metav1.CreateOptions{}))
	// What the API server answers while the webhook is down: a 500
	// InternalError, which the control plane takes as the object's alone.
	eventually(t, "the webhook to refuse", func() error {
		_, err := env.Gateway.GatewayV1().BackendTLSPolicies(hooked).Patch(ctx, "tls-0", types.MergePatchType,
			[]byte(`{"status":{"ancestors":[]}}`), metav1.PatchOptions{}, "status")
		if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "failed calling webhook") {
			return fmt.Errorf("status patch: %v", err)
		}
		return nil
	})

	hour := func(ac *agentConfig) { ac.cp.RetryInterval = time.Hour }
	a := startAgent(t, env, "agent-1", dns, hour)
	eventually(t, "the free policy's status", func() error {
		if g, err := ourGeneration(t, env, ns, "tls-0"); err != nil || g != 1 {
			return fmt.Errorf("observed generation %d (err %v), want 1", g, err)
		}
		return nil
	})
	p := must.Value[*gwv1.BackendTLSPolicy](t)(env.Gateway.GatewayV1().BackendTLSPolicies(ns).Get(ctx, "tls-0", metav1.GetOptions{}))
	p.Spec.Validation.Hostname = "web2.example.com"
	must.Succeed(t)(env.Gateway.GatewayV1().BackendTLSPolicies(ns).Update(ctx, p, metav1.UpdateOptions{}))
	eventually(t, "the free policy's new status while the other is refused", func() error {
		if g, err := ourGeneration(t, env, ns, "tls-0"); err != nil || g != 2 {
			return fmt.Errorf("observed generation %d (err %v), want 2", g, err)
		}
		return nil
	})
	if g, err := ourGeneration(t, env, hooked, "tls-0"); err != nil || g != 0 {
		t.Fatalf("the hooked policy got status generation %d (err %v) while its webhook was down", g, err)
	}
	a.stop(t)

	// A short retry interval: the refused policy is retried by itself, and
	// written once the webhook answers.
	startAgent(t, env, "agent-2", dns, func(ac *agentConfig) { ac.cp.RetryInterval = 100 * time.Millisecond })
	eventually(t, "agent-2 to try the hooked policy", func() error {
		if n := wh.calls.Load(); n < 3 {
			return fmt.Errorf("%d webhook calls", n)
		}
		return nil
	})
	wh.down.Store(false)
	eventually(t, "the hooked policy's status once the webhook is back", func() error {
		if g, err := ourGeneration(t, env, hooked, "tls-0"); err != nil || g != 1 {
			return fmt.Errorf("observed generation %d (err %v), want 1", g, err)
		}
		return nil
	})
}

// TestRBACRefusalCostsOneAttempt: the agent's identity may not patch
// backendtlspolicies/status. Each namespace's policies cost one patch,
// none at the translations after; once RBAC
// grants it, every policy gets its status at the next re-check, with no
// change of any object. Before, each translation sent every policy's patch
// again.
func TestRBACRefusalCostsOneAttempt(t *testing.T) {
	env := apiserver.Start(t)
	dns := dnsserver.Start(t).Addr
	ctx := t.Context()
	const perNamespace = 20
	createPolicies(t, env, ns, nil, perNamespace)
	createPolicies(t, env, "cp-other", nil, perNamespace)
	const user = "system:serviceaccount:cp-test:agent"
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "update"}},
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"create", "update", "delete"}},
	}
	role := must.Value[*rbacv1.ClusterRole](t)(env.Kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "cp-test-agent"}, Rules: rules}, metav1.CreateOptions{}))
	must.Succeed(t)(env.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "cp-test-agent"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
	}, metav1.CreateOptions{}))

	var mu sync.Mutex
	var patches, reviews int
	passes := &atomic.Int64{}
	startAgent(t, env, "agent-1", dns, func(ac *agentConfig) {
		ac.rest.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
		ac.rest.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				mu.Lock()
				switch {
				case r.Method == http.MethodPatch && strings.Contains(r.URL.Path, "/backendtlspolicies/"):
					patches++
				case strings.HasSuffix(r.URL.Path, "/selfsubjectaccessreviews"):
					reviews++
				}
				mu.Unlock()
				return rt.RoundTrip(r)
			})
		})
		ac.cp.AccessRecheck = 2 * time.Second
		ac.passes = passes
	})
	counts := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return patches, reviews
	}
	eventually(t, "a first pass", func() error {
		if n := passes.Load(); n < 1 {
			return fmt.Errorf("%d passes", n)
		}
		return nil
	})
	first, firstReviews := counts()
	t.Logf("first pass: %d policy patches, %d access reviews", first, firstReviews)
	if first != 2 || firstReviews < 2 {
		t.Errorf("first pass: %d policy patches, %d access reviews; want 2 (one a namespace), 2 or more", first, firstReviews)
	}
	// Five more translations: a captured Service each.
	for i := range 5 {
		n := passes.Load()
		must.Succeed(t)(env.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("h2c-", i), Namespace: ns},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 8080,
				AppProtocol: ptr("kubernetes.io/h2c")}}},
		}, metav1.CreateOptions{}))
		eventually(t, "a pass of the new translation", func() error {
			if passes.Load() == n {
				return fmt.Errorf("%d passes", n)
			}
			return nil
		})
	}
	if got, _ := counts(); got != first {
		t.Errorf("five more translations sent %d policy patches, want none", got-first)
	}

	role.Rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{gwv1.GroupName},
		Resources: []string{"backendtlspolicies/status"}, Verbs: []string{"patch"}})
	must.Succeed(t)(env.Kube.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{}))
	eventually(t, "every policy's status once RBAC allows", func() error {
		for _, namespace := range []string{ns, "cp-other"} {
			for i := range perNamespace {
				if g, err := ourGeneration(t, env, namespace, fmt.Sprint("tls-", i)); err != nil || g != 1 {
					return fmt.Errorf("%s/tls-%d: observed generation %d (err %v)", namespace, i, g, err)
				}
			}
		}
		return nil
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
