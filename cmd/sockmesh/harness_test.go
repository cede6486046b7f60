package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/nodetopo"
	"github.com/sockmesh/sockmesh/internal/nshttp"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/test/pki"
)

// TestMain lets the tests run this package's command as a child process:
// the test binary re-executed as `sockmesh ARGS` (sandbox.HelperCommand),
// which runs the same main code a built binary runs.
func TestMain(m *testing.M) {
	sandbox.Main(m, map[string]func(args []string) error{
		"sockmesh": func(args []string) error {
			cmd := newRootCommand(os.Getenv)
			cmd.SetArgs(args)
			return cmd.Execute()
		},
	})
}

// The test's node (internal/nodetopo): a "node" netns where the agent runs,
// a client pod and a backend pod, each on a veth to the node.
// 10.232.0.0/16 belongs to these tests alone in this repository, so
// concurrent tests cannot make a pod address ambiguous.
var (
	addrs = nodetopo.Plan(232)
	// vip exists nowhere: only a redirect reaches it.
	vip = netip.MustParseAddrPort("10.96.232.10:80")
)

const (
	serverName  = "secure.app.svc"
	backendPort = 8443
	testNode    = "test-node"
	// waitFor bounds every wait: no result depends on it, it only keeps a
	// broken agent from hanging the test.
	waitFor = 30 * time.Second
)

// env is one test's machine: namespaces, cgroup, bpffs, a TLS echo
// backend and the manifests directory.
type env struct {
	node, client, backend *sandbox.NetNS
	cg                    *sandbox.Cgroup
	bpffs, manifests      string
	clientCookie          uint64
	// backendConns counts connections the backend accepted.
	backendConns atomic.Int64
}

func newEnv(t *testing.T) *env {
	t.Helper()
	testenv.RequireRoot(t)
	topo := nodetopo.New(t, addrs)
	e := &env{node: topo.Node, client: topo.Client, backend: topo.Backend}
	var err error
	if e.clientCookie, err = e.client.Cookie(); err != nil {
		t.Fatal(err)
	}

	ca, err := pki.NewCA("sockmesh agent test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "secure", DNSNames: []string{serverName}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := e.backend.Listen(context.Background(), nil, "tcp", netip.AddrPortFrom(addrs.Backend.Addr(), backendPort).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := echo.New(echo.Config{Namespace: "app", Pod: "secure-0", TLS: &tls.Config{Certificates: []tls.Certificate{leaf.TLS}}})
	go srv.Serve(&countingListener{Listener: ln, n: &e.backendConns})
	t.Cleanup(func() { srv.Close() })

	e.manifests = filepath.Join(t.TempDir(), "manifests")
	if err := os.Mkdir(e.manifests, 0o700); err != nil {
		t.Fatal(err)
	}
	e.writeFile(t, "client.yaml", fmt.Sprintf(clientYAML, testNode, addrs.Client.Addr(), addrs.Client.Addr()))
	e.writeFile(t, "secure.yaml", fmt.Sprintf(secureYAML, vip.Addr(), vip.Addr(), vip.Port(), backendPort,
		backendPort, addrs.Backend.Addr(), indent(string(ca.CertPEM), "    "), serverName))

	// This process's sockets are the client's: it joins the cgroup the
	// programs attach to, where the agent is born too.
	e.cg = sandbox.NewCgroup(t)
	e.cg.Enter(t)
	e.bpffs = sandbox.TempBPFFS(t)
	return e
}

const clientYAML = `apiVersion: v1
kind: Pod
metadata: {name: client, namespace: app, uid: 00000000-0000-4000-8000-0000000000c1}
spec:
  nodeName: %s
  containers: [{name: app, image: app}]
status: {phase: Running, podIP: %s, podIPs: [{ip: %s}]}
`

const secureYAML = `apiVersion: v1
kind: Namespace
metadata: {name: app}
---
apiVersion: v1
kind: Service
metadata: {name: secure, namespace: app}
spec:
  clusterIP: %s
  clusterIPs: [%s]
  ports: [{name: http, port: %d, targetPort: %d, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: secure-1, namespace: app, labels: {kubernetes.io/service-name: secure}}
addressType: IPv4
ports: [{name: http, port: %d, protocol: TCP}]
endpoints:
- addresses: [%s]
  conditions: {ready: true, serving: true}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: secure-ca, namespace: app}
data:
  ca.crt: |
%s
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: secure, namespace: app}
spec:
  targetRefs: [{group: "", kind: Service, name: secure}]
  validation:
    hostname: %s
    caCertificateRefs: [{group: "", kind: ConfigMap, name: secure-ca}]
`

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix)
}

