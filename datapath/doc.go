// Package datapath loads, attaches and drives sockmesh's eBPF programs
// (../bpf/sockmesh.c): connections from enrolled pods to captured Service
// addresses are rewritten in connect() to the pod's proxy address, and the
// proxy reads the original destination with getsockopt(SO_ORIGINAL_DST)
// exactly as it would behind iptables (see userspace-proxy/origdst).
//
// The agent drives it:
//
//	dp, err := datapath.Open(datapath.Config{}, log, reg) // load, or adopt pinned state
//	defer dp.Close()                                      // capture keeps working
//	err = dp.Apply(snap)                                  // services map := snap.Frontends, each Service whole or not at all
//	err = dp.SetEnrolments(want)                          // netns cookie -> datapath.Proxy, per pod (see podns)
//	err = dp.Heartbeat()                                  // the proxy is alive
//	dst, err := dp.OrigDst(conn)                          // a proxy connection's original destination, from its record
//	n, err := dp.Counters()                               // per-decision counts
//	n, err = dp.PairCounter(cookie, addr)                 // the same, for one pod and Service address
//	st, err := dp.State()                                 // hooks, program and link IDs, pins
//	err = dp.Uninstall()                                  // remove every pin, link, map
//
// State: programs, links and maps are pinned under <Config.BPFFS>/sockmesh.
// Open adopts what it finds there: maps are reused (keeping enrolments,
// services and the original destinations of live connections) and the pinned
// links get the freshly loaded programs through an atomic bpf_link update, so
// an agent restart or upgrade never leaves a moment without capture and never
// attaches twice. The last process to Open owns the maps: an older one still
// running (a rolling update's overlap) stops writing them, and takes them
// back if the newer one exits first (owner.go). Close releases this
// process's descriptors only.
//
// Hooks: cgroup/connect4, connect6, getpeername4, getpeername6, getsockopt
// and sockops, attached with bpf_link (always BPF_F_ALLOW_MULTI for cgroup
// links) at Config.Cgroup, by default the root of the cgroup v2 hierarchy.
// So getsockopt runs for every getsockopt(2) of every process below it, not
// only the proxy's (measured here +0.3-0.5 µs a call; docs/design.md says
// why it stays).
// Open logs, and Conflicts reports, other programs on the same hooks: one
// that runs first may rewrite a Service address before we see it. Those
// attached at Config.Cgroup and its ancestors run for every process below
// it, before or after ours; those attached in a cgroup below it (a pod's,
// say) run before ours for the processes there, and are listed at that
// cgroup. The kernel answers per cgroup, so Conflicts walks every cgroup
// below Config.Cgroup (with the default root, the node's), up to 10,000
// of them at about 25 µs each, skipping those removed meanwhile.
//
// Needs Linux 5.15 (bpf_get_netns_cookie in sockops; cgroup bpf_link 5.7,
// getpeername hooks 5.8, socket storage in sockops 5.10), cgroup v2, and
// CAP_BPF and CAP_NET_ADMIN (load, pin and attach the networking program
// types) and CAP_SYS_ADMIN (the older agent's maps and programs by ID;
// PERFMON's bpf_skc_to_* helpers, without which the verifier refuses the
// programs; setns and mounting bpffs); daemonset.yaml says what each is
// for, and TestAgentRunsWithItsCapabilities runs the agent with exactly
// those it lists.
//
// Optional acceleration (Config.Accelerate, the agent's --accelerate):
// sockops puts both sockets of each redirected connection into a sockhash,
// and an sk_msg program hands each message to the other socket's receive
// queue, skipping two TCP stacks on the app-to-proxy leg. It needs Linux
// 6.10 (the sk_msg link; the program also reads sk_psock.msg_tot_len, 6.8),
// so that program loads only with acceleration, and Open on an older kernel
// returns a *KernelTooOldError. Sockets so accelerated must never be spliced (Go's
// io.Copy between TCP connections does, and hangs), and that queue has no
// window: see sm_msg in ../bpf/sockmesh.c for how a socket falls back to
// TCP (its first message came before its peer joined, 256 KiB went
// unanswered or lie unread in its own queue, the peer left) without
// reordering bytes.
//
// This package must not import Kubernetes code or decide which pods to
// enrol; it takes netns cookies and Snapshot frontends. It must not open
// proxy listeners (podns does, for in-pod mode).
package datapath
