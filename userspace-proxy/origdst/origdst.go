package origdst

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST from
// <linux/netfilter_ipv6/ip6_tables.h>; golang.org/x/sys/unix lacks it. It has
// the same value as SO_ORIGINAL_DST but lives at level SOL_IPV6.
const ip6tSOOriginalDst = 80

// Get returns the original destination of c, the address the client passed
// to connect() before a redirect sent it to this listener. See the package
// documentation for the errors it returns.
func Get(c *net.TCPConn) (netip.AddrPort, error) {
	local, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("get original destination: local address %v is not TCP", c.LocalAddr())
	}
	localAP := local.AddrPort()
	localAP = netip.AddrPortFrom(localAP.Addr().Unmap(), localAP.Port())

	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("get original destination: %w", err)
	}
	var (
		dst    netip.AddrPort
		sysErr error
	)
	ctlErr := rc.Control(func(fd uintptr) {
		if localAP.Addr().Is4() {
			dst, sysErr = getV4(fd)
		} else {
			dst, sysErr = getV6(fd)
		}
	})
	if ctlErr != nil {
		return netip.AddrPort{}, fmt.Errorf("get original destination: %w", ctlErr)
	}
	switch {
	case errors.Is(sysErr, unix.ENOENT), errors.Is(sysErr, unix.ENOPROTOOPT):
		return netip.AddrPort{}, fmt.Errorf("get original destination of %s: %w (%w)", localAP, ErrNotRedirected, sysErr)
	case sysErr != nil:
		return netip.AddrPort{}, fmt.Errorf("get original destination of %s: %w", localAP, sysErr)
	case dst == localAP:
		// conntrack answers for every tracked connection, NATed or not; an
		// original destination equal to our own address means no redirect.
		return netip.AddrPort{}, fmt.Errorf("get original destination of %s: %w (client dialled the listener)", localAP, ErrNotRedirected)
	}
	return dst, nil
}

// getV4 reads a struct sockaddr_in: family (host order), port (network
// order), address.
func getV4(fd uintptr) (netip.AddrPort, error) {
	var sa [unix.SizeofSockaddrInet4]byte
	if err := getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, sa[:]); err != nil {
		return netip.AddrPort{}, err
	}
	if fam := binary.NativeEndian.Uint16(sa[0:2]); fam != unix.AF_INET {
		return netip.AddrPort{}, fmt.Errorf("unexpected address family %d", fam)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), binary.BigEndian.Uint16(sa[2:4])), nil
}

// getV6 reads a struct sockaddr_in6: family, port, flowinfo, address,
// scope id.
func getV6(fd uintptr) (netip.AddrPort, error) {
	var sa [unix.SizeofSockaddrInet6]byte
	if err := getsockopt(fd, unix.SOL_IPV6, ip6tSOOriginalDst, sa[:]); err != nil {
		return netip.AddrPort{}, err
	}
	if fam := binary.NativeEndian.Uint16(sa[0:2]); fam != unix.AF_INET6 {
		return netip.AddrPort{}, fmt.Errorf("unexpected address family %d", fam)
	}
	return netip.AddrPortFrom(netip.AddrFrom16([16]byte(sa[8:24])).Unmap(), binary.BigEndian.Uint16(sa[2:4])), nil
}

// getsockopt fills buf exactly: x/sys/unix has no byte-slice getsockopt, and
// its fixed-size struct getters would pass the kernel a wrong length. The
// call never blocks, so it is raw: a tracked one would wake the runtime's
// sysmon on every accepted connection (see userspace-proxy/sockio).
func getsockopt(fd uintptr, level, opt int, buf []byte) error {
	n := uint32(len(buf))
	_, _, errno := unix.RawSyscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return errno
	}
	if int(n) < len(buf) {
		return fmt.Errorf("short answer: %d of %d bytes", n, len(buf))
	}
	return nil
}
