package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
	"github.com/sockmesh/sockmesh/ctl/render"
	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/pki"
)

// TestStatusAllNodesWithAddress: --agent-address names one agent, so with
// --all-nodes every node's row was that one agent's answer, under each of
// the cluster's nodes. The command refuses the pair and asks no one.
func TestStatusAllNodesWithAddress(t *testing.T) {
	api := apiserver.Start(t)
	for _, n := range []string{"node-a", "node-b"} {
		must.Succeed(t)(api.Kube.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}))
	}
	// One agent, serving its introspection API over TLS with a token.
	addr, caFile, tokenFile := tcpAgent(t, netip.MustParseAddrPort("127.0.0.1:0"), &introspect.Sources{Node: "node-a"})

	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"status", "--all-nodes", "--agent-port=9443", "--agent-address=" + addr.String(),
		"--agent-ca=" + caFile, "--agent-token-file=" + tokenFile, "--kubeconfig=" + api.Kubeconfig, "-o", "json"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--agent-address") {
		t.Errorf("status --all-nodes --agent-address: error %v, want one naming --agent-address; output:\n%s", err, out.String())
	}
}

// TestAgentPortWithoutNode: --agent-port finds a node's agent through the
// API server, which status (without --all-nodes), top and metrics never ask:
// they answered from the local socket's agent, as if it were the one asked
// for. They refuse the flag instead.
func TestAgentPortWithoutNode(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	srv, err := httpapi.NewServer(httpapi.Config{Socket: sock}, &introspect.Sources{Node: "node-a", Metrics: introspect.NewCatalog()}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	for _, args := range [][]string{{"status"}, {"metrics"}, {"top", "--count=1"}} {
		cmd := newRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append(args, "--agent-port=9443", "--agent-socket="+sock))
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--agent-port") {
			t.Errorf("%s --agent-port: error %v, want one naming --agent-port; output:\n%s", args[0], err, out.String())
		}
	}
}

// serve runs srv until the test ends.
func serve(t *testing.T, srv *httpapi.Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// TestStatusAllNodesUnanswered: status --all-nodes asked the nodes one
// after another within one bound for them all, so two nodes whose agents
// never answer spent it, and the healthy node after them failed with
// "context deadline exceeded". The nodes are asked at once now, each
// within --request-timeout.
func TestStatusAllNodesUnanswered(t *testing.T) {
	api := apiserver.Start(t)
	healthy := netip.MustParseAddr("127.0.0.3")
	// node-a's and node-b's agents take connections and never answer. No
	// agent pod is in the cluster, so every node is asked. All three listen
	// at one port, which --agent-port names.
	port := holdSilent(t, "127.0.0.1", "127.0.0.2", healthy.String())
	_, caFile, tokenFile := tcpAgent(t, netip.AddrPortFrom(healthy, uint16(port)), &introspect.Sources{Node: "node-c", Ready: func() error { return nil }})
	for name, ip := range map[string]string{"node-a": "127.0.0.1", "node-b": "127.0.0.2", "node-c": healthy.String()} {
		n := must.Value[*corev1.Node](t)(api.Kube.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}))
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		must.Succeed(t)(api.Kube.CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{}))
	}

	out, err := runCtl("status", "--all-nodes", "--agent-port="+strconv.Itoa(port), "--agent-ca="+caFile, "--agent-token-file="+tokenFile,
		"--kubeconfig="+api.Kubeconfig, "--request-timeout=1s", "-o", "json")
	if got := agentStates(t, out); !maps.Equal(got, map[string]render.AgentState{
		"node-a": render.AgentNotAnswering, "node-b": render.AgentNotAnswering, "node-c": render.AgentAnswered}) {
		t.Errorf("status --all-nodes = %v, want node-c's answer, node-a and node-b not answering; error %v\n%s", got, err, out)
	}
	if err == nil || !strings.Contains(err.Error(), "node node-a:") || !strings.Contains(err.Error(), "node node-b:") ||
		strings.Contains(err.Error(), "node node-c:") {
		t.Errorf("status --all-nodes error = %v, want node-a and node-b named, not node-c", err)
	}
}

