package translate

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// Kubernetes standard application protocols (KEP-3726) sockmesh acts on.
const (
	appProtocolH2C = "kubernetes.io/h2c"
	appProtocolWS  = "kubernetes.io/ws"
	appProtocolWSS = "kubernetes.io/wss"
)

// captureServices adds a frontend for every Service port with backend
// properties: a governing BackendTLSPolicy, appProtocol h2c or ws (or wss
// with a policy), a mesh route table, or session persistence from an
// XBackendTrafficPolicy. Services that stand for an
// XBackend lead there instead.
func (t *translator) captureServices() {
	for _, svc := range t.services {
		t.captureServiceContained(svc)
	}
}

// captureService adds the frontends of one Service's ports with backend
// properties (captureServices).
func (t *translator) captureService(svc *corev1.Service) {
	if name, ok := svc.Annotations[AnnotationXBackend]; ok {
		t.captureXBackendService(svc, name)
		return
	}
	addrs := clusterIPs(svc)
	if len(addrs) == 0 {
		return // headless or ExternalName: no ClusterIP to capture
	}
	for _, sp := range svc.Spec.Ports {
		if !isTCP(sp) || !validPort(sp.Port) {
			continue
		}
		// Decide before building the backend: most Services have no
		// backend properties, and their endpoints would be garbage.
		// A governing policy always yields TLS or Invalid; without one
		// the protocol comes from appProtocol alone.
		k := portKey{svc.Namespace, svc.Name, sp.Port}
		if t.portPolicies[k] == nil && portProtocol(deref(sp.AppProtocol), false) == snapshot.ProtocolAuto &&
			t.routeTables[k] == nil && !t.trafficPinsSessions(svc) {
			continue
		}
		t.capturePort(svc, sp, addrs, t.serviceBackend(svc, sp))
	}
}

// portProtocol maps a Service port's appProtocol to the wire protocol.
// With TLS from a BackendTLSPolicy the cleartext variants become their TLS
// twins (h2c → HTTP/2 over TLS, ws → wss). Without TLS, wss contributes
// nothing: the app must speak TLS itself, and sockmesh then passes it
// through (GEP-1911: wss needs a BackendTLSPolicy to be originated).
func portProtocol(appProtocol string, withTLS bool) snapshot.Protocol {
	switch appProtocol {
	case appProtocolH2C:
		if withTLS {
			return snapshot.ProtocolHTTP2
		}
		return snapshot.ProtocolH2C
	case appProtocolWS:
		if withTLS {
			return snapshot.ProtocolWSS
		}
		return snapshot.ProtocolWS
	case appProtocolWSS:
		if withTLS {
			return snapshot.ProtocolWSS
		}
	}
	return snapshot.ProtocolAuto
}

// failurePolicy: a port whose backend needs TLS, or whose properties
// cannot be honoured, is FailClosed — bypassing the proxy would send
// plaintext. Elsewhere either is safe, and the Service's
// AnnotationFailurePolicy chooses; it defaults to FailOpen (the app still
// reaches its Service, only without the proxy's help). Its value is
// matched without regard to case, and a value it cannot read (a typo such
// as "FailClose") is FailClosed: its owner asked for something, and
// opening the port on a misspelling would be the unsafe reading.
func failurePolicy(svc *corev1.Service, b *snapshot.Backend) snapshot.FailurePolicy {
	if b.TLS != nil || b.Invalid != nil {
		return snapshot.FailClosed
	}
	v, set := svc.Annotations[AnnotationFailurePolicy]
	if !set || strings.EqualFold(v, string(snapshot.FailOpen)) {
		return snapshot.FailOpen
	}
	return snapshot.FailClosed
}

