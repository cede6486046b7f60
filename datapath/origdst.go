package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// OrigDst returns the original destination the datapath recorded for c, a
// connection a proxy listener accepted: what getsockopt(SO_ORIGINAL_DST)
// answers where sm_getsockopt runs for c's cgroup (the cgroup its listener
// was made in). It reads the record itself, so it also answers where none
// of our programs runs for that cgroup: a proxy outside Config.Cgroup (a
// --cgroup that holds the pods but not the agent), or a connection an
// older agent's listener accepted on a cgroup this agent's Config.Cgroup
// leaves out, handed to this agent's listener as it closed (takeover) once
// the older agent has exited. An error wraps ebpf.ErrKeyNotExist when
// nothing is recorded.
func (d *Datapath) OrigDst(c syscall.Conn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("read the recorded original destination: %w", err)
	}
	var (
		o         sockmeshSmOrigDst
		lookupErr error
	)
	if err := rc.Control(func(fd uintptr) { o, lookupErr = d.origDst(int(fd)) }); err != nil {
		return netip.AddrPort{}, fmt.Errorf("read the recorded original destination: %w", err)
	}
	if lookupErr != nil {
		return netip.AddrPort{}, fmt.Errorf("read the recorded original destination: %w", lookupErr)
	}
	return netip.AddrPortFrom(wordsAddr(o.Addr), ntohs(o.Port)), nil
}

// origDst reads the original destination in the accepted socket fd's
// storage, or else takes the one its connection handed off, as sm_on_passive
// does when sockops runs for the socket's cgroup.
func (d *Datapath) origDst(fd int) (sockmeshSmOrigDst, error) {
	var o sockmeshSmOrigDst
	// sm_proxy_sk is socket storage: from user space its key is a
	// descriptor of the socket.
	err := d.objs.SmProxySk.Lookup(uint32(fd), &o)
	if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return o, err
	}
	k, err := passiveKey(fd)
	if err != nil {
		return o, err
	}
	if err := d.objs.SmHandoff.Lookup(&k, &o); err != nil {
		return o, err
	}
	// Kept in the socket's storage, the answer stays the socket's; deleted
	// from sm_handoff, a later connection on the same addresses cannot
	// inherit it.
	return o, errors.Join(d.objs.SmProxySk.Put(uint32(fd), &o), d.objs.SmHandoff.Delete(&k))
}

// passiveKey is the sm_handoff key of the accepted socket fd, as
// sm_passive_key builds it.
func passiveKey(fd int) (sockmeshSmHandoffKey, error) {
	var k sockmeshSmHandoffKey
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return k, fmt.Errorf("read the netns cookie: %w", err)
	}
	local, err := unix.Getsockname(fd)
	if err != nil {
		return k, fmt.Errorf("getsockname: %w", err)
	}
	peer, err := unix.Getpeername(fd)
	if err != nil {
		return k, fmt.Errorf("getpeername: %w", err)
	}
	proxy, client := sockaddrAddrPort(local), sockaddrAddrPort(peer)
	k.NetnsCookie = cookie
	k.ProxyAddr, k.ProxyPort = addrWords(proxy.Addr()), proxy.Port()
	k.ClientAddr, k.ClientPort = addrWords(client.Addr()), client.Port()
	return k, nil
}

func sockaddrAddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	return netip.AddrPort{}
}
