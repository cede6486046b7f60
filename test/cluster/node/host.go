package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sockmesh/sockmesh/internal/mountinfo"
)

// watchedSysctls are the sysctls (paths under /proc/sys) the node sets
// (ip_forward) or its components set on their own: the kubelet sets the
// vm/ and kernel/ ones to its defaults (protectKernelDefaults would refuse
// to start instead), kube-proxy the conntrack limits and route_localnet.
// Down puts back each one that differs from the value before bring-up.
// ip_forward comes first: writing it resets every interface's forwarding.
var watchedSysctls = []string{
	"net/ipv4/ip_forward",
	"net/ipv4/conf/all/route_localnet",
	"net/ipv6/conf/all/forwarding",
	"net/bridge/bridge-nf-call-iptables",
	"net/bridge/bridge-nf-call-ip6tables",
	"net/netfilter/nf_conntrack_max",
	"net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// hardcodedPaths are host paths components create whatever their flags say:
// containerd's shim sockets (/run/containerd/s), the kubelet's device-plugin
// socket directory, its container log symlinks, the CNI result cache. Down
// removes those that were absent. /run/netns, where containerd also puts
// its pods' namespaces, is not among them: other programs' namespaces live
// there too (removeNewNetns, removeEmptyNetnsDir).
var hardcodedPaths = []string{
	"/run/containerd",
	"/var/lib/kubelet/device-plugins",
	"/var/log/containers",
	"/var/log/pods",
	"/var/lib/cni/results",
}

// sysctlPath is the file of a sysctl.
func sysctlPath(name string) string { return filepath.Join("/proc/sys", name) }

// readSysctls returns the current value of each existing sysctl in names.
func readSysctls(names []string) map[string]string {
	vals := make(map[string]string)
	for _, n := range names {
		if b, err := os.ReadFile(sysctlPath(n)); err == nil {
			vals[n] = strings.TrimSpace(string(b))
		}
	}
	return vals
}

func writeSysctl(name, value string) error {
	if err := os.WriteFile(sysctlPath(name), []byte(value+"\n"), 0o644); err != nil {
		return fmt.Errorf("set sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

// restoreSysctls writes back every sysctl of before whose value changed.
func restoreSysctls(before map[string]string) error {
	var errs []error
	for _, n := range watchedSysctls {
		old, ok := before[n]
		if !ok {
			continue
		}
		if now := readSysctls([]string{n})[n]; now != old {
			errs = append(errs, writeSysctl(n, old))
		}
	}
	return errors.Join(errs...)
}

// absentPaths returns, for each candidate path that does not exist, its
// topmost missing ancestor: what a component creates and Down removes.
func absentPaths(candidates []string) []string {
	var out []string
	for _, c := range candidates {
		top := ""
		for p := c; p != "/" && p != "."; p = filepath.Dir(p) {
			if _, err := os.Lstat(p); err == nil {
				break
			}
			top = p
		}
		if top != "" && !slices.Contains(out, top) {
			out = append(out, top)
		}
	}
	return out
}

// cgroupCandidates are the kubepods cgroups the kubelet creates, one per
// mounted cgroup hierarchy (v1 controllers and, on a hybrid host, the v2
// one).
func cgroupCandidates() ([]string, error) {
	ms, err := mountinfo.List()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		if (m.FSType == "cgroup" || m.FSType == "cgroup2") && within(m.Point, "/sys/fs/cgroup") {
			out = append(out, filepath.Join(m.Point, "kubepods"))
		}
	}
	return out, nil
}

// removeCgroupTree removes a cgroup directory and its descendants, deepest
// first (cgroup files cannot be unlinked; only the directories removed).
// A cgroup whose last process is still exiting is busy for a moment.
func removeCgroupTree(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("walk %s: %w", dir, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		var rmErr error
		for range 50 {
			rmErr = syscall.Rmdir(dirs[i])
			if rmErr == nil || errors.Is(rmErr, syscall.ENOENT) || !errors.Is(rmErr, syscall.EBUSY) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if rmErr != nil && !errors.Is(rmErr, syscall.ENOENT) {
			return fmt.Errorf("remove cgroup %s: %w", dirs[i], rmErr)
		}
	}
	return nil
}

// removeAbsent removes a path recorded as absent before bring-up.
func removeAbsent(p string) error {
	if within(p, "/sys/fs/cgroup") {
		return removeCgroupTree(p)
	}
	if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return removeTree(p)
}

// listNetns returns the entries of /run/netns.
func listNetns() []string {
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// removeNewNetns removes the network namespaces containerd created (named
// cni-*) that were not there before bring-up: a crashed run's pods.
func removeNewNetns(before []string) error {
	var errs []error
	for _, n := range listNetns() {
		if !strings.HasPrefix(n, "cni-") || slices.Contains(before, n) {
			continue
		}
		p := filepath.Join("/run/netns", n)
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeEmptyNetnsDir removes /run/netns if it is empty: only then is
// nobody else's namespace in it.
func removeEmptyNetnsDir() error {
	err := syscall.Rmdir("/run/netns")
	if err == nil || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EBUSY) {
		return nil
	}
	return fmt.Errorf("remove /run/netns: %w", err)
}

// removeCNIResults removes the CNI result cache entries of network, which
// libcni names <network>-<container id>-<interface>.
func removeCNIResults(network string) error {
	if network == "" {
		return nil
	}
	files, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", network+"-*"))
	var errs []error
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeLogLinks removes the symlinks in /var/log/containers that point
// into dir (the kubelet's pod log directory of this node).
func removeLogLinks(dir string) error {
	ents, _ := os.ReadDir("/var/log/containers")
	var errs []error
	for _, e := range ents {
		p := filepath.Join("/var/log/containers", e.Name())
		if target, err := os.Readlink(p); err == nil && within(target, dir) {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// addLoAddr puts addr/32 on lo; an address left by a crashed run is fine.
func addLoAddr(addr netip.Addr) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(addr.BitLen(), addr.BitLen())}}
	if err := netlink.AddrAdd(lo, a); err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("add %s to lo: %w", addr, err)
	}
	return nil
}

func delLoAddr(prefix string) error {
	if prefix == "" {
		return nil
	}
	p, err := netip.ParsePrefix(prefix)
	if err != nil {
		return fmt.Errorf("parse lo address %q: %w", prefix, err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if err := netlink.AddrDel(lo, a); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
		return fmt.Errorf("remove %s from lo: %w", prefix, err)
	}
	return nil
}

// deleteBridge deletes the CNI bridge and any veth still enslaved to it.
func deleteBridge(name string) error {
	if name == "" {
		return nil
	}
	br, err := netlink.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("find bridge %s: %w", name, err)
	}
	if _, ok := br.(*netlink.Bridge); !ok {
		return fmt.Errorf("delete bridge %s: it is a %s, not a bridge", name, br.Type())
	}
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var errs []error
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete %s: %w", l.Attrs().Name, err))
			}
		}
	}
	if err := netlink.LinkDel(br); err != nil {
		errs = append(errs, fmt.Errorf("delete bridge %s: %w", name, err))
	}
	return errors.Join(errs...)
}

// ensureSharedBPFFS makes /sys/fs/bpf a shared bpffs mount, as systemd
// hosts have it: the DaemonSet's Bidirectional bpffs volume needs a shared
// host mount (k8s/README.md item 3). What it changes goes into l first.
func ensureSharedBPFFS(l *ledger) error {
	const point = "/sys/fs/bpf"
	m, ok, err := topMount(point)
	if err != nil {
		return err
	}
	if !ok || m.FSType != "bpf" {
		if err := syscall.Mount("bpf", point, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpffs at %s: %w", point, err)
		}
		if m, _, err = topMount(point); err != nil {
			return err
		}
		l.BPFFSMountID = m.ID
		if err := l.save(); err != nil {
			return err
		}
	} else if !m.Shared {
		l.BPFFSShared = true
		if err := l.save(); err != nil {
			return err
		}
	} else {
		return nil
	}
	if err := syscall.Mount("", point, "", syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", point, err)
	}
	return nil
}

// undoBPFFS unmounts the bpffs the node mounted, or makes the one it made
// shared private again. Pins left in a bpffs the node mounted go with it.
func undoBPFFS(l *ledger) error {
	const point = "/sys/fs/bpf"
	if l.BPFFSMountID != 0 {
		ms, err := mountinfo.List()
		if err != nil {
			return err
		}
		var top, ours bool
		for _, m := range ms {
			if m.Point == point {
				top = m.ID == l.BPFFSMountID
				ours = ours || top
			}
		}
		switch {
		case !ours:
		case !top:
			return fmt.Errorf("unmount bpffs at %s: another mount now covers the node's", point)
		default:
			if err := syscall.Unmount(point, 0); err != nil {
				if err := syscall.Unmount(point, syscall.MNT_DETACH); err != nil {
					return fmt.Errorf("unmount bpffs at %s: %w", point, err)
				}
			}
		}
	}
	if l.BPFFSShared {
		if err := syscall.Mount("", point, "", syscall.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make %s private: %w", point, err)
		}
	}
	return nil
}

// cleanIPTables removes every KUBE-* chain, and every rule jumping to one,
// from the IPv4 and IPv6 tables: what kube-proxy --cleanup leaves (the
// kubelet's own canary and hint chains) or a crash prevented it from
// removing.
func cleanIPTables(ctx context.Context) error {
	var errs []error
	for _, family := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(family + "-restore"); err != nil {
			continue
		}
		for _, table := range []string{"filter", "nat", "mangle", "raw"} {
			out, err := exec.CommandContext(ctx, family, "-w", "-t", table, "-S").Output()
			if err != nil {
				continue // the table does not exist in this kernel
			}
			script := iptablesCleanup(table, string(out))
			if script == "" {
				continue
			}
			cmd := exec.CommandContext(ctx, family+"-restore", "-w", "--noflush")
			cmd.Stdin = strings.NewReader(script)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s-restore (table %s): %w: %s", family, table, err, bytes.TrimSpace(out)))
			}
		}
	}
	return errors.Join(errs...)
}

// iptablesCleanup turns `iptables -t table -S` output into an
// iptables-restore script that deletes the rules of built-in and foreign
// chains that jump to a KUBE-* chain, then flushes and deletes the KUBE-*
// chains. It returns "" when there is nothing to remove.
func iptablesCleanup(table, rules string) string {
	ours := func(chain string) bool { return strings.HasPrefix(chain, "KUBE-") }
	var chains, deletes []string
	for _, line := range strings.Split(rules, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "-N" && ours(f[1]):
			chains = append(chains, f[1])
		case len(f) >= 2 && f[0] == "-A" && !ours(f[1]):
			if i := slices.IndexFunc(f, func(s string) bool { return s == "-j" || s == "-g" }); i >= 0 && i+1 < len(f) && ours(f[i+1]) {
				deletes = append(deletes, "-D"+strings.TrimPrefix(line, "-A"))
			}
		}
	}
	if len(chains) == 0 && len(deletes) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", table)
	for _, d := range deletes {
		b.WriteString(d + "\n")
	}
	for _, c := range chains {
		fmt.Fprintf(&b, "-F %s\n", c)
	}
	for _, c := range chains {
		fmt.Fprintf(&b, "-X %s\n", c)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// nftTables lists the nftables tables ("family name") of the host's
// network namespace; ok is false when the nft program is missing.
func nftTables(ctx context.Context) (tables []string, ok bool) {
	out, err := exec.CommandContext(ctx, "nft", "list", "tables").Output()
	if err != nil {
		return nil, false
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "table" {
			tables = append(tables, f[1]+" "+f[2])
		}
	}
	return tables, true
}

// removeNewEmptyNFTTables deletes the nftables tables that did not exist
// before bring-up and hold nothing but chains without rules: the tables
// iptables-nft creates on first use (filter, nat, mangle for IPv4 and
// IPv6) once kube-proxy's and the kubelet's chains are gone. A table with
// anyone's rule in it stays.
func removeNewEmptyNFTTables(ctx context.Context, before []string) error {
	now, ok := nftTables(ctx)
	if !ok {
		return nil
	}
	var errs []error
	for _, t := range now {
		if slices.Contains(before, t) {
			continue
		}
		family, name, _ := strings.Cut(t, " ")
		out, err := exec.CommandContext(ctx, "nft", "-j", "list", "table", family, name).Output()
		if err != nil {
			errs = append(errs, fmt.Errorf("nft list table %s: %w", t, err))
			continue
		}
		var doc struct {
			Nftables []map[string]json.RawMessage `json:"nftables"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			errs = append(errs, fmt.Errorf("decode nft table %s: %w", t, err))
			continue
		}
		empty := true
		for _, obj := range doc.Nftables {
			for kind := range obj {
				if kind != "metainfo" && kind != "table" && kind != "chain" {
					empty = false
				}
			}
		}
		if !empty {
			continue
		}
		if out, err := exec.CommandContext(ctx, "nft", "delete", "table", family, name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("nft delete table %s: %w: %s", t, err, bytes.TrimSpace(out)))
		}
	}
	return errors.Join(errs...)
}
