// Package manifests decodes Kubernetes YAML or JSON manifests (many
// documents per stream, "---"-separated, v1 List objects expanded, Lists
// nested up to 8 deep) into
// the typed objects translate.Input holds: core Services, EndpointSlices,
// Namespaces, Pods, ConfigMaps, Secrets, ClusterTrustBundles, and Gateway
// API v1.7.0 BackendTLSPolicies, HTTPRoutes, GRPCRoutes, ReferenceGrants
// (v1, and v1beta1 returned as v1: one schema), XBackends,
// XBackendTrafficPolicies and XMeshes.
//
// Decoding is strict, because nothing else checks these files: an unknown
// field (a typo), an unknown or unsupported kind, or a malformed document
// is an error naming the document. Each object is then admitted as an API
// server with the v1.7.0 experimental Gateway API CRDs would admit it on
// create (package crdschema): a Gateway API object gets its CRD's defaults
// and is checked against the CRD's schema, list types and CEL rules; every
// object's metadata is checked with the API server's rules (names, labels,
// annotations). What they refuse is an error naming the document, the
// object and each field, as kubectl apply names them: "document 2:
// HTTPRoute shop/r: spec.hostnames: Too many: 17: must have at most 16
// items". Core kinds' other fields (a Service's ports, a Pod's spec) meet
// no check here: their rules live in k8s.io/kubernetes, which is no
// library, and translate checks what it reads of them. Two more things
// kubectl apply would do are done: a namespaced object without a namespace
// is in "default", and a Secret's stringData is merged into data.
//
// NewUncheckedDecoder skips admission, for tests of what translate makes
// of objects a cluster with other CRDs (another version or channel) could
// serve.
//
// It reads only what it is given: no files, no network.
package manifests
