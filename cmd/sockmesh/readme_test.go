package main

import (
	"bufio"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/internal/agentproc"
)

// TestREADMEClusterExample: the README's in-cluster command line starts an
// agent as written, also where no pod's environment gives it
// $POD_NAMESPACE (a node's shell, a developer's machine).
func TestREADMEClusterExample(t *testing.T) {
	env := map[string]string{"NODE_NAME": "node-a"}
	args := readmeAgentLine(t, "in a cluster")
	expanded := os.Expand(args, func(k string) string { return env[k] })
	if _, err := parse(t, env, "", strings.Fields(expanded)...); err != nil {
		t.Errorf("README's in-cluster example %q: %v", args, err)
	}
}

// TestREADMEFileExample: the README's command line for a directory of
// manifests, DIR and IP filled in, runs an agent that serves: a plaintext
// request to a Service with a BackendTLSPolicy reaches the backend in TLS
// through the proxy on IP:15001. The harness adds only where this test's
// agent pins, attaches and logs.
func TestREADMEFileExample(t *testing.T) {
	e := newEnv(t)
	var args []string
	listen := netip.AddrPortFrom(addrs.Node, defaultProxyPort) // where the proxy listens
	for _, arg := range strings.Fields(readmeAgentLine(t, "a directory of manifests")) {
		flag, value, _ := strings.Cut(arg, "=")
		if value == "DIR" {
			value = e.manifests
		} else if port, ok := strings.CutPrefix(value, "IP:"); ok {
			value = addrs.Node.String() + ":" + port
			listen = netip.MustParseAddrPort(value)
		}
		args = append(args, flag+"="+value)
	}
	a := e.startAgent(t, args...)
	if got := a.logged(t, "proxy listener", agentproc.Listening("proxy")).Str("addr"); got != listen.String() {
		t.Errorf("the README's agent listens on %s, want %s", got, listen)
	}
	a.waitReady(t)
	checkTLSOriginated(t, e.get(t, "/readme"))
	a.stop(t)
}

// readmeAgentLine returns the arguments of the README's `sockmesh agent`
// command line commented with comment.
func readmeAgentLine(t *testing.T, comment string) string {
	t.Helper()
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cmd, c, ok := strings.Cut(sc.Text(), "#")
		if !ok || strings.TrimSpace(c) != comment {
			continue
		}
		args, ok := strings.CutPrefix(strings.TrimSpace(cmd), "sockmesh agent ")
		if !ok {
			t.Fatalf("README's line commented %q, %q: not a sockmesh agent command", comment, cmd)
		}
		return args
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("README has no command line commented %q", comment)
	return ""
}
