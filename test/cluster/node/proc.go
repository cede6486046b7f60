package node

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/test/childproc"
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

// recordOf identifies p across a crash of this process.
func recordOf(p *childproc.Process) procRecord {
	return procRecord{PID: p.Cmd.Process.Pid, Start: startTime(p.Cmd.Process.Pid)}
}
