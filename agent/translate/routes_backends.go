package translate

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/refgrant"
)

// ReasonInvalidBackend (ResolvedRefs=False on a route) says a backendRef
// resolves, but its backend's properties cannot be honoured (its
// BackendTLSPolicy or XBackend is invalid): requests sent to it fail
// closed with 503, as they would without the route.
const ReasonInvalidBackend = "InvalidBackend"

// refProblem is why a backendRef cannot be used, as ResolvedRefs says it.
type refProblem struct {
	reason, message string
}

// serviceBackend builds the backend of a Service port: its endpoints and
// what its BackendTLSPolicy and appProtocol ask for. Frontends and route
// backendRefs share it, so a Service is the same backend however it is
// reached.
func (t *translator) serviceBackend(svc *corev1.Service, sp corev1.ServicePort) snapshot.Backend {
	k := portKey{svc.Namespace, svc.Name, sp.Port}
	tls, invalid, policy := t.portTLS(k)
	b := snapshot.Backend{
		Ref:       snapshot.BackendRef{Kind: snapshot.KindService, Namespace: svc.Namespace, Name: svc.Name, Port: uint16(sp.Port)},
		Protocol:  portProtocol(deref(sp.AppProtocol), tls != nil || invalid != nil),
		Endpoints: t.serviceEndpoints(svc, sp),
		TLS:       tls,
		Invalid:   invalid,
	}
	if b.Protocol != snapshot.ProtocolAuto {
		// Only appProtocol names a Service port's protocol.
		b.AppProtocol = deref(sp.AppProtocol)
		b.Sources = append(b.Sources, snapshot.ObjectRef{Kind: string(snapshot.KindService), Namespace: svc.Namespace, Name: svc.Name})
	}
	if policy != nil {
		b.Sources = append(b.Sources, *policy)
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		b.ClientIPAffinitySeconds = corev1.DefaultClientIPServiceAffinitySeconds
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
			b.ClientIPAffinitySeconds = *c.ClientIP.TimeoutSeconds
		}
	}
	t.applyTrafficPolicy(&b)
	return b
}

// xbackendServiceBackend is where a Service annotated AnnotationXBackend
// leads: the XBackend, or a fail-closed entry when there is none.
func (t *translator) xbackendServiceBackend(svc *corev1.Service, name string) (snapshot.Backend, *xbackendEval) {
	if e := t.xbackends[types.NamespacedName{Namespace: svc.Namespace, Name: name}]; e != nil {
		return e.backend, e
	}
	return snapshot.Backend{
		Ref: snapshot.BackendRef{Kind: snapshot.KindXBackend, Namespace: svc.Namespace, Name: name},
		Invalid: &snapshot.Invalid{
			Policy:  snapshot.ObjectRef{Namespace: svc.Namespace, Name: svc.Name},
			Reason:  ReasonXBackendNotFound,
			Message: fmt.Sprintf("Service %s/%s names XBackend %q (annotation %s), which does not exist", svc.Namespace, svc.Name, name, AnnotationXBackend),
		},
	}, nil
}

// resolved is a backendRef that resolved.
type resolved struct {
	backend  snapshot.Backend
	xbackend *xbackendEval // the XBackend it leads to, if any
	what     string        // the reference, for messages
}

// backendRefSpecProblem says what the CRD's rules on a backendRef refuse in
// ref (a cluster's CRDs may be of another version), or "": a Service
// reference needs a port, an XBackend reference takes none (the XBackend
// has its own). As with the CRD's other refusals within a rule, the rule
// fails (UnsupportedValue is an Accepted reason, not a ResolvedRefs one).
func (rb *routeBuilder) backendRefSpecProblem(ref gwv1.BackendObjectReference) string {
	group, kind := deref(ref.Group), cmp.Or(deref(ref.Kind), "Service")
	ns := cmp.Or(deref(ref.Namespace), rb.e.ref.Namespace)
	switch {
	case group == "" && kind == "Service" && ref.Port == nil:
		return fmt.Sprintf("the reference to Service %s/%s gives no port, and a Service reference must name one of its ports", ns, ref.Name)
	case group == gwxv1alpha1.GroupName && kind == "XBackend" && ref.Port != nil:
		return fmt.Sprintf("the reference to XBackend %s/%s gives port %d, and an XBackend reference must give none: the XBackend names its own", ns, ref.Name, *ref.Port)
	}
	return ""
}

