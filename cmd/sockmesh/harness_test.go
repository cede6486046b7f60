package main

import (
	"bufio"
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
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

// The test's node: a "node" netns where the agent runs, a client pod and a
// backend pod, each on a veth to the node. 10.232.0.0/16 belongs to these
// tests alone in this repository, so concurrent tests cannot make a pod
// address ambiguous.
var (
	nodeIP    = netip.MustParseAddr("10.232.0.1")
	clientGW  = netip.MustParsePrefix("10.232.1.1/24")
	clientIP  = netip.MustParsePrefix("10.232.1.10/24")
	backendGW = netip.MustParsePrefix("10.232.2.1/24")
	backendIP = netip.MustParsePrefix("10.232.2.20/24")
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
	e := &env{node: sandbox.NewNetNS(t), client: sandbox.NewNetNS(t), backend: sandbox.NewNetNS(t)}
	e.node.AddAddr(t, "lo", netip.PrefixFrom(nodeIP, 32))
	sandbox.NewVeth(t, e.node, e.client, []netip.Prefix{clientGW}, []netip.Prefix{clientIP})
	e.client.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), clientGW.Addr())
	sandbox.NewVeth(t, e.node, e.backend, []netip.Prefix{backendGW}, []netip.Prefix{backendIP})
	e.backend.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), backendGW.Addr())
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
	ln, err := e.backend.Listen(context.Background(), nil, "tcp", netip.AddrPortFrom(backendIP.Addr(), backendPort).String())
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
	e.writeFile(t, "client.yaml", fmt.Sprintf(clientYAML, testNode, clientIP.Addr(), clientIP.Addr()))
	e.writeFile(t, "secure.yaml", fmt.Sprintf(secureYAML, vip.Addr(), vip.Addr(), vip.Port(), backendPort,
		backendPort, backendIP.Addr(), indent(string(ca.CertPEM), "    "), serverName))

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
	p       *sandbox.Process
	exited  chan struct{}
	logs    *logWatch
	health  string // host:port of /healthz and /readyz, in the node netns
	metrics string
}

// startAgent runs `sockmesh agent` in the node netns and the test cgroup
// with the file source on e.manifests, and waits until it logged its
// listeners.
func (e *env) startAgent(t *testing.T, args ...string) *agentRun {
	t.Helper()
	args = append([]string{"agent",
		"--source=file", "--manifests=" + e.manifests, "--node-name=" + testNode,
		"--health-listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
		"--bpffs=" + e.bpffs, "--cgroup=" + e.cg.Path,
		"--log-format=json", "--drain-timeout=10s",
		"--introspection-socket=" + filepath.Join(t.TempDir(), "agent.sock"),
	}, args...)
	cmd := sandbox.HelperCommand(t, "sockmesh", args...)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	a := &agentRun{logs: watchLogs(t, r), exited: make(chan struct{})}
	a.p = sandbox.Start(t, cmd, e.node, e.cg)
	w.Close()
	go func() { a.p.Wait(); close(a.exited) }()
	a.health = a.logs.wait(t, "health listener", a.exited, func(r record) bool {
		return r.msg() == "listening" && r.str("listener") == "health"
	}).str("addr")
	a.metrics = a.logs.wait(t, "metrics listener", a.exited, func(r record) bool {
		return r.msg() == "listening" && r.str("listener") == "metrics"
	}).str("addr")
	return a
}

// waitReady polls /readyz until it answers 200 and returns its body.
func (a *agentRun) waitReady(t *testing.T, e *env) string {
	t.Helper()
	c := httpClient(e.node)
	deadline := time.Now().Add(waitFor)
	last := ""
	for {
		resp, err := c.Get("http://" + a.health + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return string(body)
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		select {
		case <-a.exited:
			t.Fatalf("agent exited before it was ready: %v", a.p.Wait())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not ready after %s; /readyz: %s", waitFor, last)
		}
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (a *agentRun) stop(t *testing.T) {
	t.Helper()
	if err := a.p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.exited:
	case <-time.After(waitFor):
		t.Fatalf("agent still running %s after SIGTERM", waitFor)
	}
	if err := a.p.Wait(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v", err)
	}
}

// get requests path from Service vip inside the client pod, in plaintext
// HTTP/1.1, and decodes the backend's report.
func (e *env) get(t *testing.T, path string) echo.Report {
	t.Helper()
	resp, err := httpClient(e.client).Get("http://" + vip.String() + path)
	if err != nil {
		t.Fatalf("GET %s from the client pod: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s from the client pod: %s: %s", path, resp.Status, body)
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

// httpClient makes HTTP/1.1 requests from inside ns, a connection each.
func httpClient(ns *sandbox.NetNS) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return ns.Dial(&net.Dialer{Timeout: 5 * time.Second}, network, addr)
		},
	}}
}

// record is one JSON log record.
type record map[string]any

func (r record) msg() string           { return r.str("msg") }
func (r record) str(key string) string { s, _ := r[key].(string); return s }

// logWatch collects an agent's JSON log records.
type logWatch struct {
	mu      sync.Mutex
	records []record
	lines   []string
	grew    chan struct{} // closed and replaced when a line arrives
}

func watchLogs(t *testing.T, r io.ReadCloser) *logWatch {
	l := &logWatch{grew: make(chan struct{})}
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			var rec record
			json.Unmarshal(sc.Bytes(), &rec) // non-JSON lines (cobra's errors) stay in lines only
			l.mu.Lock()
			l.lines = append(l.lines, sc.Text())
			if rec != nil {
				l.records = append(l.records, rec)
			}
			close(l.grew)
			l.grew = make(chan struct{})
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		if t.Failed() {
			l.mu.Lock()
			t.Logf("agent log:\n%s", strings.Join(l.lines, "\n"))
			l.mu.Unlock()
		}
	})
	return l
}

// wait returns the first record that matches, waiting for it until the
// agent exits or waitFor passes.
func (l *logWatch) wait(t *testing.T, what string, exited <-chan struct{}, match func(record) bool) record {
	t.Helper()
	return l.waitAfter(t, what, exited, 0, match)
}

// waitAfter is wait for the first match after the first skip ones.
func (l *logWatch) waitAfter(t *testing.T, what string, exited <-chan struct{}, skip int, match func(record) bool) record {
	t.Helper()
	timeout := time.After(waitFor)
	for {
		l.mu.Lock()
		grew := l.grew
		n := 0
		for _, r := range l.records {
			if match(r) {
				if n == skip {
					l.mu.Unlock()
					return r
				}
				n++
			}
		}
		l.mu.Unlock()
		select {
		case <-grew:
		case <-exited:
			exited = nil // read what it logged last, then fail at the timeout
			timeout = time.After(100 * time.Millisecond)
		case <-timeout:
			t.Fatalf("agent never logged %s", what)
		}
	}
}

// count returns how many records match.
func (l *logWatch) count(match func(record) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if match(r) {
			n++
		}
	}
	return n
}
