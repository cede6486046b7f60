package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/datapath/cgroup2"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

// Cgroup is a cgroup v2 directory made for one test, directly below the
// hierarchy's root or below another such (Sub).
type Cgroup struct {
	Path string
}

// NewCgroup creates a cgroup that is removed when t ends (after every process
// Start put into it has been ended, and after Enter's move back).
func NewCgroup(t TB) *Cgroup {
	t.Helper()
	testenv.RequireRoot(t)
	root, err := cgroup2.Root()
	if err != nil {
		testenv.SkipOrFail(t, "cgroup v2: %v", err)
	}
	return mkCgroup(t, filepath.Join(root, Name()))
}

// Sub creates the cgroup name below c (a relative path whose parents
// exist), removed when t ends, before c is (cleanups run last first).
func (c *Cgroup) Sub(t TB, name string) *Cgroup {
	t.Helper()
	return mkCgroup(t, filepath.Join(c.Path, name))
}

func mkCgroup(t TB, path string) *Cgroup {
	t.Helper()
	c := &Cgroup{Path: path}
	t.Cleanup(func() {
		if err := c.remove(); err != nil {
			t.Errorf("remove cgroup %s: %v", c.Path, err)
		}
	})
	if err := os.Mkdir(c.Path, 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	return c
}

// Enter moves the whole test process (every thread: cgroup v2 membership is
// per process) into c until t ends, when it moves back to where it was.
// Sockets remember the cgroup they were created in, so sockets created while
// inside stay subject to programs attached to c. Tests that Enter must not
// run in parallel with tests that rely on the process's cgroup.
func (c *Cgroup) Enter(t TB) {
	t.Helper()
	root, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	prev, err := cgroup2.ProcessPath(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(prev, "cgroup.procs"), pid, 0); err != nil {
			t.Errorf("move test process back to cgroup %s: %v", prev, err)
		}
	})
	if err := os.WriteFile(filepath.Join(c.Path, "cgroup.procs"), pid, 0); err != nil {
		t.Fatalf("move test process into cgroup %s: %v", c.Path, err)
	}
}

// remove removes c. Processes still in it — a program interrupted while
// a child it started there runs — are killed first (cgroup.kill), and
// their exit awaited, as a populated cgroup cannot be removed.
func (c *Cgroup) remove() error {
	err := os.Remove(c.Path)
	if err == nil || errors.Is(err, os.ErrNotExist) || !errors.Is(err, syscall.EBUSY) {
		return ignoreNotExist(err)
	}
	if kerr := os.WriteFile(filepath.Join(c.Path, "cgroup.kill"), []byte("1"), 0); kerr != nil {
		return fmt.Errorf("%w (and kill its processes: %w)", err, kerr)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err = os.Remove(c.Path); !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return ignoreNotExist(err)
		}
	}
}

func ignoreNotExist(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
