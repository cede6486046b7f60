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
// is an error naming the document. So is a BackendTLSPolicy or
// XBackendTrafficPolicy without targetRefs, which the CRDs refuse (minItems
// 1): other values the CRDs refuse translate reports Invalid in the
// policy's status, but with no target the policy has no status entry. Defaults an API server would apply are
// not applied (translate copes with undefaulted objects), with two
// exceptions that make files behave as kubectl apply would: a namespaced
// object without a namespace is in "default", and a Secret's stringData is
// merged into data.
//
// It reads only what it is given: no files, no network.
package manifests