func (e *env) writeFile(t *testing.T, name, content string) {
	t.Helper()
	// Write beside and rename: the file source must never read half a file.
	tmp := filepath.Join(e.manifests, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(e.manifests, name)); err != nil {
		t.Fatal(err)
	}
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// agentRun is one agent process and what it logged.
type agentRun struct {
	*agentproc.Agent
	metrics string // host:port of /metrics, in the node netns
}

// startAgent runs `sockmesh agent` in the node netns and the test cgroup
// with the file source on e.manifests (unless args name a --source), and
// waits until it logged its listeners.
func (e *env) startAgent(t *testing.T, args ...string) *agentRun {
	t.Helper()
	a := &agentRun{Agent: agentproc.Start(t, agentproc.Config{
		Cmd: sandbox.HelperCommand(t, "sockmesh", e.agentArgs(t, args...)...), NetNS: e.node, Cgroup: e.cg, Timeout: waitFor,
	})}
	a.metrics = a.logged(t, "metrics listener", agentproc.Listening("metrics")).Str("addr")
	return a
}

// agentArgs are the arguments of `sockmesh agent` in e: args, after e's
// bpffs, cgroup and ports the kernel picks, the file source on e.manifests
// unless args name a --source, and a socket of its own unless they name an
// --introspection-socket.
func (e *env) agentArgs(t *testing.T, args ...string) []string {
	t.Helper()
	names := func(flag string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, flag+"=") })
	}
	if !names("--source") {
		args = append([]string{"--source=file", "--manifests=" + e.manifests}, args...)
	}
	if !names("--introspection-socket") {
		args = append(args, "--introspection-socket="+filepath.Join(t.TempDir(), "agent.sock"))
	}
	return append([]string{"agent",
		"--node-name=" + testNode,
		"--health-listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
		"--bpffs=" + e.bpffs, "--cgroup=" + e.cg.Path,
		"--log-format=json", "--drain-timeout=10s",
	}, args...)
}

// logged returns the first record that matches, waiting for it until the
// agent's log ends or waitFor passes.
func (a *agentRun) logged(t *testing.T, what string, match func(agentproc.Record) bool) agentproc.Record {
	t.Helper()
	r, err := a.Log.Wait(match)
	if err != nil {
		t.Fatalf("agent never logged %s: %v", what, err)
	}
	return r
}

// waitReady polls /readyz until it answers 200 and returns its body, once
// it checked what the requests that follow need of the agent beyond
// readiness, which promises the first Snapshot applied (one built from
// every manifest newEnv wrote before the agent started), not every pod
// enrolled: that Snapshot captures vip, and the client pod is enrolled. Its
// namespace existed before the agent started, so the first apply found
// it, unless its address is held by another namespace too, which the
// agent says; a request would only time out dialing an address nothing
// serves.
func (a *agentRun) waitReady(t *testing.T) string {
	t.Helper()
	body, err := a.WaitReady(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	rep := report(t, a)
	if rep.Snapshot == nil {
		t.Fatal("ready, but the report has no Snapshot applied")
	}
	if !slices.ContainsFunc(rep.Snapshot.Frontends, func(f snapshot.Frontend) bool {
		return f.Port == vip.Port() && slices.Contains(f.Addresses, vip.Addr())
	}) {
		t.Fatalf("ready with Snapshot %d, which does not capture %s", rep.Snapshot.Version, vip)
	}
	i := slices.IndexFunc(rep.Pods, func(p enrol.Pod) bool { return p.Pod.Namespace == "app" && p.Pod.Name == "client" })
	if i < 0 || rep.Pods[i].State != enrol.Enrolled {
		t.Fatalf("ready, but pod app/client is not enrolled: %+v", rep.Pods)
	}
	return body
}

// stop sends SIGTERM and waits for a clean exit. An agent that does not
// exit is sent SIGQUIT: the Go runtime then prints every goroutine's stack
// to its stderr, so that the log the failed test prints shows what held
// the exit back.
func (a *agentRun) stop(t *testing.T) {
	t.Helper()
	err := a.Stop()
	if err == nil {
		return
	}
	select {
	case <-a.Exited():
	default:
		if qerr := a.Process.Cmd.Process.Signal(syscall.SIGQUIT); qerr != nil {
			t.Logf("ask the agent for its goroutines: %v", qerr)
		}
		select {
		case <-a.Exited():
			// Read to its end, the log the failed test prints holds the dump.
			a.Log.Wait(func(agentproc.Record) bool { return false })
		case <-time.After(waitFor):
		}
	}
	t.Fatal(err)
}

// get requests path from Service vip inside the client pod, in plaintext
// HTTP/1.1, and decodes the backend's report.
func (e *env) get(t *testing.T, path string) echo.Report {
	t.Helper()
	return fetch(t, nshttp.Client(e.client, 10*time.Second), "http://"+vip.String()+path)
}

// fetch requests url with c, from the client pod, and decodes the
// backend's report.
func fetch(t *testing.T, c *http.Client, url string) echo.Report {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s from the client pod: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s from the client pod: %s: %s", url, resp.Status, body)
	}
	var rep echo.Report
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatalf("decode the backend's report: %v (%s)", err, body)
	}
	return rep
}

// checkTLSOriginated fails t unless the backend saw the request inside TLS
// with the policy's SNI.
func checkTLSOriginated(t *testing.T, rep echo.Report) {
	t.Helper()
	if rep.TLS == nil || rep.TLS.ServerName != serverName || rep.Proto != "HTTP/1.1" {
		t.Errorf("backend saw %s, TLS %+v; want HTTP/1.1 in TLS with SNI %s", rep.Proto, rep.TLS, serverName)
	}
}
