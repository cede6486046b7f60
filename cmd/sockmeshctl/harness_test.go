package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/nodetopo"
	"github.com/sockmesh/sockmesh/internal/nshttp"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/test/apiserver"
	clusternode "github.com/sockmesh/sockmesh/test/cluster/node"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/test/pki"
)

// The test's node (internal/nodetopo): a "node" netns where the agent
// runs, a client pod and a backend pod, each on a veth to the node.
// 10.236.0.0/16 belongs to these tests alone in this repository; the
// Service addresses exist nowhere (only a redirect reaches them).
var (
	addrs = nodetopo.Plan(236)
	// optedIP is the address of a pod that opted out; it has no namespace.
	optedIP   = netip.MustParseAddr("10.236.3.10")
	secureVIP = netip.MustParseAddr("10.96.236.10")
	plainVIP  = netip.MustParseAddr("10.96.236.11")
	brokenVIP = netip.MustParseAddr("10.96.236.12")
	routedVIP = netip.MustParseAddr("10.96.236.13")
)

const (
	ns          = "app"
	serverName  = "secure.app.svc"
	backendPort = 8443
	// socketGID may use the agent's introspection socket besides root.
	socketGID = 4242
	// nobody is the unprivileged user the auth tests run the CLI as.
	nobody = 65534
	// waitFor bounds every wait: no result depends on it, it only keeps a
	// broken agent from hanging the test.
	waitFor = 60 * time.Second
)

// bins are the real binaries under test, built once per run into a
// directory every user may read (the auth test runs the CLI as nobody).
type bins struct{ agent, ctl string }

