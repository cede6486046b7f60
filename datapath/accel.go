package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/sockmesh/sockmesh/datapath/bpffs"
)

// accelLink is the pin name of the sk_msg program's link to sm_accel.
const accelLink = "sk_msg"

// checkAccel returns a *KernelTooOldError unless the kernel that types
// describe (nil: the running kernel's BTF) can accelerate: attach an sk_msg
// program to a sockhash with a bpf_link (Linux 6.10; sm_msg also reads
// sk_psock.msg_tot_len, 6.8). Its BTF says so better than its version
// number, which distributions keep while backporting.
func checkAccel(types *btf.Spec) error {
	if types == nil {
		var err error
		if types, err = btf.LoadKernelSpec(); err != nil {
			return fmt.Errorf("check the kernel for acceleration: %w", err)
		}
	}
	const missing = "BPF_LINK_TYPE_SOCKMAP"
	var linkTypes *btf.Enum
	if err := types.TypeByName("bpf_link_type", &linkTypes); err != nil {
		return fmt.Errorf("check the kernel for acceleration: %w", err)
	}
	for _, v := range linkTypes.Values {
		if v.Name == missing {
			return nil
		}
	}
	return &KernelTooOldError{Feature: "acceleration (sk_msg link)", Kernel: "6.10", Missing: missing}
}

// setupAccel attaches the sk_msg program to sm_accel when Config.Accelerate
// is set (adopting a pinned link, as for the cgroup hooks), and detaches a
// pinned one when it is not. Either way only sockets that join sm_accel
// afterwards see the change: the kernel binds a socket's sk_msg program when
// it joins and keeps it, with the maps it uses, until the socket leaves.
// That is also why Uninstall loses no byte handed to a peer that has not read
// it yet (TestAccelUninstall); deleting a socket from sm_accel would.
func (d *Datapath) setupAccel() error {
	path := filepath.Join(d.cfg.pinDir(), "links", accelLink)
	if _, err := os.Stat(path); err == nil {
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			return fmt.Errorf("adopt %s link: %w", accelLink, err)
		}
		if d.cfg.Accelerate {
			if err := l.Update(d.objs.Msg); err != nil {
				l.Close()
				return fmt.Errorf("update %s link: %w", accelLink, err)
			}
			d.links[accelLink] = l
			return nil
		}
		if err := errors.Join(l.Detach(), l.Unpin(), l.Close()); err != nil {
			return fmt.Errorf("remove %s link: %w", accelLink, err)
		}
		d.log.Info("acceleration turned off")
		return nil
	}
	if !d.cfg.Accelerate {
		return nil
	}
	raw, err := link.AttachRawLink(link.RawLinkOptions{
		Target: d.objs.SmAccel.FD(), Program: d.objs.Msg, Attach: ebpf.AttachSkMsgVerdict,
	})
	if err != nil {
		return fmt.Errorf("attach sk_msg to the acceleration map: %w", err)
	}
	if err := raw.Pin(path); err != nil {
		raw.Close()
		return fmt.Errorf("pin %s link: %w", accelLink, err)
	}
	d.links[accelLink] = raw
	return nil
}

// AccelCounts says what happened to accelerated sockets since the counters
// map was created; each socket counts once per field.
type AccelCounts struct {
	// Joined: sockets that entered the acceleration map (both sides of
	// each redirected connection).
	Joined uint64 `json:"joined"`
	// Redirected: sockets whose bytes went to their peer directly.
	Redirected uint64 `json:"redirected"`
	// PeerMissing: sockets whose first message came before their peer
	// joined; they use TCP throughout.
	PeerMissing uint64 `json:"peerMissing"`
	// OverBudget: sockets that turned to TCP after sending 256 KiB their
	// peer had not answered (a stream or upload), or with 256 KiB handed to
	// them unread (an app pipelining without reading), so TCP pushes back.
	OverBudget uint64 `json:"overBudget"`
	// PeerGone: sockets that turned to TCP because their peer had closed.
	PeerGone uint64 `json:"peerGone"`
}

// AccelCounters sums the acceleration counters over the CPUs.
func (d *Datapath) AccelCounters() (AccelCounts, error) {
	return readAccelCounters(d.objs.SmAccelCounters)
}

// PinnedAccelCounters reads the acceleration counters of the datapath pinned
// under cfg.BPFFS without loading it (for tools and tests outside the agent).
func PinnedAccelCounters(cfg Config) (AccelCounts, error) {
	if cfg.BPFFS == "" {
		cfg.BPFFS = bpffs.DefaultPath
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(cfg.pinDir(), "sm_accel_counters"), nil)
	if err != nil {
		return AccelCounts{}, fmt.Errorf("open acceleration counters: %w", err)
	}
	defer m.Close()
	return readAccelCounters(m)
}

func readAccelCounters(m *ebpf.Map) (AccelCounts, error) {
	var perCPU []sockmeshSmAccelCounts
	if err := m.Lookup(uint32(0), &perCPU); err != nil {
		return AccelCounts{}, fmt.Errorf("read acceleration counters: %w", err)
	}
	var out AccelCounts
	for _, c := range perCPU {
		out.Joined += c.Joined
		out.Redirected += c.Redirected
		out.PeerMissing += c.PeerMissing
		out.OverBudget += c.OverBudget
		out.PeerGone += c.PeerGone
	}
	return out, nil
}
