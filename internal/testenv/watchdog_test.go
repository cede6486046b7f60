package testenv

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	Watchdog()
	os.Exit(m.Run())
}

// hangEnv makes TestWatchdog, in the test binary it runs, the test that
// hangs.
const hangEnv = "SOCKMESH_TESTENV_HANG"

// TestWatchdog: a test binary whose test hangs past most of its
// -test.timeout exits 2 with the hung test's name, its wait and the
// watchdog's header among the last lines of its output, where a log kept
// by its tail still shows them.
func TestWatchdog(t *testing.T) {
	if os.Getenv(hangEnv) == "1" {
		select {} // until the watchdog ends the binary
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWatchdog$", "-test.timeout=2s")
	cmd.Env = append(os.Environ(), hangEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("hung test binary: %v, want exit status 2; output:\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	tail := strings.Join(lines[max(0, len(lines)-3):], "\n")
	if !strings.Contains(tail, "testenv: tests still running") || !strings.Contains(tail, "testenv.TestWatchdog goroutine ") ||
		!strings.Contains(tail, "[select (no cases)") {
		t.Errorf("the output's last lines:\n%s\nwant the watchdog's header and TestWatchdog with its wait", tail)
	}
	if !strings.Contains(string(out), "testenv: -test.timeout 2s nearly over") || strings.Contains(string(out), "panic: test timed out") {
		t.Errorf("output:\n%s\nwant the watchdog's report before testing's own timeout", out)
	}
}
