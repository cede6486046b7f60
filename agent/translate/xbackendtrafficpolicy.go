package translate

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
	"sigs.k8s.io/gateway-api/pkg/utils"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate/tlsvalidation"
)

// XBackendTrafficPolicy defaults (the CRD's kubebuilder defaults, applied
// again because a cluster's CRD may be of another version).
const (
	defaultBudgetPercent    = 20
	defaultBudgetInterval   = 10 * time.Second
	defaultMinRetryCount    = 10
	defaultMinRetryInterval = time.Second
)

// maxTrafficTargetRefs is the CRD's maxItems of spec.targetRefs.
const maxTrafficTargetRefs = 16

// trafficEval is one XBackendTrafficPolicy, checked once.
type trafficEval struct {
	policy *gwxv1alpha1.XBackendTrafficPolicy
	ref    snapshot.ObjectRef
	// invalid is the Accepted=False/Invalid problem of the policy as a
	// whole; such a policy is applied nowhere and claims no target.
	invalid *tlsvalidation.Problem
	retry   *snapshot.RetryConstraint
	session *snapshot.SessionPersistence
	targets []*trafficTarget
	// others counts other controllers' entries in the policy's status.
	others int
}

// trafficTarget is one distinct targetRef of a policy: one status ancestor.
type trafficTarget struct {
	ref gwv1.LocalPolicyTargetReference
	key trafficKey
	// ancestorPlace: the policy is not applied to a target the status
	// has no room for.
	ancestorPlace
	// problem is the target's own Accepted=False reason (TargetNotFound
	// or Invalid); resolvedRefs its ResolvedRefs=False reason.
	problem, resolvedRefs *tlsvalidation.Problem
	winner                *trafficEval // the policy that governs the target instead
	// ownSession: the target is an XBackend with its own
	// sessionPersistence, which wins over the policy's (GEP-4894).
	ownSession bool
}

// trafficKey names a backend object a policy can target.
type trafficKey struct {
	kind            snapshot.BackendKind
	namespace, name string
}

// evalTrafficPolicies checks every XBackendTrafficPolicy, decides which one
// governs each targeted Service and XBackend, applies the winners to the
// XBackends (Service backends pick theirs up in serviceBackend), and
// writes the policies' status.
//
// Precedence is the Gateway API's for policies (GEP-713), as for
// BackendTLSPolicy: among valid policies targeting the same object, the
// older wins, then namespace/name; the others are Conflicted there. An
// invalid policy is applied nowhere and so takes part in no conflict.
func (t *translator) evalTrafficPolicies() {
	policies := sortedObjects(t.in.XBackendTrafficPolicies)
	slices.SortStableFunc(policies, olderFirst)
	for _, p := range policies {
		e := t.evalTrafficPolicyContained(p)
		for _, tg := range e.targets {
			if e.invalid != nil || tg.overLimit || tg.problem != nil {
				continue
			}
			if won := t.trafficPolicies[tg.key]; won != nil {
				tg.winner = won
				continue
			}
			t.trafficPolicies[tg.key] = e
			if tg.key.kind == snapshot.KindXBackend {
				tg.ownSession = t.applyTrafficPolicy(&t.xbackends[types.NamespacedName{Namespace: tg.key.namespace, Name: tg.key.name}].backend)
			}
		}
		t.trafficStatus[key(p)] = t.trafficAncestors(e)
	}
}

// evalTrafficPolicy checks a policy the way the CRD's rules do and lists
// its distinct targets.
func (t *translator) evalTrafficPolicy(p *gwxv1alpha1.XBackendTrafficPolicy) *trafficEval {
	e := &trafficEval{policy: p, ref: snapshot.ObjectRef{Kind: "XBackendTrafficPolicy", Namespace: p.Namespace, Name: p.Name}}
	var invalid []string
	if rc := p.Spec.RetryConstraint; rc != nil {
		e.retry = retryConstraint(rc, &invalid)
		e.retry.Policy = e.ref
	}
	//lint:ignore SA1019 deprecated in v1.7 (GEP-4894) but still served; policies that set it are honoured
	if sp := p.Spec.SessionPersistence; sp != nil {
		var msg string
		if e.session, msg = sessionPersistence(sp, e.ref); msg != "" {
			invalid = append(invalid, msg)
		}
	}
	if n := len(p.Spec.TargetRefs); n > maxTrafficTargetRefs {
		invalid = append(invalid, fmt.Sprintf("targetRefs has %d entries, more than the %d allowed", n, maxTrafficTargetRefs))
	}

	// targetRefs is a map keyed by group, kind and name: the CRD refuses a
	// target named twice. It gets one status entry, which says so.
	seen := map[trafficKey]bool{}
	for _, ref := range p.Spec.TargetRefs {
		if foreignTarget(ref) {
			continue
		}
		tg := t.trafficTarget(p.Namespace, ref)
		if tg.problem == nil && e.session != nil && t.tcpXBackend(tg.key) {
			tg.problem = &tlsvalidation.Problem{Reason: string(gwv1.PolicyReasonInvalid), Message: fmt.Sprintf(
				"XBackend %s: %s; the policy is not applied to it", tg.key.name, tcpSessionMessage)}
		}
		if msg := targetRefProblem(ref); msg != "" {
			// No object could be named so: Invalid, not TargetNotFound,
			// so that its status entry says why the policy is.
			invalid = append(invalid, "targetRefs: "+msg)
			tg.problem = &tlsvalidation.Problem{Reason: string(gwv1.PolicyReasonInvalid), Message: msg}
		}
		if seen[tg.key] {
			invalid = append(invalid, fmt.Sprintf("targetRefs names %s %s more than once", ref.Kind, ref.Name))
			continue
		}
		seen[tg.key] = true
		e.targets = append(e.targets, tg)
	}
	if len(invalid) > 0 {
		e.invalid = &tlsvalidation.Problem{Reason: string(gwv1.PolicyReasonInvalid), Message: strings.Join(invalid, "; ")}
	}
	e.others = placeTargets(p.Status.Ancestors, e.targets)
	return e
}

