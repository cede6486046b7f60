package node

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procRecord identifies a process across a crash of the process that
// started it: a PID alone may have been reused since.
type procRecord struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // field 22 of /proc/PID/stat, in clock ticks since boot
}

// startTime reads the start time of pid, or 0 if it does not exist or is
// a zombie (it has exited; only its parent's wait is missing, and after a
// crash that parent is an init that may be slow to reap).
func startTime(pid int) uint64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// alive reports whether the process r describes still runs.
func (r procRecord) alive() bool {
	return r.PID > 0 && r.Start != 0 && startTime(r.PID) == r.Start
}

// kill ends the process r describes, if it still runs: SIGTERM, then
// SIGKILL after grace. It is for processes of a crashed run, which are not
// our children, so it polls rather than waits.
func (r procRecord) kill(grace time.Duration) error {
	if !r.alive() {
		return nil
	}
	if err := syscall.Kill(r.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal pid %d: %w", r.PID, err)
	}
	deadline := time.Now().Add(grace)
	for r.alive() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if r.alive() {
		if err := syscall.Kill(r.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill pid %d: %w", r.PID, err)
		}
	}
	for i := 0; r.alive() && i < 100; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if r.alive() {
		return fmt.Errorf("pid %d survived SIGKILL", r.PID)
	}
	return nil
}

// proc is a component the node started: a child whose output goes to a log
// file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	rec     procRecord
	exited  chan struct{} // closed once the process has been waited for
	err     error         // Wait's result, valid once exited is closed
}

// startProc starts bin with args, its output appended to logDir/name.log.
func startProc(name, logDir, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", logPath, err)
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Pdeathsig: a test binary killed by its timeout takes its components
	// with it (containerd's shims survive; the next Up cleans them up). Its
	// own process group keeps a terminal's ^C from racing an orderly Down.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	p.rec = procRecord{PID: cmd.Process.Pid, Start: startTime(cmd.Process.Pid)}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop sends SIGTERM (by PID) and SIGKILL after grace.
func (p *proc) stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	<-p.exited
	return nil
}

// exitErr describes how the process ended, with the end of its log.
func (p *proc) exitErr() error {
	return fmt.Errorf("%s exited: %v\n%s", p.name, p.err, tail(p.logPath, 30))
}

// tail returns about the last n lines of the file at path.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
