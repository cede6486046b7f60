package status

import (
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// entryKind tells the merge how to read one kind of status entry
// (PolicyAncestorStatus, BackendAncestorStatus, RouteParentStatus).
type entryKind[E any] struct {
	ref        func(*E) gwv1.ParentReference
	controller func(*E) gwv1.GatewayController
	conditions func(*E) *[]metav1.Condition
}

// refKey identifies an ancestor or parent with the CRDs' defaults applied
// (group gateway.networking.k8s.io, kind Gateway, the object's namespace),
// so that a reference the API server defaulted matches the one translate
// wrote. keyOf with objNamespace "" leaves an unset namespace unset.
type refKey struct {
	group, kind, namespace, name, section string
	port                                  gwv1.PortNumber
}

func keyOf(r gwv1.ParentReference, objNamespace string) refKey {
	k := refKey{group: gwv1.GroupName, kind: "Gateway", namespace: objNamespace, name: string(r.Name)}
	if r.Group != nil {
		k.group = string(*r.Group)
	}
	if r.Kind != nil {
		k.kind = string(*r.Kind)
	}
	if r.Namespace != nil && *r.Namespace != "" {
		k.namespace = string(*r.Namespace)
	}
	if r.SectionName != nil {
		k.section = string(*r.SectionName)
	}
	if r.Port != nil {
		k.port = *r.Port
	}
	return k
}

// mergeEntries returns existing with sockmesh's entries replaced by ours:
// another controller's entries stay where they are, untouched; ours that
// translate still wants are updated in place, the others removed; new ones
// are appended in translate's order. When the result would exceed max
// entries, new entries of ours are left out (the Gateway API forbids
// adding to a full list) and counted in dropped. changed reports whether
// the result differs from existing.
func mergeEntries[E any](k entryKind[E], objNamespace string, existing, ours []E, max int) (merged []E, changed bool, dropped int) {
	// Stored entries of ours pair with wanted ones by reference as written
	// first, then with an unset namespace read as the object's. A route
	// may name one Service twice, with and without its namespace (the CRD
	// counts them as two parents, and translate wants an entry for each):
	// paired by the defaulted key alone, both wanted entries went to one
	// stored entry, so every write removed the other and appended it anew.
	pair := make([]int, len(existing)) // index into ours, or -1
	for i := range pair {
		pair[i] = -1
	}
	used := make([]bool, len(ours))
	reformed := make([]bool, len(existing)) // paired by the defaulted key only
	for pass, ns := range []string{"", objNamespace} {
		for i := range existing {
			if pair[i] >= 0 || k.controller(&existing[i]) != translate.ControllerName {
				continue
			}
			key := keyOf(k.ref(&existing[i]), ns)
			for j := range ours {
				if !used[j] && keyOf(k.ref(&ours[j]), ns) == key {
					pair[i], used[j], reformed[i] = j, true, pass == 1
					break
				}
			}
		}
	}
	for i := range existing {
		e := existing[i]
		if k.controller(&e) != translate.ControllerName {
			merged = append(merged, e)
			continue
		}
		j := pair[i]
		if j < 0 {
			// No longer related, or a duplicate of ours left by an
			// older writer: remove it.
			changed = true
			continue
		}
		// Keep the stored entry (its reference as the API server
		// defaulted it: group and kind) and merge the conditions into it;
		// the API server defaults no namespace, so a reference paired only
		// with it defaulted changed form in the spec (a namespace written
		// or dropped), which the entry follows (ParentRef "corresponds
		// with a ParentRef in the spec").
		conds, condsChanged := mergeConditions(*k.conditions(&e), *k.conditions(&ours[j]))
		if reformed[i] {
			e = ours[j]
			condsChanged = true
		}
		if condsChanged {
			*k.conditions(&e) = conds
			changed = true
		}
		merged = append(merged, e)
	}
	for j := range ours {
		if used[j] {
			continue
		}
		if len(merged) >= max {
			dropped++
			continue
		}
		e := ours[j]
		conds, _ := mergeConditions(nil, *k.conditions(&e))
		*k.conditions(&e) = conds
		merged = append(merged, e)
		changed = true
	}
	return merged, changed, dropped
}

// mergeConditions returns want merged into existing: each wanted condition
// takes the place of the existing one of its type (new types go last, in
// want's order) and keeps its lastTransitionTime while status, reason and
// message are the same. Existing conditions of a domain-prefixed type want
// does not name stay where they are: extensions another party added to the
// entry, which the Gateway API says never to remove or reorder; other
// types want no longer names are removed, the API's own and sockmesh's
// (translate.ConditionTypePrefix), which translate sets only while they
// hold. changed reports whether the result differs from existing.
func mergeConditions(existing, want []metav1.Condition) ([]metav1.Condition, bool) {
	out := make([]metav1.Condition, 0, len(want)+len(existing))
	placed := make([]bool, len(want))
	for _, old := range existing {
		i := slices.IndexFunc(want, func(c metav1.Condition) bool { return c.Type == old.Type })
		switch {
		case i >= 0 && !placed[i]:
			placed[i] = true
			out = append(out, settle(want[i], &old))
		case i < 0 && strings.Contains(old.Type, "/") && !strings.HasPrefix(old.Type, translate.ConditionTypePrefix):
			out = append(out, old)
		}
	}
	for i, c := range want {
		if !placed[i] {
			out = append(out, settle(c, nil))
		}
	}
	return out, !slices.EqualFunc(existing, out, sameCondition)
}

// settle gives c its lastTransitionTime: old's while the status is the
// same, else c's own (now when unset), in seconds. metav1.Condition defines
// it as "the last time the condition transitioned from one status to
// another", as apimachinery's meta.SetStatusCondition keeps it: a reason or
// message that changes under the same status is no transition.
func settle(c metav1.Condition, old *metav1.Condition) metav1.Condition {
	if c.LastTransitionTime.IsZero() {
		c.LastTransitionTime = metav1.NewTime(time.Now())
	}
	// The API server stores seconds.
	c.LastTransitionTime = metav1.NewTime(c.LastTransitionTime.Truncate(time.Second))
	if old != nil && old.Status == c.Status {
		c.LastTransitionTime = old.LastTransitionTime
	}
	return c
}

func sameCondition(a, b metav1.Condition) bool {
	return a.Type == b.Type && a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message &&
		a.ObservedGeneration == b.ObservedGeneration && a.LastTransitionTime.Equal(&b.LastTransitionTime)
}

// stale reports whether the object, at generation, moved past judged, the
// generation of the object translate judged, or past the observedGeneration
// of a condition in conds: what translate said must then not be written
// (the Gateway API's rule for observedGeneration), neither its conditions
// nor the removal of entries it no longer wants, which carries no
// condition to tell its generation by; the watch event that brought the
// new generation triggers a fresh translation.
func stale(generation, judged int64, conds ...[]metav1.Condition) bool {
	if generation > judged {
		return true
	}
	for _, cs := range conds {
		for _, c := range cs {
			if c.ObservedGeneration < generation {
				return true
			}
		}
	}
	return false
}
