// Package node brings up a real single-node Kubernetes cluster on this
// machine for the cluster tier of the end-to-end tests, and takes it down
// again leaving the machine as it found it.
//
// Up starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// containerd (private root, state and socket; runc; the CNI bridge plugin
// with host-local IPAM, in CNI conf and bin directories of the node's own
// that a test may chain a plugin into), kube-proxy (iptables mode) and the kubelet, all as
// children of the calling process, and returns once the Node is Ready and
// Pods can be created. Components are the ones test/cluster/build-binaries.sh
// builds (found with test/apiserver.FindBinaries) and the Debian packages
// containerd, runc, containernetworking-plugins, conntrack and iptables.
// ../../shared/k8s/README.md (in the project's shared notes) lists the facts
// of this machine kind the configuration answers to: cgroup v1 with cgroupfs,
// no CAP_SYS_RESOURCE (restrict_oom_score_adj), no registry (a locally built
// pause image, images imported before the kubelet starts), a node IP on lo.
//
// The host changes a node needs — an address on lo, ip_forward, a shared
// bpffs at /sys/fs/bpf, a bridge, iptables chains, sysctls the kubelet sets,
// directories some components hard-code — are written to a ledger
// (Dir/state.json) before each is made. Down undoes exactly what the ledger
// holds, and processes are ended by PID (checked against their start time),
// never by name. A run that crashed leaves its ledger behind; the next Up (or
// `sockmesh-node down`) finds it and undoes that run first, so bring-up is
// idempotent. A lock file (LockPath) keeps two nodes from running at once on
// the machine; the second waits.
//
// It is test infrastructure: it needs root, it owns the host's network
// configuration while a node runs, and product code must not import it.
package node
