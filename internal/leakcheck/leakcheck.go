// Package leakcheck fails a test whose goroutines outlive it: those running
// non-test code of the packages it names; and counts or takes a census of
// open file descriptors for tests that check none are left. It is for
// tests only.
package leakcheck

import (
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// Register makes t fail if, after every other cleanup (register it first),
// goroutines with a frame in a non-test file whose path contains one of
// dirs (e.g. "/userspace-proxy/") are still running after a grace period:
// connections close asynchronously after a server stops.
func Register(t testing.TB, dirs ...string) {
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			leaked := running(dirs)
			if len(leaked) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%d goroutines leaked; first:\n%s", len(leaked), leaked[0])
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// running returns the stacks of the goroutines with a frame in dirs.
func running(dirs []string) []string {
	buf := make([]byte, 1<<20)
	var out []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if inDirs(g, dirs) {
			out = append(out, g)
		}
	}
	return out
}

func inDirs(stack string, dirs []string) bool {
	for _, line := range strings.Split(stack, "\n") {
		if !strings.Contains(line, ".go:") || strings.Contains(line, "_test.go:") {
			continue
		}
		for _, d := range dirs {
			if strings.Contains(line, d) {
				return true
			}
		}
	}
	return false
}

// OpenFDs counts the process's open file descriptors, for tests that check
// a component gives back every socket and namespace it opened.
func OpenFDs(t testing.TB) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

// FDs is a census of the process's open descriptors: how many refer to each
// file, named as /proc/self/fd shows it (a path, "socket:[inode]",
// "net:[inode]", "pipe:[inode]").
type FDs map[string]int

// Census takes the process's FDs. A descriptor closed while it is taken
// (another goroutine's, briefly open) is left out.
func Census(t testing.TB) FDs {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	fds := FDs{}
	for _, e := range ents {
		// ReadDir's own descriptor is closed by now: Readlink fails.
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			fds[target]++
		}
	}
	return fds
}

// Beyond returns the files fds holds more descriptors of than base does,
// once per descriptor more: what was opened since base and is still open.
// Unlike a difference of counts, it is blind to descriptors of base that
// have closed since (the runtime's and other goroutines' own come and go:
// the race detector's, a namespace briefly entered), which would hide as
// many new ones.
func (fds FDs) Beyond(base FDs) []string {
	var out []string
	for target, n := range fds {
		for range n - base[target] {
			out = append(out, target)
		}
	}
	slices.Sort(out)
	return out
}