// resolveBackend resolves a backendRef (or a mirror's) of the route being
// built, one backendRefSpecProblem has passed. Core Services (with a port)
// and XBackends (group gateway.networking.x-k8s.io, without one, in the
// route's namespace) are backends; a Service in another namespace needs a ReferenceGrant there,
// unless it is one of the route's own parent Services (clients already
// reach those through sockmesh, so the reference exposes nothing new).
// grpc says the backend gets gRPC whatever the route's kind (a GRPC
// ExternalAuth), so it must speak HTTP/2.
func (rb *routeBuilder) resolveBackend(ref gwv1.BackendObjectReference, grpc bool) (resolved, *refProblem) {
	t := rb.t
	group, kind := deref(ref.Group), cmp.Or(deref(ref.Kind), "Service")
	ns, name := cmp.Or(deref(ref.Namespace), rb.e.ref.Namespace), string(ref.Name)
	what := "backendRef " + kind + " " + ns + "/" + name
	permitted := func() *refProblem {
		if ns == rb.e.ref.Namespace || group == "" && kind == "Service" && rb.e.parentServices[types.NamespacedName{Namespace: ns, Name: name}] ||
			t.granted(string(rb.kind), rb.e.ref.Namespace, group, kind, ns, name) {
			return nil
		}
		return &refProblem{string(gwv1.RouteReasonRefNotPermitted), fmt.Sprintf(
			"%s: no ReferenceGrant in namespace %s allows %ss from namespace %s to refer to it", what, ns, rb.kind, rb.e.ref.Namespace)}
	}
	out := resolved{what: what}
	switch {
	case group == "" && kind == "Service":
		if p := permitted(); p != nil {
			return out, p
		}
		svc := t.byService[types.NamespacedName{Namespace: ns, Name: name}]
		if svc == nil {
			return out, &refProblem{string(gwv1.RouteReasonBackendNotFound), what + ": Service not found"}
		}
		if svc.Spec.Type == corev1.ServiceTypeExternalName {
			// GEP-1294 and the API: ExternalName Services SHOULD NOT be
			// backends (CVE-2021-25740).
			return out, &refProblem{string(gwv1.RouteReasonInvalidKind), what + ": ExternalName Services are not supported as backends"}
		}
		// A port number out of range is no port: in 16 bits it would
		// stand for another port's backend (and that port's TLS).
		i := slices.IndexFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return isTCP(sp) && validPort(sp.Port) && sp.Port == *ref.Port })
		if i < 0 {
			if slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return validPort(sp.Port) && sp.Port == *ref.Port }) {
				// GEP-1911: a backend the route cannot speak to is
				// UnsupportedProtocol; it exists.
				return out, &refProblem{string(gwv1.RouteReasonUnsupportedProtocol), fmt.Sprintf(
					"%s: port %d is not TCP, and %ss send requests over TCP", what, *ref.Port, rb.kind)}
			}
			return out, &refProblem{string(gwv1.RouteReasonBackendNotFound), fmt.Sprintf("%s: the Service has no TCP port %d (%s)", what, *ref.Port, tcpPorts(svc))}
		}
		if p := t.headlessPolicy(svc); p != "" {
			// BackendTLSPolicies do not apply to headless Services (their
			// status says so); dialling its endpoints in plaintext would
			// ignore what the owner declared, so the reference fails closed.
			return out, &refProblem{ReasonInvalidBackend, fmt.Sprintf(
				"%s: BackendTLSPolicy %s targets this headless Service, and sockmesh cannot apply it to headless Services", what, p)}
		}
		if xb, ok := svc.Annotations[AnnotationXBackend]; ok {
			out.backend, out.xbackend = t.xbackendServiceBackend(svc, xb)
			break
		}
		if b := t.backends[snapshot.BackendRef{Kind: snapshot.KindService, Namespace: ns, Name: name, Port: uint16(*ref.Port)}]; b != nil {
			out.backend = *b // built for an earlier reference
		} else {
			out.backend = t.serviceBackend(svc, svc.Spec.Ports[i])
		}
		// A policy that is invalid still applies: the reference then
		// resolves, and configProblem reports the policy instead.
		withPolicy := out.backend.TLS != nil || out.backend.Invalid != nil
		if why := appProtocolProblem(deref(svc.Spec.Ports[i].AppProtocol), withPolicy); why != "" {
			// GEP-1911: a backend the route cannot send its requests to is
			// UnsupportedProtocol; requests would otherwise go in the
			// client's cleartext HTTP to a server speaking something else.
			return out, &refProblem{string(gwv1.RouteReasonUnsupportedProtocol), fmt.Sprintf(
				"%s: port %d has appProtocol %s, %s", what, *ref.Port, deref(svc.Spec.Ports[i].AppProtocol), why)}
		}
	case group == gwxv1alpha1.GroupName && kind == "XBackend":
		if ns != rb.e.ref.Namespace {
			// GEP-4894: Backends MUST live in the namespace of the routes
			// that reference them; no ReferenceGrant lifts that.
			return out, &refProblem{string(gwv1.RouteReasonRefNotPermitted), fmt.Sprintf(
				"%s: an XBackend must be in the route's namespace %s; ReferenceGrants do not extend to XBackends (GEP-4894)", what, rb.e.ref.Namespace)}
		}
		e := t.xbackends[types.NamespacedName{Namespace: ns, Name: name}]
		if e == nil {
			return out, &refProblem{string(gwv1.RouteReasonBackendNotFound), what + ": XBackend not found"}
		}
		out.backend, out.xbackend = e.backend, e
	default:
		return out, &refProblem{string(gwv1.RouteReasonInvalidKind), fmt.Sprintf(
			"%s (group %q): only core Services and %s XBackends are backends", what, group, gwxv1alpha1.GroupName)}
	}
	switch {
	case grpc && !protocolFits(snapshot.KindGRPCRoute, out.backend.Protocol):
		return out, &refProblem{string(gwv1.RouteReasonUnsupportedProtocol), fmt.Sprintf(
			"%s: gRPC needs HTTP/2, and the backend's protocol is %s", what, out.backend.Protocol)}
	case !protocolFits(rb.kind, out.backend.Protocol):
		return out, &refProblem{string(gwv1.RouteReasonUnsupportedProtocol), fmt.Sprintf(
			"%s: %ss cannot send requests to a backend whose protocol is %s", what, rb.kind, out.backend.Protocol)}
	}
	return out, nil
}

