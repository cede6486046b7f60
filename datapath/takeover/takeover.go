// Package takeover lets a new agent take over the TCP addresses an older one
// listens on (the node proxy's, in-pod listeners, health and metrics) while
// both run, as a DaemonSet rolling update with maxSurge does, with no
// connection refused or lost.
//
// Both agents listen on the address with SO_REUSEPORT (ListenConfig), so the
// new one can bind while the old one still serves. Take then attaches to the
// address's reuseport group a small eBPF program (BPF_PROG_TYPE_SK_REUSEPORT)
// that steers every new connection to the listener that took it last, the
// newest agent's, and that, when a listener closes (the old agent shutting
// down), moves the connections waiting in its queue — handshake done or
// under way — to the others instead of resetting them (the
// BPF_SK_REUSEPORT_SELECT_OR_MIGRATE attach type, Linux 5.14). A listener
// joins the group when it listens but receives nothing until it calls Take:
// an agent takes the proxy's address once it has a snapshot to serve with.
// When the taking listener closes, the one that took the address before
// it gets the connections (with three agents, the newer of the two left,
// whose snapshot is the later); the group falls back to the kernel's hash
// over those left only once no listener that took it is open.
//
// The program selects from a socket array that every Take of the group
// adds its listener to, newest last. The next agent finds it by a state
// map beside it, which names the group: both live as long as the group
// holds the program. Takes in one network namespace run one at a time,
// under a lock on it, so two agents taking an address at once both join
// the array.
//
// Any process of the same user may join a reuseport group; the agent runs
// as root, so only root can.
//
// It must not open listeners or know what they serve.
package takeover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// ListenConfig returns a copy of lc (nil: a zero one) whose sockets are
// plain TCP and set SO_REUSEPORT before they bind, after lc's own Control.
// Plain TCP: Go's listeners are Multipath TCP by default, which a reuseport
// socket array does not take (an MPTCP client falls back to TCP).
func ListenConfig(lc *net.ListenConfig) *net.ListenConfig {
	out := &net.ListenConfig{}
	if lc != nil {
		*out = *lc
	}
	out.SetMultipathTCP(false)
	inner := out.Control
	out.Control = func(network, address string, c syscall.RawConn) error {
		if inner != nil {
			if err := inner(network, address, c); err != nil {
				return err
			}
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		if err = errors.Join(err, serr); err != nil {
			return fmt.Errorf("set SO_REUSEPORT on %s: %w", address, err)
		}
		return nil
	}
	return out
}

// Listen listens on the TCP address with ListenConfig(lc). An address held
// by a socket that does not share it gets an error that says so: an agent
// of a build before this package, or another program.
func Listen(ctx context.Context, lc *net.ListenConfig, address string) (net.Listener, error) {
	ln, err := ListenConfig(lc).Listen(ctx, "tcp", address)
	if errors.Is(err, unix.EADDRINUSE) {
		return nil, fmt.Errorf("%w (held by a socket without SO_REUSEPORT, which a newer agent cannot share: "+
			"another program, or an agent of a build that did not share its addresses, whose pod must be deleted for this one to start)", err)
	}
	return ln, err
}

// Take steers the new connections of ln's reuseport group to ln from now
// on, and to the listener that took it before once ln closes, and makes a
// closing member hand its waiting connections to the newest left. ln must
// come from a ListenConfig of this package. Nothing is left to release: the
// group holds the program, the program its maps, and the socket array drops
// ln when it closes.
func Take(ln net.Listener) error {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return fmt.Errorf("take over %s: %T has no socket", ln.Addr(), ln)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return fmt.Errorf("take over %s: %w", ln.Addr(), err)
	}
	var terr error
	if err := raw.Control(func(fd uintptr) { terr = take(int(fd)) }); err != nil {
		terr = err
	}
	if terr != nil {
		return fmt.Errorf("take over %s: %w", ln.Addr(), terr)
	}
	return nil
}

// slots is how many of a group's listeners the steering remembers, newest
// first: more than the agents a node runs at once (two in a rolling
// update, three when an update starts during another). A power of two.
const slots = 8

// group is the value of a reuseport group's state map: which group its
// socket array serves, so that the next listener to take it finds the
// array, and how many listeners took it.
type group struct {
	NetNS uint64   // the listeners' network namespace cookie
	Addr  [16]byte // their address, an IPv4 one mapped
	Port  uint16
	_     uint16
	Takes uint32 // the newest listener is in slot Takes % slots
	Socks uint32 // the socket array's map ID
	_     uint32
}

const (
	socksName = "sm_takeover"
	stateName = "sm_takeover_grp"
)

// take puts the listener fd in the next slot of its group's socket array
// (created if no listener of this package took the group before) and
// attaches a program that selects the newest listener still open.
func take(fd int) error {
	want, err := groupOf(fd)
	if err != nil {
		return err
	}
	// Two agents taking one address at the same moment (in in-pod mode, a
	// pod created while they overlap) would both create the group's maps,
	// or both pick the same slot: one listener would be left out of the
	// steering, which then gives it connections only by the kernel's hash.
	unlock, err := lockNetNS(fd)
	if err != nil {
		return err
	}
	defer unlock()
	state, socks, g, err := findGroup(want)
	if err != nil {
		return err
	}
	if state == nil {
		if state, socks, g, err = newGroup(want); err != nil {
			return err
		}
	}
	defer state.Close()
	defer socks.Close()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "sm_takeover",
		Type:         ebpf.SkReuseport,
		AttachType:   ebpf.AttachSkReuseportSelectOrMigrate,
		License:      "Dual BSD/GPL",
		Instructions: steering(state, socks),
	})
	if err != nil {
		return fmt.Errorf("load the steering program: %w", err)
	}
	defer prog.Close()
	g.Takes++
	if err := socks.Put(g.Takes%slots, uint64(fd)); err != nil {
		return fmt.Errorf("add the listener to the socket array: %w", err)
	}
	if err := state.Put(uint32(0), g); err != nil {
		return fmt.Errorf("update the group's state: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, prog.FD()); err != nil {
		return fmt.Errorf("attach the steering program: %w", err)
	}
	return nil
}

