package status

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/apiserver"
)

const ns = "status-test"

// listInput reads the objects the writer needs, as a source would hand them
// to translate.
func listInput(t *testing.T, env *apiserver.Env) translate.Input {
	t.Helper()
	ctx := t.Context()
	var in translate.Input
	ps, err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range ps.Items {
		in.BackendTLSPolicies = append(in.BackendTLSPolicies, &ps.Items[i])
	}
	xbs, err := env.Gateway.ExperimentalV1alpha1().XBackends(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range xbs.Items {
		in.XBackends = append(in.XBackends, &xbs.Items[i])
	}
	rs, err := env.Gateway.GatewayV1().HTTPRoutes(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range rs.Items {
		in.HTTPRoutes = append(in.HTTPRoutes, &rs.Items[i])
	}
	tps, err := env.Gateway.ExperimentalV1alpha1().XBackendTrafficPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range tps.Items {
		in.XBackendTrafficPolicies = append(in.XBackendTrafficPolicies, &tps.Items[i])
	}
	svcs, err := env.Kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range svcs.Items {
		in.Services = append(in.Services, &svcs.Items[i])
	}
	ms, err := env.Gateway.ExperimentalV1alpha1().XMeshes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range ms.Items {
		in.XMeshes = append(in.XMeshes, &ms.Items[i])
	}
	return in
}

func getPolicy(t *testing.T, env *apiserver.Env, name string) *gwv1.BackendTLSPolicy {
	t.Helper()
	p, err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWriterAgainstAPIServer writes status into real objects: another
// controller's entries survive every write, an unchanged status is not
// written again, a stale cache is merged on the fresh object instead of
// duplicating entries, lastTransitionTime moves only with a transition, and
// a status for an older generation is not written.
func TestWriterAgainstAPIServer(t *testing.T) {
	env := startWithNamespace(t)
	ctx := t.Context()
	policy := createPolicy(t, env)
	// Another controller (say a Gateway implementation) already reports
	// on the policy.
	theirs := ancestor(other, gwv1.ParentReference{Name: "gw"}, cond("Accepted", "True", "Accepted", "theirs", 1, t0))
	policy.Status.Ancestors = []gwv1.PolicyAncestorStatus{theirs}
	if _, err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).UpdateStatus(ctx, policy, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	w, err := New(Config{}, env.Gateway, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	written := func() float64 {
		var m dto.Metric
		if err := w.writes.WithLabelValues("BackendTLSPolicy", "written").Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	key := types.NamespacedName{Namespace: ns, Name: "p"}
	now := time.Now()
	accepted := func(gen int64, msg string) translate.Status {
		return translate.Status{BackendTLSPolicies: map[types.NamespacedName][]gwv1.PolicyAncestorStatus{
			key: {ancestor(translate.ControllerName, svcRef("svc", ""),
				cond("Accepted", "True", "Accepted", msg, gen, metav1.NewTime(now)),
				cond("ResolvedRefs", "True", "ResolvedRefs", "", gen, metav1.NewTime(now)))},
		}}
	}

	stale := listInput(t, env) // a cache that never sees our writes
	if err := w.Write(ctx, stale, accepted(1, "ok"), nil); err != nil {
		t.Fatal(err)
	}
	got := getPolicy(t, env, "p")
	if n := len(got.Status.Ancestors); n != 2 || got.Status.Ancestors[0].ControllerName != other {
		t.Fatalf("ancestors after the first write = %+v; want theirs, then ours", got.Status.Ancestors)
	}
	firstRV, firstLTT := got.ResourceVersion, got.Status.Ancestors[1].Conditions[0].LastTransitionTime

	// The same status again, from the stale cache: the Writer merges
	// against what it wrote, not the stale object, and sends nothing
	// (TestWriterRetriesStalePass counts the requests).
	if err := w.Write(ctx, stale, accepted(1, "ok"), nil); err != nil {
		t.Fatal(err)
	}
	// And from a fresh cache: nothing is even sent.
	before := written()
	if err := w.Write(ctx, listInput(t, env), accepted(1, "ok"), nil); err != nil {
		t.Fatal(err)
	}
	if got := getPolicy(t, env, "p"); got.ResourceVersion != firstRV || len(got.Status.Ancestors) != 2 {
		t.Errorf("unchanged status rewrote the object: rv %s -> %s, ancestors %d", firstRV, got.ResourceVersion, len(got.Status.Ancestors))
	}
	if written() != before {
		t.Errorf("unchanged status sent %v patches", written()-before)
	}

	// The other controller changes its entry; our stale cache does not
	// show it; our next write must keep it.
	cur := getPolicy(t, env, "p")
	cur.Status.Ancestors[0].Conditions[0].Message = "theirs, updated"
	if _, err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour) // translate's clock for the next pass
	if err := w.Write(ctx, stale, accepted(1, "ok, reworded"), nil); err != nil {
		t.Fatal(err)
	}
	got = getPolicy(t, env, "p")
	if msg := got.Status.Ancestors[0].Conditions[0].Message; msg != "theirs, updated" {
		t.Errorf("the other controller's entry became %q", msg)
	}
	ours := got.Status.Ancestors[1]
	if ours.Conditions[0].Message != "ok, reworded" || !ours.Conditions[0].LastTransitionTime.Equal(&firstLTT) {
		t.Errorf("a changed message under the same status is written and is no transition: %+v (first time %v)", ours.Conditions[0], firstLTT)
	}
	if !ours.Conditions[1].LastTransitionTime.Equal(&firstLTT) {
		t.Errorf("the unchanged ResolvedRefs condition moved its time: %v, want %v", ours.Conditions[1].LastTransitionTime, firstLTT)
	}

	// A new generation of the policy: status judged on generation 1 must
	// not be written over it.
	cur = getPolicy(t, env, "p")
	cur.Spec.Validation.Hostname = "other.example.com"
	if _, err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh := listInput(t, env)
	before = written()
	if err := w.Write(ctx, fresh, accepted(1, "judged on generation 1"), nil); err != nil {
		t.Fatal(err)
	}
	if written() != before {
		t.Errorf("a status for generation 1 was written over generation 2")
	}
	if err := w.Write(ctx, fresh, accepted(2, "ok, reworded"), nil); err != nil {
		t.Fatal(err)
	}
	got = getPolicy(t, env, "p")
	if g := got.Status.Ancestors[1].Conditions[0].ObservedGeneration; g != 2 {
		t.Errorf("observedGeneration = %d, want 2", g)
	}

	// The policy no longer relates to the Service: our entry goes, theirs
	// stays.
	if err := w.Write(ctx, listInput(t, env), translate.Status{BackendTLSPolicies: map[types.NamespacedName][]gwv1.PolicyAncestorStatus{key: {}}}, nil); err != nil {
		t.Fatal(err)
	}
	got = getPolicy(t, env, "p")
	if diff := cmp.Diff([]gwv1.GatewayController{other}, controllers(got.Status.Ancestors)); diff != "" {
		t.Errorf("after removal, controllers (-want +got):\n%s", diff)
	}

	// The policy is deleted and another of the same name created before
	// the status judged on the old one is written: the new policy is not
	// what translate judged, and gets nothing.
	judged := listInput(t, env)
	if err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	policy.ObjectMeta = metav1.ObjectMeta{Name: "p", Namespace: ns}
	policy.Status = gwv1.PolicyStatus{}
	if _, err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, judged, accepted(2, "judged on the deleted policy"), nil); err != nil {
		t.Fatal(err)
	}
	if got := getPolicy(t, env, "p"); len(got.Status.Ancestors) != 0 {
		t.Errorf("the recreated policy got the deleted one's status: %+v", got.Status.Ancestors)
	}
}

func controllers(as []gwv1.PolicyAncestorStatus) []gwv1.GatewayController {
	var out []gwv1.GatewayController
	for _, a := range as {
		out = append(out, a.ControllerName)
	}
	return out
}

// TestWriterOtherKinds writes XBackend ancestors, HTTPRoute parents and an
// XMesh's status.
func TestWriterOtherKinds(t *testing.T) {
	env := startWithNamespace(t)
	ctx := t.Context()
	if _, err := env.Gateway.ExperimentalV1alpha1().XBackends(ns).Create(ctx, &gwxv1alpha1.XBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: ns},
		Spec: gwxv1alpha1.BackendSpec{
			Type:             gwxv1alpha1.BackendTypeExternalHostname,
			Port:             gwxv1alpha1.BackendPort{Number: 443},
			ExternalHostname: &gwxv1alpha1.ExternalHostnameBackend{Hostname: "api.example.com"},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Gateway.GatewayV1().HTTPRoutes(ns).Create(ctx, &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: ns},
		Spec:       gwv1.HTTPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{svcRef("svc", "")}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Gateway.ExperimentalV1alpha1().XMeshes().Create(ctx, &gwxv1alpha1.XMesh{
		ObjectMeta: metav1.ObjectMeta{Name: "sockmesh"},
		Spec:       gwxv1alpha1.MeshSpec{ControllerName: translate.ControllerName},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{}, env.Gateway, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.NewTime(time.Now())
	key := types.NamespacedName{Namespace: ns, Name: "ext"}
	st := translate.Status{
		XBackends: map[types.NamespacedName][]gwxv1alpha1.BackendAncestorStatus{key: {{
			ControllerName: translate.ControllerName, AncestorRef: svcRef("svc", ""),
			Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "ok", 1, now)},
		}}},
		HTTPRoutes: map[types.NamespacedName][]gwv1.RouteParentStatus{{Namespace: ns, Name: "r"}: {{
			ControllerName: translate.ControllerName, ParentRef: svcRef("svc", ""),
			Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "ok", 1, now), cond("ResolvedRefs", "True", "ResolvedRefs", "ok", 1, now)},
		}}},
		XMeshes: map[string]gwxv1alpha1.MeshStatus{"sockmesh": {
			Conditions:        []metav1.Condition{cond("Accepted", "True", "Accepted", "ok", 1, now)},
			SupportedFeatures: []gwv1.SupportedFeature{{Name: "MeshHTTPRouteRedirectPath"}, {Name: "MeshClusterIPMatching"}},
		}},
	}
	if err := w.Write(ctx, listInput(t, env), st, nil); err != nil {
		t.Fatal(err)
	}
	xb, err := env.Gateway.ExperimentalV1alpha1().XBackends(ns).Get(ctx, "ext", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(xb.Status.Ancestors) != 1 || xb.Status.Ancestors[0].Conditions[0].Reason != "Accepted" {
		t.Errorf("XBackend ancestors = %+v", xb.Status.Ancestors)
	}
	r, err := env.Gateway.GatewayV1().HTTPRoutes(ns).Get(ctx, "r", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Status.Parents) != 1 || len(r.Status.Parents[0].Conditions) != 2 {
		t.Errorf("HTTPRoute parents = %+v", r.Status.Parents)
	}
	m, err := env.Gateway.ExperimentalV1alpha1().XMeshes().Get(ctx, "sockmesh", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Status.Conditions) != 1 || len(m.Status.SupportedFeatures) != 2 {
		t.Errorf("XMesh status = %+v", m.Status)
	}

	// Written again unchanged: no object changes.
	rvs := []string{xb.ResourceVersion, r.ResourceVersion, m.ResourceVersion}
	if err := w.Write(context.Background(), listInput(t, env), st, nil); err != nil {
		t.Fatal(err)
	}
	in := listInput(t, env)
	if got := []string{in.XBackends[0].ResourceVersion, in.HTTPRoutes[0].ResourceVersion, in.XMeshes[0].ResourceVersion}; !cmp.Equal(got, rvs) {
		t.Errorf("resource versions after an unchanged write = %v, want %v", got, rvs)
	}
}

// startWithNamespace starts an API server holding the tests' namespace ns.
func startWithNamespace(t *testing.T) *apiserver.Env {
	t.Helper()
	env := apiserver.Start(t)
	if _, err := env.Kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return env
}

// createPolicy creates BackendTLSPolicy p in ns, for Service svc with
// System roots.
func createPolicy(t *testing.T, env *apiserver.Env) *gwv1.BackendTLSPolicy {
	t.Helper()
	policy, err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).Create(t.Context(), &gwv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{
				LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Group: "", Kind: "Service", Name: "svc"},
			}},
			Validation: gwv1.BackendTLSPolicyValidation{
				WellKnownCACertificates: ptr(gwv1.WellKnownCACertificatesSystem),
				Hostname:                "svc.example.com",
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return policy
}
