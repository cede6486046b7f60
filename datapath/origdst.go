package datapath

import (
	"fmt"
	"net/netip"
	"syscall"
)

// OrigDst returns the original destination the datapath recorded for c, a
// connection a proxy listener accepted: what getsockopt(SO_ORIGINAL_DST)
// answers where sm_getsockopt runs for c's cgroup (the cgroup its listener
// was made in). It reads the socket's storage itself, so it also answers
// where none of our programs runs for that cgroup any more: a connection
// an older agent's listener accepted on a cgroup this agent's
// Config.Cgroup leaves out, and handed to this agent's listener as it
// closed (takeover), once the older agent has exited. An error wraps
// ebpf.ErrKeyNotExist when nothing is recorded.
func (d *Datapath) OrigDst(c syscall.Conn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("read the recorded original destination: %w", err)
	}
	var (
		o         sockmeshSmOrigDst
		lookupErr error
	)
	// sm_proxy_sk is socket storage: from user space its key is a
	// descriptor of the socket.
	if err := rc.Control(func(fd uintptr) { lookupErr = d.objs.SmProxySk.Lookup(uint32(fd), &o) }); err != nil {
		return netip.AddrPort{}, fmt.Errorf("read the recorded original destination: %w", err)
	}
	if lookupErr != nil {
		return netip.AddrPort{}, fmt.Errorf("read the recorded original destination: %w", lookupErr)
	}
	return netip.AddrPortFrom(wordsAddr(o.Addr), ntohs(o.Port)), nil
}