func buildBinaries(t *testing.T) bins {
	t.Helper()
	dir := publicDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b := bins{agent: filepath.Join(dir, "sockmesh"), ctl: filepath.Join(dir, "sockmeshctl")}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Go(func() { errs[0] = clusternode.BuildBinary(ctx, "github.com/sockmesh/sockmesh/cmd/sockmesh", b.agent) })
	wg.Go(func() { errs[1] = clusternode.BuildBinary(ctx, "github.com/sockmesh/sockmesh/cmd/sockmeshctl", b.ctl) })
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// publicDir is a directory removed when t ends, which every user may
// enter (t.TempDir is root's alone).
func publicDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", sandbox.Name()+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// env is one test's machine: namespaces, cgroup, bpffs, the API server, a
// TLS echo backend, and the objects.
type env struct {
	api                   *apiserver.Env
	bins                  bins
	node, client, backend *sandbox.NetNS
	cg                    *sandbox.Cgroup
	bpffs                 string
	nodeName              string
	nodeIP                netip.Addr // where the proxy listens
	ca                    *pki.CA
	// kubeconfig reaches the API server from inside the node netns.
	kubeconfig string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	testenv.RequireRoot(t)
	e := &env{bins: buildBinaries(t), api: apiserver.Start(t), nodeName: "node-" + sandbox.Name(), nodeIP: addrs.Node}
	topo := nodetopo.New(t, addrs)
	e.node, e.client, e.backend = topo.Node, topo.Client, topo.Backend

	var err error
	if e.ca, err = pki.NewCA("sockmeshctl test CA"); err != nil {
		t.Fatal(err)
	}
	leaf, err := e.ca.Issue(pki.LeafOptions{CommonName: "secure", DNSNames: []string{serverName}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := e.backend.Listen(context.Background(), nil, "tcp", netip.AddrPortFrom(addrs.Backend.Addr(), backendPort).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := echo.New(echo.Config{Namespace: ns, Pod: "secure-0", TLS: &tls.Config{Certificates: []tls.Certificate{leaf.TLS}}})
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	// The test process's sockets are the client's: it joins the cgroup the
	// programs attach to, where the agent is born too.
	e.cg = sandbox.NewCgroup(t)
	e.cg.Enter(t)
	e.bpffs = sandbox.TempBPFFS(t)
	// The API server listens on the host's loopback: a relay on the
	// node's loopback reaches it.
	relay, err := e.node.Listen(context.Background(), nil, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.kubeconfig = e.api.KubeconfigVia(t, relay)
	return e
}

// createObjects writes the cluster: the node, the client pod, a pod that
// opted out and one on another node, four Services — secure (a
// BackendTLSPolicy with a good CA, and a newer one that conflicts with it),
// plain (no backend properties), broken (a BackendTLSPolicy whose CA is not
// a certificate) and routed (an HTTPRoute sends /api to secure) — and
// their EndpointSlices.
func (e *env) createObjects(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	kube, gw := e.api.Kube, e.api.Gateway
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("create %s: %v", what, err)
		}
	}
	node, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.nodeName}}, metav1.CreateOptions{})
	must("node", err)
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addrs.Node.String()}}
	_, err = kube.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	must("node status", err)
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must("namespace", err)
	// No controller manager runs: make the ServiceAccount pods need.
	_, err = kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	must("serviceaccount", err)

	no := false
	pod := func(name, node string, ip netip.Addr, labels map[string]string) {
		t.Helper()
		p, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &no,
				Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
		}, metav1.CreateOptions{})
		must("pod "+name, err)
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}}
		_, err = kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		must("pod status "+name, err)
	}
	pod("client", e.nodeName, addrs.Client.Addr(), nil)
	pod("opted", e.nodeName, optedIP, map[string]string{"sockmesh.io/capture": "disabled"})
	// On another node, whose agent is not the one the socket reaches.
	pod("remote", "elsewhere", netip.MustParseAddr("10.236.4.10"), nil)

	service := func(name string, vip netip.Addr) {
		t.Helper()
		_, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{ClusterIP: vip.String(), ClusterIPs: []string{vip.String()},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(backendPort)}}},
		}, metav1.CreateOptions{})
		must("service "+name, err)
		port, proto, ready := int32(backendPort), corev1.ProtocolTCP, true
		portName := "http"
		_, err = kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{addrs.Backend.Addr().String()},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready}}},
		}, metav1.CreateOptions{})
		must("endpointslice "+name, err)
	}
	service("secure", secureVIP)
	service("plain", plainVIP)
	service("broken", brokenVIP)
	service("routed", routedVIP)
	port := gwv1.PortNumber(80)
	prefix, api := gwv1.PathMatchPathPrefix, "/api"
	_, err = gw.GatewayV1().HTTPRoutes(ns).Create(ctx, &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "to-secure", Namespace: ns},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Name: "routed", Port: &port}}},
			Rules: []gwv1.HTTPRouteRule{{
				Matches:     []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: &prefix, Value: &api}}},
				BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: "secure", Port: &port}}}},
			}},
		},
	}, metav1.CreateOptions{})
	must("httproute to-secure", err)

	_, err = kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "secure-ca", Namespace: ns}, Data: map[string]string{"ca.crt": string(e.ca.CertPEM)},
	}, metav1.CreateOptions{})
	must("configmap secure-ca", err)
	_, err = kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "broken-ca", Namespace: ns}, Data: map[string]string{"ca.crt": "not a certificate"},
	}, metav1.CreateOptions{})
	must("configmap broken-ca", err)
	policy := func(name, target, ca string) {
		t.Helper()
		_, err := gw.GatewayV1().BackendTLSPolicies(ns).Create(ctx, &gwv1.BackendTLSPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: gwv1.BackendTLSPolicySpec{
				TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{
					Group: "", Kind: "Service", Name: gwv1.ObjectName(target)}}},
				Validation: gwv1.BackendTLSPolicyValidation{
					Hostname:          gwv1.PreciseHostname(target + ".app.svc"),
					CACertificateRefs: []gwv1.LocalObjectReference{{Group: "", Kind: "ConfigMap", Name: gwv1.ObjectName(ca)}},
				},
			},
		}, metav1.CreateOptions{})
		must("backendtlspolicy "+name, err)
	}
	policy("secure", "secure", "secure-ca")
	policy("broken", "broken", "broken-ca")
	// Valid too, created after "secure" (and, within the same second,
	// sorted after it): it loses the conflict.
	policy("secure-newer", "secure", "secure-ca")
}

// agentRun is one agent process and what it logged.
type agentRun struct {
	*agentproc.Agent
	socket string
}

// startAgent runs the real agent binary in the node netns and the test
// cgroup. It serves its introspection socket in a directory every user may
// enter, mode 0660 for socketGID.
func (e *env) startAgent(t *testing.T, args ...string) *agentRun {
	t.Helper()
	socket := filepath.Join(publicDir(t), "agent.sock")
	args = append([]string{"agent",
		"--node-name=" + e.nodeName, "--proxy-mode=node-ip", "--proxy-listen=" + e.nodeIP.String() + ":0",
		"--health-listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
		"--bpffs=" + e.bpffs, "--cgroup=" + e.cg.Path,
		"--log-format=json", "--drain-timeout=5s",
		"--introspection-socket=" + socket, fmt.Sprintf("--introspection-group=%d", socketGID),
	}, args...)
	a := &agentRun{socket: socket, Agent: agentproc.Start(t, agentproc.Config{
		Cmd: exec.Command(e.bins.agent, args...), NetNS: e.node, Cgroup: e.cg, Timeout: waitFor,
	})}
	// A graceful stop before sandbox's kill, as an operator removing the
	// agent would; how it exits is not what these tests check.
	t.Cleanup(func() { a.Stop() })
	return a
}

