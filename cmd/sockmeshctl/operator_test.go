package main

import (
	"encoding/json"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/ctl/render"
	"github.com/sockmesh/sockmesh/daemonset"
	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/internal/yamldocs"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/pki"
)

// TestStatusAllNodesOperator runs status --all-nodes as an operator with
// the rights daemonset/introspection-tcp grants (operators.example.yaml's
// group): the Nodes, and the pods of sockmesh-system alone. It listed the
// agent pods in every namespace, which those rights refuse, so it warned
// and asked every node, and a node without an agent failed it. Now it
// lists them in --agent-namespace. Without the Role's binding it warns, as
// documented, and asks every node.
func TestStatusAllNodesOperator(t *testing.T) {
	api := apiserver.Start(t)
	kube := api.Kube
	healthy := netip.MustParseAddr("127.0.0.3")
	addr, caFile, tokenFile := tcpAgent(t, netip.AddrPortFrom(healthy, 0), &introspect.Sources{Node: "node-c", Ready: func() error { return nil }})
	createAgentNamespace(t, kube)
	for name, ip := range map[string]string{"control-plane": "127.0.0.4", "node-c": healthy.String()} {
		createNode(t, kube, name, ip)
	}
	createAgentPod(t, kube, "sockmesh-c", "node-c", true)
	group := applyOperatorRBAC(t, kube)
	kubeconfig := impersonating(t, api.Kubeconfig, "smt-operator", group, "system:authenticated")
	status := func() (map[string]render.AgentState, string, error) {
		out, stderr, err := runCtlStderr("status", "--all-nodes", "--agent-port="+strconv.Itoa(addr.Port),
			"--agent-ca="+caFile, "--agent-token-file="+tokenFile, "--kubeconfig="+kubeconfig, "--request-timeout=5s", "-o", "json")
		return agentStates(t, out), stderr, err
	}

	got, stderr, err := status()
	if want := map[string]render.AgentState{"control-plane": render.AgentNotScheduled, "node-c": render.AgentAnswered}; err != nil ||
		stderr != "" || !maps.Equal(got, want) {
		t.Errorf("status --all-nodes as an operator = %v, error %v, stderr %q; want %v, no error, no warning", got, err, stderr, want)
	}

	// Only the ClusterRole: the Nodes, but no agent pods.
	must.Succeed(t)(nil, kube.RbacV1().RoleBindings(agentNS).DeleteCollection(t.Context(), metav1.DeleteOptions{}, metav1.ListOptions{}))
	got, stderr, err = status()
	if want := "Warning: cannot list the agent pods"; !strings.Contains(stderr, want) || !strings.Contains(stderr, "forbidden") ||
		got["control-plane"] != render.AgentNotAnswering || got["node-c"] != render.AgentAnswered ||
		err == nil || !strings.Contains(err.Error(), "node control-plane: agent not answering") {
		t.Errorf("status --all-nodes without the Role = %v, error %v, stderr %q; want %q (forbidden), every node asked, control-plane failing",
			got, err, stderr, want)
	}
}

// TestExplainAgentPortOperator runs explain --agent-port as an operator
// with the rights daemonset/introspection-tcp grants and the built-in
// view role in the pod's namespace, which reads the pod and the Service.
// explain found the pod's node's address with a get on the Node, which
// the component's roles did not grant (they list Nodes): it failed,
// forbidden.
func TestExplainAgentPortOperator(t *testing.T) {
	api := apiserver.Start(t)
	kube := api.Kube
	nodeIP := netip.MustParseAddr("127.0.0.3")
	vip, src := createClientAndService(t, kube, "node-c")
	addr, caFile, tokenFile := tcpAgent(t, netip.AddrPortFrom(nodeIP, 0), src)
	createNode(t, kube, "node-c", nodeIP.String())
	createAgentNamespace(t, kube)
	group := applyOperatorRBAC(t, kube)
	// What explain reads of the namespace itself, as the built-in view
	// role grants it (aggregated by a controller manager, which does not
	// run here).
	must.Succeed(t)(kube.RbacV1().Roles(ns).Create(t.Context(), &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "app-view", Namespace: ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "services"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.RbacV1().RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "operators-view", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "app-view"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "Group", Name: group}},
	}, metav1.CreateOptions{}))
	kubeconfig := impersonating(t, api.Kubeconfig, "smt-operator", group, "system:authenticated")

	out, stderr, err := runCtlStderr("explain", "-n", ns, "client", "secure:http", "--agent-port="+strconv.Itoa(addr.Port),
		"--agent-ca="+caFile, "--agent-token-file="+tokenFile, "--kubeconfig="+kubeconfig, "--request-timeout=5s", "-o", "json")
	var e render.Explained
	if err != nil || json.Unmarshal([]byte(out), &e) != nil || e.Node != "node-c" || !e.Capture.Captured ||
		!slices.Contains(e.Query.Addrs, vip) || e.Query.Port != 80 {
		t.Errorf("explain --agent-port as an operator: %v\nstdout:\n%s\nstderr:\n%s\nwant node-c's agent's answer: %s:80 captured", err, out, stderr, vip)
	}
}

