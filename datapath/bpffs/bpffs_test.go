package bpffs_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/datapath/bpffs"
	"github.com/sockmesh/sockmesh/internal/mountinfo"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

func TestEnsure(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "bpf")
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if ok, _ := bpffs.IsMounted(filepath.Dir(dir)); ok {
		t.Fatal("temp dir is already on bpffs")
	}
	if err := bpffs.Ensure(dir); err != nil {
		t.Fatalf("Ensure(absent dir): %v", err)
	}
	if ok, err := bpffs.IsMounted(dir); err != nil || !ok {
		t.Fatalf("after Ensure: IsMounted = %v, %v", ok, err)
	}
	// A second Ensure, and one for a directory below, must not mount again.
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, sub} {
		if err := bpffs.Ensure(d); err != nil {
			t.Errorf("Ensure(%s) on bpffs: %v", d, err)
		}
	}
	if n := mounts(t, dir) + mounts(t, sub); n != 1 {
		t.Errorf("bpffs mounted %d times at %s and below, want once", n, dir)
	}
}

func TestEnsureRefusesNonEmpty(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "keep"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := bpffs.Ensure(dir); !errors.Is(err, bpffs.ErrNotEmpty) {
		unix.Unmount(dir, unix.MNT_DETACH)
		t.Errorf("Ensure(non-empty dir) = %v, want ErrNotEmpty", err)
	}
}

func TestSandboxBPFFS(t *testing.T) {
	dir := sandbox.TempBPFFS(t)
	if ok, err := bpffs.IsMounted(dir); err != nil || !ok {
		t.Errorf("IsMounted(TempBPFFS) = %v, %v", ok, err)
	}
}

// mounts counts the mount points at dir in /proc/self/mountinfo.
func mounts(t *testing.T, dir string) int {
	t.Helper()
	ms, err := mountinfo.List()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range ms {
		if m.Point == dir {
			n++
		}
	}
	return n
}