// holdSilent listens at one port on the silent addresses, a port that is
// also free on spare, and returns it: the connections it takes are held,
// never answered, until the test ends. An ephemeral port of one address
// may be in use on another (tests listen on 127.0.0.1:0), so ports are
// tried until one is free on every address.
func holdSilent(t *testing.T, silent0, silent1, spare string) int {
	t.Helper()
	for range 50 {
		first, err := net.Listen("tcp", net.JoinHostPort(silent0, "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := first.Addr().(*net.TCPAddr).Port
		second, err := net.Listen("tcp", net.JoinHostPort(silent1, strconv.Itoa(port)))
		if err != nil {
			first.Close()
			continue
		}
		probe, err := net.Listen("tcp", net.JoinHostPort(spare, strconv.Itoa(port)))
		if err != nil {
			first.Close()
			second.Close()
			continue
		}
		probe.Close()
		holdConns(t, first)
		holdConns(t, second)
		return port
	}
	t.Fatalf("no port free on %s, %s and %s in 50 tries", silent0, silent1, spare)
	return 0
}

// holdConns accepts on ln and holds what it takes until the test ends.
func holdConns(t *testing.T, ln net.Listener) {
	held := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for len(held) > 0 {
			(<-held).Close()
		}
	})
}

// tcpAgent serves an agent's introspection API with src over TLS at addr
// (port 0: one the kernel picks; an IP SAN for it, a CA of its own) with
// a bearer token until the test ends, and returns its address and what
// sockmeshctl needs to reach it: the CA's file and the token's.
func tcpAgent(t *testing.T, addr netip.AddrPort, src *introspect.Sources) (agent *net.TCPAddr, caFile, tokenFile string) {
	t.Helper()
	dir := t.TempDir()
	ca := must.Value[*pki.CA](t)(pki.NewCA("sockmeshctl status test CA"))
	leaf := must.Value[*pki.Leaf](t)(ca.Issue(pki.LeafOptions{IPs: []netip.Addr{addr.Addr()}}))
	certFile, keyFile, err := leaf.WriteFiles(dir, "agent")
	if err != nil {
		t.Fatal(err)
	}
	caFile, tokenFile = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := httpapi.NewServer(httpapi.Config{Socket: filepath.Join(dir, "agent.sock"), Listen: addr.String(),
		TLSCertFile: certFile, TLSKeyFile: keyFile, TokenFile: tokenFile}, src, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	_, tcp := srv.Addrs()
	return tcp.(*net.TCPAddr), caFile, tokenFile
}

// agentStates decodes status -o json: each node's AgentState.
func agentStates(t *testing.T, out string) map[string]render.AgentState {
	t.Helper()
	var nodes []render.NodeStatus
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, out)
	}
	got := map[string]render.AgentState{}
	for _, n := range nodes {
		got[n.Node] = n.Agent
	}
	return got
}

