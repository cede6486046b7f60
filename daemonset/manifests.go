package daemonset

import "embed"

// Manifests are the files of kustomization.yaml, the kustomization itself
// included, at the root of the FS.
//
//go:embed kustomization.yaml namespace.yaml serviceaccount.yaml rbac.yaml daemonset.yaml
var Manifests embed.FS
