package datapath

import (
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// TestOldKernel: on Linux 5.15-6.7 the datapath captures without
// acceleration, and Open with Config.Accelerate says which kernel it needs.
// This kernel's BTF, without what 6.8 (sk_psock.msg_tot_len) and 6.10 (the
// sockmap link) added, stands in for the older kernel's.
func TestOldKernel(t *testing.T) {
	tp := newTopology(t)
	tp.cfg.kernelTypes = olderKernelTypes(t)

	t.Run("accelerate", func(t *testing.T) {
		cfg := tp.cfg
		cfg.Accelerate = true
		d, err := Open(cfg, nil, nil)
		if err == nil {
			d.Uninstall()
			t.Fatal("Open with Accelerate on a kernel older than 6.10 succeeded")
		}
		var old *KernelTooOldError
		if !errors.As(err, &old) || old.Kernel != "6.10" || !errors.Is(err, ebpf.ErrNotSupported) {
			t.Fatalf("Open with Accelerate = %v, want a *KernelTooOldError naming Linux 6.10", err)
		}
		if _, err := os.Stat(cfg.pinDir()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused Open left %s behind (stat: %v)", cfg.pinDir(), err)
		}
	})

	t.Run("capture", func(t *testing.T) {
		tp.openCapturing(t, Service{Addr: vip4})
		startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4},
			map[netip.AddrPort]netip.AddrPort{vip4: tp.server4})
		v, err := dialAndGreet(tp.pod, vip4, nil)
		wantRedirected(t, v, err, vip4)
	})
}

// olderKernelTypes is the running kernel's BTF without sk_psock.msg_tot_len
// and BPF_LINK_TYPE_SOCKMAP, renamed away.
func olderKernelTypes(t *testing.T) *btf.Spec {
	t.Helper()
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatal(err)
	}
	var psock *btf.Struct
	if err := spec.TypeByName("sk_psock", &psock); err != nil {
		t.Fatal(err)
	}
	var linkTypes *btf.Enum
	if err := spec.TypeByName("bpf_link_type", &linkTypes); err != nil {
		t.Fatal(err)
	}
	renamed := 0
	for i, m := range psock.Members {
		if m.Name == "msg_tot_len" {
			psock.Members[i].Name = "sm_missing"
			renamed++
		}
	}
	for i, v := range linkTypes.Values {
		if v.Name == "BPF_LINK_TYPE_SOCKMAP" {
			linkTypes.Values[i].Name = "SM_MISSING"
			renamed++
		}
	}
	if renamed != 2 {
		t.Fatalf("renamed %d of sk_psock.msg_tot_len and BPF_LINK_TYPE_SOCKMAP in this kernel's BTF, want both", renamed)
	}
	return spec
}
