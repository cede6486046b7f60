// Package crdschema admits Gateway API objects as a Kubernetes API server
// with the v1.7.0 experimental CRDs installed would on create: it applies
// the CRDs' defaults, then checks the OpenAPI schema, the list types
// (x-kubernetes-list-type set and map) and the CEL rules
// (x-kubernetes-validations), with the API server's own code
// (k8s.io/apiextensions-apiserver) and cost budget.
//
// The CRDs are embedded copies (crds/) of upstream's files from the module
// go.mod requires, the same files daemonset/crds installs and the tests'
// API server serves. go generate (update-crds.sh) refreshes them;
// TestEmbeddedCRDsAreFresh fails when they differ from the module's.
//
// It checks an object's body only: metadata (name, labels, annotations) is
// its caller's, as the API server validates it apart from the CRD. It does
// no I/O.
package crdschema

//go:generate sh update-crds.sh
