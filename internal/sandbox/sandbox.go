package sandbox

import (
	"fmt"
	"os"
	"sync/atomic"
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
