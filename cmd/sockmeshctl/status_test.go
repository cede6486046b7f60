package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
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
	dir := t.TempDir()
	certFile, keyFile, caFile, tokenFile := agentTLSFiles(t, dir, netip.MustParseAddr("127.0.0.1"))
	srv, err := httpapi.NewServer(httpapi.Config{Socket: filepath.Join(dir, "agent.sock"), Listen: "127.0.0.1:0",
		TLSCertFile: certFile, TLSKeyFile: keyFile, TokenFile: tokenFile}, &introspect.Sources{Node: "node-a"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	_, addr := srv.Addrs()

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
	dir := t.TempDir()
	healthy := netip.MustParseAddr("127.0.0.3")
	certFile, keyFile, caFile, tokenFile := agentTLSFiles(t, dir, healthy)
	srv, err := httpapi.NewServer(httpapi.Config{Socket: filepath.Join(dir, "agent.sock"), Listen: netip.AddrPortFrom(healthy, 0).String(),
		TLSCertFile: certFile, TLSKeyFile: keyFile, TokenFile: tokenFile}, &introspect.Sources{Node: "node-c"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	_, addr := srv.Addrs()
	port := addr.(*net.TCPAddr).Port
	// node-a's and node-b's agents take connections and never answer.
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
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
	for name, ip := range map[string]string{"node-a": "127.0.0.1", "node-b": "127.0.0.2", "node-c": healthy.String()} {
		n := must.Value[*corev1.Node](t)(api.Kube.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}))
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		must.Succeed(t)(api.Kube.CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{}))
	}

	out, err := runCtl("status", "--all-nodes", "--agent-port="+strconv.Itoa(port), "--agent-ca="+caFile, "--agent-token-file="+tokenFile,
		"--kubeconfig="+api.Kubeconfig, "--request-timeout=1s", "-o", "json")
	var sts []introspect.Status
	if jerr := json.Unmarshal([]byte(out), &sts); jerr != nil || len(sts) != 1 || sts[0].Node != "node-c" {
		t.Errorf("status --all-nodes = %+v (%v), want node-c's answer; error %v", sts, jerr, err)
	}
	if err == nil || !strings.Contains(err.Error(), "node node-a:") || !strings.Contains(err.Error(), "node node-b:") ||
		strings.Contains(err.Error(), "node node-c:") {
		t.Errorf("status --all-nodes error = %v, want node-a and node-b named, not node-c", err)
	}
}

// agentTLSFiles writes to dir what an agent serving its introspection API
// over TLS at addr with a token needs, and what sockmeshctl needs to reach
// it: the agent's certificate and key, the CA that issued them, the token.
func agentTLSFiles(t *testing.T, dir string, addr netip.Addr) (certFile, keyFile, caFile, tokenFile string) {
	t.Helper()
	ca := must.Value[*pki.CA](t)(pki.NewCA("sockmeshctl status test CA"))
	leaf := must.Value[*pki.Leaf](t)(ca.Issue(pki.LeafOptions{IPs: []netip.Addr{addr}}))
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
	return certFile, keyFile, caFile, tokenFile
}
