package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

// TestHealthNotTakenOverFailsTheStart: an agent that cannot take its
// health address over fails its start, before it opens the datapath. In a
// rolling update the kubelet's probes of its pod would otherwise reach the
// agent it replaces too, whose /readyz could make the new pod ready before
// this agent serves. The takeover fails here as it would without the
// capabilities to load its steering program (setpriv drops them).
func TestHealthNotTakenOverFailsTheStart(t *testing.T) {
	e := newEnv(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testenv.SkipOrFail(t, "setpriv (util-linux) drops the capabilities: %v", err)
	}
	cmd := sandbox.HelperCommand(t, "sockmesh", e.agentArgs(t, "--proxy-listen="+addrs.Node.String()+":0")...)
	cmd.Args = append([]string{setpriv, "--bounding-set=-bpf,-sys_admin,-perfmon", "--inh-caps=-all", "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = setpriv
	err = e.run(t, cmd)
	if err == nil || !strings.Contains(err.Error(), "health listener: take over") {
		t.Fatalf("agent without the capabilities to take its health address over: %v, want its start to fail naming the health listener's takeover", err)
	}
	if strings.Contains(err.Error(), "datapath ready") {
		t.Errorf("the agent opened the datapath before it failed: %v", err)
	}
}
