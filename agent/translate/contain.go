package translate

import (
	"cmp"
	"fmt"
	"runtime/debug"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate/tlsvalidation"
)

// Failure is an object whose translation panicked: a bug its data reached.
// Translate contains it to that object, which it judges as it would an
// invalid one, closed for what it governs (Result.Failures).
type Failure struct {
	Object snapshot.ObjectRef `json:"object"`
	// Panic is the recovered value, Stack where it was raised.
	Panic string `json:"panic"`
	Stack string `json:"stack"`
	// Services are the Services the object governs and its status
	// stands toward (a policy's targets, a route's parents, the Services
	// that lead to an XBackend; a Service itself), Namespace and Name as
	// in snapshot.Frontend.Service: sockmeshctl explain names the failure
	// for connections to them.
	Services []snapshot.ObjectRef `json:"services,omitempty"`
}

// containObject runs eval, the judgement of the object ref names, and
// returns its result; should eval panic, it records the Failure and
// returns failed(message) instead, message naming the internal error for
// the object's status. An object's judgement is the boundary because it
// is where the object's own data is read: one malformed object must not
// freeze every translation (the agent would keep the last Snapshot until
// the object is fixed), nor go unjudged (a BackendTLSPolicy left out would
// send its Service's connections in plaintext). Partial results a
// panicking judgement left in the translator are harmless: a backend
// nothing leads to is dropped from the Snapshot.
func containObject[E any](t *translator, ref snapshot.ObjectRef, eval func() E, failed func(message string) E) (out E) {
	defer func() {
		if v := recover(); v != nil {
			t.failures = append(t.failures, Failure{Object: ref, Panic: fmt.Sprint(v), Stack: string(debug.Stack())})
			out = failed(fmt.Sprintf("sockmesh failed to translate this %s (internal error: %v); it is treated as invalid until it changes or sockmesh is fixed", ref.Kind, v))
		}
	}()
	if t.fault != nil {
		t.fault(ref)
	}
	return eval()
}

// evalPolicyContained is evalPolicy contained (containObject): a policy
// whose judgement panicked is Invalid, so the ports of the Services it
// targets fail closed, and its Service targets' entries say why.
func (t *translator) evalPolicyContained(p *gwv1.BackendTLSPolicy) *policyEval {
	ref := snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: p.Namespace, Name: p.Name}
	return containObject(t, ref, func() *policyEval { return t.evalPolicy(p) }, func(msg string) *policyEval {
		e := &policyEval{policy: p, ref: ref, invalid: &tlsvalidation.Problem{Reason: tlsvalidation.ReasonInvalid, Message: msg}}
		seen := map[string]bool{}
		for _, r := range p.Spec.TargetRefs {
			id := string(r.Name) + "/" + deref(r.SectionName)
			if r.Group != "" || r.Kind != "Service" || seen[id] {
				continue
			}
			seen[id] = true
			e.targets = append(e.targets, &policyTarget{ref: r,
				ancestorPlace: ancestorPlace{parent: serviceParent(p.Namespace, string(r.Name), deref(r.SectionName))}})
		}
		e.others = placeTargets(p.Status.Ancestors, e.targets)
		return e
	})
}

// evalTrafficPolicyContained is evalTrafficPolicy contained: a policy
// whose judgement panicked is Invalid, applied nowhere (as an invalid
// policy is), and its targets' entries say why.
func (t *translator) evalTrafficPolicyContained(p *gwxv1alpha1.XBackendTrafficPolicy) *trafficEval {
	ref := snapshot.ObjectRef{Kind: "XBackendTrafficPolicy", Namespace: p.Namespace, Name: p.Name}
	return containObject(t, ref, func() *trafficEval { return t.evalTrafficPolicy(p) }, func(msg string) *trafficEval {
		e := &trafficEval{policy: p, ref: ref, invalid: &tlsvalidation.Problem{Reason: string(gwv1.PolicyReasonInvalid), Message: msg}}
		seen := map[trafficKey]bool{}
		for _, r := range p.Spec.TargetRefs {
			if foreignTarget(r) {
				continue
			}
			if tg := t.trafficTarget(p.Namespace, r); !seen[tg.key] {
				seen[tg.key] = true
				e.targets = append(e.targets, tg)
			}
		}
		e.others = placeTargets(p.Status.Ancestors, e.targets)
		return e
	})
}

// evalXBackendContained is evalXBackend contained: an XBackend whose
// judgement panicked is Invalid, so what leads to it fails closed.
func (t *translator) evalXBackendContained(xb *gwxv1alpha1.XBackend) *xbackendEval {
	ref := snapshot.ObjectRef{Kind: string(snapshot.KindXBackend), Namespace: xb.Namespace, Name: xb.Name}
	return containObject(t, ref, func() *xbackendEval { return t.evalXBackend(xb) }, func(msg string) *xbackendEval {
		e := &xbackendEval{xb: xb, ref: ref, accepted: &tlsvalidation.Problem{Reason: tlsvalidation.ReasonInvalid, Message: msg}}
		e.backend = snapshot.Backend{
			Ref:     snapshot.BackendRef{Kind: snapshot.KindXBackend, Namespace: xb.Namespace, Name: xb.Name},
			Sources: []snapshot.ObjectRef{ref},
			Invalid: &snapshot.Invalid{Policy: ref, Reason: e.accepted.Reason, Message: msg},
		}
		if p := int32(xb.Spec.Port.Number); validPort(p) {
			e.backend.Ref.Port = uint16(p)
		}
		return e
	})
}

