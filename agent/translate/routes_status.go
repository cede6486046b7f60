package translate

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// routeStatus writes one RouteParentStatus per Service parentRef that the
// route's status has room for (fitEntries: RouteStatus holds 32 parents,
// other controllers' included): Accepted, ResolvedRefs and, when some
// rules are left out or answer 500, PartiallyInvalid. A parent without
// room gets no entry and is listed in Unrepresented; the route is still
// served there, since the API, unlike a policy's, does not make it
// unimplementable. A route with no Service parent gets an empty list, so
// stale entries of ours are removed.
func (t *translator) routeStatus(e *routeEval) []gwv1.RouteParentStatus {
	out := []gwv1.RouteParentStatus{}
	refs := make([]gwv1.ParentReference, len(e.parents))
	for i, po := range e.parents {
		refs[i] = po.ref
	}
	fits, others := fitEntries(e.existing, func(p *gwv1.RouteParentStatus) (gwv1.GatewayController, gwv1.ParentReference) {
		return p.ControllerName, p.ParentRef
	}, refs, maxRouteParents)
	invalidReason := gwv1.RouteReasonUnsupportedValue
	if e.incompatible {
		invalidReason = gwv1.RouteReasonIncompatibleFilters
	}
	for i, po := range e.parents {
		slices.Sort(po.conflicted) // buildSet ran per port, in map order
		slices.Sort(po.winners)
		problems := ruleProblems(e, po)
		c := conditionSet{generation: e.generation, now: t.now}
		failed, panicked := t.joinFailedAt(po)
		switch {
		case po.problem != nil:
			c.set(condAccepted, false, po.problem.reason, po.problem.message)
		case len(failed) > 0:
			c.set(condAccepted, false, string(gwv1.RouteReasonUnsupportedValue), fmt.Sprintf(
				"sockmesh failed to join this %s with the other routes on Service %s/%s port(s) %s (internal error: %s): every request there is answered with an error "+
					"(HTTP 500, or UNAVAILABLE where a GRPCRoute attaches) until the routes there change or sockmesh is fixed",
				e.kind, po.svc.Namespace, po.svc.Name, portList(failed), panicked))
		case e.invalid != "":
			c.set(condAccepted, false, string(gwv1.RouteReasonUnsupportedValue), "the route is invalid: "+e.invalid)
		case !e.accepted():
			msg := "no rule can be honoured: " + strings.Join(problems, "; ")
			if len(po.conflicted) > 0 {
				msg += "; " + lostPorts(e, po)
			}
			c.set(condAccepted, false, string(invalidReason), msg)
		case len(po.conflicted) == len(po.ports):
			c.set(condAccepted, false, ReasonConflicted, fmt.Sprintf(
				"for these clients, the route lost Service %s/%s port(s) %s to %s: GRPCRoutes take precedence over HTTPRoutes on a port both attach to (GEP-1294)",
				po.svc.Namespace, po.svc.Name, portList(po.conflicted), routeList(snapshot.KindGRPCRoute, po.winners)))
		default:
			c.set(condAccepted, true, string(gwv1.RouteReasonAccepted), acceptedMessage(e, po))
		}
		if len(e.refProblems) > 0 {
			var msgs []string
			for _, p := range e.refProblems {
				// One reference named in several rules is one thing to fix.
				if !slices.Contains(msgs, p.message) {
					msgs = append(msgs, p.message)
				}
			}
			c.set(condResolvedRefs, false, e.refProblems[0].reason, strings.Join(msgs, "; "))
		} else {
			c.set(condResolvedRefs, true, string(gwv1.RouteReasonResolvedRefs), "all references resolved")
		}
		if len(failed) > 0 {
			unjudged(c.conds, fmt.Sprintf("sockmesh failed to join this %s with the other routes on port(s) %s (internal error: %s), so which of its references serve there was never settled",
				e.kind, portList(failed), panicked))
		}
		if len(problems) > 0 && c.conds[0].Status == metav1.ConditionTrue {
			// The API's "Drop Rule(s)" approach: Accepted stays True and
			// the message starts with "Dropped Rule".
			c.set(condPartiallyInvalid, true, string(invalidReason), "Dropped Rule(s): "+strings.Join(problems, "; "))
		}
		if len(po.shadowed) > 0 && c.conds[0].Status == metav1.ConditionTrue {
			c.set(ConditionRulesShadowed, true, ReasonIdenticalMatches, shadowedMessage(po))
		}
		if fits[i] {
			out = append(out, gwv1.RouteParentStatus{ParentRef: *po.ref.DeepCopy(), ControllerName: ControllerName, Conditions: c.conds})
		} else {
			t.unrepresented = append(t.unrepresented, Unrepresented{Policy: e.ref, Target: *po.ref.DeepCopy(), Message: fmt.Sprintf(
				"the route's status has no room for this parent (it holds at most %d parents, %d of them other controllers'); the route is served here all the same",
				maxRouteParents, others)})
		}
		if c.conds[0].Status == metav1.ConditionTrue {
			for _, xb := range e.xbackends {
				if !slices.Contains(xb.fronts, po.svc) {
					xb.fronts = append(xb.fronts, po.svc)
				}
			}
		}
	}
	return out
}

