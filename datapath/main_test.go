package datapath

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/internal/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Main(m, map[string]func([]string) error{"load": loadHelper})
}

// loaderJob is what the "load" helper process does: what a restarted agent
// would do before exiting.
type loaderJob struct {
	Config   Config
	Cookie   uint64
	Proxy    Proxy
	Services []Service
	// KilledAtRename has the kernel kill the loader at its first rename:
	// in Open, once it attached its programs, when it pins them.
	KilledAtRename bool
}

// runLoader runs job in a loader process — another agent that opens the
// datapath, applies job and exits — and waits for it.
func runLoader(t *testing.T, job loaderJob) {
	t.Helper()
	if _, stderr, err := execLoader(t, job); err != nil {
		t.Fatalf("loader process: %v\n%s", err, stderr)
	}
}

// runKilledLoader runs job in a loader process that the kernel kills at
// its first rename (KilledAtRename), and waits for it.
func runKilledLoader(t *testing.T, job loaderJob) {
	t.Helper()
	job.KilledAtRename = true
	state, stderr, err := execLoader(t, job)
	if ws, ok := state.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGSYS {
		t.Fatalf("loader process: %v, want it killed at its first rename (SIGSYS)\n%s", err, stderr)
	}
}

// execLoader runs job in a loader process and returns how it ended.
func execLoader(t *testing.T, job loaderJob) (state *os.ProcessState, stderr string, err error) {
	t.Helper()
	b, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	cmd := sandbox.HelperCommand(t, "load", string(b))
	cmd.Stderr = &buf
	err = sandbox.Start(t, cmd, nil, nil).Wait()
	return cmd.ProcessState, buf.String(), err
}

// loadHelper runs in a child process: it loads (or adopts) the datapath,
// configures it, and exits, leaving only the pins behind.
func loadHelper(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("want one JSON argument, got %d", len(args))
	}
	var job loaderJob
	if err := json.Unmarshal([]byte(args[0]), &job); err != nil {
		return err
	}
	if job.KilledAtRename {
		if err := killAtRename(); err != nil {
			return err
		}
	}
	d, err := Open(job.Config, nil, nil)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.SetServices(job.Services); err != nil {
		return err
	}
	if err := d.Enrol(job.Cookie, job.Proxy); err != nil {
		return err
	}
	return d.Heartbeat()
}

// killAtRename installs a seccomp filter, on every thread, under which the
// kernel kills the process when it calls renameat(2): a crash at a
// chosen point of Open without a hook in it.
func killAtRename() error {
	const nr = 0 // offset of seccomp_data.nr
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: nr},
		// Go's os.Rename calls renameat; cilium/ebpf's re-pin renameat2.
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_RENAMEAT, Jt: 2},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_RENAMEAT2, Jt: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_KILL_PROCESS},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
		uintptr(unsafe.Pointer(&prog)))
	if errno != 0 {
		return fmt.Errorf("install the seccomp filter: %w", errno)
	}
	return nil
}
