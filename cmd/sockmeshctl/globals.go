package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
	kubesource "github.com/sockmesh/sockmesh/agent/source/kubernetes"
	"github.com/sockmesh/sockmesh/ctl/agentclient"
	"github.com/sockmesh/sockmesh/ctl/render"
	"github.com/sockmesh/sockmesh/internal/buildversion"
)

// globals are the flags every command shares.
type globals struct {
	kubeconfig, context, namespace string
	output                         string
	agentSocket, agentAddress      string
	agentPort                      int
	agentCA, agentTokenFile        string
	agentServerName                string
	timeout                        time.Duration

	// loaded by kube()
	loaded     bool
	kubeErr    error
	kubeClient kubernetes.Interface
	gwClient   gwclient.Interface
	defaultNS  string
}

func (g *globals) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&g.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster)")
	fs.StringVar(&g.context, "context", "", "kubeconfig context to use")
	fs.StringVarP(&g.namespace, "namespace", "n", "", "namespace of the named objects (default: the context's, else default)")
	fs.StringVarP(&g.output, "output", "o", "table", "output format: table, yaml or json")
	fs.StringVar(&g.agentSocket, "agent-socket", httpapi.DefaultSocket, "the node agent's introspection socket")
	fs.StringVar(&g.agentAddress, "agent-address", "", "host:port of an agent's --introspection-listen (instead of the socket)")
	fs.IntVar(&g.agentPort, "agent-port", 0, "reach the agent of the pod's node (explain) or of every node (status --all-nodes) at the node's InternalIP on this --introspection-listen port")
	fs.StringVar(&g.agentCA, "agent-ca", "", "CA bundle verifying agents' TLS certificates (default: system roots)")
	fs.StringVar(&g.agentServerName, "agent-server-name", "", "name agents' TLS certificates are verified for (default: the address dialed): one every agent's certificate holds, such as a DNS name shared by all nodes")
	fs.StringVar(&g.agentTokenFile, "agent-token-file", "", "file holding the bearer token of agents' --introspection-listen")
	fs.DurationVar(&g.timeout, "request-timeout", 30*time.Second, "timeout of each request to an agent or the API server")
}

func (g *globals) format() (render.Format, error) { return render.ParseFormat(g.output) }

// errNoKubeconfig: there is no kubeconfig and no in-cluster account; the
// commands that can work from the agent alone do.
var errNoKubeconfig = errors.New("no kubeconfig found (set --kubeconfig or $KUBECONFIG)")

// kube returns the API server clients, loading the kubeconfig once.
func (g *globals) kube() (kubernetes.Interface, gwclient.Interface, error) {
	if g.loaded {
		return g.kubeClient, g.gwClient, g.kubeErr
	}
	g.loaded = true
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = g.kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: g.context})
	rc, err := cc.ClientConfig()
	if err != nil {
		if clientcmd.IsEmptyConfig(err) && g.kubeconfig == "" {
			g.kubeErr = errNoKubeconfig
		} else {
			g.kubeErr = fmt.Errorf("load kubeconfig: %w", err)
		}
		return nil, nil, g.kubeErr
	}
	rc = rest.CopyConfig(rc)
	rc.Timeout = g.timeout
	rest.AddUserAgent(rc, "sockmeshctl/"+buildversion.Of(version))
	if g.defaultNS, _, err = cc.Namespace(); err != nil || g.defaultNS == "" {
		g.defaultNS = "default"
	}
	g.kubeClient, g.gwClient, g.kubeErr = kubesource.NewClients(rc)
	return g.kubeClient, g.gwClient, g.kubeErr
}

// ns is the namespace of named objects.
func (g *globals) ns() string {
	if g.namespace != "" {
		return g.namespace
	}
	g.kube() // sets defaultNS from the context when there is one
	if g.defaultNS != "" {
		return g.defaultNS
	}
	return "default"
}

// agentFor returns a client of node's agent: --agent-address when set,
// else with --agent-port the node's InternalIP (from the API server),
// else the local socket. --agent-port without a node is refused: the
// local socket's agent would answer for a remote one asked for.
func (g *globals) agentFor(ctx context.Context, node string) (*agentclient.Client, error) {
	if g.agentAddress != "" || g.agentPort <= 0 {
		return g.agentOn(nil)
	}
	if node == "" {
		return nil, errors.New("--agent-port reaches the agent of a pod's node (explain, with the API server) or of every node (status --all-nodes); name one agent with --agent-address")
	}
	kube, _, err := g.kube()
	if err != nil {
		return nil, fmt.Errorf("--agent-port needs the API server to find node %s: %w", node, err)
	}
	n, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("find node %s's address: %w", node, err)
	}
	return g.agentOn(n)
}

// agentOn returns a client of the agent on n, at its InternalIP and
// --agent-port, or of the one --agent-address or the local socket names
// (--agent-address set, or n nil). status --all-nodes calls it with the
// Nodes it listed, rather than fetching each again.
func (g *globals) agentOn(n *corev1.Node) (*agentclient.Client, error) {
	cfg := agentclient.Config{Socket: g.agentSocket, CAFile: g.agentCA, ServerName: g.agentServerName, TokenFile: g.agentTokenFile, Timeout: g.timeout}
	switch {
	case g.agentAddress != "":
		cfg.Address = g.agentAddress
	case n != nil:
		ip := internalIP(n)
		if ip == "" {
			return nil, fmt.Errorf("node %s has no InternalIP", n.Name)
		}
		cfg.Address = net.JoinHostPort(ip, strconv.Itoa(g.agentPort))
	}
	return agentclient.New(cfg)
}

func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}
