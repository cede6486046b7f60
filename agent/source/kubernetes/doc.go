// Package kubernetes is the config source that watches a Kubernetes API
// server with client-go informers and hands translate the objects it lists:
// Services, EndpointSlices, Namespaces, the Pods and the Node of this node,
// ClusterTrustBundles, ServiceCIDRs (Input.Node.ServiceCIDRs: the ranges
// external hostnames may not resolve into), and the Gateway API kinds sockmesh implements
// (BackendTLSPolicy, HTTPRoute, GRPCRoute, ReferenceGrant, XBackend,
// XBackendTrafficPolicy, XMesh). It implements agent/source.Source.
//
// ConfigMaps and Secrets are not cached cluster-wide: a cluster's Secrets
// are large (Helm keeps whole releases in them) and none of the agent's
// business. The source watches exactly the ConfigMaps and Secrets that
// BackendTLSPolicies and XBackends reference, one single-object watch
// (field selector metadata.name) per reference, started when a reference
// appears and stopped when it goes. That is how the kubelet watches the
// ConfigMaps and Secrets its pods mount, so the API server is built for the
// pattern; it costs one LIST and one WATCH stream per referenced object.
//
// Which optional kinds the cluster serves (the Gateway API CRDs, of either
// channel, ClusterTrustBundles and ServiceCIDRs) is asked at start and again every
// Config.DiscoveryInterval, as GEP-5075 asks of ClusterTrustBundles: a kind
// that becomes served (a CRD installed, a channel upgraded) is watched and
// its objects reach Input once listed; a kind that two answers in a row
// find not served (its CRD deleted, its version no longer served) stops
// being watched and its objects leave Input, as the cluster says they are
// gone. Either is logged; sockmesh_source_kind_watched says which kinds
// are watched now, and Kinds also why the others are not (not served, or
// forbidden to the agent), for sockmeshctl status. Asking costs one discovery request per group
// version per interval; watching the CRDs instead would take RBAC on them.
//
// It only lists, watches and signals. It must not translate, write to the
// API server or mutate an object it hands out.
package kubernetes
