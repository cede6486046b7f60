package cgroup2

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sockmesh/sockmesh/internal/testenv"
)

func TestParseMountInfo(t *testing.T) {
	tests := []struct {
		file string
		want string
		err  error // nil: no error; errAny: any error
	}{
		{"hybrid.mountinfo", "/sys/fs/cgroup/unified", nil},
		{"unified.mountinfo", "/sys/fs/cgroup", nil},
		{"nested-first.mountinfo", "/sys/fs/cgroup", nil},
		{"nested-only.mountinfo", "/run/pods cgroup", nil},
		{"v1only.mountinfo", "", ErrNotMounted},
		{"bad-escape.mountinfo", "", errAny},
	}
	for _, tc := range tests {
		f, err := os.Open(filepath.Join("testdata", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseMountInfo(f)
		f.Close()
		switch {
		case tc.err == errAny && err == nil:
			t.Errorf("ParseMountInfo(%s) = %q, want an error", tc.file, got)
		case tc.err != errAny && !errors.Is(err, tc.err):
			t.Errorf("ParseMountInfo(%s) error = %v, want %v", tc.file, err, tc.err)
		case got != tc.want:
			t.Errorf("ParseMountInfo(%s) = %q, want %q", tc.file, got, tc.want)
		}
	}
}

var errAny = errors.New("any error")

// TestThisMachine reads the real mountinfo and our own cgroup, which must lie
// below the hierarchy's root.
func TestThisMachine(t *testing.T) {
	root, err := Root()
	if errors.Is(err, ErrNotMounted) {
		testenv.SkipOrFail(t, "no cgroup2 on this machine")
	}
	if err != nil {
		t.Fatal(err)
	}
	p, err := ProcessPath(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err != nil {
		t.Errorf("own cgroup %s has no cgroup.procs: %v", p, err)
	}
}
