package translate

import (
	"net/netip"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
)

// ControllerName is the controllerName sockmesh writes status under.
const ControllerName gwv1.GatewayController = "sockmesh.io/mesh-controller"

// Input is everything Translate looks at. Sources fill it from listers (the
// kubernetes source) or from manifests (the file source); the objects are
// read-only.
type Input struct {
	// Now stamps lastTransitionTime on new conditions, and is when an
	// XBackend's client certificate, and a certificate of each CA
	// reference, must be valid (Result.ChangesAt says when that judgement
	// changes).
	Now time.Time
	// Node describes this node and the cluster ranges that external
	// hostnames must never resolve into.
	Node Node

	Services            []*corev1.Service
	EndpointSlices      []*discoveryv1.EndpointSlice
	Namespaces          []*corev1.Namespace
	Pods                []*corev1.Pod // the pods scheduled to this node
	ConfigMaps          []*corev1.ConfigMap
	Secrets             []*corev1.Secret
	ClusterTrustBundles []*certificatesv1.ClusterTrustBundle

	BackendTLSPolicies      []*gwv1.BackendTLSPolicy
	HTTPRoutes              []*gwv1.HTTPRoute
	GRPCRoutes              []*gwv1.GRPCRoute
	XBackends               []*gwxv1alpha1.XBackend
	XBackendTrafficPolicies []*gwxv1alpha1.XBackendTrafficPolicy
	XMeshes                 []*gwxv1alpha1.XMesh
	// ReferenceGrants permit mesh routes' cross-namespace backendRefs and
	// XBackends' cross-namespace clientCertificateRefs
	// (gateway.networking.k8s.io v1; v1beta1 is the same schema).
	ReferenceGrants []*gwv1.ReferenceGrant

	// Resolved holds the agent's DNS answers for ExternalHostname XBackends,
	// keyed by hostname. A hostname absent from the map has not been resolved
	// yet; one present with no addresses did not resolve.
	Resolved map[string][]netip.Addr

	// ClusterTrustBundlesUnavailable is true when the cluster does not serve
	// certificates.k8s.io/v1 ClusterTrustBundles. References to them then get
	// ResolvedRefs=False/InvalidKind and the ClusterTrustBundle feature is not
	// advertised (GEP-5075). The zero value (false) suits the file source,
	// where bundles are whatever the manifests hold.
	ClusterTrustBundlesUnavailable bool
}

// Node is what Translate knows about where it runs.
type Node struct {
	Name string
	// Zone is the node's topology.kubernetes.io/zone label: the zone a
	// Service's topology hints must name for this node (serviceEndpoints).
	Zone string
	// IPs are the node's own addresses.
	IPs []netip.Addr
	// PodCIDRs and ServiceCIDRs are the cluster's ranges (the kubernetes
	// source gives this node's podCIDRs and the ServiceCIDR objects').
	PodCIDRs     []netip.Prefix
	ServiceCIDRs []netip.Prefix
	// NodeCIDRs are the ranges of the cluster's nodes (--node-cidr): the
	// agent watches only its own Node, so these are all it knows of the
	// others' addresses.
	NodeCIDRs []netip.Prefix
	// EgressAllow, when not empty, is the list of hostname patterns
	// ("example.com", "*.example.com") ExternalHostname XBackends may use.
	// "*.example.com" matches any name below example.com, not example.com
	// itself.
	EgressAllow []string
	// ClusterDomain is the cluster's DNS domain when it is not
	// cluster.local: ExternalHostname XBackends may not name hosts in it
	// (nor in cluster.local, which the CRD refuses anyway).
	ClusterDomain string
}
