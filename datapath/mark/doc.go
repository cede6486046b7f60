// Package mark holds the SO_MARK that the node proxy puts on its own sockets,
// and a Dialer.Control that sets it.
//
// The datapath's connect hooks never redirect a socket carrying this mark, so
// the proxy's connections to endpoints cannot loop back into the proxy even
// when its netns is enrolled (hostNetwork capture). The value is a contract
// between datapath (which configures the eBPF programs with it) and
// userspace-proxy (which marks its upstream sockets): both import this
// package, which imports nothing of either.
//
// It must not grow anything else: no socket options besides the mark, no
// knowledge of the proxy's dialing.
package mark