// appProtocolProblem says why a route cannot send requests to a Service
// port with appProtocol, or returns "" when it can. withPolicy says a
// BackendTLSPolicy applies to the port. Routes send HTTP (and gRPC over
// it), so the port must take that: the Kubernetes names sockmesh knows
// (KEP-3726), and, case-insensitively, the unprefixed names apps commonly
// set for HTTP (Istio's convention; an HTTP request relayed over "tcp" is
// still what the app sent). TLS names need the policy, since only it tells
// sockmesh how to originate TLS. Anything else (another kubernetes.io/
// name, a domain-prefixed one, mysql, redis) is a protocol routes do not
// speak (GEP-1911: UnsupportedProtocol). Captured Services without a
// route are not judged here: their traffic is the app's own.
func appProtocolProblem(appProtocol string, withPolicy bool) string {
	const (
		noPolicy = "and no BackendTLSPolicy tells sockmesh how to originate its TLS"
		notHTTP  = "not one sockmesh knows as HTTP, and routes send only HTTP"
	)
	switch appProtocol {
	case "", appProtocolH2C, appProtocolWS:
		return ""
	case appProtocolWSS:
		if withPolicy {
			return ""
		}
		return noPolicy
	}
	if strings.Contains(appProtocol, "/") {
		return notHTTP
	}
	switch strings.ToLower(appProtocol) {
	case "http", "http2", "h2c", "grpc", "grpc-web", "tcp":
		return ""
	case "https", "tls":
		if withPolicy {
			return ""
		}
		return noPolicy
	}
	return notHTTP
}

// protocolFits reports whether a route of kind can use a backend speaking
// p: gRPC needs HTTP/2, and neither route kind can use opaque TCP.
func protocolFits(kind snapshot.RouteKind, p snapshot.Protocol) bool {
	switch p {
	case snapshot.ProtocolTCP:
		return false
	case snapshot.ProtocolHTTP11, snapshot.ProtocolWS, snapshot.ProtocolWSS, snapshot.ProtocolMCP:
		return kind == snapshot.KindHTTPRoute
	}
	return true
}

// configProblem is the ResolvedRefs problem of a resolved backend whose
// properties cannot be honoured, or nil. Node-local DNS state (Unresolved,
// AddressesRefused) stays out of status, as for XBackends themselves.
func (r resolved) configProblem() *refProblem {
	var p *snapshot.Invalid
	switch {
	case r.xbackend != nil && r.xbackend.accepted != nil:
		p = r.backend.Invalid
	case r.xbackend == nil && r.backend.Invalid != nil:
		p = r.backend.Invalid
	}
	if p == nil {
		return nil
	}
	return &refProblem{ReasonInvalidBackend, fmt.Sprintf("%s: %s %s: %s; requests sent to it fail closed (503)", r.what, p.Policy, p.Reason, p.Message)}
}

// headlessPolicy names a BackendTLSPolicy targeting svc when svc is
// headless, or returns "".
func (t *translator) headlessPolicy(svc *corev1.Service) string {
	if len(clusterIPs(svc)) > 0 {
		return ""
	}
	for _, p := range sortedObjects(t.in.BackendTLSPolicies) {
		if p.Namespace == svc.Namespace && slices.ContainsFunc(p.Spec.TargetRefs, func(r gwv1.LocalPolicyTargetReferenceWithSectionName) bool {
			return r.Group == "" && r.Kind == "Service" && string(r.Name) == svc.Name
		}) {
			return p.Namespace + "/" + p.Name
		}
	}
	return ""
}

// granted reports whether a ReferenceGrant in namespace toNS lets routes
// of fromKind in fromNS refer to the object.
func (t *translator) granted(fromKind, fromNS, toGroup, toKind, toNS, toName string) bool {
	return refgrant.Allows(t.grants[toNS], refgrant.From{Group: gwv1.GroupName, Kind: fromKind, Namespace: fromNS},
		refgrant.To{Group: toGroup, Kind: toKind, Namespace: toNS, Name: toName})
}
