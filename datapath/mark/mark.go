package mark

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Proxy is the default SO_MARK of the proxy's sockets. The connect hooks
// compare the entire 32-bit mark with the configured value (datapath
// Config.ProxyMark, zero meaning Proxy), so no other software's partial bits
// can make an application socket look like ours.
//
// Why this value: every mark bit is claimed by someone (the fwmark registry,
// github.com/fwmark/registry, lists them). Kubernetes matches bits 14-15
// (0x4000 masquerade, 0x8000 drop), CNI portmap bit 13, Cilium bits 0-12
// (its magic values in 0x0F00 steer packets to its proxy routing table; it
// reads the high half only as a payload next to a magic value), Tailscale
// bits 16-23 (0x80000 bypasses its routing table), Weave bits 17-18, Istio
// and ztunnel the whole values 0x539 and 0x1337. Our low half is therefore
// zero, so no kube-proxy masquerade or drop, Cilium or Tailscale rule fires
// on the proxy's packets; the set bits (25, 27, 28, 30) sit in the top byte,
// above Tailscale's byte and above the accept/pass/scratch bits Calico takes
// first from its 0xffff0000 pool. A Calico install that hands out endpoint
// marks from the top of its pool could still collide; override the mark on
// such nodes (both the datapath and the proxy must use the same value).
const Proxy uint32 = 0x5a000000

// Control sets Proxy on a socket before it connects or listens. Its signature
// fits net.Dialer.Control and net.ListenConfig.Control. Setting SO_MARK needs
// CAP_NET_ADMIN, or CAP_NET_RAW since Linux 5.17.
func Control(network, address string, c syscall.RawConn) error {
	return ControlWith(Proxy)(network, address, c)
}

// ControlWith returns a Control func that sets mark m, for nodes that
// override Proxy.
func ControlWith(m uint32) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var sockErr error
		if err := c.Control(func(fd uintptr) {
			sockErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(m))
		}); err != nil {
			return fmt.Errorf("set mark %#x on %s socket for %s: %w", m, network, address, err)
		}
		if sockErr != nil {
			return fmt.Errorf("set mark %#x on %s socket for %s: %w", m, network, address, sockErr)
		}
		return nil
	}
}
