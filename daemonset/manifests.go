package daemonset

import "embed"

// Manifests are the files of kustomization.yaml, the kustomization itself
// included, at the root of the FS.
//
//go:embed kustomization.yaml namespace.yaml serviceaccount.yaml rbac.yaml daemonset.yaml
var Manifests embed.FS

// IntrospectionTCP holds the opt-in component introspection-tcp/ (its
// kustomization.yaml, the DaemonSet patch that turns TCP introspection on,
// the operators' RBAC) and the examples operators.example.yaml (their
// binding) and cert-manager.example.yaml (the agents' certificate), under
// the directory introspection-tcp.
//
//go:embed introspection-tcp/*.yaml
var IntrospectionTCP embed.FS
