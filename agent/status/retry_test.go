package status

import (
	"context"
	"log/slog"
	"maps"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// requestCounter counts the requests a client sends, by method.
type requestCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		c.mu.Lock()
		c.n[r.Method]++
		c.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

// take returns the counts since the last take.
func (c *requestCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestWriterRetriesStalePass writes one translation pass again and again, as
// the control plane retries it while another writer fails: the pass's
// objects are the cached ones from before the first write, and a status-only
// change never brings newer ones. A retry must not send again what the first
// write wrote, nor conflict on a status that changed since; within a new
// leader term the Writer trusts nothing it remembers.
func TestWriterRetriesStalePass(t *testing.T) {
	env := startWithNamespace(t)
	ctx := t.Context()
	createPolicy(t, env)
	if _, err := env.Gateway.ExperimentalV1alpha1().XMeshes().Create(ctx, &gwxv1alpha1.XMesh{
		ObjectMeta: metav1.ObjectMeta{Name: "sockmesh"},
		Spec:       gwxv1alpha1.MeshSpec{ControllerName: translate.ControllerName},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	requests := &requestCounter{n: map[string]int{}}
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = requests.wrap
	gw, err := gwclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{}, gw, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	conflicts := func() float64 {
		var sum float64
		for _, kind := range []string{"BackendTLSPolicy", "XMesh"} {
			var m dto.Metric
			if err := w.writes.WithLabelValues(kind, "conflict").Write(&m); err != nil {
				t.Fatal(err)
			}
			sum += m.GetCounter().GetValue()
		}
		return sum
	}
	now := metav1.NewTime(time.Now())
	status := func(msg string) translate.Status {
		return translate.Status{
			BackendTLSPolicies: map[types.NamespacedName][]gwv1.PolicyAncestorStatus{
				{Namespace: ns, Name: "p"}: {ancestor(translate.ControllerName, svcRef("svc", ""),
					cond("Accepted", "True", "Accepted", msg, 1, now))},
			},
			XMeshes: map[string]gwxv1alpha1.MeshStatus{"sockmesh": {
				Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", msg, 1, now)},
			}},
		}
	}
	// messages returns the message of our Accepted condition on the
	// policy and the mesh.
	messages := func() (policy, mesh string) {
		t.Helper()
		p := getPolicy(t, env, "p")
		m, err := env.Gateway.ExperimentalV1alpha1().XMeshes().Get(ctx, "sockmesh", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		as := p.Status.Ancestors
		if len(as) == 0 || as[len(as)-1].ControllerName != translate.ControllerName || len(m.Status.Conditions) != 1 {
			t.Fatalf("policy ancestors %+v, mesh conditions %+v; want ours last, one condition", as, m.Status.Conditions)
		}
		return as[len(as)-1].Conditions[0].Message, m.Status.Conditions[0].Message
	}

	pass := listInput(t, env)              // the cache, never to see the writes below
	nextTerm := context.WithoutCancel(ctx) // a ctx with another Done: another term
	for _, step := range []struct {
		name    string
		ctx     context.Context
		msg     string
		patches int
		gets    int
	}{
		{name: "first write", ctx: ctx, msg: "ok", patches: 2},
		{name: "the same pass retried", ctx: ctx, msg: "ok"},
		{name: "the same pass retried again", ctx: ctx, msg: "ok"},
		{name: "a changed status on the stale objects", ctx: ctx, msg: "ok, reworded", patches: 2},
		{name: "the changed status retried", ctx: ctx, msg: "ok, reworded"},
		// Another agent may have led in between: what this one wrote is
		// no proof of what the objects hold. The stale objects conflict,
		// and the fresh ones already have the status.
		{name: "the same pass in a new term", ctx: nextTerm, msg: "ok, reworded", patches: 2, gets: 2},
	} {
		requests.take()
		before := conflicts()
		if err := w.Write(step.ctx, pass, status(step.msg), nil); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		got := requests.take()
		if got[http.MethodPatch] != step.patches || got[http.MethodGet] != step.gets || len(got) > 2 {
			t.Errorf("%s: requests %v; want %d PATCH, %d GET", step.name, got, step.patches, step.gets)
		}
		if step.gets == 0 && conflicts() != before {
			t.Errorf("%s: %v conflicts", step.name, conflicts()-before)
		}
		if p, m := messages(); p != step.msg || m != step.msg {
			t.Errorf("%s: messages policy %q, mesh %q; want %q", step.name, p, m, step.msg)
		}
	}

	// Another controller adds its entry to the policy, which the pass does
	// not show either: the policy's patch from what this term remembers
	// conflicts, and the merge on the object read again keeps their entry.
	cur := getPolicy(t, env, "p")
	theirs := ancestor(other, gwv1.ParentReference{Name: "gw"}, cond("Accepted", "True", "Accepted", "theirs", 1, now))
	cur.Status.Ancestors = append([]gwv1.PolicyAncestorStatus{theirs}, cur.Status.Ancestors...)
	if _, err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	requests.take()
	if err := w.Write(nextTerm, pass, status("ok, once more"), nil); err != nil {
		t.Fatal(err)
	}
	if got, want := requests.take(), map[string]int{http.MethodPatch: 3, http.MethodGet: 1}; !maps.Equal(got, want) {
		t.Errorf("a changed status over another controller's write: requests %v, want %v", got, want)
	}
	if p, m := messages(); p != "ok, once more" || m != "ok, once more" {
		t.Errorf("over another controller's write: messages policy %q, mesh %q", p, m)
	}
	if as := getPolicy(t, env, "p").Status.Ancestors; len(as) != 2 || as[0].ControllerName != other {
		t.Errorf("the other controller's entry is gone: %+v", as)
	}

	// The cache catches up: nothing to send, and nothing left to remember.
	requests.take()
	if err := w.Write(nextTerm, listInput(t, env), status("ok, once more"), nil); err != nil {
		t.Fatal(err)
	}
	if got := requests.take(); len(got) != 0 {
		t.Errorf("a caught-up pass sent %v", got)
	}
	if n := w.recent.size(); n != 0 {
		t.Errorf("%d objects remembered after the cache caught up", n)
	}
}
