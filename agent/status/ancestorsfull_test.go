package status

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestPolicyAncestorsFull runs translate and the writer over policies whose
// status other controllers have filled in a real API server. The Gateway
// API forbids adding to a full ancestors list and makes the policy
// unimplementable for the ancestor left out: that BackendTLSPolicy's
// Service fails closed and a route leading to it says so, that
// XBackendTrafficPolicy is not applied, and neither policy is written to.
// A policy with room for one entry gets ours, and keeps being applied once
// that entry fills its list.
func TestPolicyAncestorsFull(t *testing.T) {
	env := startWithNamespace(t)
	ctx := t.Context()
	for _, name := range []string{"full", "kept", "client"} {
		if _, err := env.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.Gateway.GatewayV1().HTTPRoutes(ns).Create(ctx, &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "to-full"},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{svcRef("client", "")}},
			Rules: []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{
				BackendObjectReference: gwv1.BackendObjectReference{Name: "full", Port: ptr(gwv1.PortNumber(443))}}}}}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	theirs := func(n int) []gwv1.PolicyAncestorStatus {
		var out []gwv1.PolicyAncestorStatus
		for i := range n {
			out = append(out, ancestor(other, gwv1.ParentReference{Name: gwv1.ObjectName(fmt.Sprintf("gw%02d", i))},
				cond("Accepted", "True", "Accepted", "theirs", 1, t0)))
		}
		return out
	}
	tlsPolicy := func(name, service string, others int) {
		t.Helper()
		p, err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).Create(ctx, &gwv1.BackendTLSPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: gwv1.BackendTLSPolicySpec{
				TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{
					LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Group: "", Kind: "Service", Name: gwv1.ObjectName(service)},
				}},
				Validation: gwv1.BackendTLSPolicyValidation{WellKnownCACertificates: ptr(gwv1.WellKnownCACertificatesSystem), Hostname: "web.example.com"},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Ancestors = theirs(others)
		if _, err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tlsPolicy("full", "full", 16)
	tlsPolicy("kept", "kept", 15)
	budget, err := env.Gateway.ExperimentalV1alpha1().XBackendTrafficPolicies(ns).Create(ctx, &gwxv1alpha1.XBackendTrafficPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "budget"},
		Spec: gwxv1alpha1.BackendTrafficPolicySpec{
			TargetRefs:      []gwv1.LocalPolicyTargetReference{{Group: "", Kind: "Service", Name: "full"}},
			RetryConstraint: &gwxv1alpha1.RetryConstraint{Budget: &gwxv1alpha1.BudgetDetails{Percent: ptr(30)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	budget.Status.Ancestors = theirs(16)
	if _, err := env.Gateway.ExperimentalV1alpha1().XBackendTrafficPolicies(ns).UpdateStatus(ctx, budget, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	w, err := New(Config{}, env.Gateway, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	// translateAndWrite translates what the API server holds, as an agent
	// would from its informers, writes the status and checks the backends
	// and the route.
	translateAndWrite := func(pass string) {
		t.Helper()
		in := listInput(t, env)
		in.Now = time.Now()
		res, err := translate.Translate(in)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(ctx, in, res.Status, nil); err != nil {
			t.Fatal(err)
		}
		backends := map[string]snapshot.Backend{}
		for _, b := range res.Backends {
			backends[b.Ref.Name] = b
		}
		if b := backends["full"]; b.Invalid == nil || b.TLS != nil {
			t.Errorf("%s: Service full's backend: TLS %+v, Invalid %+v; want it to fail closed", pass, b.TLS, b.Invalid)
		}
		if b := backends["full"]; b.RetryConstraint != nil {
			t.Errorf("%s: Service full's backend has the unimplementable XBackendTrafficPolicy's retry constraint", pass)
		}
		if b := backends["kept"]; b.TLS == nil || b.Invalid != nil {
			t.Errorf("%s: Service kept's backend: TLS %+v, Invalid %+v; want its policy's TLS", pass, b.TLS, b.Invalid)
		}
		r, err := env.Gateway.GatewayV1().HTTPRoutes(ns).Get(ctx, "to-full", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Status.Parents) != 1 || len(r.Status.Parents[0].Conditions) < 2 ||
			r.Status.Parents[0].Conditions[1].Reason != translate.ReasonInvalidBackend {
			t.Errorf("%s: route to-full's parents = %+v; want ResolvedRefs %s", pass, r.Status.Parents, translate.ReasonInvalidBackend)
		}
	}
	ancestors := func(name string) []gwv1.PolicyAncestorStatus {
		t.Helper()
		return getPolicy(t, env, name).Status.Ancestors
	}
	rvs := func() []string {
		return []string{getPolicy(t, env, "full").ResourceVersion, getPolicy(t, env, "kept").ResourceVersion}
	}
	wantControllers := func(name string, want ...gwv1.GatewayController) {
		t.Helper()
		got := controllers(ancestors(name))
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s's controllers = %v, want %v", name, got, want)
		}
	}
	fullRV := getPolicy(t, env, "full").ResourceVersion

	translateAndWrite("first pass")
	if rv := getPolicy(t, env, "full").ResourceVersion; rv != fullRV {
		t.Errorf("the full policy was written to: %+v", ancestors("full"))
	}
	sixteen := controllers(theirs(16))
	wantControllers("full", sixteen...)
	wantControllers("kept", append(controllers(theirs(15)), translate.ControllerName)...)
	if tp, err := env.Gateway.ExperimentalV1alpha1().XBackendTrafficPolicies(ns).Get(ctx, "budget", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if got := controllers(tp.Status.Ancestors); fmt.Sprint(got) != fmt.Sprint(sixteen) {
		t.Errorf("budget's controllers = %v, want the other controller's 16", got)
	}
	var m dto.Metric
	if err := w.dropped.WithLabelValues("BackendTLSPolicy").Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n != 0 {
		t.Errorf("%v entries dropped: translate handed the writer entries for a full list", n)
	}

	// Our entry now fills kept's list: kept stays applied, and nothing
	// changes.
	before := rvs()
	translateAndWrite("second pass")
	if after := rvs(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the second pass wrote: resource versions %v -> %v", before, after)
	}
}
