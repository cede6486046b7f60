package translate

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate/tlsvalidation"
)

// policyEval is one BackendTLSPolicy, checked once.
type policyEval struct {
	policy *gwv1.BackendTLSPolicy
	ref    snapshot.ObjectRef
	// tls is usable when invalid is nil.
	tls snapshot.TLS
	// invalid is the Accepted=False reason of the policy as a whole
	// (Invalid or NoValidCACertificate).
	invalid      *tlsvalidation.Problem
	resolvedRefs *tlsvalidation.Problem
	targets      []*policyTarget
	// others counts other controllers' entries in the policy's status.
	others int
}

// policyTarget is one distinct targetRef of a policy: one status ancestor.
type policyTarget struct {
	ref gwv1.LocalPolicyTargetReferenceWithSectionName
	// ancestorPlace: a target the status has no room for fails its
	// ports closed.
	ancestorPlace
	// problem is this target's own Accepted=False reason
	// (TargetNotFound, Invalid or Conflicted), or nil.
	problem *tlsvalidation.Problem
	// warning is appended to an Accepted=True message.
	warning string
	// ports counts the Service ports this target governs; conflicted
	// lists those where an older policy of the same specificity won.
	ports      int
	conflicted []int32
	winner     portPolicy // the policy that beat this one, for messages
	// sectioned names, for a whole-Service target, the policies naming a
	// port of it in sectionName, which govern that port instead.
	sectioned []string
}

// portPolicy is the BackendTLSPolicy that governs a Service port.
type portPolicy struct {
	eval   *policyEval
	target *policyTarget
}

// translatePolicies checks every BackendTLSPolicy, decides which governs
// each targeted Service port, and writes the policies' status.
//
// Precedence (apis/v1 BackendTLSPolicySpec.TargetRefs): among policies
// targeting the same Service and sectionName, the older wins, then
// namespace/name; the others are Conflicted. A policy naming a port
// (sectionName) governs that port over one naming the whole Service;
// neither is Conflicted by the other (conformance test
// BackendTLSPolicyConflictResolution), unless a whole-Service policy is left
// governing no port at all.
func (t *translator) translatePolicies() {
	policies := sortedObjects(t.in.BackendTLSPolicies)
	slices.SortStableFunc(policies, olderFirst)
	evals := make([]*policyEval, 0, len(policies))
	for _, p := range policies {
		evals = append(evals, t.evalPolicyContained(p))
	}

	type claims struct{ sectioned, whole []portPolicy }
	byPort := map[portKey]*claims{}
	var ports []portKey // in first-claim order, for determinism
	claim := func(k portKey, pp portPolicy, sectioned bool) {
		c := byPort[k]
		if c == nil {
			c = &claims{}
			byPort[k] = c
			ports = append(ports, k)
		}
		if sectioned {
			c.sectioned = append(c.sectioned, pp)
		} else {
			c.whole = append(c.whole, pp)
		}
	}
	for _, e := range evals {
		for _, tg := range e.targets {
			svc, tcpPorts := t.resolveTarget(tg)
			if svc == nil {
				continue
			}
			for _, sp := range tcpPorts {
				// An empty sectionName names the whole Service, as in
				// resolveTarget and the CRD's targetRefs rules.
				claim(portKey{svc.Namespace, svc.Name, sp.Port}, portPolicy{eval: e, target: tg}, deref(tg.ref.SectionName) != "")
			}
		}
	}
	// Evals are in precedence order, so the first claim of a kind wins.
	for _, k := range ports {
		c := byPort[k]
		contenders := c.whole
		if len(c.sectioned) > 0 {
			contenders = c.sectioned
		}
		win := contenders[0]
		t.portPolicies[k] = &win
		win.target.ports++
		for _, lost := range contenders[1:] {
			lost.target.conflicted = append(lost.target.conflicted, k.port)
			lost.target.winner = win
		}
		if len(c.sectioned) > 0 {
			name := win.eval.ref.Namespace + "/" + win.eval.ref.Name
			for _, w := range c.whole {
				if !slices.Contains(w.target.sectioned, name) {
					w.target.sectioned = append(w.target.sectioned, name)
				}
			}
		}
	}
	for _, e := range evals {
		t.policyStatus[types.NamespacedName{Namespace: e.policy.Namespace, Name: e.policy.Name}] = t.policyAncestors(e)
	}
}

