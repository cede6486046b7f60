package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// helperEnv names the helper a re-executed test binary runs (see Main).
const helperEnv = "SOCKMESH_SANDBOX_HELPER"

// Main is a TestMain body: in a child started from HelperCommand it runs the
// named helper (see RunHelper); in the test process itself it runs the
// tests.
//
//	func TestMain(m *testing.M) {
//		sandbox.Main(m, map[string]func(args []string) error{"load": loadHelper})
//	}
func Main(m *testing.M, helpers map[string]func(args []string) error) {
	RunHelper(helpers)
	os.Exit(m.Run())
}

// RunHelper returns at once in a process that HelperCommand did not start.
// In one it did, it runs the named helper with the process's arguments and
// exits: status 0 when the helper returns nil, 1 with the error on stderr
// otherwise, 2 for an unknown helper. Programs that are not tests (the
// benchmarks) call it first thing in main.
func RunHelper(helpers map[string]func(args []string) error) {
	name := os.Getenv(helperEnv)
	if name == "" {
		return
	}
	fn, ok := helpers[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "sandbox: no helper %q\n", name)
		os.Exit(2)
	}
	if err := fn(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox helper %s: %v\n", name, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// HelperCommand returns a command that re-executes the test binary as the
// helper name (registered with Main) with args. Start it with Start.
func HelperCommand(t TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), helperEnv+"="+name)
	return cmd
}

// Process is a child process started by Start.
type Process struct {
	Cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts cmd inside ns (nil: the test process's own netns) and cgroup
// cg (nil: the test process's own cgroup; otherwise the child is born there
// with CLONE_INTO_CGROUP, Linux 5.7). When t ends the process is killed, by
// its PID, if it still runs, and reaped.
func Start(t TB, cmd *exec.Cmd, ns *NetNS, cg *Cgroup) *Process {
	t.Helper()
	if cg != nil {
		dir, err := os.Open(cg.Path)
		if err != nil {
			t.Fatal(err)
		}
		defer dir.Close() // the child holds its own reference once started
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(dir.Fd())
	}
	start := cmd.Start
	if ns != nil {
		// The child inherits the netns of the thread that forks it.
		start = func() error { return ns.Do(cmd.Start) }
	}
	if err := start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("kill pid %d: %v", cmd.Process.Pid, err)
		}
		<-p.done
	})
	return p
}

// Wait waits for the process to exit and returns cmd.Wait's result.
func (p *Process) Wait() error {
	<-p.done
	return p.err
}
