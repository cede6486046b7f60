// Package manifests decodes Kubernetes YAML or JSON manifests (many
// documents per stream, "---"-separated, each of at most MaxDocumentBytes,
// v1 List objects expanded, Lists nested up to 8 deep) into the typed
// objects translate.Input holds: core Services, EndpointSlices,
// Namespaces, Pods, ConfigMaps, Secrets, ClusterTrustBundles, and Gateway
// API v1.7.0 BackendTLSPolicies, HTTPRoutes, GRPCRoutes, ReferenceGrants,
// XBackends, XBackendTrafficPolicies and XMeshes. The older versions the
// CRDs serve with v1's schema (BackendTLSPolicy v1alpha3, HTTPRoute and
// ReferenceGrant v1beta1) are returned as v1, as the API server stores
// them; another version is an error naming those served.
// DecodeWithWarnings also returns the API server's warning for each object
// of a version its CRD deprecates (BackendTLSPolicy v1alpha3).
//
// Decoding is strict, because nothing else checks these files: an unknown
// field (a typo), an unknown or unsupported kind, or a malformed document
// is an error naming the document. Each object is then admitted as an API
// server with the v1.7.0 experimental Gateway API CRDs would admit it on
// create (package crdschema): a Gateway API object loses its status and
// gets its CRD's defaults, and is checked against the CRD's schema, list
// types and CEL rules (with the API server's cost budget); every object's
// metadata is checked with the API server's rules (names, labels,
// annotations; a generateName is refused, as kubectl apply refuses it).
// What they refuse is an error naming the document, the
// object and each field, as kubectl apply names them: "document 2:
// HTTPRoute shop/r: spec.hostnames: Too many: 17: must have at most 16
// items". Of core kinds' other fields, those translate reads are checked
// with the API server's rules, restated (k8s.io/kubernetes is no library):
// a Service's clusterIPs and ports (number, targetPort, protocol), an
// EndpointSlice's addressType, addresses and port protocols, a
// ClusterTrustBundle's trustBundle, a kubernetes.io/tls Secret's keys; the
// rest (a Pod's spec) meet none. Core objects keep their status (a Pod's
// podIPs place it, as the kubelet's would). Two more things
// kubectl apply would do are done: a namespaced object without a namespace
// is in "default", and a Secret's stringData is merged into data.
//
// NewUncheckedDecoder skips admission, for tests of what translate makes
// of objects a cluster with other CRDs (another version or channel) could
// serve.
//
// It reads only what it is given: no files, no network.
package manifests