// clusterIPs returns a Service's virtual addresses (both families when
// dual-stack), or nil for headless and ExternalName Services.
func clusterIPs(svc *corev1.Service) []netip.Addr {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.IsValid() || a.Unmap().IsUnspecified() || slices.Contains(out, a.Unmap()) {
			continue // "None" (headless) and garbage alike
		}
		out = append(out, a.Unmap())
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func isTCP(sp corev1.ServicePort) bool {
	return sp.Protocol == "" || sp.Protocol == corev1.ProtocolTCP
}

func validPort(p int32) bool { return p > 0 && p <= 65535 }

// hinted is an endpoint with the topology hints of its EndpointSlice entry.
type hinted struct {
	snapshot.Endpoint
	forZones, forNodes []string
}

// slicePortFunc says at which port a slice's endpoints are dialled, or
// that they are not (false).
type slicePortFunc func(*discoveryv1.EndpointSlice) (uint16, bool)

// hintedEndpoints lists the endpoints of a Service from its EndpointSlices,
// each slice's at the port portOf gives: both address families,
// deduplicated.
func (t *translator) hintedEndpoints(namespace, service string, portOf slicePortFunc) []hinted {
	seen := map[netip.AddrPort]bool{}
	var out []hinted
	for _, es := range t.slices[types.NamespacedName{Namespace: namespace, Name: service}] {
		if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
			continue // FQDN slices are not dialled
		}
		port, ok := portOf(es)
		if !ok {
			continue
		}
		for _, ep := range es.Endpoints {
			// An endpoint is its first address: the API gives further ones
			// no meaning, and kube-proxy never looks at them.
			if len(ep.Addresses) == 0 {
				continue
			}
			a, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil {
				continue
			}
			ap := netip.AddrPortFrom(a.Unmap(), port)
			if seen[ap] {
				continue
			}
			seen[ap] = true
			h := hinted{Endpoint: endpoint(ap, ep, es.Namespace)}
			if ep.Hints != nil {
				for _, z := range ep.Hints.ForZones {
					h.forZones = append(h.forZones, z.Name)
				}
				for _, n := range ep.Hints.ForNodes {
					h.forNodes = append(h.forNodes, n.Name)
				}
			}
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(a, b hinted) int { return a.Addr.Compare(b.Addr) })
	return out
}

// serviceEndpoints lists the endpoints of a Service port that this node's
// proxy may use, as kube-proxy chooses them on this node, since the proxy
// takes its place for the port (pkg/proxy/topology.go): with
// internalTrafficPolicy Local, those on this node only (none: the app's
// connections fail, as without sockmesh); otherwise, when every ready
// endpoint carries topology hints (trafficDistribution, or the
// topology-mode annotation) and one is hinted for this node
// (PreferSameNode) or else for its zone, the ready ones so hinted, and the
// other ready ones as a Fallback, those of this node's zone first:
// kube-proxy cannot know that this node's or zone's endpoints stopped
// taking connections, the proxy can (its ejections), and then sends them
// to the others rather than answer 503.
// Endpoints not ready stay either way: the proxy falls back to those still
// serving while terminating when none is ready (balance.New). A node whose
// name the agent does not know (a manifest file's) takes every endpoint.
func (t *translator) serviceEndpoints(svc *corev1.Service, sp corev1.ServicePort) []snapshot.Endpoint {
	// The slice port with the Service port's name: its number is the
	// resolved targetPort.
	eps := t.hintedEndpoints(svc.Namespace, svc.Name, func(es *discoveryv1.EndpointSlice) (uint16, bool) {
		return slicePort(es, sp.Name, corev1.ProtocolTCP)
	})
	node := t.in.Node
	local := node.Name != "" && svc.Spec.InternalTrafficPolicy != nil &&
		*svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	var hints func(hinted) []string
	var mine string
	if node.Name != "" && !local {
		hints, mine = topologyHints(eps, node)
	}
	out := make([]snapshot.Endpoint, 0, len(eps))
	for _, h := range eps {
		if local && h.NodeName != node.Name {
			continue
		}
		if hints != nil && h.Ready && !slices.Contains(hints(h), mine) {
			// This zone's first, as Istio's locality failover: nearer,
			// and no cross-zone traffic to pay for.
			h.Fallback = snapshot.FallbackFar
			if node.Zone != "" && h.Zone == node.Zone {
				h.Fallback = snapshot.FallbackZone
			}
		}
		out = append(out, h.Endpoint)
	}
	return out
}

// topologyHints chooses the hints that decide for this node, as kube-proxy
// does: node hints when every ready endpoint has one and one names this
// node, else zone hints when every ready endpoint has one and one names
// this node's zone; nil when neither. mine is what the hints must name.
func topologyHints(eps []hinted, node Node) (hints func(hinted) []string, mine string) {
	byNode := func(h hinted) []string { return h.forNodes }
	byZone := func(h hinted) []string { return h.forZones }
	for _, c := range []struct {
		hints func(hinted) []string
		mine  string
	}{{byNode, node.Name}, {byZone, node.Zone}} {
		all, found := true, false
		for _, h := range eps {
			if !h.Ready {
				continue
			}
			hs := c.hints(h)
			all = all && len(hs) > 0
			found = found || c.mine != "" && slices.Contains(hs, c.mine)
		}
		if all && found {
			return c.hints, c.mine
		}
	}
	return nil, ""
}

func slicePort(es *discoveryv1.EndpointSlice, name string, proto corev1.Protocol) (uint16, bool) {
	for _, p := range es.Ports {
		pp := corev1.ProtocolTCP
		if p.Protocol != nil && *p.Protocol != "" {
			pp = *p.Protocol
		}
		if deref(p.Name) != name || pp != proto || p.Port == nil || !validPort(*p.Port) {
			continue
		}
		return uint16(*p.Port), true
	}
	return 0, false
}

// endpoint converts one EndpointSlice endpoint. Conditions follow the
// EndpointSlice API: nil ready and serving mean true, nil terminating false.
func endpoint(ap netip.AddrPort, ep discoveryv1.Endpoint, namespace string) snapshot.Endpoint {
	e := snapshot.Endpoint{
		Addr:        ap,
		Ready:       ep.Conditions.Ready == nil || *ep.Conditions.Ready,
		Serving:     ep.Conditions.Serving == nil || *ep.Conditions.Serving,
		Terminating: ep.Conditions.Terminating != nil && *ep.Conditions.Terminating,
		Zone:        deref(ep.Zone),
		NodeName:    deref(ep.NodeName),
	}
	if r := ep.TargetRef; r != nil && r.Kind == "Pod" && r.Name != "" {
		ns := cmp.Or(r.Namespace, namespace)
		e.Pod = &snapshot.ObjectRef{Kind: "Pod", Namespace: ns, Name: r.Name}
	}
	return e
}
