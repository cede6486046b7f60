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
// When the taking listener closes, the group falls back to the kernel's
// hash over those left.
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
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// ListenConfig returns a copy of lc (nil: a zero one) whose sockets are
// plain TCP and set SO_REUSEPORT before they bind, after lc's own Control.
// Plain TCP: Go's listeners are Multipath TCP by default, which a reuseport
// socket array does not take (and no client of a mesh proxy speaks).
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
// on, and makes a closing member hand its waiting connections to the
// others. ln must come from a ListenConfig of this package. Nothing is left
// to release: the group holds the program, the program its map, and the
// map drops ln when it closes.
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

func take(fd int) error {
	socks, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "sm_takeover", Type: ebpf.ReusePortSockArray, KeySize: 4, ValueSize: 8, MaxEntries: 1,
	})
	if err != nil {
		return fmt.Errorf("create socket array: %w", err)
	}
	defer socks.Close()
	if err := socks.Put(uint32(0), uint64(fd)); err != nil {
		return fmt.Errorf("add the listener to the socket array: %w", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:       "sm_takeover",
		Type:       ebpf.SkReuseport,
		AttachType: ebpf.AttachSkReuseportSelectOrMigrate,
		License:    "Dual BSD/GPL",
		Instructions: asm.Instructions{
			// bpf_sk_select_reuseport(ctx, socks, &0, 0): the newest
			// listener, for a new connection and for one moving from a
			// closing listener. It fails once that listener has closed (its
			// entry is gone), and SK_PASS without a selection lets the
			// kernel hash over the listeners left.
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.LoadMapPtr(asm.R2, socks.FD()),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -4),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnSkSelectReuseport.Call(),
			asm.Mov.Imm(asm.R0, 1), // SK_PASS
			asm.Return(),
		},
	})
	if err != nil {
		return fmt.Errorf("load the steering program: %w", err)
	}
	defer prog.Close()
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, prog.FD()); err != nil {
		return fmt.Errorf("attach the steering program: %w", err)
	}
	return nil
}
