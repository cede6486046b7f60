// Package sandbox gives privileged tests throwaway kernel objects — network
// namespaces, veth pairs, cgroup v2 directories, bpffs mounts, child
// processes — and removes every one of them when the test ends, also when it
// fails half-way.
//
// Use it from any test that needs root (datapath, proxy end-to-end, e2e
// harness):
//
//	func TestX(t *testing.T) {
//		node := sandbox.NewNetNS(t)            // stands in for the node's root netns
//		pod := sandbox.NewNetNS(t)             // a "pod"
//		sandbox.NewVeth(t, node, pod,
//			[]netip.Prefix{netip.MustParsePrefix("10.200.0.1/24")},
//			[]netip.Prefix{netip.MustParsePrefix("10.200.0.2/24")})
//		pod.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParseAddr("10.200.0.1"))
//		cg := sandbox.NewCgroup(t)             // attach eBPF programs here, not at the real root
//		cg.Enter(t)                            // the test process joins it until the test ends
//		bpffs := sandbox.TempBPFFS(t)          // pins go here, not to /sys/fs/bpf
//		err := pod.Do(func() error { ...dial... }) // runs on a thread inside pod
//		c, err := pod.Dial(nil, "tcp", "10.96.0.10:80")  // the socket lives in pod
//		ln, err := node.Listen(ctx, nil, "tcp", "10.200.0.1:8080")
//		errc := pod.Go(func() error { ... })        // the same, in the background
//		p := sandbox.Start(t, exec.Command("iptables", ...), node, nil) // a child in node
//	}
//
// Rules it keeps, so that tests of several engineers can run side by side on
// one machine:
//   - Every object is named smt-<pid>-<n> (Name), unique on the machine while
//     the process lives; a leftover tells which process made it.
//   - Each constructor calls t.Helper(), checks for root (a skip that
//     becomes a failure in CI, as testenv.RequireRoot), and registers its
//     cleanup before the next step, so a failure half-way still removes what
//     was made.
//   - Objects are ready when returned: a NetNS has its loopback up and skips
//     IPv6 duplicate address detection; NewVeth waits until both ends are
//     operationally up (otherwise the first IPv6 connection stalls a second).
//   - No thread is ever left in a foreign netns: NetNS.Do runs on a fresh
//     goroutine locked to its OS thread and, if it cannot return the thread to
//     its namespace, keeps it locked so the Go runtime destroys it.
//   - Tests never touch the host's own network namespace or cgroups: make a
//     NetNS for the "node" and a Cgroup to attach to.
//   - Processes are ended by their PID only (Process), never by name.
//   - Fixed addresses are claimed (ClaimAddrs): a second run of a test that
//     gives pods the same addresses, from another checkout, waits for the
//     first to end, since an agent enrols no pod whose address two
//     namespaces hold.
//
// Cleanups cannot run when the test binary itself dies (a panic in a
// goroutine, SIGKILL, the go test timeout). What it made then stays: the
// pid in smt-<pid>-<n> names the dead process, so `ip netns del`, rmdir of
// the cgroup and umount of the bpffs directory can be done by hand.
//
// Functions take a TB: *testing.T and *testing.B satisfy it, and a program
// that is not a test (test/bench) can pass its own runner.
//
// Cgroup v2 membership is per process, not per thread (outside threaded
// subtrees), so running code "inside a cgroup" means either moving the whole
// test process (Cgroup.Enter) or starting a child process in it (Start, with
// Main and HelperCommand to re-execute the test binary as that child).
//
// This package is for tests only; product code must not import it.
package sandbox
