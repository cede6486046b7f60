package main

import (
	"testing"

	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/sandbox"
)

// TestAgentServesUntilANewerOneIsReady: with --handover-wait, an agent told
// to stop while no newer agent is ready on its node (a deleted pod whose
// replacement is still starting) serves on: a request to the fail-closed
// Service is answered in TLS through it after the signal, where the agent
// used to close its proxy's listener at once and the request was refused.
// It stops, status 0, once the newer agent, in another container, is ready.
func TestAgentServesUntilANewerOneIsReady(t *testing.T) {
	e := newEnv(t)
	old := e.startAgent(t, "--proxy-listen="+addrs.Node.String()+":0", "--handover-wait=10m")
	old.waitReady(t)
	proxy := old.logged(t, "proxy listener", agentproc.Listening("proxy")).Str("addr")
	stopped := make(chan error, 1)
	go func() { stopped <- old.Stop() }()
	old.logged(t, "the handover's start", msgIs("serving until a newer agent is ready"))
	checkTLSOriginated(t, e.get(t, "/after-the-signal"))

	// The next pod's container: agents tell each other apart by it.
	cmd := sandbox.HelperCommand(t, "sockmesh", e.agentArgs(t, "--proxy-listen="+proxy, "--health-listen="+old.Health, "--handover-wait=10m")...)
	cmd.SysProcAttr = newMountNS()
	next := &agentRun{Agent: agentproc.Start(t, agentproc.Config{Name: "next agent", Cmd: cmd, NetNS: e.node, Cgroup: e.cg, Timeout: waitFor})}
	next.waitReady(t)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if r := old.logged(t, "handed over", msgIs("handed over")); r.Str("reason") != "a newer agent is ready" {
		t.Errorf("the old agent handed over because %q, want because a newer agent is ready", r.Str("reason"))
	}
	checkTLSOriginated(t, e.get(t, "/to-the-newer-agent"))
}

// TestAgentHandoverEnds: with no newer agent coming, an agent told to stop
// serves on until `sockmesh uninstall` removed capture from the node (no
// connection is redirected to it any more), or until --handover-wait has
// passed, then stops with status 0.
func TestAgentHandoverEnds(t *testing.T) {
	t.Run("capture removed", func(t *testing.T) {
		e := newEnv(t)
		a := e.startAgent(t, "--proxy-listen="+addrs.Node.String()+":0", "--handover-wait=10m")
		a.waitReady(t)
		stopped := make(chan error, 1)
		go func() { stopped <- a.Stop() }()
		a.logged(t, "the handover's start", msgIs("serving until a newer agent is ready"))
		if out, err := sandbox.HelperCommand(t, "sockmesh", "uninstall", "--bpffs="+e.bpffs, "--force").CombinedOutput(); err != nil {
			t.Fatalf("sockmesh uninstall --force: %v\n%s", err, out)
		}
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
		if r := a.logged(t, "handed over", msgIs("handed over")); r.Str("reason") != "capture removed from the node" {
			t.Errorf("the agent stopped serving because %q, want because capture was removed", r.Str("reason"))
		}
	})
	t.Run("wait over", func(t *testing.T) {
		e := newEnv(t)
		a := e.startAgent(t, "--proxy-listen="+addrs.Node.String()+":0", "--handover-wait=1s")
		a.waitReady(t)
		a.stop(t)
		a.logged(t, "the end of the wait", msgIs("no newer agent ready: stopping"))
	})
}

// msgIs matches a record by its message.
func msgIs(msg string) func(agentproc.Record) bool {
	return func(r agentproc.Record) bool { return r.Msg() == msg }
}
