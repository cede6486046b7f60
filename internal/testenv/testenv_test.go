package testenv

import (
	"fmt"
	"runtime"
	"testing"
)

// recordTB records whether Fatalf or Skipf ended the test, and ends the
// goroutine there, as testing.T does.
type recordTB struct {
	ended string
}

func (r *recordTB) Helper() {}

func (r *recordTB) Fatalf(format string, args ...any) {
	r.ended = "fail: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recordTB) Skipf(format string, args ...any) {
	r.ended = "skip: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestSkipOrFail: a missing prerequisite skips on a developer's machine and
// fails in CI (CI=true, or SOCKMESH_REQUIRE_PRIVILEGED=1), where a skip
// would hide a privileged test that never ran.
func TestSkipOrFail(t *testing.T) {
	for _, tc := range []struct {
		ci, require string
		want        string
	}{
		{"", "", "skip: no netns"},
		{"false", "0", "skip: no netns"},
		{"true", "", "fail: required in CI but unavailable: no netns"},
		{"", "1", "fail: required in CI but unavailable: no netns"},
	} {
		t.Setenv("CI", tc.ci)
		t.Setenv("SOCKMESH_REQUIRE_PRIVILEGED", tc.require)
		r := &recordTB{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			SkipOrFail(r, "no %s", "netns")
		}()
		<-done
		if r.ended != tc.want {
			t.Errorf("CI=%q SOCKMESH_REQUIRE_PRIVILEGED=%q: SkipOrFail ended with %q, want %q", tc.ci, tc.require, r.ended, tc.want)
		}
	}
}
