package status

import (
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestXBackendAncestorsRoomCounted runs translate and the writer over an
// XBackend that 20 Services stand for, each holding an entry of another
// controller's, in a real API server (whose CRD holds 32 ancestors).
// Translate counts the other controller's entries against BackendStatus's
// 32, as it does a route's parents: it wants entries for the 12 Services
// that fit, lists the other 8 in Unrepresented (their connections still go
// to the XBackend), and the writer leaves nothing out. When the other
// controller gives up 4 entries, the next translation keeps its 12 and
// takes the 4; a translation that changes nothing writes nothing. Before,
// translate wanted all 20 (it capped at 32 without counting the others')
// and the writer dropped 8 at each change, logged as a full list.
func TestXBackendAncestorsRoomCounted(t *testing.T) {
	env := startWithNamespace(t)
	ctx := t.Context()
	xbs := env.Gateway.ExperimentalV1alpha1().XBackends(ns)
	xb, err := xbs.Create(ctx, &gwxv1alpha1.XBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: ns},
		Spec: gwxv1alpha1.BackendSpec{Type: gwxv1alpha1.BackendTypeExternalHostname, Port: gwxv1alpha1.BackendPort{Number: 443},
			ExternalHostname: &gwxv1alpha1.ExternalHostnameBackend{Hostname: "api.example.com"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 20)
	for i := range names {
		names[i] = fmt.Sprintf("svc%02d", i)
		if _, err := env.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: names[i], Namespace: ns, Annotations: map[string]string{translate.AnnotationXBackend: "ext"}},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 443, Protocol: corev1.ProtocolTCP}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		xb.Status.Ancestors = append(xb.Status.Ancestors, gwxv1alpha1.BackendAncestorStatus{ControllerName: other,
			AncestorRef: svcRef(names[i], ""), Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "theirs", xb.Generation, t0)}})
	}
	if _, err := xbs.UpdateStatus(ctx, xb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{}, env.Gateway, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	get := func() *gwxv1alpha1.XBackend {
		t.Helper()
		xb, err := xbs.Get(ctx, "ext", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return xb
	}
	// pass translates what the API server holds and writes it; it checks
	// that translate wanted entries for the first n Services, listed the
	// rest as unrepresented, and that the writer wrote them all.
	pass := func(name string, n int) {
		t.Helper()
		in := listInput(t, env)
		in.Now = time.Now()
		res, err := translate.Translate(in)
		if err != nil {
			t.Fatal(err)
		}
		var wanted []string
		for _, a := range res.Status.XBackends[types.NamespacedName{Namespace: ns, Name: "ext"}] {
			wanted = append(wanted, string(a.AncestorRef.Name))
		}
		if !slices.Equal(wanted, names[:n]) {
			t.Fatalf("%s: translate wants entries for %v, want %v", name, wanted, names[:n])
		}
		var unrepresented []string
		for _, u := range res.Unrepresented {
			if u.Policy.Kind != "XBackend" || u.Policy.Name != "ext" {
				t.Errorf("%s: unrepresented %+v", name, u)
			}
			unrepresented = append(unrepresented, string(u.Target.Name))
		}
		if !slices.Equal(unrepresented, names[n:]) {
			t.Errorf("%s: unrepresented %v, want %v", name, unrepresented, names[n:])
		}
		if err := w.Write(ctx, in, res.Status, nil); err != nil {
			t.Fatal(err)
		}
		written := 0
		for _, a := range get().Status.Ancestors {
			if a.ControllerName == translate.ControllerName {
				written++
			}
		}
		if written != n {
			t.Errorf("%s: %d entries of ours written, want %d", name, written, n)
		}
		var m dto.Metric
		if err := w.dropped.WithLabelValues("XBackend").Write(&m); err != nil {
			t.Fatal(err)
		}
		if d := m.GetCounter().GetValue(); d != 0 {
			t.Errorf("%s: the writer left %v entries out: translate handed it more than the list holds", name, d)
		}
	}

	pass("first pass", 12)

	// The other controller drops its entries for svc16-svc19: 4 more of
	// ours fit, and ours keep their room.
	xb = get()
	xb.Status.Ancestors = slices.DeleteFunc(xb.Status.Ancestors, func(a gwxv1alpha1.BackendAncestorStatus) bool {
		return a.ControllerName == other && a.AncestorRef.Name >= gwv1.ObjectName("svc16")
	})
	if _, err := xbs.UpdateStatus(ctx, xb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pass("after the other controller made room", 16)

	rv := get().ResourceVersion
	pass("unchanged", 16)
	if now := get().ResourceVersion; now != rv {
		t.Errorf("a pass that changed nothing wrote: resource version %s -> %s", rv, now)
	}
}
