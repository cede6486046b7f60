package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
)

// TestAgentStopWhileStarting: SIGTERM at each phase of the agent's start
// (before its health listener, before and after the datapath opens, with
// the proxy listening, in the API server's discovery) is a clean stop:
// status 0, "stopped while starting" logged, and nothing left behind that
// a normal stop would not leave (its pins, or none if the datapath had not
// opened; no introspection socket). The API server accepts connections and
// never answers (hung, or cut off by a partition), so the agent can never
// get past discovery: whenever the signal lands after its phase's record,
// the agent is still starting. A real failure at start still fails.
func TestAgentStopWhileStarting(t *testing.T) {
	// What a normal stop leaves: the agent served, then got SIGTERM.
	var served leftovers
	t.Run("served", func(t *testing.T) {
		e := newEnv(t)
		none := leftoversOf(t, e) // what a fresh bpffs holds: the kernel's own files
		a := e.startAgent(t, "--proxy-listen="+addrs.Node.String()+":0")
		a.waitReady(t)
		a.stop(t)
		a.logged(t, `"stopped"`, func(r agentproc.Record) bool { return r.Msg() == msgStopped })
		served = leftoversOf(t, e)
		if len(served.pins) <= len(none.pins) || served.attached == 0 {
			t.Fatalf("a normal stop left %+v, want capture pinned and attached", served)
		}
	})

	for _, phase := range []struct {
		name string
		at   func(agentproc.Record) bool // nil: when discovery's request arrives
	}{
		{"before the health listener", func(r agentproc.Record) bool { return r.Msg() == "starting" }},
		{"before the datapath opens", agentproc.Listening("health")},
		{"datapath open", func(r agentproc.Record) bool { return r.Msg() == "datapath ready" }},
		{"proxy listening", agentproc.Listening("proxy")},
		{"in discovery", nil},
	} {
		t.Run(phase.name, func(t *testing.T) {
			e := newEnv(t)
			none := leftoversOf(t, e) // what the fresh bpffs holds
			kubeconfig, requested := hungAPIServer(t, e)
			sock := filepath.Join(t.TempDir(), "agent.sock")
			a := e.startRaw(t, "--source=kubernetes", "--kubeconfig="+kubeconfig,
				"--proxy-listen="+addrs.Node.String()+":0", "--introspection-socket="+sock)
			if phase.at != nil {
				if _, err := a.Wait(phase.at); err != nil {
					t.Fatalf("agent never reached %s: %v", phase.name, err)
				}
			} else {
				select {
				case <-requested:
				case <-a.exited:
					t.Fatalf("agent exited before it asked the API server: %v", a.Process.Wait())
				}
			}
			if err := a.Process.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := a.exit(); err != nil {
				t.Fatalf("agent stopped while starting: %v, want status 0", err)
			}
			if _, err := a.Wait(func(r agentproc.Record) bool {
				return r.Msg() == msgStoppedStarting && strings.Contains(r.Str("reason"), "terminated")
			}); err != nil {
				t.Errorf("no %q record naming SIGTERM: %v", msgStoppedStarting, err)
			}
			if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("introspection socket after the stop: %v, want it gone", err)
			}
			got := leftoversOf(t, e)
			if !slices.Equal(got.pins, served.pins) && !slices.Equal(got.pins, none.pins) ||
				got.attached != served.attached && got.attached != none.attached {
				t.Errorf("stopped while starting, the agent left %+v; want what a normal stop leaves, %+v, or nothing", got, served)
			}
		})
	}

	// A start that fails for a reason of its own still fails: here the
	// proxy's address is held by a socket that does not share it.
	t.Run("failure", func(t *testing.T) {
		e := newEnv(t)
		var held net.Listener
		if err := e.node.Do(func() (err error) {
			held, err = net.Listen("tcp", addrs.Node.String()+":0")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		a := e.startRaw(t, "--proxy-listen="+held.Addr().String())
		var exit *exec.ExitError
		if err := a.exit(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Fatalf("agent whose proxy address is taken: %v, want exit status 1\n%s", err, a.Tail(0))
		}
		if tail := a.Tail(0); !strings.Contains(tail, "proxy listener") || strings.Contains(tail, msgStoppedStarting) {
			t.Errorf("agent whose proxy address is taken logged:\n%s\nwant the proxy listener's error, not a stop", tail)
		}
	})
}

// rawAgent is an agent started without waiting for any record.
type rawAgent struct {
	*agentproc.Log
	Process *sandbox.Process
	exited  chan struct{}
}

// startRaw runs `sockmesh agent` as startAgent does, but returns at once:
// its first records may be what a test waits for.
func (e *env) startRaw(t *testing.T, args ...string) *rawAgent {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := sandbox.HelperCommand(t, "sockmesh", e.agentArgs(t, args...)...)
	cmd.Stdout, cmd.Stderr = w, w
	a := &rawAgent{Log: agentproc.NewLog(r, 0, waitFor), exited: make(chan struct{})}
	a.Process = sandbox.Start(t, cmd, e.node, e.cg)
	go func() {
		a.Process.Wait()
		w.Close() // the log ends
		close(a.exited)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Tail(0))
		}
	})
	return a
}

