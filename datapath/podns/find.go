package podns

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// NamedDir is where `ip netns` and CNI runtimes bind-mount named namespaces.
const NamedDir = "/var/run/netns"

// List opens every distinct network namespace it can find: those named in
// NamedDir, then those of every process in /proc. The caller closes them.
// Namespaces that vanish during the scan are skipped.
func List() ([]*NS, error) {
	var paths []string
	named, err := os.ReadDir(NamedDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list %s: %w", NamedDir, err)
	}
	for _, e := range named {
		paths = append(paths, filepath.Join(NamedDir, e.Name()))
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list /proc: %w", err)
	}
	for _, e := range procs {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			paths = append(paths, filepath.Join("/proc", e.Name(), "ns", "net"))
		}
	}

	seen := make(map[uint64]bool)
	var out []*NS
	for _, p := range paths {
		ns, err := Open(p)
		if err != nil {
			continue // the process exited or the mount went away
		}
		ino, err := ns.Inode()
		if err != nil || seen[ino] {
			ns.Close()
			continue
		}
		seen[ino] = true
		out = append(out, ns)
	}
	return out, nil
}

// FindByIP returns the one network namespace with ip configured on an
// interface: a pod's namespace holds its pod IP. It returns an error wrapping
// ErrNotFound or ErrAmbiguous when there is not exactly one.
func FindByIP(ip netip.Addr) (*NS, error) {
	all, err := List()
	if err != nil {
		return nil, fmt.Errorf("find netns of %s: %w", ip, err)
	}
	ip = ip.Unmap()
	var found []*NS
	for _, ns := range all {
		addrs, err := ns.Addrs()
		if err == nil && slices.Contains(addrs, ip) {
			found = append(found, ns)
			continue
		}
		ns.Close()
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("find netns of %s: %w", ip, ErrNotFound)
	case 1:
		return found[0], nil
	}
	names := make([]string, len(found))
	for i, ns := range found {
		names[i] = ns.Path()
		ns.Close()
	}
	return nil, fmt.Errorf("find netns of %s: %w: %s", ip, ErrAmbiguous, strings.Join(names, ", "))
}
