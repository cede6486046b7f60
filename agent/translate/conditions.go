package translate

import (
	"cmp"
	"fmt"
	"slices"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/translate/tlsvalidation"
)

// Labels and annotations sockmesh reads. LabelXBackend is in result.go.
const (
	// LabelCapture on a Pod or Namespace: "disabled" opts its pods out of
	// capture; "enabled" on a hostNetwork Pod opts it in.
	LabelCapture = "sockmesh.io/capture"
	// AnnotationXBackend on a Service names an XBackend in the Service's
	// namespace: connections to the Service's ClusterIPs go to the XBackend.
	AnnotationXBackend = "sockmesh.io/xbackend"
	// AnnotationFailurePolicy on a Service ("FailOpen" or "FailClosed")
	// chooses the failure policy of its captured ports where either is safe;
	// ports whose backend needs TLS or is invalid are always FailClosed.
	AnnotationFailurePolicy = "sockmesh.io/failure-policy"
)

// Condition types and reasons sockmesh writes beyond those Gateway API
// names for the resource.
const (
	condAccepted     = "Accepted"
	condResolvedRefs = "ResolvedRefs"

	// ReasonEgressNotAllowed: an ExternalHostname XBackend's hostname is not
	// on the agent's egress allow-list (Accepted=False).
	ReasonEgressNotAllowed = "EgressNotAllowed"
	// ReasonUnresolved and ReasonAddressesRefused explain an
	// ExternalHostname backend's Snapshot Invalid entry: the agent has no
	// DNS answer yet, or refused every answer. They are node-local and so
	// never written to status.
	ReasonUnresolved       = "Unresolved"
	ReasonAddressesRefused = "AddressesRefused"
	// ReasonXBackendNotFound explains the Invalid entry of a Service whose
	// AnnotationXBackend names no XBackend.
	ReasonXBackendNotFound = "XBackendNotFound"
)

// Status limits from the Gateway API types.
const (
	maxPolicyAncestors  = 16 // PolicyStatus.Ancestors MaxItems
	maxBackendAncestors = 32 // BackendStatus.Ancestors MaxItems
)

// conditionSet builds the conditions of one status entry.
type conditionSet struct {
	generation int64
	now        metav1.Time
	conds      []metav1.Condition
}

func (c *conditionSet) set(typ string, ok bool, reason, message string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	c.conds = append(c.conds, metav1.Condition{
		Type:               typ,
		Status:             status,
		ObservedGeneration: c.generation,
		LastTransitionTime: c.now,
		Reason:             reason,
		Message:            truncate(message),
	})
}

