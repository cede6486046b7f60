package node

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// mount is one line of /proc/self/mountinfo.
type mount struct {
	ID     int
	Point  string
	FSType string
	Shared bool // propagation: a member of a peer group ("shared:N")
}

// mounts lists the calling process's mounts, parents before children (the
// order of mountinfo).
func mounts() ([]mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var ms []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID parent major:minor root point options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 7 || sep < 6 || sep+1 >= len(fields) {
			continue
		}
		id, _ := strconv.Atoi(fields[0])
		m := mount{ID: id, Point: unescapeMountinfo(fields[4]), FSType: fields[sep+1]}
		for _, opt := range fields[6:sep] {
			if strings.HasPrefix(opt, "shared:") {
				m.Shared = true
			}
		}
		ms = append(ms, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return ms, nil
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of
// mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// topMount returns the mount visible at point (the last one mounted
// there), or ok false.
func topMount(point string) (m mount, ok bool, err error) {
	ms, err := mounts()
	if err != nil {
		return mount{}, false, err
	}
	for _, x := range ms {
		if x.Point == point {
			m, ok = x, true
		}
	}
	return m, ok, nil
}

// within reports whether path is dir or lies below it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// unmountUnder unmounts every mount at or below dir, deepest first,
// detaching lazily a mount that stays busy, until none is left.
func unmountUnder(dir string) error {
	for range 10 {
		ms, err := mounts()
		if err != nil {
			return err
		}
		var points []string
		for _, m := range ms {
			if within(m.Point, dir) {
				points = append(points, m.Point)
			}
		}
		if len(points) == 0 {
			return nil
		}
		// Deepest first; a point mounted twice comes up again next round.
		slices.SortStableFunc(points, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
		for _, p := range slices.Compact(points) {
			if err := syscall.Unmount(p, 0); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
					return fmt.Errorf("unmount %s: %w", p, err)
				}
			}
		}
	}
	return fmt.Errorf("unmount under %s: mounts keep coming back", dir)
}

// removeTree removes dir and everything below it, after unmounting what is
// mounted there. It refuses while anything stays mounted below dir: a bind
// mount (a kubelet subPath, a hostPath) would let RemoveAll delete the
// host's own files.
func removeTree(dir string) error {
	if !filepath.IsAbs(dir) || strings.Count(filepath.Clean(dir), "/") < 2 {
		return fmt.Errorf("remove %s: refusing a path this short", dir)
	}
	if err := unmountUnder(dir); err != nil {
		return err
	}
	ms, err := mounts()
	if err != nil {
		return err
	}
	for _, m := range ms {
		if within(m.Point, dir) {
			return fmt.Errorf("remove %s: %s is still mounted", dir, m.Point)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}
