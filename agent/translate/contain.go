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
func containObject[E any](t *translator, ref snapshot.ObjectRef, eval func() E, failed func(message string) E) E {
	return contain(t, ref, eval, func(v any, stack string) E {
		t.failures = append(t.failures, Failure{Object: ref, Panic: fmt.Sprint(v), Stack: stack})
		return failed(fmt.Sprintf("sockmesh failed to translate this %s (internal error: %v); it is treated as invalid until it changes or sockmesh is fixed", ref.Kind, v))
	})
}

// contain runs eval and returns its result; should eval panic, it returns
// failed's, given the recovered value and the stack. The fault hook runs
// first, with at, which names what eval judges.
func contain[E any](t *translator, at snapshot.ObjectRef, eval func() E, failed func(v any, stack string) E) (out E) {
	defer func() {
		if v := recover(); v != nil {
			out = failed(v, string(debug.Stack()))
		}
	}()
	if t.fault != nil {
		t.fault(at)
	}
	return eval()
}

// faultRouteJoin is the Kind of the ref the fault hook gets before a
// Service port's route join, Name "service:port".
const faultRouteJoin = "route join"

// joinContained builds port k's route table from the routes attached to it
// per role (buildSet), contained: should the join panic — it reads every
// route there together, so no one object is at fault — the port's table
// answers every request with an error (failedSet), and each route attached
// there is listed in Failures, its status entries toward the port saying
// so (routeStatus). The table stays: without it requests would go straight
// to the Service, past the routes' filters (ExternalAuth among them). What
// the panicking buildSet recorded on the routes' parents at k is not
// shown: those parents' entries say Accepted=False for the failure alone.
func (t *translator) joinContained(k portKey, roles map[string][]*routeEval) *snapshot.RouteTable {
	at := snapshot.ObjectRef{Kind: faultRouteJoin, Namespace: k.namespace, Name: fmt.Sprintf("%s:%d", k.name, k.port)}
	join := func() *snapshot.RouteTable {
		return routeTable(roles, func(role string, routes []*routeEval) snapshot.RouteSet { return buildSet(k, role, routes) })
	}
	return contain(t, at, join, func(v any, stack string) *snapshot.RouteTable {
		panicked := fmt.Sprint(v)
		t.joinFailures[k] = panicked
		svc := snapshot.ObjectRef{Namespace: k.namespace, Name: k.name}
		return routeTable(roles, func(_ string, routes []*routeEval) snapshot.RouteSet {
			for _, e := range routes {
				t.joinFailed(e.ref, svc, panicked, stack)
			}
			return failedSet(k, routes, panicked)
		})
	})
}

// joinFailed lists route in Failures for a route join that panicked at a
// port of svc: once per route, naming every Service of such ports.
func (t *translator) joinFailed(route, svc snapshot.ObjectRef, panicked, stack string) {
	i := slices.IndexFunc(t.failures, func(f Failure) bool { return f.Object == route })
	if i < 0 {
		t.failures = append(t.failures, Failure{Object: route, Panic: panicked, Stack: stack})
		t.joined[route] = true
		i = len(t.failures) - 1
	}
	if f := &t.failures[i]; !slices.Contains(f.Services, svc) {
		f.Services = append(f.Services, svc)
	}
}

// failedSet is the route set of one role at port k, whose join panicked:
// each route's one rule matches every request and is Invalid, so that
// every request is answered as an invalid rule's are (500; where a
// GRPCRoute attaches, the set is a GRPCRoute set: UNAVAILABLE), and
// sockmeshctl names each route there.
func failedSet(k portKey, routes []*routeEval, panicked string) snapshot.RouteSet {
	set := snapshot.RouteSet{Kind: snapshot.KindHTTPRoute}
	for i, e := range routes {
		if e.kind == snapshot.KindGRPCRoute {
			set.Kind = snapshot.KindGRPCRoute
		}
		set.Matches = append(set.Matches, snapshot.RouteMatch{Rule: i, Path: snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/"}})
		set.Rules = append(set.Rules, snapshot.RouteRule{Route: e.ref, Invalid: &snapshot.Invalid{Policy: e.ref, Reason: ReasonInternalError,
			Message: joinFailedMessage(k, panicked)}})
	}
	return set
}

// joinFailedMessage says that the route join at port k panicked, and what
// requests there get.
func joinFailedMessage(k portKey, panicked string) string {
	return fmt.Sprintf("sockmesh failed to join the routes attached to Service %s/%s port %d (internal error: %s): every request there is answered with an error "+
		"(HTTP 500, or UNAVAILABLE where a GRPCRoute attaches) until the routes there change or sockmesh is fixed", k.namespace, k.name, k.port, panicked)
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
// those entries stand toward in Failure.Services, with those its status
// had no room for (Unrepresented).
func (t *translator) settleFailures() {
	for i := range t.failures {
		f := &t.failures[i]
		if t.joined[f.Object] {
			continue // a route join's: routeStatus settled its entries toward the ports where it failed
		}
		if f.Object.Kind == string(snapshot.KindService) {
			f.Services = []snapshot.ObjectRef{{Namespace: f.Object.Namespace, Name: f.Object.Name}}
			continue
		}
		msg := fmt.Sprintf("sockmesh failed to translate this %s (internal error: %s) before it judged its references", f.Object.Kind, f.Panic)
		var stands []gwv1.ParentReference
		for _, e := range t.statusEntries(f.Object) {
			unjudged(e.conds, msg)
			stands = append(stands, e.ref)
		}
		// Those its status had no room for are governed all the same.
		for _, u := range t.unrepresented {
			if u.Policy == f.Object {
				stands = append(stands, u.Target)
			}
		}
		for _, ref := range stands {
			if deref(ref.Group) == "" && deref(ref.Kind) == "Service" {
				svc := snapshot.ObjectRef{Namespace: cmp.Or(deref(ref.Namespace), f.Object.Namespace), Name: string(ref.Name)}
				if !slices.Contains(f.Services, svc) {
					f.Services = append(f.Services, svc)
				}
			}
		}
	}
}

// unjudged turns the ResolvedRefs condition of conds to Unknown
// (ReasonInternalError), saying msg: a panic kept sockmesh from judging
// the references it is about.
func unjudged(conds []metav1.Condition, msg string) {
	for i := range conds {
		if c := &conds[i]; c.Type == condResolvedRefs {
			c.Status, c.Reason, c.Message = metav1.ConditionUnknown, ReasonInternalError, truncate(msg)
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
