package status

import (
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestRemovalNotWrittenOnNewerGeneration: translate judged generation 1 of
// a policy to have no ancestor of sockmesh's left, and the policy's spec
// changed (generation 2) before the write. That judgement is not written
// onto generation 2, which the next translation judges: the entry stays,
// as a wanted entry's conditions would not be written either. A removal
// carries no condition whose observedGeneration could tell; before, the
// writer judged staleness by those alone, and removed the entry from a
// generation it never judged (one that may target the Service again). The
// same removal judged on generation 2 is written.
func TestRemovalNotWrittenOnNewerGeneration(t *testing.T) {
	env := startWithNamespace(t)
	ctx := t.Context()
	createPolicy(t, env)
	w, err := New(Config{}, env.Gateway, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: ns, Name: "p"}
	entry := ancestor(translate.ControllerName, svcRef("svc", ""),
		cond("Accepted", "True", "Accepted", "ok", 1, metav1.NewTime(time.Now())))
	if err := w.Write(ctx, listInput(t, env), translate.Status{
		BackendTLSPolicies: map[types.NamespacedName][]gwv1.PolicyAncestorStatus{key: {entry}}}, nil); err != nil {
		t.Fatal(err)
	}
	judged := listInput(t, env) // generation 1, with our entry
	p := getPolicy(t, env, "p")
	p.Spec.Validation.Hostname = "other.example.com"
	if _, err := env.Gateway.GatewayV1().BackendTLSPolicies(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	none := translate.Status{BackendTLSPolicies: map[types.NamespacedName][]gwv1.PolicyAncestorStatus{key: {}}}
	if err := w.Write(ctx, judged, none, nil); err != nil {
		t.Fatal(err)
	}
	if p := getPolicy(t, env, "p"); p.Generation != 2 || len(p.Status.Ancestors) != 1 {
		t.Errorf("generation %d's ancestors after a removal judged on generation 1: %+v; want ours kept", p.Generation, p.Status.Ancestors)
	}

	if err := w.Write(ctx, listInput(t, env), none, nil); err != nil {
		t.Fatal(err)
	}
	if p := getPolicy(t, env, "p"); len(p.Status.Ancestors) != 0 {
		t.Errorf("ancestors after a removal judged on generation 2: %+v; want none", p.Status.Ancestors)
	}
}