// joinFailedAt returns the ports of po where the route join panicked
// (joinContained), and the panic.
func (t *translator) joinFailedAt(po *parentOutcome) (ports []int32, panicked string) {
	for _, p := range po.ports {
		if v, ok := t.joinFailures[portKey{po.svc.Namespace, po.svc.Name, p}]; ok {
			ports, panicked = append(ports, p), cmp.Or(panicked, v)
		}
	}
	return ports, panicked
}

// ruleProblems describes e's rules that are left out or answer an error,
// as true of po's ports: a failing rule's answer is told for the ports
// the route governs, not those routes of the other kind govern
// (lostPorts), where its requests never meet it.
func ruleProblems(e *routeEval, po *parentOutcome) []string {
	var problems []string
	for _, d := range e.dropped {
		problems = append(problems, d+" (the rule is left out)")
	}
	answer := "requests the rule matches get " + e.failAnswer()
	switch governed := po.governed(); {
	case len(governed) == 0 && len(po.conflicted) > 0:
		answer = ""
	case len(po.conflicted) > 0:
		answer = fmt.Sprintf("requests the rule matches on port(s) %s get %s", portList(governed), e.failAnswer())
	}
	for _, f := range e.failing {
		if answer != "" {
			f += " (" + answer + ": sockmesh never routes a rule without all it asks for)"
		}
		problems = append(problems, f)
	}
	return problems
}

// governed returns the ports of po where routes of e's kind govern: all
// but those lost to routes of the other kind (governingKind).
func (po *parentOutcome) governed() []int32 {
	var ports []int32
	for _, p := range po.ports {
		if !slices.Contains(po.conflicted, p) {
			ports = append(ports, p)
		}
	}
	return ports
}

func acceptedMessage(e *routeEval, po *parentOutcome) string {
	ports := po.governed()
	who := "every client without a consumer route of its own (producer route)"
	if po.consumer {
		who = fmt.Sprintf("clients in namespace %s (consumer route)", e.ref.Namespace)
	}
	msg := fmt.Sprintf("routes requests to Service %s/%s port(s) %s from %s", po.svc.Namespace, po.svc.Name, portList(ports), who)
	if len(po.conflicted) > 0 {
		msg += "; " + lostPorts(e, po)
	}
	for _, r := range e.idle {
		msg += "; " + r
	}
	return msg
}

// failAnswer is what a client gets from a rule that cannot route.
func (e *routeEval) failAnswer() string {
	if e.kind == snapshot.KindGRPCRoute {
		return "UNAVAILABLE" // the API's answer where a GRPCRoute cannot route
	}
	return "HTTP 500"
}

// lostPorts says which of po's ports routes of the other kind govern
// (governingKind): an HTTPRoute loses them to GRPCRoutes; a GRPCRoute that
// is not accepted leaves them to the HTTPRoutes that are.
func lostPorts(e *routeEval, po *parentOutcome) string {
	if e.kind == snapshot.KindGRPCRoute {
		return fmt.Sprintf("it takes no part on port(s) %s, which stay with %s: a route that is not accepted takes no port from accepted routes of another kind (GEP-1294 ignores rejected routes)",
			portList(po.conflicted), routeList(snapshot.KindHTTPRoute, po.winners))
	}
	return fmt.Sprintf("it lost port(s) %s to %s, as GRPCRoutes take precedence (GEP-1294)", portList(po.conflicted), routeList(snapshot.KindGRPCRoute, po.winners))
}

// routeList names routes of kind ("namespace/name").
func routeList(kind snapshot.RouteKind, names []string) string {
	if len(names) == 1 {
		return string(kind) + " " + names[0]
	}
	return string(kind) + "s " + strings.Join(names, ", ")
}

func portList(ports []int32) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, ", ")
}
