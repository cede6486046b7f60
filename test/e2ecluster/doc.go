// Package e2ecluster is the cluster tier of sockmesh's end-to-end tests
// (`make e2e-cluster`, also part of `go test ./...` and CI): a real single
// node — kube-apiserver, controller-manager, scheduler, kubelet,
// kube-proxy, containerd, runc, the CNI bridge (test/cluster/node) — with
// the images built here from this module, the Gateway API CRDs and the
// DaemonSet of daemonset/ installed as a user would install them.
//
// TestMain builds the images (the agent from cmd/sockmesh with sockmesh-cni
// beside it, the echo backend from cmd/sockmesh-echo, the app client from
// ./appclient), brings the node up once for all tests and takes it down
// after them, leaving the machine as it was. The tests need root and the
// Kubernetes binaries of test/cluster/build-binaries.sh: without them they
// skip, except in CI (internal/testenv), where they fail. -short skips
// them.
//
// It holds tests only; nothing may import it.
package e2ecluster