// TestStatusAllNodesScheduled: status --all-nodes exited 1 whenever a node
// had no agent, such as a control-plane node whose taint the DaemonSet
// does not tolerate. A node without an agent pod is listed, not asked and
// no failure; one with an agent pod whose agent does not answer (here
// created by the DaemonSet controller and not bound yet), or answers not
// ready, is.
func TestStatusAllNodesScheduled(t *testing.T) {
	api := apiserver.Start(t)
	ctx, kube := t.Context(), api.Kube
	healthy := netip.MustParseAddr("127.0.0.3")
	var notReady atomic.Pointer[error]
	addr, caFile, tokenFile := tcpAgent(t, netip.AddrPortFrom(healthy, 0), &introspect.Sources{Node: "node-c", Ready: func() error {
		if err := notReady.Load(); err != nil {
			return *err
		}
		return nil
	}})
	port := strconv.Itoa(addr.Port)

	createAgentNamespace(t, kube)
	node := func(name, ip string) {
		t.Helper()
		n := must.Value[*corev1.Node](t)(kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}))
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		must.Succeed(t)(kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}))
	}
	// The control plane has no agent pod and nothing listens there.
	node("control-plane", "127.0.0.4")
	node("node-c", healthy.String())
	createAgentPod(t, kube, "sockmesh-c", "node-c", true)
	status := func(output string) (string, error) {
		return runCtl("status", "--all-nodes", "--agent-port="+port, "--agent-ca="+caFile, "--agent-token-file="+tokenFile,
			"--kubeconfig="+api.Kubeconfig, "-o", output)
	}

	out, err := status("json")
	if got := agentStates(t, out); err != nil || !maps.Equal(got, map[string]render.AgentState{
		"control-plane": render.AgentNotScheduled, "node-c": render.AgentAnswered}) {
		t.Errorf("status --all-nodes = %v, error %v; want node-c's answer, control-plane without an agent, no error\n%s", got, err, out)
	}
	out, _ = status("table")
	if want := "control-plane   no agent scheduled"; !strings.Contains(out, want) {
		t.Errorf("status --all-nodes lacks %q:\n%s", want, out)
	}

	// node-b's agent pod is not bound yet, and nothing listens there.
	node("node-b", "127.0.0.2")
	createAgentPod(t, kube, "sockmesh-b", "node-b", false)
	out, err = status("json")
	var nodes []render.NodeStatus
	if jerr := json.Unmarshal([]byte(out), &nodes); jerr != nil || len(nodes) != 3 || nodes[1].Node != "node-b" ||
		nodes[1].Agent != render.AgentNotAnswering || nodes[1].Pod != agentNS+"/sockmesh-b" || nodes[1].PodState != "Pending, not ready" {
		t.Errorf("status --all-nodes = %+v (%v), want node-b not answering, its pod pending", nodes, jerr)
	}
	if err == nil || !strings.Contains(err.Error(), "node node-b: agent not answering") || strings.Contains(err.Error(), "control-plane") ||
		strings.Contains(err.Error(), "node-c") {
		t.Errorf("status --all-nodes error = %v, want node-b alone named", err)
	}

	// node-c's agent answers, not ready.
	stale := errors.New("datapath heartbeat stale")
	notReady.Store(&stale)
	if _, err := status("json"); err == nil || !strings.Contains(err.Error(), "node node-c: agent not ready: datapath heartbeat stale") {
		t.Errorf("status --all-nodes error = %v, want node-c not ready", err)
	}
}

// agentNS is where the shipped DaemonSet runs the agents.
const agentNS = "sockmesh-system"

// createAgentNamespace creates agentNS and the ServiceAccount its pods
// need (no controller manager runs to make it).
func createAgentNamespace(t *testing.T, kube kubernetes.Interface) {
	t.Helper()
	ctx := t.Context()
	must.Succeed(t)(kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNS}}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.CoreV1().ServiceAccounts(agentNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}))
}

// createAgentPod creates an agent pod in agentNS as the DaemonSet
// controller does, pinned to its node by affinity; bound (given the
// node's name), running and ready when running. Like the DaemonSet's, it
// is on the host network, which an agent watching the node does not
// enrol.
func createAgentPod(t *testing.T, kube kubernetes.Interface, name, nodeName string, running bool) {
	t.Helper()
	ctx := t.Context()
	no := false
	must.Value[*corev1.Pod](t)(kube.CoreV1().Pods(agentNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: agentNS, Labels: map[string]string{
			"app.kubernetes.io/name": "sockmesh", "app.kubernetes.io/component": "agent"}},
		Spec: corev1.PodSpec{AutomountServiceAccountToken: &no, HostNetwork: true, Containers: []corev1.Container{{Name: "agent", Image: "registry.invalid/sockmesh:1"}},
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
					{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpIn, Values: []string{nodeName}}}}}}}}},
	}, metav1.CreateOptions{}))
	if !running {
		return
	}
	must.Succeed(t)(nil, kube.CoreV1().Pods(agentNS).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: agentNS},
		Target: corev1.ObjectReference{Kind: "Node", Name: nodeName}}, metav1.CreateOptions{}))
	p := must.Value[*corev1.Pod](t)(kube.CoreV1().Pods(agentNS).Get(ctx, name, metav1.GetOptions{}))
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	must.Succeed(t)(kube.CoreV1().Pods(agentNS).UpdateStatus(ctx, p, metav1.UpdateOptions{}))
}
