package childproc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Process is a started child whose output goes to a log file.
type Process struct {
	// Name names the process in errors.
	Name string
	// Cmd is the started command; Cmd.Process.Pid is its PID.
	Cmd *exec.Cmd
	// LogPath is the file its stdout and stderr are appended to.
	LogPath string

	exited chan struct{}
	err    error // Wait's result, valid once exited is closed
}

// Start starts bin with args, its output appended to logPath (created if
// absent: a restarted component continues its predecessor's log).
func Start(name, logPath, bin string, args ...string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", logPath, err)
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, LogPath: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Exited is closed once the process has exited and been waited for.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitErr describes how the process ended, with the end of its log. Call
// it once Exited is closed.
func (p *Process) ExitErr() error {
	return fmt.Errorf("%s exited: %v\n%s", p.Name, p.err, Tail(p.LogPath, 30))
}

// Stop sends SIGTERM (by PID) and SIGKILL after grace, and returns once the
// process has been waited for. Stopping an exited process does nothing.
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s: %w", p.Name, err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	if err := p.Cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", p.Name, err)
	}
	<-p.exited
	return nil
}

// Tail returns about the last n lines of the file at path, or why it could
// not be read: it is for failure messages.
func Tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	return string(bytes.Join(lines[max(0, len(lines)-n):], []byte("\n")))
}
