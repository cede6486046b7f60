package translate

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate/tlsvalidation"
	"github.com/sockmesh/sockmesh/internal/refgrant"
)

// xbackendEval is one XBackend, checked once.
type xbackendEval struct {
	xb  *gwxv1alpha1.XBackend
	ref snapshot.ObjectRef
	// backend has Invalid set when the XBackend cannot be honoured: from
	// its configuration (accepted), or node-locally from DNS.
	backend snapshot.Backend
	// accepted is the configuration's Accepted=False reason, or nil.
	accepted     *tlsvalidation.Problem
	resolvedRefs *tlsvalidation.Problem
	// fronts are its ancestors: the Services that stand for it
	// (captureXBackendService) and the parent Services of accepted routes
	// that lead to it (routeStatus).
	fronts []*corev1.Service
}

func (t *translator) translateXBackends() {
	for _, xb := range sortedObjects(t.in.XBackends) {
		if _, ok := t.xbackends[key(xb)]; !ok {
			t.xbackends[key(xb)] = t.evalXBackendContained(xb)
		}
	}
}

// evalXBackend checks an XBackend the way the CRD's validation rules do
// (a cluster's CRD may be of another version) and builds its backend.
func (t *translator) evalXBackend(xb *gwxv1alpha1.XBackend) *xbackendEval {
	spec := &xb.Spec
	e := &xbackendEval{xb: xb, ref: snapshot.ObjectRef{Kind: string(snapshot.KindXBackend), Namespace: xb.Namespace, Name: xb.Name}}
	b := &e.backend
	b.Ref = snapshot.BackendRef{Kind: snapshot.KindXBackend, Namespace: xb.Namespace, Name: xb.Name}
	b.Sources = []snapshot.ObjectRef{e.ref}
	var invalid []string
	bad := func(format string, args ...any) { invalid = append(invalid, fmt.Sprintf(format, args...)) }

	if validPort(int32(spec.Port.Number)) {
		b.Ref.Port = uint16(spec.Port.Number)
	} else {
		bad("port.number %d is not a port number (1-65535)", spec.Port.Number)
	}
	proto, ok := xbackendProtocol(spec.Protocol)
	if !ok {
		bad("protocol %q is not one of TCP, HTTP, HTTP2, HTTP11, H2C, MCP, GRPC, WSS", deref(spec.Protocol))
	}
	b.Protocol = proto

	mode := gwxv1alpha1.BackendTLSModeNone
	if spec.TLS != nil {
		mode = spec.TLS.Mode
	}
	switch {
	case proto == snapshot.ProtocolH2C && mode != gwxv1alpha1.BackendTLSModeNone:
		bad("tls must be disabled when protocol is H2C; use protocol HTTP2 for HTTP/2 with tls")
	case proto == snapshot.ProtocolHTTP2 && mode == gwxv1alpha1.BackendTLSModeNone:
		bad("tls must be enabled when protocol is HTTP2; use protocol H2C for HTTP/2 without tls")
	case proto == snapshot.ProtocolWSS && mode == gwxv1alpha1.BackendTLSModeNone:
		bad("tls must be enabled when protocol is WSS")
	}
	noValidCA := t.xbackendTLS(e, mode, bad)

	var (
		egressDenied string
		selected     []snapshot.Endpoint // an EndpointSelector's, whatever its validity
	)
	switch spec.Type {
	case gwxv1alpha1.BackendTypeExternalHostname:
		if spec.EndpointSelector != nil {
			bad("endpointSelector must be unset when type is ExternalHostname")
		}
		if spec.SessionPersistence != nil {
			bad("sessionPersistence can only be set when type is EndpointSelector")
		}
		if spec.ExternalHostname == nil {
			bad("externalHostname must be set when type is ExternalHostname")
			break
		}
		host := string(spec.ExternalHostname.Hostname)
		b.Hostname = host
		if msg := externalHostnameProblem(host, t.in.Node.ClusterDomain); msg != "" {
			bad("%s", msg)
		} else if !egressAllowed(host, t.in.Node.EgressAllow) {
			egressDenied = fmt.Sprintf("externalHostname.hostname %q is not on the agent's egress allow-list", host)
		}
	case gwxv1alpha1.BackendTypeEndpointSelector:
		if spec.ExternalHostname != nil {
			bad("externalHostname must be unset when type is EndpointSelector")
		}
		sp, msg := sessionPersistence(spec.SessionPersistence, e.ref)
		if msg != "" {
			bad("%s", msg)
		}
		if sp != nil && proto == snapshot.ProtocolTCP {
			bad("%s", tcpSessionMessage)
		}
		b.SessionPersistence = sp
		if spec.EndpointSelector == nil {
			bad("endpointSelector must be set when type is EndpointSelector")
		} else if msg := selectorProblem(spec.EndpointSelector.MatchLabels); msg != "" {
			bad("%s", msg)
		} else if b.Ref.Port != 0 {
			// The generated Service's lifecycle is tied to the XBackend
			// (the API's implementer notes), not to the rest of its
			// validity: an XBackend invalid for its TLS or protocol keeps
			// it, so a fix takes effect at once rather than after a new
			// Service and its EndpointSlices are made.
			selected = t.selectorEndpoints(xb)
		}
	default:
		bad("type %q is not ExternalHostname or EndpointSelector", spec.Type)
	}

	switch {
	case len(invalid) > 0:
		e.accepted = &tlsvalidation.Problem{Reason: tlsvalidation.ReasonInvalid, Message: strings.Join(invalid, "; ")}
	case noValidCA != nil:
		e.accepted = noValidCA
	case egressDenied != "":
		e.accepted = &tlsvalidation.Problem{Reason: ReasonEgressNotAllowed, Message: egressDenied}
	}
	if e.accepted != nil {
		b.TLS = nil
		b.Invalid = &snapshot.Invalid{Policy: e.ref, Reason: e.accepted.Reason, Message: e.accepted.Message}
		return e
	}

	switch spec.Type {
	case gwxv1alpha1.BackendTypeExternalHostname:
		eps, reason, msg := t.externalEndpoints(b.Hostname, b.Ref.Port)
		b.Endpoints = eps
		if reason != "" {
			b.TLS = nil // an Invalid backend carries no settings to use
			b.Invalid = &snapshot.Invalid{Policy: e.ref, Reason: reason, Message: msg}
		}
	case gwxv1alpha1.BackendTypeEndpointSelector:
		b.Endpoints = selected
	}
	return e
}

