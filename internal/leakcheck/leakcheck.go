// Package leakcheck fails a test whose goroutines outlive it: those running
// non-test code of the packages it names; and counts open file descriptors
// for tests that check none are left. It is for tests only.
package leakcheck

import (
	"os"
	"runtime"
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