// waitReady polls /readyz until it answers 200, then checks what the
// requests that follow need of the agent beyond readiness, which promises
// the first Snapshot applied (with the kubernetes source, one translated
// from every object listed; createObjects wrote them before the agent
// started), not every pod enrolled: that Snapshot captures secure, broken
// and routed, and the client pod is enrolled. Its namespace existed before
// the agent started, so the first apply found it, unless its address is
// held by another namespace too, which the agent says; a request would
// only time out dialing a Service address nothing serves.
func (a *agentRun) waitReady(t *testing.T) {
	t.Helper()
	if _, err := a.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	rep, err := a.Report()
	if err != nil {
		t.Fatal(err)
	}
	if rep.Snapshot == nil {
		t.Fatal("ready, but the report has no Snapshot applied")
	}
	for _, vip := range []netip.Addr{secureVIP, brokenVIP, routedVIP} {
		if !slices.ContainsFunc(rep.Snapshot.Frontends, func(f snapshot.Frontend) bool {
			return f.Port == 80 && slices.Contains(f.Addresses, vip)
		}) {
			t.Fatalf("ready with Snapshot %d, which does not capture %s:80", rep.Snapshot.Version, vip)
		}
	}
	i := slices.IndexFunc(rep.Pods, func(p enrol.Pod) bool { return p.Pod.Namespace == ns && p.Pod.Name == "client" })
	if i < 0 || rep.Pods[i].State != enrol.Enrolled {
		t.Fatalf("ready, but pod %s/client is not enrolled: %+v", ns, rep.Pods)
	}
}

// get requests http://vip/path from inside the client pod and returns the
// status code and body.
func (e *env) get(t *testing.T, vip netip.Addr, path string) (int, []byte) {
	t.Helper()
	resp, err := nshttp.Client(e.client, 10*time.Second).Get("http://" + netip.AddrPortFrom(vip, 80).String() + path)
	if err != nil {
		t.Fatalf("GET %s%s from the client pod: %v", vip, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// ctlResult is one run of the CLI binary.
type ctlResult struct {
	stdout, stderr string
	err            error
}

// ctl runs the real sockmeshctl binary, as cred (nil: root), with the test
// API server's kubeconfig (from the host, where the API server listens;
// unless args name one) and the agent's socket.
func (e *env) ctl(t *testing.T, a *agentRun, cred *syscall.Credential, args ...string) ctlResult {
	t.Helper()
	if !slices.ContainsFunc(args, func(s string) bool { return strings.HasPrefix(s, "--kubeconfig") }) {
		args = append([]string{"--kubeconfig=" + e.api.Kubeconfig}, args...)
	}
	args = append([]string{"--agent-socket=" + a.socket}, args...)
	return e.runCtl(t, nil, cred, args...)
}

// ctlOnNode runs the real sockmeshctl binary as root in the node's network
// namespace, as an operator on another host would (it reaches the agents
// at their node IPs), with only the flags given.
func (e *env) ctlOnNode(t *testing.T, args ...string) ctlResult {
	t.Helper()
	return e.runCtl(t, e.node, nil, args...)
}

// runCtl runs the real sockmeshctl binary with args, in netns (nil: the
// test's own) as cred (nil: root).
func (e *env) runCtl(t *testing.T, netns *sandbox.NetNS, cred *syscall.Credential, args ...string) ctlResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bins.ctl, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent"}
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := cmd.Start
	if netns != nil {
		// The child inherits the netns of the thread that forks it.
		start = func() error { return netns.Do(cmd.Start) }
	}
	if err := start(); err != nil {
		t.Fatalf("start sockmeshctl: %v", err)
	}
	err := cmd.Wait()
	return ctlResult{stdout: stdout.String(), stderr: stderr.String(), err: err}
}

// ok runs the CLI and fails t unless it succeeds.
func (e *env) ok(t *testing.T, a *agentRun, args ...string) string {
	t.Helper()
	r := e.ctl(t, a, nil, args...)
	if r.err != nil {
		t.Fatalf("sockmeshctl %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.err, r.stdout, r.stderr)
	}
	return r.stdout
}

// okJSON runs the CLI with -o json and decodes its output into v.
func (e *env) okJSON(t *testing.T, a *agentRun, v any, args ...string) {
	t.Helper()
	out := e.ok(t, a, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("sockmeshctl %s -o json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func ptr[T any](v T) *T { return &v }
