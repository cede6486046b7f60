package main

import (
	"bytes"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/datapath/bpffs"
	"github.com/sockmesh/sockmesh/internal/mountinfo"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	cmd := newRootCommand(func(string) string { return "" })
	cmd.SetArgs([]string{"version"})
	cmd.SetOut(&out)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "sockmesh "+buildVersion()+" (go") {
		t.Errorf("version printed %q", out.String())
	}
}

// TestMountBPFFS runs `sockmesh mount-bpffs` as the DaemonSet's init
// container does: it mounts a shared BPF filesystem where there is none,
// and leaves one that is there alone.
func TestMountBPFFS(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), sandbox.Name(), "bpf") // absent: it is created
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	run := func() string {
		t.Helper()
		out, err := sandbox.HelperCommand(t, "sockmesh", "mount-bpffs", "--path="+dir).CombinedOutput()
		if err != nil {
			t.Fatalf("sockmesh mount-bpffs: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := run(); !strings.Contains(out, "mounted a shared BPF filesystem") {
		t.Errorf("first run printed %q", out)
	}
	if ok, err := bpffs.IsMounted(dir); err != nil || !ok {
		t.Fatalf("IsMounted(%s) = %v, %v after mount-bpffs", dir, ok, err)
	}
	if !sharedMount(t, dir) {
		t.Errorf("%s is not a shared mount: a Bidirectional volume would not carry it to the host", dir)
	}
	if out := run(); !strings.Contains(out, "already mounted") {
		t.Errorf("second run printed %q, want it to leave the mount alone", out)
	}
}

// sharedMount reports whether mountinfo lists dir as a mount point in a
// peer group.
func sharedMount(t *testing.T, dir string) bool {
	t.Helper()
	ms, err := mountinfo.List()
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(ms, func(m mountinfo.Mount) bool { return m.Point == dir && m.Shared })
}