// xbackendTLS fills the backend's TLS from spec.tls, through the same
// validation code as BackendTLSPolicy. Field problems go to bad; a CA
// bundle with no valid certificate is returned as the Accepted problem.
func (t *translator) xbackendTLS(e *xbackendEval, mode gwxv1alpha1.BackendTLSMode, bad func(string, ...any)) *tlsvalidation.Problem {
	spec := e.xb.Spec.TLS
	if spec == nil {
		return nil
	}
	switch mode {
	case gwxv1alpha1.BackendTLSModeNone:
		if spec.Validation != nil {
			bad("tls.validation must be unset when tls.mode is None")
		}
		if spec.ClientCertificateRef != nil {
			bad("tls.clientCertificateRef must be unset when tls.mode is None")
		}
		return nil
	case gwxv1alpha1.BackendTLSModeServerOnly, gwxv1alpha1.BackendTLSModeClientAndServer:
	default:
		bad("tls.mode %q is not None, ServerOnly or ClientAndServer", mode)
		return nil
	}
	if spec.Validation == nil {
		bad("tls.validation must be set when tls.mode is %s", mode)
		return nil
	}
	// XBackend's CRD is experimental only, where caCertificateRefs has
	// MinItems=1. Validate, shared with BackendTLSPolicy, whose standard
	// channel accepts an empty list beside wellKnownCACertificates, reads
	// one as unset.
	if refs := spec.Validation.CACertificateRefs; refs != nil && len(refs) == 0 {
		bad("tls.validation.caCertificateRefs must not be empty; leave it out")
	}
	v := tlsvalidation.Validate(spec.Validation, "tls.validation", e.xb.Namespace, t, t.in.ClusterTrustBundlesUnavailable, t.in.Now)
	t.judgedUntil(v.ChangesAt)
	tls := v.TLS
	tls.Mode = snapshot.TLSServerOnly
	tls.Policy = e.ref
	e.resolvedRefs = v.ResolvedRefs
	var noValidCA *tlsvalidation.Problem
	if v.Accepted != nil {
		if v.Accepted.Reason == tlsvalidation.ReasonInvalid {
			bad("%s", v.Accepted.Message)
		} else {
			noValidCA = v.Accepted
		}
	}

	switch {
	case mode == gwxv1alpha1.BackendTLSModeServerOnly && spec.ClientCertificateRef != nil:
		bad("tls.clientCertificateRef must be unset when tls.mode is ServerOnly")
	case mode == gwxv1alpha1.BackendTLSModeClientAndServer && spec.ClientCertificateRef == nil:
		bad("tls.clientCertificateRef must be set when tls.mode is ClientAndServer")
	case mode == gwxv1alpha1.BackendTLSModeClientAndServer:
		granted := func(namespace, name string) bool {
			return refgrant.Allows(t.grants[namespace], refgrant.XBackend(e.xb.Namespace), refgrant.To{Kind: "Secret", Namespace: namespace, Name: name})
		}
		cc, p := tlsvalidation.ClientCertificate(spec.ClientCertificateRef, e.xb.Namespace, t, granted, t.in.Now)
		t.judgedUntil(cc.ChangesAt)
		if p != nil {
			bad("tls.%s", p.Message)
			if e.resolvedRefs == nil {
				e.resolvedRefs = p
			} else {
				e.resolvedRefs = &tlsvalidation.Problem{Reason: e.resolvedRefs.Reason, Message: e.resolvedRefs.Message + "; " + p.Message}
			}
			break
		}
		tls.Mode = snapshot.TLSMutual
		tls.ClientCertificatePEM, tls.ClientKeyPEM = cc.CertPEM, cc.KeyPEM
	}
	e.backend.TLS = &tls
	return noValidCA
}