// lockNetNS takes an exclusive lock on the network namespace of the socket
// fd, for processes that take its addresses one at a time, and returns its
// release. The lock is flock(2) on the namespace's nsfs file (SIOCGSKNS,
// Linux 4.9), one inode for every process whatever its mount namespace,
// and released if the process dies.
func lockNetNS(fd int) (unlock func(), err error) {
	ns, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS)
	if err != nil {
		return nil, fmt.Errorf("open the listener's network namespace: %w", err)
	}
	if err := unix.Flock(ns, unix.LOCK_EX); err != nil {
		unix.Close(ns)
		return nil, fmt.Errorf("lock the listener's network namespace: %w", err)
	}
	return func() {
		unix.Flock(ns, unix.LOCK_UN)
		unix.Close(ns)
	}, nil
}

// steering returns a program that selects, for a new connection and for
// one moving from a closing listener, the newest listener of socks still
// open: a closed one's slot is empty, and bpf_sk_select_reuseport fails on
// it. So once the newest agent's listener closes, the next newest gets the
// connections, not all those left by the kernel's hash (which SK_PASS
// without a selection falls back to when none is left).
func steering(state, socks *ebpf.Map) asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1), // the context, kept across calls
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, state.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R7, asm.R0, int16(unsafe.Offsetof(group{}.Takes)), asm.Word),
	}
	for i := range int32(slots) {
		insns = append(insns,
			// bpf_sk_select_reuseport(ctx, socks, &((Takes-i) % slots), 0)
			asm.Mov.Reg(asm.R1, asm.R7),
			asm.Add.Imm(asm.R1, -i),
			asm.And.Imm(asm.R1, slots-1),
			asm.StoreMem(asm.RFP, -8, asm.R1, asm.Word),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.LoadMapPtr(asm.R2, socks.FD()),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -8),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnSkSelectReuseport.Call(),
			asm.JEq.Imm(asm.R0, 0, "pass"),
		)
	}
	return append(insns,
		asm.Mov.Imm(asm.R0, 1).WithSymbol("pass"), // SK_PASS
		asm.Return(),
	)
}

// groupOf returns the group of the listener fd: its netns (SO_NETNS_COOKIE,
// Linux 5.14 as SELECT_OR_MIGRATE) and address.
func groupOf(fd int) (group, error) {
	var g group
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return g, fmt.Errorf("read the listener's netns cookie: %w", err)
	}
	g.NetNS = cookie
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return g, fmt.Errorf("read the listener's address: %w", err)
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		g.Addr, g.Port = netip.AddrFrom4(sa.Addr).As16(), uint16(sa.Port)
	case *unix.SockaddrInet6:
		g.Addr, g.Port = sa.Addr, uint16(sa.Port)
	default:
		return g, fmt.Errorf("listener address %T is not TCP", sa)
	}
	return g, nil
}

// findGroup returns the state map and socket array of want's group, which
// live as long as the group holds the program of the last Take (nil maps
// when no Take of this package set them up: a new address, or one only
// agents of an earlier build took). It looks through every map on the
// host: the group does not say which program it holds.
func findGroup(want group) (state, socks *ebpf.Map, g group, err error) {
	for id := ebpf.MapID(0); ; {
		id, err = ebpf.MapGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, g, nil
		}
		if err != nil {
			return nil, nil, g, fmt.Errorf("list maps: %w", err)
		}
		if state, socks, g = openGroup(id, want); state != nil {
			return state, socks, g, nil
		}
	}
}

// openGroup returns the maps of want's group if id is its state map.
// Errors mean it is not: a map freed since it was listed, another map.
func openGroup(id ebpf.MapID, want group) (state, socks *ebpf.Map, g group) {
	m, err := ebpf.NewMapFromID(id)
	if err != nil {
		return nil, nil, g
	}
	if info, err := m.Info(); err != nil || info.Name != stateName || info.Type != ebpf.Array ||
		m.Lookup(uint32(0), &g) != nil || g.NetNS != want.NetNS || g.Addr != want.Addr || g.Port != want.Port {
		m.Close()
		return nil, nil, g
	}
	socks, err = ebpf.NewMapFromID(ebpf.MapID(g.Socks))
	if err != nil {
		m.Close()
		return nil, nil, g
	}
	if info, err := socks.Info(); err != nil || info.Type != ebpf.ReusePortSockArray {
		m.Close()
		socks.Close()
		return nil, nil, g
	}
	return m, socks, g
}

// newGroup creates the state map and socket array of g's group.
func newGroup(g group) (state, socks *ebpf.Map, _ group, err error) {
	socks, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: socksName, Type: ebpf.ReusePortSockArray, KeySize: 4, ValueSize: 8, MaxEntries: slots,
	})
	if err != nil {
		return nil, nil, g, fmt.Errorf("create socket array: %w", err)
	}
	info, err := socks.Info()
	if err != nil {
		socks.Close()
		return nil, nil, g, fmt.Errorf("read the socket array's ID: %w", err)
	}
	id, _ := info.ID()
	g.Socks = uint32(id)
	state, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: stateName, Type: ebpf.Array, KeySize: 4, ValueSize: uint32(unsafe.Sizeof(g)), MaxEntries: 1,
	})
	if err != nil {
		socks.Close()
		return nil, nil, g, fmt.Errorf("create the group's state map: %w", err)
	}
	return state, socks, g, nil
}
