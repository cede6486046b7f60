package status

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestWriterXBackendTrafficPolicy runs translate over XBackendTrafficPolicies
// in a real API server and writes what it returns: one ancestor per
// targeted Service and XBackend under sockmesh's controllerName, with
// Accepted (Accepted, TargetNotFound, Conflicted) and ResolvedRefs at the
// policy's generation, beside another controller's entry that is never
// touched; a policy that no longer targets something loses that entry.
func TestWriterXBackendTrafficPolicy(t *testing.T) {
	env := startWithNamespace(t)
	ctx := t.Context()
	if _, err := env.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "api"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Gateway.ExperimentalV1alpha1().XBackends(ns).Create(ctx, &gwxv1alpha1.XBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "ext"},
		Spec: gwxv1alpha1.BackendSpec{
			Type:             gwxv1alpha1.BackendTypeExternalHostname,
			Port:             gwxv1alpha1.BackendPort{Number: 443},
			ExternalHostname: &gwxv1alpha1.ExternalHostnameBackend{Hostname: "api.example.com"},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svcTarget := gwv1.LocalPolicyTargetReference{Group: "", Kind: "Service", Name: "api"}
	xbTarget := gwv1.LocalPolicyTargetReference{Group: gwxv1alpha1.GroupName, Kind: "XBackend", Name: "ext"}
	policies := env.Gateway.ExperimentalV1alpha1().XBackendTrafficPolicies(ns)
	create := func(name string, opts metav1.CreateOptions, targets ...gwv1.LocalPolicyTargetReference) *gwxv1alpha1.XBackendTrafficPolicy {
		t.Helper()
		p, err := policies.Create(ctx, &gwxv1alpha1.XBackendTrafficPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: gwxv1alpha1.BackendTrafficPolicySpec{
				TargetRefs:      targets,
				RetryConstraint: &gwxv1alpha1.RetryConstraint{Budget: &gwxv1alpha1.BudgetDetails{Percent: ptr(30)}},
			},
		}, opts)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	budget := create("budget", metav1.CreateOptions{}, svcTarget, xbTarget, gwv1.LocalPolicyTargetReference{Group: "", Kind: "Service", Name: "gone"})
	// Another controller reports on the policy too.
	theirs := ancestor(other, gwv1.ParentReference{Name: "gw"}, cond("Accepted", "True", "Accepted", "theirs", 1, t0))
	budget.Status.Ancestors = []gwv1.PolicyAncestorStatus{theirs}
	if _, err := env.Gateway.ExperimentalV1alpha1().XBackendTrafficPolicies(ns).UpdateStatus(ctx, budget, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// "after" targets the Service too, created in a later second (the API
	// server's timestamps have seconds): the older policy must win although
	// the names, the tie-break, would pick "after". The server sets
	// creationTimestamp, so dry runs of the create ask it for its clock.
	var probe *gwxv1alpha1.XBackendTrafficPolicy
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		probe = create("after", metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}, svcTarget)
		return budget.CreationTimestamp.Before(&probe.CreationTimestamp), nil
	}); err != nil {
		t.Fatalf("the API server's creationTimestamp stayed at %s, budget's: %v", probe.CreationTimestamp, err)
	}
	create("after", metav1.CreateOptions{}, svcTarget)

	w, err := New(Config{}, env.Gateway, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	write := func() {
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
	}
	get := func(name string) *gwxv1alpha1.XBackendTrafficPolicy {
		t.Helper()
		p, err := env.Gateway.ExperimentalV1alpha1().XBackendTrafficPolicies(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	type entry struct{ ctrl, group, kind, name, accepted, resolved string }
	summary := func(p *gwxv1alpha1.XBackendTrafficPolicy) []entry {
		var out []entry
		for _, a := range p.Status.Ancestors {
			e := entry{ctrl: string(a.ControllerName), name: string(a.AncestorRef.Name)}
			if a.AncestorRef.Group != nil {
				e.group = string(*a.AncestorRef.Group)
			}
			if a.AncestorRef.Kind != nil {
				e.kind = string(*a.AncestorRef.Kind)
			}
			for _, c := range a.Conditions {
				if a.ControllerName == translate.ControllerName && c.ObservedGeneration != p.Generation {
					t.Errorf("%s ancestor %s: %s observedGeneration %d, want %d", p.Name, e.name, c.Type, c.ObservedGeneration, p.Generation)
				}
				switch c.Type {
				case "Accepted":
					e.accepted = string(c.Status) + "/" + c.Reason
				case "ResolvedRefs":
					e.resolved = string(c.Status) + "/" + c.Reason
				}
			}
			out = append(out, e)
		}
		return out
	}
	ours := string(translate.ControllerName)
	check := func(name string, want []entry) {
		t.Helper()
		got := summary(get(name))
		if len(got) != len(want) {
			t.Fatalf("%s ancestors = %+v, want %+v", name, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s ancestor %d = %+v, want %+v", name, i, got[i], want[i])
			}
		}
	}

	write()
	// Theirs first, its reference as the API server defaulted it.
	check("budget", []entry{
		{ctrl: string(other), group: gwv1.GroupName, kind: "Gateway", name: "gw", accepted: "True/Accepted"},
		{ours, "", "Service", "api", "True/Accepted", "True/ResolvedRefs"},
		{ours, "", "Service", "gone", "False/TargetNotFound", "True/ResolvedRefs"},
		{ours, gwxv1alpha1.GroupName, "XBackend", "ext", "True/Accepted", "True/ResolvedRefs"},
	})
	check("after", []entry{{ours, "", "Service", "api", "False/Conflicted", "True/ResolvedRefs"}})
	if msg := get("budget").Status.Ancestors[0].Conditions[0].Message; msg != "theirs" {
		t.Errorf("the other controller's entry became %q", msg)
	}

	// Unchanged: nothing is written.
	rv := get("budget").ResourceVersion
	write()
	if got := get("budget").ResourceVersion; got != rv {
		t.Errorf("an unchanged status rewrote the policy: rv %s -> %s", rv, got)
	}

	// The older policy now targets the XBackend only: its Service entries
	// go (theirs stays), and the newer policy governs the Service.
	p := get("budget")
	p.Spec.TargetRefs = []gwv1.LocalPolicyTargetReference{xbTarget}
	if _, err := env.Gateway.ExperimentalV1alpha1().XBackendTrafficPolicies(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	write()
	check("budget", []entry{
		{ctrl: string(other), group: gwv1.GroupName, kind: "Gateway", name: "gw", accepted: "True/Accepted"},
		{ours, gwxv1alpha1.GroupName, "XBackend", "ext", "True/Accepted", "True/ResolvedRefs"},
	})
	check("after", []entry{{ours, "", "Service", "api", "True/Accepted", "True/ResolvedRefs"}})
}