// xbackendProtocol maps an XBackend protocol; nil leaves the protocol to
// what the app speaks.
func xbackendProtocol(p *gwxv1alpha1.BackendProtocol) (snapshot.Protocol, bool) {
	if p == nil {
		return snapshot.ProtocolAuto, true
	}
	switch *p {
	case gwxv1alpha1.BackendProtocolTCP:
		return snapshot.ProtocolTCP, true
	case gwxv1alpha1.BackendProtocolHTTP:
		return snapshot.ProtocolHTTP, true
	case gwxv1alpha1.BackendProtocolHTTP11:
		return snapshot.ProtocolHTTP11, true
	case gwxv1alpha1.BackendProtocolHTTP2:
		return snapshot.ProtocolHTTP2, true
	case gwxv1alpha1.BackendProtocolH2C:
		return snapshot.ProtocolH2C, true
	case gwxv1alpha1.BackendProtocolGRPC:
		return snapshot.ProtocolGRPC, true
	case gwxv1alpha1.BackendProtocolWSS:
		return snapshot.ProtocolWSS, true
	case gwxv1alpha1.BackendProtocolMCP:
		return snapshot.ProtocolMCP, true
	}
	return snapshot.ProtocolAuto, false
}

// tcpSessionMessage says why sessionPersistence cannot apply to an
// XBackend whose protocol is TCP: the proxy relays its bytes untouched.
const tcpSessionMessage = "sessionPersistence needs an HTTP protocol (its cookie or header is HTTP's), and protocol is TCP, whose bytes are relayed untouched"

// captureXBackendService captures the ports of a Service annotated with
// AnnotationXBackend: connections to its ClusterIPs go to the XBackend
// named by the annotation in the Service's namespace.
func (t *translator) captureXBackendService(svc *corev1.Service, name string) {
	b, e := t.xbackendServiceBackend(svc, name)
	if e != nil && !slices.Contains(e.fronts, svc) {
		e.fronts = append(e.fronts, svc)
	}
	addrs := clusterIPs(svc)
	if len(addrs) == 0 {
		return
	}
	for _, sp := range svc.Spec.Ports {
		if !isTCP(sp) || !validPort(sp.Port) {
			continue
		}
		t.capturePort(svc, sp, addrs, b)
	}
}

