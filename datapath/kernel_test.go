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
// This kernel's BTF, without what 5.19 (bpf_skc_to_mptcp_sock), 6.8
// (sk_psock.msg_tot_len) and 6.10 (the sockmap link) added, stands in for
// 5.15's.
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

// olderKernelTypes is the running kernel's BTF without sk_psock.msg_tot_len,
// BPF_LINK_TYPE_SOCKMAP and BPF_FUNC_skc_to_mptcp_sock, renamed away.
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
	var linkTypes, funcs *btf.Enum
	if err := spec.TypeByName("bpf_link_type", &linkTypes); err != nil {
		t.Fatal(err)
	}
	if err := spec.TypeByName("bpf_func_id", &funcs); err != nil {
		t.Fatal(err)
	}
	renamed := 0
	for i, m := range psock.Members {
		if m.Name == "msg_tot_len" {
			psock.Members[i].Name = "sm_missing"
			renamed++
		}
	}
	for _, e := range []*btf.Enum{linkTypes, funcs} {
		for i, v := range e.Values {
			if v.Name == "BPF_LINK_TYPE_SOCKMAP" || v.Name == "BPF_FUNC_skc_to_mptcp_sock" {
				e.Values[i].Name = "SM_MISSING_" + v.Name
				renamed++
			}
		}
	}
	if renamed != 3 {
		t.Fatalf("renamed %d of the 3 names in this kernel's BTF", renamed)
	}
	return spec
}