// createNode creates a Node whose InternalIP is ip.
func createNode(t *testing.T, kube kubernetes.Interface, name, ip string) {
	t.Helper()
	n := must.Value[*corev1.Node](t)(kube.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}))
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	must.Succeed(t)(kube.CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{}))
}

// introspectionTCP is the component daemonset/introspection-tcp.
const introspectionTCP = "introspection-tcp"

// applyOperatorRBAC creates the roles of daemonset/introspection-tcp and
// the bindings of its operators.example.yaml, as shipped, and returns the
// group they bind.
func applyOperatorRBAC(t *testing.T, kube kubernetes.Interface) (group string) {
	t.Helper()
	ctx, rbac := t.Context(), kube.RbacV1()
	for _, file := range []string{"rbac.yaml", "operators.example.yaml"} {
		for _, doc := range componentDocs(t, file) {
			data := must.Value[[]byte](t)(yaml.Marshal(doc))
			var err error
			switch doc["kind"] {
			case "ClusterRole":
				var o rbacv1.ClusterRole
				if err = yaml.UnmarshalStrict(data, &o); err == nil {
					_, err = rbac.ClusterRoles().Create(ctx, &o, metav1.CreateOptions{})
				}
			case "Role":
				var o rbacv1.Role
				if err = yaml.UnmarshalStrict(data, &o); err == nil {
					_, err = rbac.Roles(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
				}
			case "ClusterRoleBinding":
				var o rbacv1.ClusterRoleBinding
				if err = yaml.UnmarshalStrict(data, &o); err == nil {
					group = o.Subjects[0].Name
					_, err = rbac.ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{})
				}
			case "RoleBinding":
				var o rbacv1.RoleBinding
				if err = yaml.UnmarshalStrict(data, &o); err == nil {
					_, err = rbac.RoleBindings(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
				}
			default:
				t.Fatalf("%s: unexpected %v", file, doc["kind"])
			}
			if err != nil {
				t.Fatalf("%s: %v %v: %v", file, doc["kind"], doc["metadata"], err)
			}
		}
	}
	return group
}

// componentDocs decodes file of daemonset/introspection-tcp.
func componentDocs(t *testing.T, file string) []map[string]any {
	t.Helper()
	data := must.Value[[]byte](t)(fs.ReadFile(daemonset.IntrospectionTCP, path.Join(introspectionTCP, file)))
	docs, err := yamldocs.Decode(data)
	if err != nil {
		t.Fatalf("decode %s: %v", file, err)
	}
	return docs
}

// agentTCP is what the agent serves with daemonset/introspection-tcp.
type agentTCP struct {
	// args are the component's agent flags, as the kubelet expands them on
	// a node whose host IP is the test's node IP, the Secrets' mount
	// replaced by a directory holding their keys.
	args []string
	port string
	// caFile and tokenFile are what an operator passes sockmeshctl.
	caFile, tokenFile string
}

// agentSharedName is the DNS name the test's agent certificate holds, and
// no IP: every node's agent can present it (docs/introspection.md).
const agentSharedName = "agents.sockmesh.test"

// introspectionTCPFlags reads the agent flags the component adds from its
// DaemonSet patch and writes the files of the volume it mounts, projected
// from two Secrets: tls.crt and tls.key (a certificate for
// agentSharedName) and token.
func introspectionTCPFlags(t *testing.T, nodeIP netip.Addr) agentTCP {
	t.Helper()
	var ops []struct {
		Op, Path string
		Value    any
	}
	raw := must.Value[[]byte](t)(fs.ReadFile(daemonset.IntrospectionTCP, path.Join(introspectionTCP, "daemonset-patch.yaml")))
	if err := yaml.UnmarshalStrict(raw, &ops); err != nil {
		t.Fatalf("decode daemonset-patch.yaml: %v", err)
	}
	var a agentTCP
	var mountPath string
	for _, op := range ops {
		switch {
		case strings.HasSuffix(op.Path, "/args/-"):
			a.args = append(a.args, strings.ReplaceAll(op.Value.(string), "$(HOST_IP)", nodeIP.String()))
		case strings.HasSuffix(op.Path, "/volumeMounts/-"):
			mountPath = op.Value.(map[string]any)["mountPath"].(string)
		}
	}
	if len(a.args) == 0 || mountPath == "" {
		t.Fatalf("daemonset-patch.yaml adds args %q and mounts %q", a.args, mountPath)
	}

	secret := t.TempDir()
	ca := must.Value[*pki.CA](t)(pki.NewCA("sockmesh introspection CA"))
	leaf := must.Value[*pki.Leaf](t)(ca.Issue(pki.LeafOptions{CommonName: "sockmesh agent", DNSNames: []string{agentSharedName}}))
	a.caFile, a.tokenFile = filepath.Join(t.TempDir(), "ca.crt"), filepath.Join(secret, "token")
	for file, data := range map[string][]byte{
		filepath.Join(secret, "tls.crt"): leaf.CertPEM, filepath.Join(secret, "tls.key"): leaf.KeyPEM,
		a.tokenFile: []byte("operator-token\n"), a.caFile: ca.CertPEM,
	} {
		if err := os.WriteFile(file, data, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	for i, arg := range a.args {
		a.args[i] = strings.ReplaceAll(arg, mountPath, secret)
		if listen, ok := strings.CutPrefix(arg, "--introspection-listen="); ok {
			var err error
			if _, a.port, err = net.SplitHostPort(listen); err != nil {
				t.Fatalf("%s: %v", arg, err)
			}
		}
	}
	return a
}

// checkStatusAllNodesTCP runs status --all-nodes from the node's network
// (as from another host: it dials the agent's node IP) as an operator with
// the rights of daemonset/introspection-tcp, against the agent serving
// with the component's flags (tcp).
func (e *env) checkStatusAllNodesTCP(t *testing.T, tcp agentTCP) {
	createAgentNamespace(t, e.api.Kube)
	createAgentPod(t, e.api.Kube, "sockmesh-agent", e.nodeName, true)
	group := applyOperatorRBAC(t, e.api.Kube)
	kubeconfig := impersonating(t, e.kubeconfig, "smt-operator", group, "system:authenticated")
	args := []string{"status", "--all-nodes", "--kubeconfig=" + kubeconfig, "--agent-port=" + tcp.port,
		"--agent-ca=" + tcp.caFile, "--agent-token-file=" + tcp.tokenFile, "-o", "json"}

	r := e.ctlOnNode(t, append(args, "--agent-server-name="+agentSharedName)...)
	var nodes []render.NodeStatus
	if err := json.Unmarshal([]byte(r.stdout), &nodes); r.err != nil || r.stderr != "" || err != nil || len(nodes) != 1 ||
		nodes[0].Node != e.nodeName || nodes[0].Agent != render.AgentAnswered || !nodes[0].Ready || nodes[0].Pod != agentNS+"/sockmesh-agent" {
		t.Errorf("status --all-nodes: %v (%v)\nstdout:\n%s\nstderr:\n%s\nwant node %s's agent answering, ready, no warning", r.err, err, r.stdout, r.stderr, e.nodeName)
	}
	// The certificate names no address: verified for the address dialed,
	// it is refused.
	r = e.ctlOnNode(t, args...)
	if want := "x509: cannot validate certificate for " + e.nodeIP.String(); r.err == nil || !strings.Contains(r.stderr, want) {
		t.Errorf("status --all-nodes without --agent-server-name: %v, stderr %q; want %q", r.err, r.stderr, want)
	}
}
