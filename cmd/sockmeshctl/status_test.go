package main

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
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
	ca := must.Value[*pki.CA](t)(pki.NewCA("sockmeshctl status test CA"))
	leaf := must.Value[*pki.Leaf](t)(ca.Issue(pki.LeafOptions{IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}))
	certFile, keyFile, err := leaf.WriteFiles(dir, "agent")
	if err != nil {
		t.Fatal(err)
	}
	caFile, tokenFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
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
