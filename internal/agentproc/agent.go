package agentproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/internal/nshttp"
	"github.com/sockmesh/sockmesh/internal/sandbox"
)

// Config says how to run one agent.
type Config struct {
	// Name names the agent in messages (its node, where a test runs
	// several); empty is "agent".
	Name string
	// Cmd is the agent command, not yet started: the built binary or the
	// test binary re-executed (sandbox.HelperCommand), with
	// --log-format=json and a --health-listen. Start sets its Stdout and
	// Stderr.
	Cmd *exec.Cmd
	// NetNS is where the agent runs; nil is the caller's own namespace.
	NetNS *sandbox.NetNS
	// Cgroup is where the agent is born; nil is the caller's own cgroup.
	Cgroup *sandbox.Cgroup
	// Copy also receives the log as the agent writes it; nil: nothing does.
	Copy io.Writer
	// KeepLines bounds the log lines kept for Tail and for the failure
	// message; zero keeps every line.
	KeepLines int
	// FailureLines is how many of the last log lines are logged when the
	// test failed; zero logs every line kept.
	FailureLines int
	// Timeout bounds every wait (the health listener, readiness, a report,
	// the exit after SIGTERM); zero is 30 seconds. No result depends on it:
	// it only keeps a broken agent from hanging the caller.
	Timeout time.Duration
}

// Agent is one running agent process.
type Agent struct {
	// Process is the agent's process (its PID: Process.Cmd.Process.Pid).
	Process *sandbox.Process
	// Log is what the agent logged.
	Log *Log
	// Health is the host:port of /healthz and /readyz, in the agent's
	// network namespace.
	Health string

	name    string
	ns      *sandbox.NetNS
	timeout time.Duration
	exited  chan struct{}
	stop    sync.Once
	stopErr error
}

// failureLogger is what Start needs of t to log the agent's log when the
// test failed: *testing.T has it; the demo's runner does not (its errors
// carry the log's tail).
type failureLogger interface {
	Failed() bool
	Logf(format string, args ...any)
}

// Start runs the agent (sandbox kills it when t ends, if it still runs)
// and waits until it logged its health listener.
func Start(t sandbox.TB, cfg Config) *Agent {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Name == "" {
		cfg.Name = "agent"
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Cmd.Stdout, cfg.Cmd.Stderr = w, w
	if cfg.Copy != nil {
		cfg.Cmd.Stdout = io.MultiWriter(w, cfg.Copy)
		cfg.Cmd.Stderr = cfg.Cmd.Stdout
	}
	a := &Agent{Log: NewLog(r, cfg.KeepLines, cfg.Timeout), name: cfg.Name, ns: cfg.NetNS, timeout: cfg.Timeout, exited: make(chan struct{})}
	if fl, ok := t.(failureLogger); ok {
		t.Cleanup(func() {
			if fl.Failed() {
				fl.Logf("%s log (reports left out):\n%s", a.name, a.Log.Tail(cfg.FailureLines))
			}
		})
	}
	a.Process = sandbox.Start(t, cfg.Cmd, cfg.NetNS, cfg.Cgroup)
	go func() {
		a.Process.Wait()
		// Only now: with Copy, exec copies into w until the agent exits.
		// The log ends when w, the agent's and ours, is closed.
		w.Close()
		close(a.exited)
	}()
	rec, err := a.Log.Wait(Listening("health"))
	if err != nil {
		t.Fatalf("%s health listener: %v\n%s", cfg.Name, err, a.Log.Tail(50))
	}
	a.Health = rec.Str("addr")
	return a
}

// Exited is closed once the agent has exited.
func (a *Agent) Exited() <-chan struct{} { return a.exited }

// WaitReady polls /readyz until it answers 200 and returns its body. It
// fails when the agent exits, ctx ends or the timeout passes.
func (a *Agent) WaitReady(ctx context.Context) (string, error) {
	c := nshttp.Client(a.ns, 5*time.Second)
	deadline := time.After(a.timeout)
	for {
		var last string
		resp, err := c.Get("http://" + a.Health + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return string(body), nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		select {
		case <-a.exited:
			return "", fmt.Errorf("%s exited before it was ready: %v\n%s", a.name, a.Process.Wait(), a.Log.Tail(50))
		case <-ctx.Done():
			return "", fmt.Errorf("wait for %s /readyz: %w", a.name, context.Cause(ctx))
		case <-deadline:
			return "", fmt.Errorf("%s not ready after %s; /readyz: %s\n%s", a.name, a.timeout, last, a.Log.Tail(50))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Report asks the agent for its introspection report (SIGUSR1) and decodes
// the first one it logs after the request.
func (a *Agent) Report() (introspect.Report, error) {
	var rep introspect.Report
	seen := a.Log.reportCount()
	if err := a.Process.Cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		return rep, fmt.Errorf("ask %s for a report: %w", a.name, err)
	}
	raw, err := a.Log.waitReport(seen)
	if err != nil {
		return rep, fmt.Errorf("%s: %w", a.name, err)
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		return rep, fmt.Errorf("decode the introspection report of %s: %w", a.name, err)
	}
	return rep, nil
}

// Stop sends SIGTERM and waits for the agent to drain and exit; it fails
// unless the agent exits, with status 0, within the timeout. Later calls
// return the first call's result.
func (a *Agent) Stop() error {
	a.stop.Do(func() {
		if err := a.Process.Cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			a.stopErr = fmt.Errorf("stop %s: %w", a.name, err)
			return
		}
		select {
		case <-a.exited:
		case <-time.After(a.timeout):
			a.stopErr = fmt.Errorf("%s still running %s after SIGTERM\n%s", a.name, a.timeout, a.Log.Tail(30))
			return
		}
		if err := a.Process.Wait(); err != nil {
			a.stopErr = fmt.Errorf("%s exit after SIGTERM: %w\n%s", a.name, err, a.Log.Tail(30))
		}
	})
	return a.stopErr
}