// evalPolicy checks a policy's validation and options and lists its
// distinct targets.
func (t *translator) evalPolicy(p *gwv1.BackendTLSPolicy) *policyEval {
	e := &policyEval{
		policy: p,
		ref:    snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: p.Namespace, Name: p.Name},
	}
	v := tlsvalidation.Validate(&p.Spec.Validation, "validation", p.Namespace, t, t.in.ClusterTrustBundlesUnavailable, t.in.Now)
	t.judgedUntil(v.ChangesAt)
	e.tls, e.invalid, e.resolvedRefs = v.TLS, v.Accepted, v.ResolvedRefs
	e.tls.Mode = snapshot.TLSServerOnly
	e.tls.Policy = e.ref
	if optProblem := tlsvalidation.ApplyOptions(p.Spec.Options, &e.tls); optProblem != nil {
		e.invalidate(optProblem.Message)
	}
	if msg := targetRefsProblem(p.Spec.TargetRefs); msg != "" {
		e.invalidate(msg)
	}

	// A target named twice gets one status entry; the policy is Invalid
	// then (targetRefsProblem), but its entries still say so per target.
	seen := map[string]bool{}
	for _, ref := range p.Spec.TargetRefs {
		if foreignTarget(ref.LocalPolicyTargetReference) {
			continue
		}
		parent := gwv1.ParentReference{
			Group: &ref.Group, Kind: &ref.Kind, Name: ref.Name, SectionName: ref.SectionName,
		}
		if ref.Group == "" && ref.Kind == "Service" {
			parent = serviceParent(p.Namespace, string(ref.Name), deref(ref.SectionName))
		} else {
			ns := gwv1.Namespace(p.Namespace)
			parent.Namespace = &ns
		}
		id := fmt.Sprintf("%s/%s/%s/%s", ref.Group, ref.Kind, ref.Name, deref(ref.SectionName))
		if seen[id] {
			continue
		}
		seen[id] = true
		e.targets = append(e.targets, &policyTarget{ref: ref, ancestorPlace: ancestorPlace{parent: parent}})
	}
	e.others = placeTargets(p.Status.Ancestors, e.targets)
	return e
}

// invalidate makes the policy Invalid for msg, keeping the messages of
// other fields that made it so (Invalid wins over NoValidCACertificate:
// the policy is wrong whatever its references hold).
func (e *policyEval) invalidate(msg string) {
	if e.invalid != nil && e.invalid.Reason == tlsvalidation.ReasonInvalid {
		msg = e.invalid.Message + "; " + msg
	}
	e.invalid = &tlsvalidation.Problem{Reason: tlsvalidation.ReasonInvalid, Message: msg}
}

// maxTargetRefs is BackendTLSPolicySpec.TargetRefs' MaxItems.
const maxTargetRefs = 16

// targetRefsProblem says what the CRD's rules for targetRefs would refuse
// ("" when nothing): more than 16 entries, or a target named more than once
// without distinct, non-empty sectionNames (its two CEL rules, messages as
// they word them), or a target its schema refuses (targetRefProblem).
// A cluster's CRD may be of another version or channel than v1.7.0
// experimental.
func targetRefsProblem(refs []gwv1.LocalPolicyTargetReferenceWithSectionName) string {
	if len(refs) > maxTargetRefs {
		return fmt.Sprintf("spec.targetRefs has %d entries, more than the %d allowed", len(refs), maxTargetRefs)
	}
	type section struct {
		target gwv1.LocalPolicyTargetReference
		name   string
	}
	firstSectioned := map[gwv1.LocalPolicyTargetReference]bool{}
	mixed := map[gwv1.LocalPolicyTargetReference]bool{}
	seen := map[section]bool{}
	var errs []string
	for _, ref := range refs {
		target, sn := ref.LocalPolicyTargetReference, deref(ref.SectionName)
		if msg := targetRefProblem(target); msg != "" {
			errs = append(errs, "spec.targetRefs: "+msg)
		}
		if s, ok := firstSectioned[target]; !ok {
			firstSectioned[target] = sn != ""
		} else if s != (sn != "") && !mixed[target] {
			mixed[target] = true
			errs = append(errs, fmt.Sprintf("spec.targetRefs: sectionName must be specified when targetRefs includes 2 or more references to the same target (%s %s)", ref.Kind, ref.Name))
		}
		k := section{target, sn}
		if seen[k] {
			errs = append(errs, fmt.Sprintf("spec.targetRefs: sectionName must be unique when targetRefs includes 2 or more references to the same target (%s %s, sectionName %q)", ref.Kind, ref.Name, sn))
		}
		seen[k] = true
	}
	return strings.Join(errs, "; ")
}

// kindName is the CRD's Kind pattern (at most 63 characters).
var kindName = regexp.MustCompile(`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`)