// retryConstraint maps a retryConstraint with the CRD's defaults, adding
// what the CRD would refuse to invalid.
func retryConstraint(rc *gwxv1alpha1.RetryConstraint, invalid *[]string) *snapshot.RetryConstraint {
	out := &snapshot.RetryConstraint{
		BudgetPercent: defaultBudgetPercent, BudgetInterval: snapshot.Duration(defaultBudgetInterval),
		MinRetryCount: defaultMinRetryCount, MinRetryInterval: snapshot.Duration(defaultMinRetryInterval),
	}
	bad := func(format string, args ...any) { *invalid = append(*invalid, fmt.Sprintf(format, args...)) }
	if b := rc.Budget; b != nil {
		if b.Percent != nil {
			if *b.Percent < 0 || *b.Percent > 100 {
				bad("retryConstraint.budget.percent %d is not between 0 and 100", *b.Percent)
			}
			out.BudgetPercent = *b.Percent
		}
		if b.Interval != nil {
			d, ok := policyDuration(*b.Interval)
			if !ok || d < time.Second || d > time.Hour {
				bad("retryConstraint.budget.interval %q must be a duration (GEP-2257) from 1s to 1h", *b.Interval)
			}
			out.BudgetInterval = snapshot.Duration(d)
		}
	}
	if r := rc.MinRetryRate; r != nil {
		if r.Count != nil {
			if *r.Count < 1 || *r.Count > 1000000 {
				bad("retryConstraint.minRetryRate.count %d is not between 1 and 1000000", *r.Count)
			}
			out.MinRetryCount = *r.Count
		}
		if r.Interval != nil {
			d, ok := policyDuration(*r.Interval)
			if !ok || d <= 0 || d > time.Hour {
				bad("retryConstraint.minRetryRate.interval %q must be a duration (GEP-2257) above 0s, at most 1h", *r.Interval)
			}
			out.MinRetryInterval = snapshot.Duration(d)
		}
	}
	return out
}

func policyDuration(d gwv1.Duration) (time.Duration, bool) {
	v, err := utils.ParseDuration(string(d))
	if err != nil {
		return 0, false
	}
	return *v, true
}

// tcpXBackend reports whether k names an XBackend whose protocol is TCP.
func (t *translator) tcpXBackend(k trafficKey) bool {
	if k.kind != snapshot.KindXBackend {
		return false
	}
	e := t.xbackends[types.NamespacedName{Namespace: k.namespace, Name: k.name}]
	return e != nil && e.backend.Protocol == snapshot.ProtocolTCP
}