// exit waits for the agent to exit and for its log to end, and returns
// how it exited.
func (a *rawAgent) exit() error {
	err := a.Process.Wait()
	a.Wait(func(agentproc.Record) bool { return false }) // returns at the log's end
	return err
}

// hungAPIServer serves, in the node's netns, an API server that accepts
// connections, reads requests and never answers. It returns a kubeconfig
// naming it, and a channel closed once the first request arrived.
func hungAPIServer(t *testing.T, e *env) (kubeconfig string, requested <-chan struct{}) {
	t.Helper()
	var ln net.Listener
	if err := e.node.Do(func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	req := make(chan struct{})
	var once sync.Once
	tcpserve.Serve(t, ln, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			once.Do(func() { close(req) })
		}
		io.Copy(io.Discard, c) // open and unanswered until the test ends
	})
	kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: hung, cluster: {server: "http://%s"}}]
users: [{name: agent, user: {}}]
contexts: [{name: hung, context: {cluster: hung, user: agent}}]
current-context: hung
`, ln.Addr())
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, req
}

// leftovers are what an agent left once it exited: the files under its
// bpffs and the programs attached on its hooks.
type leftovers struct {
	pins     []string
	attached int
}

func leftoversOf(t *testing.T, e *env) leftovers {
	t.Helper()
	var l leftovers
	err := filepath.WalkDir(e.bpffs, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == e.bpffs {
			return err
		}
		rel, _ := filepath.Rel(e.bpffs, path)
		l.pins = append(l.pins, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	l.attached = attachedPrograms(t, e.cg.Path)
	return l
}

// TestAgentBadFlagOpensNothing: a flag the agent cannot use, here an
// --introspection-group that names no group, fails the start before
// anything opens: no listener, no pin, no program attached. The group was
// looked up only when the introspection socket opened, after the datapath.
func TestAgentBadFlagOpensNothing(t *testing.T) {
	e := newEnv(t)
	none := leftoversOf(t, e)
	a := e.startRaw(t, "--proxy-listen="+addrs.Node.String()+":0", "--introspection-group=sockmesh-no-such-group")
	var exit *exec.ExitError
	if err := a.exit(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("agent with an unknown --introspection-group: %v, want exit status 1", err)
	}
	if tail := a.Tail(0); !strings.Contains(tail, `--introspection-group="sockmesh-no-such-group"`) {
		t.Errorf("agent with an unknown --introspection-group logged:\n%s\nwant an error naming the flag", tail)
	}
	if n := a.Count(func(r agentproc.Record) bool { return r.Msg() == "listening" }); n != 0 {
		t.Errorf("agent with an unknown --introspection-group opened %d listeners before it failed", n)
	}
	if got := leftoversOf(t, e); !slices.Equal(got.pins, none.pins) || got.attached != none.attached {
		t.Errorf("agent with an unknown --introspection-group left %+v; want what was there before, %+v", got, none)
	}
}
