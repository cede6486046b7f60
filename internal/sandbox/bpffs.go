package sandbox

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/internal/testenv"
)

// TempBPFFS mounts a fresh BPF filesystem on a temporary directory named
// smt-<pid>-<n> and returns its path; it is unmounted (dropping every pin in
// it) and removed when t ends. Use it instead of /sys/fs/bpf so tests never
// see or leave pins of other tests or of a real agent.
func TempBPFFS(t TB) string {
	t.Helper()
	testenv.RequireRoot(t)
	// t.TempDir is removed by its own cleanup, which runs after ours.
	dir := filepath.Join(t.TempDir(), Name())
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmount bpffs %s: %v", dir, err)
		}
	})
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		testenv.SkipOrFail(t, "mount bpffs: %v", err)
	}
	return dir
}
