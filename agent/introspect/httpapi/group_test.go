package httpapi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/internal/testenv"
)

// TestGroupWithoutCapChown: the shipped DaemonSet's agent has no CAP_CHOWN.
// A member of the group (the pod's supplementalGroups) gives the socket to
// it all the same; an agent that is not fails at start, saying what it
// lacks.
func TestGroupWithoutCapChown(t *testing.T) {
	testenv.RequireRoot(t)
	const gid = 60123
	if groups, err := os.Getgroups(); err != nil || slices.Contains(groups, gid) || os.Getegid() == gid {
		t.Fatalf("this process is in group %d (groups %v, err %v): pick another", gid, groups, err)
	}
	src := testSources(t)
	cfg := func(t *testing.T) Config {
		return Config{Socket: filepath.Join(t.TempDir(), "agent.sock"), Group: strconv.Itoa(gid)}
	}

	t.Run("not a member", func(t *testing.T) {
		c := cfg(t)
		err := withoutCapChown(t, nil, func() error {
			s, err := NewServer(c, src, nil, nil)
			if err == nil {
				s.Close()
			}
			return err
		})
		if !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), "CAP_CHOWN") ||
			!strings.Contains(err.Error(), "supplementalGroups") {
			t.Errorf("NewServer: %v, want a permission error naming supplementalGroups and CAP_CHOWN", err)
		}
	})

	t.Run("member", func(t *testing.T) {
		c := cfg(t)
		var fi os.FileInfo
		err := withoutCapChown(t, []uint32{gid}, func() error {
			s, err := NewServer(c, src, nil, nil)
			if err != nil {
				return err
			}
			defer s.Close()
			fi, err = os.Lstat(c.Socket)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Gid != gid || fi.Mode().Perm() != 0o660 {
			t.Errorf("socket group %d, mode %v; want group %d, mode 0660", st.Gid, fi.Mode().Perm(), gid)
		}
	})
}

// withoutCapChown runs fn on a thread of its own whose supplementary groups
// are groups and whose effective capabilities lack CAP_CHOWN, as the
// DaemonSet runs the agent. Credentials are per thread in the kernel (Go's
// syscall.Setgroups changes every thread, so the raw call is used); the
// thread is never unlocked, so it ends with fn and nothing else runs with
// its credentials.
func withoutCapChown(t *testing.T, groups []uint32, fn func() error) error {
	t.Helper()
	type result struct{ setup, fn error }
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var p unsafe.Pointer
		if len(groups) > 0 {
			p = unsafe.Pointer(&groups[0])
		}
		if _, _, errno := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); errno != 0 {
			done <- result{setup: fmt.Errorf("setgroups: %w", errno)}
			return
		}
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var caps [2]unix.CapUserData
		if err := unix.Capget(&hdr, &caps[0]); err != nil {
			done <- result{setup: fmt.Errorf("capget: %w", err)}
			return
		}
		caps[0].Effective &^= 1 << unix.CAP_CHOWN
		if err := unix.Capset(&hdr, &caps[0]); err != nil {
			done <- result{setup: fmt.Errorf("capset: %w", err)}
			return
		}
		done <- result{fn: fn()}
	}()
	r := <-done
	if r.setup != nil {
		t.Fatal(r.setup)
	}
	return r.fn
}
