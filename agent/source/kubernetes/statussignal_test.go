package kubernetes

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/test/apiserver"
)

func parent(ctrl gwv1.GatewayController, name, message string) gwv1.RouteParentStatus {
	group, kind := gwv1.Group(""), gwv1.Kind("Service")
	return gwv1.RouteParentStatus{ControllerName: ctrl, ParentRef: gwv1.ParentReference{Group: &group, Kind: &kind, Name: gwv1.ObjectName(name)},
		Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", Message: message,
			ObservedGeneration: 1, LastTransitionTime: metav1.Now()}}}
}

// TestStatusUpdatesThatSignal: of the updates to status alone, those that
// remove an entry (or an XMesh condition) of sockmesh's, or bring or take
// another controller's entry, signal; sockmesh's own writes, which add or
// update its entries, do not.
func TestStatusUpdatesThatSignal(t *testing.T) {
	const theirs gwv1.GatewayController = "example.net/mesh"
	route := func(parents ...gwv1.RouteParentStatus) *gwv1.HTTPRoute {
		return &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Generation: 1}, Status: gwv1.HTTPRouteStatus{
			RouteStatus: gwv1.RouteStatus{Parents: parents}}}
	}
	ours, theirsToo := parent(translate.ControllerName, "a", "ok"), parent(theirs, "a", "ok")
	mesh := func(conds ...string) *gwxv1alpha1.XMesh {
		m := &gwxv1alpha1.XMesh{ObjectMeta: metav1.ObjectMeta{Generation: 1}, Spec: gwxv1alpha1.MeshSpec{ControllerName: translate.ControllerName}}
		for _, c := range conds {
			m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: c})
		}
		return m
	}
	xb := func(ctrls ...gwv1.GatewayController) *gwxv1alpha1.XBackend {
		x := &gwxv1alpha1.XBackend{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
		for _, c := range ctrls {
			x.Status.Ancestors = append(x.Status.Ancestors, gwxv1alpha1.BackendAncestorStatus{ControllerName: c, AncestorRef: ours.ParentRef})
		}
		return x
	}
	for name, tc := range map[string]struct {
		old, new any
		want     bool
	}{
		"our entry added":               {route(), route(ours), false},
		"our entry updated":             {route(ours), route(parent(translate.ControllerName, "a", "changed")), false},
		"our entry removed":             {route(ours, theirsToo), route(theirsToo), true},
		"our entry for another parent":  {route(ours), route(parent(translate.ControllerName, "b", "ok")), true},
		"their entry added to a route":  {route(ours), route(ours, theirsToo), true},
		"their entry updated":           {route(ours, theirsToo), route(ours, parent(theirs, "a", "changed")), false},
		"our XBackend ancestor removed": {xb(translate.ControllerName), xb(), true},
		"our XBackend ancestor added":   {xb(), xb(translate.ControllerName), false},
		"our XMesh condition removed":   {mesh("Accepted", "SupportedFeatures"), mesh("SupportedFeatures"), true},
		"our XMesh condition added":     {mesh(), mesh("Accepted"), false},
	} {
		if got := statusChanged(tc.old, tc.new); got != tc.want {
			t.Errorf("statusChanged(%s) = %v, want %v", name, got, tc.want)
		}
	}
}

// TestStatusEntryRemovedSignals: an entry of sockmesh's that another party
// removes from a route's status (a controller that replaces the whole
// list, kubectl edit --subresource=status) signals a change at once, so
// that the writer puts it back; an update of sockmesh's entry, as its own
// writes make, signals nothing. Before, the removal waited for the control
// plane's 10-minute resync.
func TestStatusEntryRemovedSignals(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	routes := env.Gateway.GatewayV1().HTTPRoutes(ns)
	must.Succeed(t)(env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	s := startSource(t, env)
	waitInput(t, s, "the first listing", func(translate.Input) bool { return true })
	group, kind := gwv1.Group(""), gwv1.Kind("Service")
	r := must.Value[*gwv1.HTTPRoute](t)(routes.Create(ctx, &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: ns},
		Spec: gwv1.HTTPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{
			ParentRefs: []gwv1.ParentReference{{Group: &group, Kind: &kind, Name: "a"}}}},
	}, metav1.CreateOptions{}))
	waitInput(t, s, "the route", func(in translate.Input) bool { return len(in.HTTPRoutes) == 1 })
	parents := func(in translate.Input) []gwv1.RouteParentStatus {
		if len(in.HTTPRoutes) != 1 {
			return nil
		}
		return in.HTTPRoutes[0].Status.Parents
	}
	// Another mesh's entry, which takes room, signals; wait for it.
	r.Status.Parents = []gwv1.RouteParentStatus{parent(translate.ControllerName, "a", "ok"), parent("example.net/mesh", "a", "ok")}
	r = must.Value[*gwv1.HTTPRoute](t)(routes.UpdateStatus(ctx, r, metav1.UpdateOptions{}))
	waitInput(t, s, "both entries", func(in translate.Input) bool { return len(parents(in)) == 2 })
	events := func() float64 {
		var m dto.Metric
		if err := s.events.WithLabelValues(kindHTTPRoute).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	before := events()

	r.Status.Parents[0] = parent(translate.ControllerName, "a", "as sockmesh writes it")
	r = must.Value[*gwv1.HTTPRoute](t)(routes.UpdateStatus(ctx, r, metav1.UpdateOptions{}))
	r.Status.Parents = r.Status.Parents[1:]
	must.Succeed(t)(routes.UpdateStatus(ctx, r, metav1.UpdateOptions{}))
	// The informer hands updates over in order: once the removal has
	// signalled, the update before it was handled.
	waitInput(t, s, "the removal of sockmesh's entry", func(in translate.Input) bool {
		ps := parents(in)
		return len(ps) == 1 && ps[0].ControllerName != translate.ControllerName
	})
	if n := events() - before; n != 1 {
		t.Errorf("%v route events signalled for an update of sockmesh's entry and its removal, want 1 (the removal)", n)
	}
}
