package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/sockmesh/sockmesh/internal/mountinfo"
)

// HostState is what a node changes on this machine, read from the machine
// itself rather than from the ledger: the addresses on lo, whether the
// bridge exists, the sysctls components set, mounts at the places a node
// mounts, the paths components hard-code, the kubepods cgroups, KUBE-*
// iptables chains, nftables tables, and containerd shims of the node's
// socket. Compare one read before Up with one after Down to check that
// Down left the machine as it was. It deliberately ignores what other
// programs on a shared machine change all the time (their network
// namespaces, links, temporary files).
type HostState struct {
	LoAddrs  []string
	Bridge   bool
	Sysctls  map[string]string
	Mounts   []string
	Paths    []string
	Cgroups  []string
	Chains   []string
	NFTables []string
	Shims    int
}

// ReadHostState reads the HostState for a node configured as cfg.
func ReadHostState(ctx context.Context, cfg Config) (HostState, error) {
	cfg, err := cfg.withDefaults()
	if err != nil && !errors.Is(err, ErrMissing) {
		return HostState{}, err
	}
	lay := newLayout(cfg)
	var s HostState
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return s, fmt.Errorf("find lo: %w", err)
	}
	addrs, err := netlink.AddrList(lo, netlink.FAMILY_ALL)
	if err != nil {
		return s, fmt.Errorf("list lo addresses: %w", err)
	}
	for _, a := range addrs {
		s.LoAddrs = append(s.LoAddrs, a.IPNet.String())
	}
	slices.Sort(s.LoAddrs)
	_, err = netlink.LinkByName(lay.Bridge)
	s.Bridge = err == nil
	s.Sysctls = readSysctls(watchedSysctls)

	ms, err := mountinfo.List()
	if err != nil {
		return s, err
	}
	for _, m := range ms {
		if within(m.Point, "/sys/fs/bpf") || within(m.Point, lay.Dir) || within(m.Point, "/run/containerd") ||
			strings.HasPrefix(m.Point, "/run/netns/cni-") {
			s.Mounts = append(s.Mounts, fmt.Sprintf("%s %s shared=%v", m.Point, m.FSType, m.Shared))
		}
	}
	for _, p := range append([]string{lay.Dir}, hardcodedPaths...) {
		if _, err := os.Lstat(p); err == nil {
			s.Paths = append(s.Paths, p)
		}
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "cni-") {
			s.Paths = append(s.Paths, filepath.Join("/run/netns", e.Name()))
		}
	}
	cgs, err := cgroupCandidates()
	if err != nil {
		return s, err
	}
	for _, c := range cgs {
		if _, err := os.Stat(c); err == nil {
			s.Cgroups = append(s.Cgroups, c)
		}
	}
	for _, family := range []string{"iptables", "ip6tables"} {
		for _, table := range []string{"filter", "nat", "mangle", "raw"} {
			out, err := exec.CommandContext(ctx, family, "-w", "-t", table, "-S").Output()
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(out), "\n") {
				if f := strings.Fields(line); len(f) == 2 && f[0] == "-N" && strings.HasPrefix(f[1], "KUBE-") {
					s.Chains = append(s.Chains, family+" "+table+" "+f[1])
				}
			}
		}
	}
	s.NFTables, _ = nftTables(ctx)
	slices.Sort(s.NFTables)
	s.Shims = len(pidsMatching(func(args []string) bool {
		return len(args) > 0 && strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") && hasArg(args, "-address", lay.ContainerdSocket)
	}))
	return s, nil
}

// Diff lists how b differs from s, one line per field; none means equal.
func (s HostState) Diff(b HostState) []string {
	var d []string
	cmp := func(name string, x, y any) {
		if fmt.Sprint(x) != fmt.Sprint(y) {
			d = append(d, fmt.Sprintf("%s: %v, now %v", name, x, y))
		}
	}
	cmp("lo addresses", s.LoAddrs, b.LoAddrs)
	cmp("bridge", s.Bridge, b.Bridge)
	if !maps.Equal(s.Sysctls, b.Sysctls) {
		cmp("sysctls", s.Sysctls, b.Sysctls)
	}
	cmp("mounts", s.Mounts, b.Mounts)
	cmp("paths", s.Paths, b.Paths)
	cmp("cgroups", s.Cgroups, b.Cgroups)
	cmp("iptables chains", s.Chains, b.Chains)
	cmp("nftables tables", s.NFTables, b.NFTables)
	cmp("containerd shims", s.Shims, b.Shims)
	return d
}
