package bpffs

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// DefaultPath is where bpffs is mounted by convention.
const DefaultPath = "/sys/fs/bpf"

// ErrNotEmpty is returned by Ensure for a directory that is not on a BPF
// filesystem but holds files: mounting there would hide them.
var ErrNotEmpty = errors.New("directory is not empty")

// IsMounted reports whether dir lies on a BPF filesystem (the mount point or
// any directory below it).
func IsMounted(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return uint32(st.Type) == unix.BPF_FS_MAGIC, nil
}

// Ensure mounts a BPF filesystem at dir unless dir already lies on one,
// creating dir when absent. Mounting needs CAP_SYS_ADMIN in the initial
// mount namespace's user namespace.
func Ensure(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create bpffs directory %s: %w", dir, err)
	}
	ok, err := IsMounted(dir)
	if err != nil || ok {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("mount bpffs at %s: %w", dir, ErrNotEmpty)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}