// evalRouteContained runs eval, an HTTPRoute's or GRPCRoute's judgement,
// contained: a route whose judgement panicked is invalid as one the CRD
// refuses is (Accepted=False on every Service parent, routing nothing).
func (t *translator) evalRouteContained(kind snapshot.RouteKind, meta metav1.ObjectMeta, parents []gwv1.ParentReference, eval func() *routeEval) *routeEval {
	ref := snapshot.ObjectRef{Kind: string(kind), Namespace: meta.Namespace, Name: meta.Name}
	return containObject(t, ref, eval, func(msg string) *routeEval {
		e := newRouteEval(kind, meta, parents)
		e.invalid = msg
		return e
	})
}

// captureServiceContained is captureService contained: should capturing
// svc panic, what it captured is taken back, and the ports where plaintext
// would otherwise leak fail closed (fallbackPort); its other ports are
// left uncaptured, as a Service without backend properties is.
func (t *translator) captureServiceContained(svc *corev1.Service) {
	ref := snapshot.ObjectRef{Kind: string(snapshot.KindService), Namespace: svc.Namespace, Name: svc.Name}
	captured := len(t.frontends)
	containObject(t, ref, func() struct{} { t.captureService(svc); return struct{}{} }, func(msg string) struct{} {
		t.frontends = t.frontends[:captured]
		addrs := clusterIPs(svc)
		_, standsFor := svc.Annotations[AnnotationXBackend]
		for _, sp := range svc.Spec.Ports {
			if len(addrs) == 0 || !isTCP(sp) || !validPort(sp.Port) ||
				!standsFor && t.portPolicies[portKey{svc.Namespace, svc.Name, sp.Port}] == nil {
				continue
			}
			b := snapshot.Backend{
				Ref:     snapshot.BackendRef{Kind: snapshot.KindService, Namespace: svc.Namespace, Name: svc.Name, Port: uint16(sp.Port)},
				Sources: []snapshot.ObjectRef{ref},
				Invalid: &snapshot.Invalid{Policy: ref, Reason: string(gwv1.PolicyReasonInvalid), Message: msg},
			}
			// Replace what a route's backendRef made of the port: it came
			// from the same Service, and must not lead around the failure.
			delete(t.backends, b.Ref)
			t.capturePort(svc, sp, addrs, b)
		}
		return struct{}{}
	})
}

// ReasonInternalError is the reason of ResolvedRefs=Unknown on the status
// entries of an object whose judgement panicked (Result.Failures):
// sockmesh's own, as no reason the API lists says that an object's
// references were never judged.
const ReasonInternalError = "InternalError"

// settleFailures completes each Failure once status is judged. It turns
// the ResolvedRefs condition of every status entry of the failed object
// to Unknown: its judgement panicked before it judged the references, so
// the True its invalid stand-in would carry is a claim nothing checked
// (and a False one's reason would be made up), while Accepted=False says
// the object is treated as invalid, and why. And it lists the Services
// those entries stand toward in Failure.Services.
func (t *translator) settleFailures() {
	for i := range t.failures {
		f := &t.failures[i]
		if f.Object.Kind == string(snapshot.KindService) {
			f.Services = []snapshot.ObjectRef{{Namespace: f.Object.Namespace, Name: f.Object.Name}}
			continue
		}
		msg := truncate(fmt.Sprintf("sockmesh failed to translate this %s (internal error: %s) before it judged its references", f.Object.Kind, f.Panic))
		for _, e := range t.statusEntries(f.Object) {
			for j := range e.conds {
				if c := &e.conds[j]; c.Type == condResolvedRefs {
					c.Status, c.Reason, c.Message = metav1.ConditionUnknown, ReasonInternalError, msg
				}
			}
			if deref(e.ref.Group) == "" && deref(e.ref.Kind) == "Service" {
				svc := snapshot.ObjectRef{Namespace: cmp.Or(deref(e.ref.Namespace), f.Object.Namespace), Name: string(e.ref.Name)}
				if !slices.Contains(f.Services, svc) {
					f.Services = append(f.Services, svc)
				}
			}
		}
	}
}

// statusEntry is one status entry of ours: its conditions (shared with the
// entry, so changes to them are the entry's) and the ancestor or parent it
// stands toward.
type statusEntry struct {
	conds []metav1.Condition
	ref   gwv1.ParentReference
}

// statusEntries returns the status entries translate wants for the object
// ref names.
func (t *translator) statusEntries(ref snapshot.ObjectRef) []statusEntry {
	k := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
	var out []statusEntry
	switch ref.Kind {
	case "BackendTLSPolicy", "XBackendTrafficPolicy":
		entries := t.policyStatus[k]
		if ref.Kind == "XBackendTrafficPolicy" {
			entries = t.trafficStatus[k]
		}
		for _, a := range entries {
			out = append(out, statusEntry{a.Conditions, a.AncestorRef})
		}
	case string(snapshot.KindXBackend):
		for _, a := range t.xbackendStatuses[k] {
			out = append(out, statusEntry{a.Conditions, a.AncestorRef})
		}
	case string(snapshot.KindHTTPRoute), string(snapshot.KindGRPCRoute):
		entries := t.httpRouteStatus[k]
		if ref.Kind == string(snapshot.KindGRPCRoute) {
			entries = t.grpcRouteStatus[k]
		}
		for _, p := range entries {
			out = append(out, statusEntry{p.Conditions, p.ParentRef})
		}
	}
	return out
}
