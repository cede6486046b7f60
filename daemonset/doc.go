// Package daemonset holds sockmesh's Kubernetes manifests — the Namespace,
// ServiceAccount, least-privilege RBAC and the agent DaemonSet, tied
// together by kustomization.yaml (`kubectl apply --server-side -k
// daemonset/`) — and embeds them for the tests and tools that read them.
// introspection-tcp/ is an opt-in kustomize component that serves the
// agents' introspection API over TCP, for `sockmeshctl status --all-nodes`,
// with the RBAC of the operators who run it. cni/ is an opt-in component
// with which the agent chains the CNI plugin sockmesh-cni into the node's
// network configuration, to capture pods from their first connection.
// crds/ references the upstream Gateway API v1.7.0 experimental CRDs;
// image/ and imagebuild/ build the node image without Docker or a registry.
//
// The YAML files are the product; the package adds no logic of its own and
// must not import the agent: the manifests describe how the agent runs, not
// what it does.
package daemonset
