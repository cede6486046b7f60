// Package origdst recovers where a redirected TCP connection was meant to go:
// the original destination that an eBPF connect hook (sockmesh's datapath) or
// an iptables REDIRECT/DNAT rule rewrote before the connection reached the
// proxy's listener.
//
// The whole API is one function and one sentinel:
//
//	func Get(c *net.TCPConn) (netip.AddrPort, error)
//	var ErrNotRedirected error
//
// Get asks the kernel with getsockopt(SOL_IP, SO_ORIGINAL_DST) on IPv4
// connections (including IPv4 connections accepted on a dual-stack IPv6
// listener, whose local address is IPv4-mapped) and
// getsockopt(SOL_IPV6, IP6T_SO_ORIGINAL_DST) on IPv6 ones. It runs the call
// through the connection's syscall.RawConn, so the descriptor is never
// duplicated and the connection stays in Go's poller.
//
// The answer has identical semantics whichever mechanism redirected the
// connection:
//   - sockmesh's datapath: a cgroup/getsockopt program on the proxy's cgroup
//     answers SO_ORIGINAL_DST from the accepted socket's storage, which a
//     sockops program filled from the application's socket;
//   - iptables REDIRECT or DNAT: netfilter's conntrack answers.
//
// The returned address is always unmapped (an IPv4 destination is a 4-byte
// netip.Addr, never ::ffff:a.b.c.d).
//
// Get returns an error wrapping ErrNotRedirected when the kernel holds no
// original destination for the connection: the datapath recorded none and
// conntrack has no entry (ENOENT) or is not loaded (ENOPROTOOPT), or
// conntrack's "original" destination is the listener's own address, which
// means the client dialled the proxy directly. Unless the agent finds one
// in the datapath's maps (proxy.Config.OrigDst: for a socket no getsockopt
// program answers for), the proxy closes such a connection
// (not_redirected): a node-IP listener is reachable from other hosts and
// must never relay. Any other error (a closed connection, an
// unexpected errno) is returned wrapped as is.
//
// This package must not decide anything about the destination (whether it
// is captured, which backend it leads to): callers look it up in the
// Snapshot. It must not import the datapath: the kernel is the only channel
// between the two.
package origdst
