package status

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestRouteParentsRoomCounted runs translate and the writer over a route
// whose 20 Service parents another mesh's controller also answers for, in
// a real API server. Translate counts the other controller's entries
// against RouteStatus's 32, as it counts a policy's against 16: it wants
// entries for the 12 parents that fit, lists the other 8 in Unrepresented
// (sockmeshctl shows them), and the writer leaves nothing out. When the
// other controller gives up 4 entries, the next translation keeps its 12
// and takes the 4; a translation that changes nothing writes nothing.
// Before, translate wanted all 20 and left the writer to drop 8 at each
// change, logged and counted as a full list.
func TestRouteParentsRoomCounted(t *testing.T) {
	env := startWithNamespace(t)
	ctx := t.Context()
	_, refs := crowdedRoute(t, env)
	w, err := New(Config{}, env.Gateway, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	// pass translates what the API server holds and writes it; it checks
	// that translate wanted entries for the parents named in ours, in
	// order, listed the rest as unrepresented, and that the written route
	// holds them and nothing was left out.
	pass := func(name string, ours ...int) {
		t.Helper()
		in := listInput(t, env)
		in.Now = time.Now()
		res, err := translate.Translate(in)
		if err != nil {
			t.Fatal(err)
		}
		want := map[gwv1.ObjectName]bool{}
		for _, i := range ours {
			want[refs[i].Name] = true
		}
		var wanted []gwv1.ObjectName
		for _, p := range res.Status.HTTPRoutes[types.NamespacedName{Namespace: ns, Name: "crowded"}] {
			wanted = append(wanted, p.ParentRef.Name)
		}
		if len(wanted) != len(ours) {
			t.Fatalf("%s: translate wants entries for %v, want %d of them: %v", name, wanted, len(ours), ours)
		}
		for _, n := range wanted {
			if !want[n] {
				t.Errorf("%s: translate wants an entry for %s, which has no room", name, n)
			}
		}
		if n := len(res.Unrepresented); n != len(refs)-len(ours) {
			t.Errorf("%s: %d parents unrepresented, want %d", name, n, len(refs)-len(ours))
		}
		for _, u := range res.Unrepresented {
			if u.Policy.Kind != "HTTPRoute" || u.Policy.Name != "crowded" || want[u.Target.Name] {
				t.Errorf("%s: unrepresented %+v", name, u)
			}
		}
		if err := w.Write(ctx, in, res.Status, nil); err != nil {
			t.Fatal(err)
		}
		written := 0
		for _, p := range getCrowded(t, env).Status.Parents {
			if p.ControllerName == translate.ControllerName {
				written++
			}
		}
		if written != len(ours) {
			t.Errorf("%s: %d entries of ours written, want %d", name, written, len(ours))
		}
		var m dto.Metric
		if err := w.dropped.WithLabelValues("HTTPRoute").Write(&m); err != nil {
			t.Fatal(err)
		}
		if n := m.GetCounter().GetValue(); n != 0 {
			t.Errorf("%s: the writer left %v entries out: translate handed it more than the list holds", name, n)
		}
	}
	seq := func(from, to int) []int {
		var s []int
		for i := from; i < to; i++ {
			s = append(s, i)
		}
		return s
	}

	pass("first pass", seq(0, 12)...)

	// The other controller drops its entries for svc16-svc19: 4 more of
	// ours fit, and ours keep their room.
	r := getCrowded(t, env)
	var kept []gwv1.RouteParentStatus
	for _, p := range r.Status.Parents {
		if p.ControllerName != other || p.ParentRef.Name < "svc16" {
			kept = append(kept, p)
		}
	}
	r.Status.Parents = kept
	if _, err := env.Gateway.GatewayV1().HTTPRoutes(ns).UpdateStatus(ctx, r, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pass("after the other controller made room", seq(0, 16)...)

	rv := getCrowded(t, env).ResourceVersion
	pass("unchanged", seq(0, 16)...)
	if now := getCrowded(t, env).ResourceVersion; now != rv {
		t.Errorf("a pass that changed nothing wrote: resource version %s -> %s", rv, now)
	}
}
