// Package childproc runs the components a test brings up — etcd,
// kube-apiserver, containerd, the kubelet — as children of the calling
// process, each writing its output to a log file, and stops them by PID:
// SIGTERM, then SIGKILL after a grace period.
//
// A child dies with the process that started it (Pdeathsig), so a test
// binary killed by its timeout leaves none behind, and runs in a process
// group of its own, so a terminal's ^C does not race an orderly stop.
//
// It is test infrastructure: it must not end a process it did not start,
// nor look processes up by name; product code must not import it.
package childproc
