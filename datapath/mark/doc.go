// Package mark holds the SO_MARK that the node proxy puts on its own sockets,
// and a Dialer.Control that sets it.
//
// The datapath's connect hooks never redirect a socket carrying this mark in
// the agent's network namespace, which the proxy dials its endpoints from, so
// the proxy's connections cannot loop back into the proxy when that netns is
// enrolled (hostNetwork capture). In any other netns the mark is no proof:
// since Linux 5.17 CAP_NET_RAW, which container runtimes grant pods by
// default, is enough to set it, and a pod's socket wearing it is captured
// like any other. A hostNetwork pod shares the agent's netns: one that may
// set marks (CAP_NET_RAW or CAP_NET_ADMIN) can pass its connections
// through, past its proxy. The value is a contract between datapath (which
// configures the eBPF programs with it) and userspace-proxy (which marks its
// upstream sockets): both import this package, which imports nothing of
// either.
//
// It must not grow anything else: no socket options besides the mark, no
// knowledge of the proxy's dialing.
package mark