// truncate keeps a message within metav1.Condition's 32768-byte limit. It
// cuts between runes: a rune cut in two is invalid UTF-8, which JSON
// encoding turns into U+FFFD, so the API server would store a message that
// never equals translate's, and the status writer patch it every pass.
func truncate(s string) string {
	const limit = 32768
	if len(s) <= limit {
		return s
	}
	cut := limit - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// serviceParent is the ancestorRef of a core Service (port name optional).
func serviceParent(namespace, name, sectionName string) gwv1.ParentReference {
	group, kind, ns := gwv1.Group(""), gwv1.Kind("Service"), gwv1.Namespace(namespace)
	ref := gwv1.ParentReference{Group: &group, Kind: &kind, Namespace: &ns, Name: gwv1.ObjectName(name)}
	if sectionName != "" {
		sn := gwv1.SectionName(sectionName)
		ref.SectionName = &sn
	}
	return ref
}

func compareParents(a, b gwv1.ParentReference) int {
	return cmp.Or(cmp.Compare(deref(a.Group), deref(b.Group)), cmp.Compare(deref(a.Kind), deref(b.Kind)),
		cmp.Compare(deref(a.Namespace), deref(b.Namespace)), cmp.Compare(a.Name, b.Name),
		cmp.Compare(deref(a.SectionName), deref(b.SectionName)))
}

// deref reads an optional string field; nil reads as "".
func deref[T ~string](p *T) string {
	if p == nil {
		return ""
	}
	return string(*p)
}

// ancestorPlace is a policy target's place in the policy's status: its
// ancestor there, and whether the status has room for it.
type ancestorPlace struct {
	parent gwv1.ParentReference
	// overLimit is set when the policy's status has no room for the
	// target (fitEntries): it gets no status entry, and is not served
	// by the policy.
	overLimit bool
}

func (a *ancestorPlace) place() *ancestorPlace { return a }

// placeTargets sorts a policy's targets in status order and marks those
// its status has no room for (fitEntries, given existing, the status the
// informer shows); it returns how many entries other controllers hold.
func placeTargets[T interface{ place() *ancestorPlace }](existing []gwv1.PolicyAncestorStatus, targets []T) (others int) {
	slices.SortFunc(targets, func(a, b T) int { return compareParents(a.place().parent, b.place().parent) })
	parents := make([]gwv1.ParentReference, len(targets))
	for i, tg := range targets {
		parents[i] = tg.place().parent
	}
	fits, others := fitEntries(existing, func(a *gwv1.PolicyAncestorStatus) (gwv1.GatewayController, gwv1.ParentReference) {
		return a.ControllerName, a.AncestorRef
	}, parents, maxPolicyAncestors)
	for i, tg := range targets {
		tg.place().overLimit = !fits[i]
	}
	return others
}

// fitEntries tells which of an object's ancestors or parents (parents, in
// status order) get a status entry. The max entries its status holds (a
// policy's 16 ancestors, a route's 32 parents) are shared with other
// controllers, and the Gateway API forbids adding to a full list: a policy
// is then unimplementable for a target that finds no room (its caller
// fails that target closed or leaves it unapplied); a route goes without
// an entry for that parent. One that holds an entry of ours already is
// represented, full list or not, so it keeps its room first; the others
// take what is left, in order. existing is the status as the informer
// shows it, so every agent decides alike, and entry reads one of its
// entries. others counts the other controllers' entries, for messages.
func fitEntries[E any](existing []E, entry func(*E) (gwv1.GatewayController, gwv1.ParentReference), parents []gwv1.ParentReference, max int) (fits []bool, others int) {
	room := max
	var ours []gwv1.ParentReference
	for i := range existing {
		ctrl, ref := entry(&existing[i])
		if ctrl == ControllerName {
			ours = append(ours, ref)
		} else {
			room--
			others++
		}
	}
	fits = make([]bool, len(parents))
	for i, p := range parents {
		if room > 0 && slices.ContainsFunc(ours, func(r gwv1.ParentReference) bool { return sameParent(r, p) }) {
			fits[i] = true
			room--
		}
	}
	for i := range fits {
		if !fits[i] && room > 0 {
			fits[i] = true
			room--
		}
	}
	return fits, others
}

// sameParent reports whether a and b refer to the same ancestor or parent:
// compareParents' fields and a route's port.
func sameParent(a, b gwv1.ParentReference) bool {
	return compareParents(a, b) == 0 && (a.Port == nil) == (b.Port == nil) && (a.Port == nil || *a.Port == *b.Port)
}

// noRoomMessage says why a policy is unimplementable for a target its
// status has no room for; others counts other controllers' entries.
func noRoomMessage(target string, others int) string {
	return fmt.Sprintf("the policy's status has no room for this %s (it holds at most %d ancestors, %d of them other controllers'): "+
		"the Gateway API makes the policy unimplementable here", target, maxPolicyAncestors, others)
}

func sortPolicyAncestors(s []gwv1.PolicyAncestorStatus) {
	slices.SortFunc(s, func(a, b gwv1.PolicyAncestorStatus) int { return compareParents(a.AncestorRef, b.AncestorRef) })
}

// rejectTarget sets Accepted=False for one target of a policy when there is
// a reason, in the order every policy kind reports them: the target is
// missing, the policy as a whole is invalid, the target has its own
// problem. It reports whether it set the condition.
func (c *conditionSet) rejectTarget(targetProblem, policyInvalid *tlsvalidation.Problem) bool {
	switch {
	case targetProblem != nil && targetProblem.Reason == string(gwv1.PolicyReasonTargetNotFound):
		c.set(condAccepted, false, targetProblem.Reason, targetProblem.Message)
	case policyInvalid != nil:
		c.set(condAccepted, false, policyInvalid.Reason, policyInvalid.Message)
	case targetProblem != nil:
		c.set(condAccepted, false, targetProblem.Reason, targetProblem.Message)
	default:
		return false
	}
	return true
}
