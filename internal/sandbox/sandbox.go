package sandbox

import (
	"fmt"
	"os"
	"sync/atomic"

	"github.com/sockmesh/sockmesh/internal/testenv"
)

// TB is the part of testing.TB that sandbox uses. *testing.T and *testing.B
// satisfy it; so can a benchmark program's own runner (test/bench), which
// cannot implement testing.TB.
type TB interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	TempDir() string
}

// seq numbers the objects this process creates. It is the one piece of
// package state: names must be unique across every test in the binary.
var seq atomic.Uint64

// Name returns a fresh name smt-<pid>-<n>, at most 15 bytes for n < 100 on
// any Linux pid (interface names allow 15).
func Name() string {
	return fmt.Sprintf("smt-%d-%d", os.Getpid(), seq.Add(1))
}

// requireRoot is testenv.RequireRoot for a TB.
func requireRoot(t TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root (netns, cgroups, bpffs)")
	}
}

// skipOrFail is testenv.SkipOrFail for a TB: a skip that fails in CI.
func skipOrFail(t TB, format string, args ...any) {
	t.Helper()
	if testenv.Required() {
		t.Fatalf("required in CI but unavailable: "+format, args...)
	}
	t.Skipf(format, args...)
}