// xbackendStatus writes each XBackend's ancestors: the Services that stand
// for it and the parent Services of accepted routes that lead to it, those
// its status has room for (fitEntries: BackendStatus holds 32 ancestors,
// other controllers' included). An ancestor without room gets no entry and
// is listed in Unrepresented; its connections go to the XBackend all the
// same, as a route is served on a parent without room: the API, unlike a
// policy's, does not make the XBackend unimplementable there. An XBackend
// nothing reaches has no ancestors. DNS state is node-local and stays out
// of status; the leader writes what every agent would.
func (t *translator) xbackendStatus() {
	// In namespace/name order, for Unrepresented's.
	for _, k := range slices.SortedFunc(maps.Keys(t.xbackends), compareNames) {
		t.xbackendStatuses[k] = t.xbackendAncestors(t.xbackends[k])
	}
}

func (t *translator) xbackendAncestors(e *xbackendEval) []gwxv1alpha1.BackendAncestorStatus {
	out := []gwxv1alpha1.BackendAncestorStatus{}
	// The API: "the lack of TLS for external hostnames should be
	// considered insecure and a security risk". Accepted, but said
	// where the owner reads whether it works. From the spec: the
	// backend also lacks TLS when this node's DNS fails it, which
	// stays out of status.
	cleartext := ""
	if spec := e.xb.Spec; spec.Type == gwxv1alpha1.BackendTypeExternalHostname && (spec.TLS == nil || spec.TLS.Mode == gwxv1alpha1.BackendTLSModeNone) {
		cleartext = fmt.Sprintf("; tls is None, so they reach %s in cleartext, which the XBackend API considers insecure", e.backend.Hostname)
	}
	slices.SortFunc(e.fronts, func(a, b *corev1.Service) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	refs := make([]gwv1.ParentReference, len(e.fronts))
	for i, svc := range e.fronts {
		refs[i] = serviceParent(svc.Namespace, svc.Name, "")
	}
	fits, others := fitEntries(e.xb.Status.Ancestors, func(a *gwxv1alpha1.BackendAncestorStatus) (gwv1.GatewayController, gwv1.ParentReference) {
		return a.ControllerName, a.AncestorRef
	}, refs, maxBackendAncestors)
	for i, svc := range e.fronts {
		if !fits[i] {
			t.unrepresented = append(t.unrepresented, Unrepresented{Policy: e.ref, Target: refs[i], Message: fmt.Sprintf(
				"the XBackend's status has no room for this Service (it holds at most %d ancestors, %d of them other controllers'); its connections go to the XBackend all the same",
				maxBackendAncestors, others)})
			continue
		}
		c := conditionSet{generation: e.xb.Generation, now: t.now}
		switch {
		case len(clusterIPs(svc)) == 0:
			c.set(condAccepted, false, string(gwv1.PolicyReasonInvalid), fmt.Sprintf(
				"Service %s/%s has no ClusterIP (headless or ExternalName), so sockmesh cannot capture connections to it", svc.Namespace, svc.Name))
		case !slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return isTCP(sp) && validPort(sp.Port) }):
			c.set(condAccepted, false, string(gwv1.PolicyReasonInvalid), fmt.Sprintf(
				"Service %s/%s has no TCP port, so sockmesh captures no connection to it", svc.Namespace, svc.Name))
		case e.accepted != nil:
			c.set(condAccepted, false, e.accepted.Reason, e.accepted.Message)
		case svc.Annotations[AnnotationXBackend] != e.xb.Name || svc.Namespace != e.xb.Namespace:
			c.set(condAccepted, true, string(gwxv1alpha1.BackendReasonAccepted),
				fmt.Sprintf("routes of Service %s/%s send requests to this XBackend%s", svc.Namespace, svc.Name, cleartext))
		default:
			c.set(condAccepted, true, string(gwxv1alpha1.BackendReasonAccepted),
				fmt.Sprintf("connections to Service %s/%s go to this XBackend%s", svc.Namespace, svc.Name, cleartext))
		}
		if e.resolvedRefs != nil {
			c.set(condResolvedRefs, false, e.resolvedRefs.Reason, e.resolvedRefs.Message)
		} else {
			c.set(condResolvedRefs, true, string(gwv1.BackendTLSPolicyReasonResolvedRefs), "all references resolved")
		}
		out = append(out, gwxv1alpha1.BackendAncestorStatus{ControllerName: ControllerName, AncestorRef: refs[i], Conditions: c.conds})
	}
	return out
}