// foreignTarget reports whether a well-formed targetRef names a kind
// sockmesh does not implement (neither a core Service nor an XBackend: an
// InferencePool, say, which another implementation may serve). Such a
// target gets no status entry of ours and takes no room in the list: an
// implementation "MUST ONLY populate ancestor status for the Ancestor
// resources they are responsible for" (PolicyAncestorStatus).
func foreignTarget(ref gwv1.LocalPolicyTargetReference) bool {
	ours := ref.Group == "" && ref.Kind == "Service" || ref.Group == gwxv1alpha1.GroupName && ref.Kind == "XBackend"
	return !ours && targetRefProblem(ref) == ""
}

// targetRefProblem says what the CRD's schema refuses in a policy's
// targetRef ("" when nothing): a group that is not a DNS subdomain, a kind
// that is not a kind name, a name empty or over 253 characters. Such a
// target is Invalid, not TargetNotFound: no object could be named so.
func targetRefProblem(ref gwv1.LocalPolicyTargetReference) string {
	var errs []string
	if ref.Group != "" && !validPreciseHostname(string(ref.Group)) {
		errs = append(errs, fmt.Sprintf("group %q is not a DNS subdomain", ref.Group))
	}
	if len(ref.Kind) > 63 || !kindName.MatchString(string(ref.Kind)) {
		errs = append(errs, fmt.Sprintf("kind %q is not a kind name (a letter, then letters, digits or '-', at most 63 characters)", ref.Kind))
	}
	if n := utf8.RuneCountInString(string(ref.Name)); n == 0 || n > 253 {
		errs = append(errs, fmt.Sprintf("name must be 1 to 253 characters, not %d", n))
	}
	return strings.Join(errs, ", ")
}

// resolveTarget finds the Service and the TCP ports a target names,
// recording on the target why it does not apply where it does not.
func (t *translator) resolveTarget(tg *policyTarget) (*corev1.Service, []corev1.ServicePort) {
	ns := deref(tg.parent.Namespace)
	name := string(tg.ref.Name)
	notFound := func(format string, args ...any) (*corev1.Service, []corev1.ServicePort) {
		tg.problem = &tlsvalidation.Problem{Reason: string(gwv1.PolicyReasonTargetNotFound), Message: fmt.Sprintf(format, args...)}
		return nil, nil
	}
	invalid := func(format string, args ...any) (*corev1.Service, []corev1.ServicePort) {
		tg.problem = &tlsvalidation.Problem{Reason: string(gwv1.PolicyReasonInvalid), Message: fmt.Sprintf(format, args...)}
		return nil, nil
	}
	if msg := targetRefProblem(tg.ref.LocalPolicyTargetReference); msg != "" {
		return invalid("%s", msg) // the policy is Invalid too (targetRefsProblem)
	}
	if tg.ref.Kind == "XBackend" { // the other kind evalPolicy keeps: foreignTarget
		return notFound("XBackend %s/%s cannot be targeted: XBackends carry their own tls (GEP-4894)", ns, name)
	}
	svc := t.byService[types.NamespacedName{Namespace: ns, Name: name}]
	if svc == nil {
		return notFound("Service %s/%s not found", ns, name)
	}
	if _, ok := svc.Annotations[AnnotationXBackend]; ok {
		tg.problem = &tlsvalidation.Problem{Reason: string(gwv1.PolicyReasonConflicted),
			Message: fmt.Sprintf("Service %s/%s stands for XBackend %q (annotation %s), whose own tls applies", ns, name, svc.Annotations[AnnotationXBackend], AnnotationXBackend)}
		return nil, nil
	}
	if len(clusterIPs(svc)) == 0 {
		return invalid("Service %s/%s has no ClusterIP (headless or ExternalName): sockmesh captures connections to ClusterIPs only, so this policy cannot be applied", ns, name)
	}
	if sn := deref(tg.ref.SectionName); sn != "" {
		for _, sp := range svc.Spec.Ports {
			if sp.Name != sn {
				continue
			}
			if !isTCP(sp) {
				return invalid("Service %s/%s port %s is %s; BackendTLSPolicy applies to TCP only", ns, name, sn, sp.Protocol)
			}
			if !validPort(sp.Port) {
				return invalid("Service %s/%s port %s has invalid number %d", ns, name, sn, sp.Port)
			}
			return svc, []corev1.ServicePort{sp}
		}
		// sectionName is a port's name; listing the ports shows a number
		// written there what to write instead.
		return notFound("Service %s/%s has no port named %q (%s)", ns, name, sn, tcpPorts(svc))
	}
	var tcp []corev1.ServicePort
	var other []string
	for _, sp := range svc.Spec.Ports {
		switch {
		case !isTCP(sp):
			other = append(other, fmt.Sprintf("%d/%s", sp.Port, sp.Protocol))
		case validPort(sp.Port):
			tcp = append(tcp, sp)
		}
	}
	if len(tcp) == 0 {
		return invalid("Service %s/%s has no TCP port; BackendTLSPolicy applies to TCP only", ns, name)
	}
	if len(other) > 0 {
		tg.warning = fmt.Sprintf("; ports %s are not TCP and are not affected", strings.Join(other, ", "))
	}
	return svc, tcp
}

