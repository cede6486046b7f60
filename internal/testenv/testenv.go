// Package testenv decides what a test does when this machine lacks something
// it needs (root, eBPF, a built kube-apiserver): skip on a developer's machine
// that truly lacks it, fail in CI, where a skip would hide a broken test.
package testenv

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
)

// Required reports whether skips must become failures: in CI (CI=true) or
// when SOCKMESH_REQUIRE_PRIVILEGED=1.
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("SOCKMESH_REQUIRE_PRIVILEGED") == "1"
}

// TB is the part of testing.TB that SkipOrFail and RequireRoot use, so
// that a benchmark program's own runner (test/bench, through
// internal/sandbox), which cannot implement testing.TB, can pass itself.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

// SkipOrFail skips t with the reason, or fails it when Required.
func SkipOrFail(t TB, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf("required in CI but unavailable: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequireRoot skips or fails t unless it runs as root.
func RequireRoot(t TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "needs root (eBPF, netns, cgroups)")
	}
}

// MainWithGODEBUG runs m's tests in a process whose GODEBUG holds setting
// ("name=value"), re-executing the test binary with it added when it does
// not: the runtime and the standard library read GODEBUG once, at init.
// Its tests run under the Watchdog.
func MainWithGODEBUG(m *testing.M, setting string) {
	if g := os.Getenv("GODEBUG"); !strings.Contains(g, setting) {
		if g != "" {
			g += ","
		}
		env := append(os.Environ(), "GODEBUG="+g+setting)
		exe, err := os.Executable()
		if err == nil {
			err = syscall.Exec(exe, os.Args, env)
		}
		fmt.Fprintf(os.Stderr, "re-exec with GODEBUG=%s: %v\n", setting, err)
		os.Exit(2)
	}
	Watchdog()
	os.Exit(m.Run())
}
