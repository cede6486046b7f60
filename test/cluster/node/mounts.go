package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/sockmesh/sockmesh/internal/mountinfo"
)

// topMount returns the mount visible at point (the last one mounted
// there), or ok false.
func topMount(point string) (m mountinfo.Mount, ok bool, err error) {
	ms, err := mountinfo.List()
	if err != nil {
		return mountinfo.Mount{}, false, err
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
		ms, err := mountinfo.List()
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
	ms, err := mountinfo.List()
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
