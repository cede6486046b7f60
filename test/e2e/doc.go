// Package e2e is the fast end-to-end tier (issue 5, tier 1), run by every
// `go test ./...`: a real etcd and kube-apiserver (test/apiserver), "nodes"
// and "pods" made of network namespaces and cgroups on this machine
// (internal/sandbox), the real sockmesh agent binary, built once per run,
// with the kubernetes source in node-IP and in-pod modes, and echo backends
// (test/echo) as processes inside pod namespaces. Every scenario asserts on
// what a backend actually saw (SNI, ALPN, TLS version, client certificate,
// protocol, peer address) and, where the API defines one, on status.
//
// A node is a network namespace standing for the node's root namespace: the
// agent runs in it, in its own cgroup v2 directory (--cgroup) and BPF
// filesystem (--bpffs), and reaches the API server through a relay on its
// loopback. A pod is a network namespace with a veth to its node, a Pod
// object bound to the node whose status.podIPs are the namespace's
// addresses (the agent finds the namespace by IP), and processes born in
// the node's cgroup: a dialer (which connects sockets for the test and
// hands them over, so that every client socket is created in the pod's
// namespace and cgroup) or an echo backend. There is no controller manager:
// the harness writes EndpointSlices itself, and a kube-proxy stand-in
// (iptables DNAT in the node namespace) gives Service addresses a way to
// their endpoints when sockmesh does not capture them, so a connection
// that bypassed the proxy would reach a TLS-only backend in plaintext and
// be counted, not silently vanish.
//
// Addresses: nothing else in this repository uses 10.251.0.0/16 or
// fd00:251::/48. Pods take 10.251.K.2/24 and fd00:251:0:K::2/64 (K < 128;
// their node holds .1 and ::1), node addresses 10.251.128.N and
// fd00:251:0:80::N, DNS servers and external hosts 10.251.K.0/24 with
// 200 <= K < 240, and Services are allocated by the API server from
// 10.251.240.0/20 and fd00:251:0:f0::/112 (a dual-stack range: see
// startAPIServer).
//
// Isolation from the other tests of `go test ./...` and from the cluster
// tier: the host's network namespace, its addresses and routes, the cgroup
// v2 root and /sys/fs/bpf are never touched. Each node attaches to a
// throwaway cgroup below the root and pins to a BPF filesystem of its own,
// so programs another agent attached at the root (the cluster tier's) see
// namespaces they have not enrolled and pass them untouched; every name is
// sandbox's smt-<pid>-<n>. What the tier does use of the host: loopback
// ports (the API server, etcd), the xtables lock, and a lock file
// (tierLock) that makes a second run of this tier on the machine wait,
// since both would use the same addresses.
//
// Everything lives in _test.go files: this package has no API.
package e2e
