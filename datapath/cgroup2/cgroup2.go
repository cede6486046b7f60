package cgroup2

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNotMounted is returned when no cgroup v2 hierarchy is mounted.
var ErrNotMounted = errors.New("no cgroup2 filesystem mounted")

// Root returns the mount point of the cgroup v2 hierarchy as this process
// sees it.
func Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	defer f.Close()
	return ParseMountInfo(f)
}

// ParseMountInfo returns the cgroup2 mount point listed in a mountinfo file
// (proc(5)). When several are listed it prefers one that mounts the
// hierarchy's root ("/"), which every cgroup is below.
func ParseMountInfo(r io.Reader) (string, error) {
	var found string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// 36 35 0:30 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw
		// The optional fields before " - " vary in number, so split there.
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		if fs := strings.Fields(post); len(fs) == 0 || fs[0] != "cgroup2" {
			continue
		}
		fields := strings.Fields(pre)
		if len(fields) < 5 {
			return "", fmt.Errorf("parse mountinfo line %q: too few fields", sc.Text())
		}
		mnt, err := unescape(fields[4])
		if err != nil {
			return "", fmt.Errorf("parse mountinfo line %q: %w", sc.Text(), err)
		}
		if fields[3] == "/" {
			return mnt, nil
		}
		if found == "" {
			found = mnt
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	if found == "" {
		return "", ErrNotMounted
	}
	return found, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space, \011, \012,
// \134).
func unescape(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+4 > len(s) {
			return "", fmt.Errorf("truncated escape in %q", s)
		}
		n, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
		if err != nil {
			return "", fmt.Errorf("bad escape in %q: %w", s, err)
		}
		b.WriteByte(byte(n))
		i += 3
	}
	return b.String(), nil
}

// ProcessPath returns the directory of pid's cgroup v2 under root, read from
// /proc/<pid>/cgroup (the "0::" line). pid 0 means this process.
func ProcessPath(root string, pid int) (string, error) {
	p := "/proc/self/cgroup"
	if pid != 0 {
		p = "/proc/" + strconv.Itoa(pid) + "/cgroup"
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("read cgroup of process %d: %w", pid, err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(root, rel), nil
		}
	}
	return "", fmt.Errorf("read cgroup of process %d: %w", pid, ErrNotMounted)
}
