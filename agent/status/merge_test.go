package status

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

var (
	t0 = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 = metav1.NewTime(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
)

func ptr[T any](v T) *T { return &v }

func svcRef(name, section string) gwv1.ParentReference {
	r := gwv1.ParentReference{Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Name: gwv1.ObjectName(name)}
	if section != "" {
		r.SectionName = ptr(gwv1.SectionName(section))
	}
	return r
}

func withNamespace(r gwv1.ParentReference, ns string) gwv1.ParentReference {
	r.Namespace = ptr(gwv1.Namespace(ns))
	return r
}

func cond(typ, status, reason, msg string, gen int64, at metav1.Time) metav1.Condition {
	return metav1.Condition{Type: typ, Status: metav1.ConditionStatus(status), Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: at}
}

func ancestor(ctrl gwv1.GatewayController, ref gwv1.ParentReference, conds ...metav1.Condition) gwv1.PolicyAncestorStatus {
	return gwv1.PolicyAncestorStatus{AncestorRef: ref, ControllerName: ctrl, Conditions: conds}
}

var policyEntries = entryKind[gwv1.PolicyAncestorStatus]{
	ref:        func(e *gwv1.PolicyAncestorStatus) gwv1.ParentReference { return e.AncestorRef },
	controller: func(e *gwv1.PolicyAncestorStatus) gwv1.GatewayController { return e.ControllerName },
	conditions: func(e *gwv1.PolicyAncestorStatus) *[]metav1.Condition { return &e.Conditions },
}

const other gwv1.GatewayController = "example.com/other-controller"

func TestMergeEntries(t *testing.T) {
	ours := translate.ControllerName
	accepted := func(gen int64, at metav1.Time) metav1.Condition {
		return cond("Accepted", "True", "Accepted", "policy accepted", gen, at)
	}
	theirs := ancestor(other, svcRef("svc", ""), cond("Accepted", "False", "Whatever", "theirs", 1, t0))
	for _, tc := range []struct {
		name     string
		existing []gwv1.PolicyAncestorStatus
		want     []gwv1.PolicyAncestorStatus
		max      int
		merged   []gwv1.PolicyAncestorStatus
		changed  bool
		dropped  int
	}{{
		name:    "add to empty",
		want:    []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t1))},
		merged:  []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t1))},
		changed: true,
	}, {
		name:     "unchanged keeps the stored entry and its time",
		existing: []gwv1.PolicyAncestorStatus{theirs, ancestor(ours, svcRef("svc", ""), accepted(1, t0))},
		want:     []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t1))},
		merged:   []gwv1.PolicyAncestorStatus{theirs, ancestor(ours, svcRef("svc", ""), accepted(1, t0))},
	}, {
		name:     "new generation keeps the time, updates observedGeneration",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t0))},
		want:     []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(2, t1))},
		merged:   []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(2, t0))},
		changed:  true,
	}, {
		name:     "a new status is a transition",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t0))},
		want: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""),
			cond("Accepted", "False", "NoValidCACertificate", "ca missing", 1, t1))},
		merged: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""),
			cond("Accepted", "False", "NoValidCACertificate", "ca missing", 1, t1))},
		changed: true,
	}, {
		// metav1.Condition: "the last time the condition transitioned
		// from one status to another".
		name: "a new reason and message under the same status keep the time",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""),
			cond("Accepted", "False", "NoValidCACertificate", "ca missing", 1, t0))},
		want: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""),
			cond("Accepted", "False", "Conflicted", "older policy", 1, t1))},
		merged: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""),
			cond("Accepted", "False", "Conflicted", "older policy", 1, t0))},
		changed: true,
	}, {
		// PolicyAncestorStatus.Conditions: "Implementations MUST NOT
		// remove or reorder Conditions that they are not directly
		// responsible for", such as special.io/SomeField.
		name: "another party's condition in our entry stays in place",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""),
			cond("special.io/SomeField", "True", "Set", "theirs", 1, t0), accepted(1, t0),
			cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0))},
		want: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""),
			cond("Accepted", "False", "Conflicted", "older policy", 2, t1))},
		merged: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""),
			cond("special.io/SomeField", "True", "Set", "theirs", 1, t0), cond("Accepted", "False", "Conflicted", "older policy", 2, t1))},
		changed: true,
	}, {
		// translate sets its own domain-prefixed types only while they
		// hold: one it no longer names is gone, another party's stays.
		name: "our own prefixed condition no longer wanted is removed",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t0),
			cond(translate.ConditionRulesShadowed, "True", translate.ReasonIdenticalMatches, "rule 1", 1, t0),
			cond("special.io/SomeField", "True", "Set", "theirs", 1, t0))},
		want: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t1))},
		merged: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""),
			accepted(1, t0), cond("special.io/SomeField", "True", "Set", "theirs", 1, t0))},
		changed: true,
	}, {
		name: "another party's condition alone changes nothing",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""),
			accepted(1, t0), cond("special.io/SomeField", "True", "Set", "theirs", 1, t0))},
		want: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t1))},
		merged: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""),
			accepted(1, t0), cond("special.io/SomeField", "True", "Set", "theirs", 1, t0))},
	}, {
		name:     "an ancestor no longer related is removed, others stay in place",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("gone", ""), accepted(1, t0)), theirs, ancestor(ours, svcRef("svc", ""), accepted(1, t0))},
		want:     []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t1))},
		merged:   []gwv1.PolicyAncestorStatus{theirs, ancestor(ours, svcRef("svc", ""), accepted(1, t0))},
		changed:  true,
	}, {
		name:     "empty want removes all of ours, never theirs",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t0)), theirs},
		merged:   []gwv1.PolicyAncestorStatus{theirs},
		changed:  true,
	}, {
		name: "duplicates of ours collapse to one",
		existing: []gwv1.PolicyAncestorStatus{
			ancestor(ours, svcRef("svc", ""), accepted(1, t0)), ancestor(ours, svcRef("svc", ""), accepted(1, t0))},
		want:    []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t1))},
		merged:  []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t0))},
		changed: true,
	}, {
		// The CRDs default group and kind, never the namespace.
		name: "a reference the API server defaulted matches",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, gwv1.ParentReference{
			Group: ptr(gwv1.Group(gwv1.GroupName)), Kind: ptr(gwv1.Kind("Gateway")), Name: "gw"},
			accepted(1, t0))},
		want: []gwv1.PolicyAncestorStatus{ancestor(ours, gwv1.ParentReference{Name: "gw"}, accepted(1, t1))},
		merged: []gwv1.PolicyAncestorStatus{ancestor(ours, gwv1.ParentReference{
			Group: ptr(gwv1.Group(gwv1.GroupName)), Kind: ptr(gwv1.Kind("Gateway")), Name: "gw"},
			accepted(1, t0))},
	}, {
		// A route's parentRef edited from {name: svc, namespace: ns} to
		// {name: svc}, and back: the entry follows the spec's form,
		// keeping its conditions' times.
		name:     "a namespace dropped from the spec's reference is dropped from the entry",
		existing: []gwv1.PolicyAncestorStatus{theirs, ancestor(ours, withNamespace(svcRef("svc", ""), "ns"), accepted(1, t0))},
		want:     []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(2, t1))},
		merged:   []gwv1.PolicyAncestorStatus{theirs, ancestor(ours, svcRef("svc", ""), accepted(2, t0))},
		changed:  true,
	}, {
		name:     "a namespace written into the spec's reference is written into the entry",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t0))},
		want:     []gwv1.PolicyAncestorStatus{ancestor(ours, withNamespace(svcRef("svc", ""), "ns"), accepted(1, t1))},
		merged:   []gwv1.PolicyAncestorStatus{ancestor(ours, withNamespace(svcRef("svc", ""), "ns"), accepted(1, t0))},
		changed:  true,
	}, {
		// A route may name one Service twice, with and without its
		// namespace: the CRD counts them as two parents, and translate
		// writes an entry for each.
		name: "one parent written with and without its namespace keeps both entries",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t0)),
			ancestor(ours, withNamespace(svcRef("svc", ""), "ns"), accepted(1, t0))},
		want: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t1)),
			ancestor(ours, withNamespace(svcRef("svc", ""), "ns"), accepted(1, t1))},
		merged: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t0)),
			ancestor(ours, withNamespace(svcRef("svc", ""), "ns"), accepted(1, t0))},
	}, {
		name:     "the form written is matched first",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, withNamespace(svcRef("svc", ""), "ns"), accepted(1, t0))},
		want: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t1)),
			ancestor(ours, withNamespace(svcRef("svc", ""), "ns"), accepted(1, t1))},
		merged: []gwv1.PolicyAncestorStatus{ancestor(ours, withNamespace(svcRef("svc", ""), "ns"), accepted(1, t0)),
			ancestor(ours, svcRef("svc", ""), accepted(1, t1))},
		changed: true,
	}, {
		name:     "sectionName distinguishes ancestors",
		existing: []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", "https"), accepted(1, t0))},
		want:     []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", "https"), accepted(1, t1)), ancestor(ours, svcRef("svc", "grpc"), accepted(1, t1))},
		merged:   []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", "https"), accepted(1, t0)), ancestor(ours, svcRef("svc", "grpc"), accepted(1, t1))},
		changed:  true,
	}, {
		name:     "a full list takes no new entry of ours",
		existing: []gwv1.PolicyAncestorStatus{theirs, ancestor(other, svcRef("b", ""), accepted(1, t0))},
		want:     []gwv1.PolicyAncestorStatus{ancestor(ours, svcRef("svc", ""), accepted(1, t1)), ancestor(ours, svcRef("c", ""), accepted(1, t1))},
		max:      3,
		merged:   []gwv1.PolicyAncestorStatus{theirs, ancestor(other, svcRef("b", ""), accepted(1, t0)), ancestor(ours, svcRef("svc", ""), accepted(1, t1))},
		changed:  true,
		dropped:  1,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			max := tc.max
			if max == 0 {
				max = maxPolicyAncestors
			}
			merged, changed, dropped := mergeEntries(policyEntries, "ns", tc.existing, tc.want, max)
			if diff := cmp.Diff(tc.merged, merged); diff != "" {
				t.Errorf("merged (-want +got):\n%s", diff)
			}
			if changed != tc.changed || dropped != tc.dropped {
				t.Errorf("changed, dropped = %v, %d; want %v, %d", changed, dropped, tc.changed, tc.dropped)
			}
		})
	}
}

func TestStale(t *testing.T) {
	conds := []metav1.Condition{cond("Accepted", "True", "Accepted", "", 3, t0)}
	for _, tc := range []struct {
		generation, judged int64
		conds              []metav1.Condition
		want               bool
	}{
		{3, 3, conds, false},
		{2, 3, conds, false},
		{4, 4, conds, true}, // a condition judged on an older generation
		{4, 3, conds, true},
		{3, 3, nil, false},
		{4, 3, nil, true}, // a removal judged on generation 3
	} {
		if got := stale(tc.generation, tc.judged, tc.conds); got != tc.want {
			t.Errorf("stale(generation %d, judged %d, %d conditions observed at 3) = %v, want %v",
				tc.generation, tc.judged, len(tc.conds), got, tc.want)
		}
	}
}

func TestMergeConditionsTruncatesNewTimes(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 123456789, time.UTC))
	got, changed := mergeConditions(nil, []metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, at)})
	if !changed || got[0].LastTransitionTime.Nanosecond() != 0 {
		t.Errorf("mergeConditions = %v, changed %v; want a second-precision time, changed", got, changed)
	}
}
