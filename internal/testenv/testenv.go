// Package testenv decides what a test does when this machine lacks something
// it needs (root, eBPF, a built kube-apiserver): skip on a developer's machine
// that truly lacks it, fail in CI, where a skip would hide a broken test.
package testenv

import (
	"os"
	"testing"
)

// Required reports whether skips must become failures: in CI (CI=true) or
// when SOCKMESH_REQUIRE_PRIVILEGED=1.
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("SOCKMESH_REQUIRE_PRIVILEGED") == "1"
}

// SkipOrFail skips t with the reason, or fails it when Required.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf("required in CI but unavailable: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequireRoot skips or fails t unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "needs root (eBPF, netns, cgroups)")
	}
}
