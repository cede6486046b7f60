// Package apiserver runs a real etcd and kube-apiserver for tests, benchmarks
// and the end-to-end harness, with the Gateway API experimental CRDs
// installed and Established.
//
// The binaries are the ones test/cluster/build-binaries.sh builds into the
// cache (SOCKMESH_CACHE, default /var/cache/sockmesh) for the versions in
// test/cluster/versions.env. When they are missing, Start skips the test on a
// developer's machine and fails it in CI (internal/testenv), which builds them
// first.
//
// KubeconfigVia relays a listener the caller opened (in a test's node
// network namespace) to the API server, for agents that run there.
//
// Everything an Env creates lives in a temporary directory on loopback ports;
// its processes are ended by PID, never by name. It must not touch the host:
// no addresses, routes, mounts or system services.
package apiserver
