package translate

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// isServiceParent: the mesh's parentRefs name a core Service; group must
// be "" explicitly (unset means gateway.networking.k8s.io).
func isServiceParent(p gwv1.ParentReference) bool {
	return p.Group != nil && *p.Group == "" && p.Kind != nil && *p.Kind == "Service"
}

// attach attaches e to the Service ports its Service parentRefs name. A
// parentRef with port (and/or sectionName, the port's name) selects those
// that match all it names; one without, every TCP port. A route in the
// Service's namespace is a producer route; one elsewhere a consumer route
// for clients in its own namespace (GEP-1294). ReferenceGrants do not
// govern parentRefs to Services.
func (t *translator) attach(e *routeEval, attached map[portKey]map[string][]*routeEval) {
	for i, ref := range e.parentRefs {
		if !isServiceParent(ref) {
			continue // a Gateway's, or another implementation's
		}
		if slices.ContainsFunc(e.parentRefs[:i], func(o gwv1.ParentReference) bool {
			return compareParents(o, ref) == 0 && (o.Port == nil) == (ref.Port == nil) && (o.Port == nil || *o.Port == *ref.Port)
		}) {
			// A repeat, which the CRD refuses (parentRefsProblem): status
			// entries are keyed by parentRef, so it gets none of its own.
			continue
		}
		po := &parentOutcome{ref: ref}
		e.parents = append(e.parents, po)
		if ref.Port != nil && !validPort(*ref.Port) {
			// parentRefsProblem made the route invalid, which its status
			// says, not that no Service port matched.
			continue
		}
		ns := cmp.Or(deref(ref.Namespace), e.ref.Namespace)
		what := fmt.Sprintf("Service %s/%s", ns, ref.Name)
		po.svc = t.byService[types.NamespacedName{Namespace: ns, Name: string(ref.Name)}]
		if po.svc == nil {
			po.problem = &refProblem{string(gwv1.RouteReasonNoMatchingParent), what + " not found"}
			continue
		}
		if len(clusterIPs(po.svc)) == 0 {
			po.problem = &refProblem{string(gwv1.RouteReasonNoMatchingParent), what +
				" has no ClusterIP (headless or ExternalName), so there is no Service address to route requests for (GEP-1294)"}
			continue
		}
		for _, sp := range po.svc.Spec.Ports {
			if isTCP(sp) && validPort(sp.Port) && (ref.Port == nil || *ref.Port == sp.Port) &&
				(ref.SectionName == nil || string(*ref.SectionName) == sp.Name) {
				po.ports = append(po.ports, sp.Port)
			}
		}
		if len(po.ports) == 0 {
			po.problem = &refProblem{string(gwv1.RouteReasonNoMatchingParent), fmt.Sprintf("%s has no TCP port%s (%s)", what, portSelector(ref), tcpPorts(po.svc))}
			continue
		}
		po.consumer = ns != e.ref.Namespace
		if !e.installed() {
			continue
		}
		role := po.role(e)
		for _, p := range po.ports {
			k := portKey{ns, string(ref.Name), p}
			if attached[k] == nil {
				attached[k] = map[string][]*routeEval{}
			}
			if !slices.Contains(attached[k][role], e) {
				attached[k][role] = append(attached[k][role], e)
			}
		}
	}
}

// tcpPorts lists the ports of svc a route can use, for a message that
// names a port it lacks: what the app team may write instead.
func tcpPorts(svc *corev1.Service) string {
	var ps []string
	for _, sp := range svc.Spec.Ports {
		switch {
		case !isTCP(sp) || !validPort(sp.Port):
		case sp.Name == "":
			ps = append(ps, fmt.Sprint(sp.Port))
		default:
			ps = append(ps, fmt.Sprintf("%d %q", sp.Port, sp.Name))
		}
	}
	if len(ps) == 0 {
		return "it has none"
	}
	return "its TCP ports: " + strings.Join(ps, ", ")
}

func portSelector(ref gwv1.ParentReference) string {
	var s []string
	if ref.Port != nil {
		s = append(s, fmt.Sprintf(" %d", *ref.Port))
	}
	if ref.SectionName != nil {
		s = append(s, fmt.Sprintf(" named %q", *ref.SectionName))
	}
	return strings.Join(s, "")
}

// role is the role po gives e's rules: "" for a producer route, else the
// consumer route's namespace.
func (po *parentOutcome) role(e *routeEval) string {
	if po.consumer {
		return e.ref.Namespace
	}
	return ""
}

// parentsAt returns e's parent outcomes that attached it to port k for
// role.
func (e *routeEval) parentsAt(k portKey, role string) []*parentOutcome {
	var out []*parentOutcome
	for _, po := range e.parents {
		if po.svc != nil && po.svc.Namespace == k.namespace && po.svc.Name == k.name && po.role(e) == role && slices.Contains(po.ports, k.port) {
			out = append(out, po)
		}
	}
	return out
}
