package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/sandbox"
)

// TestProbe: the startup probe passes only on a 200 that names this
// process's container.
func TestProbe(t *testing.T) {
	self, err := containerID()
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	for _, tc := range []struct {
		name    string
		handler http.Handler
		wantErr string // "" for a pass
	}{
		{"this container's agent", namingContainer(self, ok), ""},
		{"another container's agent", namingContainer("mnt:[1]", ok), "answered by the agent of another container"},
		// An agent of a build before the header: another pod's, as far as
		// the probe can tell.
		{"an agent naming no container", ok, "answered by the agent of another container"},
		{"this container's agent failing", namingContainer(self, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		})), "503"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			err := probe(t.Context(), strings.TrimPrefix(srv.URL, "http://"))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("probe = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("probe = %v, want an error saying %q", err, tc.wantErr)
			}
		})
	}
}

// TestProbeTellsRollingAgentsApart is a rolling update's start as the
// kubelet probes it: the old agent answers on the node's health port, the
// new agent's container (a mount namespace of its own) starts, and its
// startup probe must fail until the new agent has taken the port over, and
// pass then; the old one's, run again, fails from then on. An HTTP probe
// passed on the old agent's answer, and the DaemonSet stopped the old agent
// while the new one did not serve yet.
func TestProbeTellsRollingAgentsApart(t *testing.T) {
	e := newEnv(t)
	// The old agent runs in this process's mount namespace, its container.
	old := e.startAgent(t, "--proxy-mode=node-ip", "--proxy-listen="+addrs.Node.String()+":0")
	if err := e.runProbe(t, old.Health, nil); err != nil {
		t.Fatalf("probe in the old agent's container, the only agent running: %v", err)
	}
	err := e.runProbe(t, old.Health, newMountNS)
	if err == nil || !strings.Contains(err.Error(), "answered by the agent of another container") {
		t.Fatalf("probe in a new container whose agent has not started, the old one answering: %v, want a failure naming another container's agent", err)
	}

	cmd := sandbox.HelperCommand(t, "sockmesh", e.agentArgs(t, "--proxy-mode=node-ip",
		"--proxy-listen="+addrs.Node.String()+":0", "--health-listen="+old.Health)...)
	cmd.SysProcAttr = newMountNS() // the next pod's container
	next := agentproc.Start(t, agentproc.Config{Name: "next agent", Cmd: cmd, NetNS: e.node, Cgroup: e.cg, Timeout: waitFor})
	if next.Health != old.Health {
		t.Fatalf("the next agent's health listener is %s, want the old one's, %s", next.Health, old.Health)
	}
	if err := e.runProbeIn(t, next.Process.Cmd.Process.Pid, old.Health); err != nil {
		t.Errorf("probe in the next agent's container, once it took the health port: %v", err)
	}
	if err := e.runProbe(t, old.Health, nil); err == nil || !strings.Contains(err.Error(), "answered by the agent of another container") {
		t.Errorf("probe in the old agent's container once the next agent took the health port over: %v, want a failure naming another container's agent", err)
	}
}

// newMountNS starts a process in a mount namespace of its own, as a
// container's.
func newMountNS() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
}

// runProbe runs `sockmesh probe --addr=addr` in the node's network
// namespace, in a process started with attr (nil: in this process's mount
// namespace), and returns its failure with its output.
func (e *env) runProbe(t *testing.T, addr string, attr func() *syscall.SysProcAttr) error {
	t.Helper()
	cmd := sandbox.HelperCommand(t, "sockmesh", "probe", "--addr="+addr)
	if attr != nil {
		cmd.SysProcAttr = attr()
	}
	return e.run(t, cmd)
}

// runProbeIn runs `sockmesh probe --addr=addr` in the node's network
// namespace and in the mount namespace of process pid, as the kubelet
// runs a probe in a container (nsenter: a Go process, threaded, cannot
// enter a mount namespace itself).
func (e *env) runProbeIn(t *testing.T, pid int, addr string) error {
	t.Helper()
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Fatalf("nsenter (util-linux): %v", err)
	}
	cmd := sandbox.HelperCommand(t, "sockmesh", "probe", "--addr="+addr)
	cmd.Args = append([]string{nsenter, fmt.Sprintf("--mount=/proc/%d/ns/mnt", pid), "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = nsenter
	return e.run(t, cmd)
}

// run runs cmd in the node's network namespace and returns its failure
// with its output.
func (e *env) run(t *testing.T, cmd *exec.Cmd) error {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := sandbox.Start(t, cmd, e.node, nil).Wait(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}
