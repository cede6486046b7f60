package status

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/apiserver"
)

// TestRouteParentsFullReportedOnce: a route whose 20 Service parents
// another mesh's controller also answers for (two GAMMA implementations
// side by side, as in a migration) needs 40 entries where RouteStatus
// holds 32. The writer adds the 12 of ours that fit, after the other
// controller's, and reports the 8 left out with that write; the passes
// after it, which change nothing, write nothing and report nothing. Before,
// each translation (one per endpoint change on a busy cluster) logged the
// warning and counted the 8 again though nothing was written.
func TestRouteParentsFullReportedOnce(t *testing.T) {
	env := startWithNamespace(t)
	ctx := t.Context()
	r, refs := crowdedRoute(t, env)
	var want []gwv1.RouteParentStatus
	for _, ref := range refs {
		want = append(want, gwv1.RouteParentStatus{ControllerName: translate.ControllerName, ParentRef: ref, Conditions: []metav1.Condition{
			cond("Accepted", "True", "Accepted", "ok", r.Generation, metav1.NewTime(time.Now()))}})
	}
	w, err := New(Config{}, env.Gateway, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	st := translate.Status{HTTPRoutes: map[types.NamespacedName][]gwv1.RouteParentStatus{
		{Namespace: ns, Name: "crowded"}: want}}
	dropped := func() float64 {
		t.Helper()
		var m dto.Metric
		if err := w.dropped.WithLabelValues("HTTPRoute").Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}

	if err := w.Write(ctx, listInput(t, env), st, nil); err != nil {
		t.Fatal(err)
	}
	written := getCrowded(t, env)
	var ours int
	for i, p := range written.Status.Parents {
		if p.ControllerName != translate.ControllerName {
			if i >= 20 {
				t.Errorf("parents[%d] is the other controller's after ours: its entries must stay in place", i)
			}
			continue
		}
		if want := refs[ours].Name; p.ParentRef.Name != want {
			t.Errorf("parents[%d] is ours for %s, want %s: ours in translate's order", i, p.ParentRef.Name, want)
		}
		ours++
	}
	if len(written.Status.Parents) != maxRouteParents || ours != 12 {
		t.Errorf("first write: %d parents, %d ours; want %d, 12", len(written.Status.Parents), ours, maxRouteParents)
	}
	if n := dropped(); n != 8 {
		t.Errorf("first write: %v entries reported left out, want 8", n)
	}

	for pass := range 3 {
		if err := w.Write(ctx, listInput(t, env), st, nil); err != nil {
			t.Fatal(err)
		}
		if rv := getCrowded(t, env).ResourceVersion; rv != written.ResourceVersion {
			t.Errorf("pass %d changed nothing but wrote: resource version %s -> %s", pass+2, written.ResourceVersion, rv)
		}
		if n := dropped(); n != 8 {
			t.Errorf("pass %d changed nothing: %v entries reported left out in all, want still 8", pass+2, n)
		}
	}
}

// crowdedRoute creates HTTPRoute "crowded" with 20 Service parents, svc00
// to svc19, each holding an entry of another mesh's controller (two GAMMA
// implementations side by side, as in a migration), and returns it and
// its parentRefs.
func crowdedRoute(t *testing.T, env *apiserver.Env) (*gwv1.HTTPRoute, []gwv1.ParentReference) {
	t.Helper()
	var refs []gwv1.ParentReference
	for i := range 20 {
		refs = append(refs, svcRef(fmt.Sprintf("svc%02d", i), ""))
	}
	r, err := env.Gateway.GatewayV1().HTTPRoutes(ns).Create(t.Context(), &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "crowded", Namespace: ns},
		Spec:       gwv1.HTTPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: refs}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range refs {
		r.Status.Parents = append(r.Status.Parents, gwv1.RouteParentStatus{ControllerName: other, ParentRef: ref,
			Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "theirs", r.Generation, t0)}})
	}
	if r, err = env.Gateway.GatewayV1().HTTPRoutes(ns).UpdateStatus(t.Context(), r, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return r, refs
}

// getCrowded reads crowdedRoute's route as the API server holds it.
func getCrowded(t *testing.T, env *apiserver.Env) *gwv1.HTTPRoute {
	t.Helper()
	r, err := env.Gateway.GatewayV1().HTTPRoutes(ns).Get(t.Context(), "crowded", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