// trafficTarget resolves one targetRef of a policy in namespace ns:
// a core Service or an XBackend there.
func (t *translator) trafficTarget(ns string, ref gwv1.LocalPolicyTargetReference) *trafficTarget {
	name := string(ref.Name)
	tg := &trafficTarget{ref: ref}
	problem := func(reason gwv1.PolicyConditionReason, format string, args ...any) *trafficTarget {
		tg.problem = &tlsvalidation.Problem{Reason: string(reason), Message: fmt.Sprintf(format, args...)}
		return tg
	}
	switch {
	case ref.Group == "" && ref.Kind == "Service":
		tg.key = trafficKey{snapshot.KindService, ns, name}
		tg.parent = serviceParent(ns, name, "")
		svc := t.byService[types.NamespacedName{Namespace: ns, Name: name}]
		switch {
		case svc == nil:
			return problem(gwv1.PolicyReasonTargetNotFound, "Service %s/%s not found", ns, name)
		case svc.Spec.Type == corev1.ServiceTypeExternalName:
			return problem(gwv1.PolicyReasonInvalid, "Service %s/%s is an ExternalName Service, which is never a backend", ns, name)
		}
		if xb, ok := svc.Annotations[AnnotationXBackend]; ok {
			return problem(gwv1.PolicyReasonInvalid, "Service %s/%s stands for XBackend %q (annotation %s): target the XBackend", ns, name, xb, AnnotationXBackend)
		}
	case ref.Group == gwxv1alpha1.GroupName && ref.Kind == "XBackend":
		tg.key = trafficKey{snapshot.KindXBackend, ns, name}
		group, kind, nsRef := gwv1.Group(ref.Group), gwv1.Kind(ref.Kind), gwv1.Namespace(ns)
		tg.parent = gwv1.ParentReference{Group: &group, Kind: &kind, Namespace: &nsRef, Name: ref.Name}
		if t.xbackends[types.NamespacedName{Namespace: ns, Name: name}] == nil {
			return problem(gwv1.PolicyReasonTargetNotFound, "XBackend %s/%s not found", ns, name)
		}
	default: // a kind the schema refuses: evalTrafficPolicy skips other foreign kinds
		tg.key = trafficKey{snapshot.BackendKind(string(ref.Group) + "/" + string(ref.Kind)), ns, name}
		group, kind, nsRef := ref.Group, ref.Kind, gwv1.Namespace(ns)
		tg.parent = gwv1.ParentReference{Group: &group, Kind: &kind, Namespace: &nsRef, Name: ref.Name}
		tg.resolvedRefs = &tlsvalidation.Problem{Reason: string(gwv1.BackendTLSPolicyReasonInvalidKind), Message: fmt.Sprintf(
			"target %s %s (group %q) is not supported: only core Services and %s XBackends", ref.Kind, name, ref.Group, gwxv1alpha1.GroupName)}
		return problem(gwv1.PolicyReasonTargetNotFound, "%s", tg.resolvedRefs.Message)
	}
	return tg
}

// applyTrafficPolicy gives b what the XBackendTrafficPolicy governing it
// asks for: the retry constraint, and its sessionPersistence unless b has
// its own (an XBackend's wins, GEP-4894). It reports whether b's own
// session persistence won over the policy's.
func (t *translator) applyTrafficPolicy(b *snapshot.Backend) (ownSession bool) {
	e := t.trafficPolicies[trafficKey{b.Ref.Kind, b.Ref.Namespace, b.Ref.Name}]
	if e == nil {
		return false
	}
	if e.retry != nil {
		rc := *e.retry
		b.RetryConstraint = &rc
	}
	if e.session != nil {
		if b.SessionPersistence != nil {
			ownSession = true
		} else {
			sp := *e.session
			b.SessionPersistence = &sp
		}
	}
	b.Sources = append(slices.Clone(b.Sources), e.ref)
	return ownSession
}

// trafficPinsSessions reports whether an XBackendTrafficPolicy gives the
// Service's backend session persistence: its ports are then captured, so
// that the proxy keeps every client's session on its endpoint.
func (t *translator) trafficPinsSessions(svc *corev1.Service) bool {
	e := t.trafficPolicies[trafficKey{snapshot.KindService, svc.Namespace, svc.Name}]
	return e != nil && e.session != nil
}

// trafficAncestors writes one status entry per target within the limit.
func (t *translator) trafficAncestors(e *trafficEval) []gwv1.PolicyAncestorStatus {
	out := []gwv1.PolicyAncestorStatus{}
	for _, tg := range e.targets {
		if tg.overLimit {
			t.unrepresented = append(t.unrepresented, Unrepresented{Policy: e.ref, Target: tg.parent,
				Message: noRoomMessage("target", e.others) + "; it is not applied to this backend"})
			continue
		}
		c := conditionSet{generation: e.policy.Generation, now: t.now}
		switch {
		case c.rejectTarget(tg.problem, e.invalid):
		case tg.winner != nil:
			c.set(condAccepted, false, string(gwv1.PolicyReasonConflicted), fmt.Sprintf(
				"XBackendTrafficPolicy %s/%s targets the same backend and takes precedence (older, then first by namespace/name)",
				tg.winner.policy.Namespace, tg.winner.policy.Name))
		default:
			msg := "policy applies to the requests sockmesh sends to this backend"
			if tg.ownSession {
				msg += "; the XBackend's own sessionPersistence applies instead of this policy's (GEP-4894)"
			}
			c.set(condAccepted, true, string(gwv1.PolicyReasonAccepted), msg)
		}
		if tg.resolvedRefs != nil {
			c.set(condResolvedRefs, false, tg.resolvedRefs.Reason, tg.resolvedRefs.Message)
		} else {
			c.set(condResolvedRefs, true, string(gwv1.BackendTLSPolicyReasonResolvedRefs), "all references resolved")
		}
		out = append(out, gwv1.PolicyAncestorStatus{AncestorRef: tg.parent, ControllerName: ControllerName, Conditions: c.conds})
	}
	sortPolicyAncestors(out)
	return out
}