// policyAncestors writes one status entry per target within the limit.
func (t *translator) policyAncestors(e *policyEval) []gwv1.PolicyAncestorStatus {
	out := []gwv1.PolicyAncestorStatus{}
	for _, tg := range e.targets {
		if tg.overLimit {
			t.unrepresented = append(t.unrepresented, Unrepresented{Policy: e.ref, Target: tg.parent,
				Message: noRoomMessage("Service", e.others) + "; its ports fail closed"})
			continue
		}
		c := conditionSet{generation: e.policy.Generation, now: t.now}
		switch {
		case c.rejectTarget(tg.problem, e.invalid):
		case len(tg.conflicted) > 0:
			c.set(condAccepted, false, string(gwv1.PolicyReasonConflicted), conflictMessage(tg))
		case tg.ports == 0:
			c.set(condAccepted, false, string(gwv1.PolicyReasonConflicted), fmt.Sprintf(
				"every TCP port of the Service is governed by a BackendTLSPolicy that names it in sectionName (%s)", strings.Join(tg.sectioned, ", ")))
		default:
			c.set(condAccepted, true, string(gwv1.PolicyReasonAccepted), "policy applies to connections sockmesh captures"+tg.warning)
		}
		if e.resolvedRefs != nil {
			c.set(condResolvedRefs, false, e.resolvedRefs.Reason, e.resolvedRefs.Message)
		} else {
			c.set(condResolvedRefs, true, string(gwv1.BackendTLSPolicyReasonResolvedRefs), "all references resolved")
		}
		out = append(out, gwv1.PolicyAncestorStatus{AncestorRef: tg.parent, ControllerName: ControllerName, Conditions: c.conds})
	}
	sortPolicyAncestors(out)
	return out
}

// conflictMessage names the policy that took precedence over a target and
// the ports it took; when that policy cannot be honoured, it says that
// those ports fail closed, which the loser's owner would otherwise learn
// only from the winner's status.
func conflictMessage(tg *policyTarget) string {
	w := tg.winner
	msg := fmt.Sprintf("BackendTLSPolicy %s/%s also targets Service %s/%s port(s) %s and takes precedence (older, then first by namespace/name)",
		w.eval.policy.Namespace, w.eval.policy.Name, deref(tg.parent.Namespace), tg.ref.Name, portList(tg.conflicted))
	reason := ""
	switch {
	case w.target.overLimit:
		reason = "its status has no room for the Service"
	case w.eval.invalid != nil:
		reason = w.eval.invalid.Reason
	}
	if reason != "" {
		msg += fmt.Sprintf("; it cannot be honoured (%s), so connections to those ports fail closed until it is fixed or deleted", reason)
	}
	return msg
}

// portTLS returns what the governing BackendTLSPolicy (if any) makes of a
// Service port: TLS settings, or why connections must fail closed.
func (t *translator) portTLS(k portKey) (tls *snapshot.TLS, invalid *snapshot.Invalid, source *snapshot.ObjectRef) {
	pp := t.portPolicies[k]
	if pp == nil {
		return nil, nil, nil
	}
	e := pp.eval
	switch {
	case pp.target.overLimit:
		return nil, &snapshot.Invalid{Policy: e.ref, Reason: string(gwv1.PolicyReasonInvalid), Message: noRoomMessage("Service", e.others)}, &e.ref
	case e.invalid != nil:
		return nil, &snapshot.Invalid{Policy: e.ref, Reason: e.invalid.Reason, Message: e.invalid.Message}, &e.ref
	}
	tc := e.tls
	tc.SubjectAltNames = slices.Clone(tc.SubjectAltNames)
	tc.CipherSuites = slices.Clone(tc.CipherSuites)
	tc.Curves = slices.Clone(tc.Curves)
	tc.ALPN = slices.Clone(tc.ALPN)
	return &tc, nil, &e.ref
}
