package datapath

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
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
	// KilledTakingBack: once it applied the job the loader waits for its
	// stdin to close, then heartbeats with KilledAtRename: a take-back,
	// were another agent to open the datapath and exit meanwhile, killed
	// once its programs run the links again, when it pins them.
	KilledTakingBack bool
}

// runLoader runs job in a loader process — another agent that opens the
// datapath, applies job and exits — and waits for it.
func runLoader(t *testing.T, job loaderJob) {
	t.Helper()
	cmd, stderr := loaderCommand(t, job)
	if err := sandbox.Start(t, cmd, nil, nil).Wait(); err != nil {
		t.Fatalf("loader process: %v\n%s", err, stderr)
	}
}

// runKilledLoader runs job in a loader process that the kernel kills at
// its first rename (KilledAtRename), and waits for it.
func runKilledLoader(t *testing.T, job loaderJob) {
	t.Helper()
	job.KilledAtRename = true
	cmd, stderr := loaderCommand(t, job)
	wantKilled(t, cmd, sandbox.Start(t, cmd, nil, nil).Wait(), stderr)
}

// runKilledTakingBack runs job in a loader process (KilledTakingBack),
// runs meanwhile once the loader has applied it, then lets the loader
// heartbeat and waits for the kernel to kill it.
func runKilledTakingBack(t *testing.T, job loaderJob, meanwhile func()) {
	t.Helper()
	job.KilledTakingBack = true
	cmd, stderr := loaderCommand(t, job)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := sandbox.Start(t, cmd, nil, nil)
	if _, err := bufio.NewReader(stdout).ReadString('\n'); err != nil {
		t.Fatalf("loader process: %v before it applied its job\n%s", p.Wait(), stderr)
	}
	meanwhile()
	stdin.Close()
	wantKilled(t, cmd, p.Wait(), stderr)
}

// wantKilled checks that the loader cmd, which ended with err, was killed
// at a rename (SIGSYS).
func wantKilled(t *testing.T, cmd *exec.Cmd, err error, stderr *bytes.Buffer) {
	t.Helper()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGSYS {
		t.Fatalf("loader process: %v, want it killed at its first rename (SIGSYS)\n%s", err, stderr)
	}
}

// loaderCommand returns the command of a loader process that runs job, and
// the buffer its stderr goes to.
func loaderCommand(t *testing.T, job loaderJob) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	b, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	cmd := sandbox.HelperCommand(t, "load", string(b))
	cmd.Stderr = &buf
	return cmd, &buf
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
	if err := d.Heartbeat(); err != nil || !job.KilledTakingBack {
		return err
	}
	fmt.Println("applied")
	if _, err := io.Copy(io.Discard, os.Stdin); err != nil {
		return err
	}
	if err := killAtRename(); err != nil {
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
