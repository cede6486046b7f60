package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sockmesh/sockmesh/ctl/render"
)

// defaultAgentSelector and defaultAgentNamespace find the agent pods of
// the shipped DaemonSet (daemonset/daemonset.yaml).
const (
	defaultAgentSelector  = "app.kubernetes.io/name=sockmesh,app.kubernetes.io/component=agent"
	defaultAgentNamespace = "sockmesh-system"
)

// agentPods says where status --all-nodes looks for the agent pods.
type agentPods struct{ namespace, selector string }

func newStatusCommand(g *globals) *cobra.Command {
	var (
		allNodes bool
		pods     agentPods
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "show the node agent's programs, pins, conflicts, snapshot, proxy connections, watched kinds and recent errors",
		Long: `status asks the node's agent (its socket, or --agent-address) how it
stands: the eBPF programs attached to each hook with their program and link
IDs, whether they are pinned (so capture survives an agent restart), other
programs on the same hooks, the Snapshot version and its age, the proxy's
open connections, pods whose enrolment is pending or failed, which optional
kinds (Gateway API CRDs, ClusterTrustBundle, ServiceCIDR) it watches and why
not (NotServed, Forbidden, Listing), and recent warnings and errors. With --all-nodes and --agent-port it asks every node's
agent, found through the API server (not with --agent-address, which names
one agent). A node where no agent pod (--agent-selector, in
--agent-namespace) is scheduled, as the DaemonSet's nodeSelector, affinity
or tolerations leave it out, is listed as such and not asked.

Exit status 1 when an agent that should answer does not, or answers that
it is not ready; a node without an agent pod is no failure.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := g.format()
			if err != nil {
				return err
			}
			// Each request has --request-timeout: no bound on them all,
			// which nodes that do not answer would spend for those that do.
			var nodes []render.NodeStatus
			if allNodes {
				nodes, err = allStatuses(cmd.Context(), g, pods, cmd.ErrOrStderr())
			} else {
				nodes, err = localStatus(cmd.Context(), g)
			}
			if err != nil {
				return err
			}
			if err := render.Print(cmd.OutOrStdout(), f, nodes, func(w io.Writer) error { return render.Status(w, nodes) }); err != nil {
				return err
			}
			return failing(nodes)
		},
	}
	cmd.Flags().BoolVar(&allNodes, "all-nodes", false, "ask every node's agent (needs --agent-port and the API server; not with --agent-address)")
	cmd.Flags().StringVar(&pods.selector, "agent-selector", defaultAgentSelector,
		"with --all-nodes, the label selector of the agent pods: nodes without one are not asked ('' asks every node)")
	// One namespace by default: listing pods there is a right a Role can
	// grant (daemonset/introspection-tcp), where listing them in every
	// namespace would let the operator read every pod's spec.
	cmd.Flags().StringVar(&pods.namespace, "agent-namespace", defaultAgentNamespace,
		"with --all-nodes, the namespace of the agent pods ('' looks in every namespace)")
	return cmd
}

// localStatus asks the one agent --agent-address or the socket names.
func localStatus(ctx context.Context, g *globals) ([]render.NodeStatus, error) {
	c, err := g.agentFor(ctx, "")
	if err != nil {
		return nil, err
	}
	st, err := c.Status(ctx)
	if err != nil {
		return nil, err
	}
	return []render.NodeStatus{{Status: &st, Node: st.Node, Agent: render.AgentAnswered}}, nil
}

// allStatuses asks the agent of every node where an agent pod of sel is
// scheduled; with no such pod (agents run outside a DaemonSet, in another
// namespace, or with other labels) or sel.selector "", every node's. warn
// receives why every node is asked.
func allStatuses(ctx context.Context, g *globals, sel agentPods, warn io.Writer) ([]render.NodeStatus, error) {
	// --agent-address names one agent: every node's answer would be its.
	if g.agentAddress != "" {
		return nil, errors.New("--all-nodes asks each node's agent at its InternalIP and --agent-port; drop --agent-address")
	}
	if g.agentPort == 0 {
		return nil, errors.New("--all-nodes needs --agent-port")
	}
	if _, err := labels.Parse(sel.selector); err != nil {
		return nil, fmt.Errorf("--agent-selector %q: %w", sel.selector, err)
	}
	kube, _, err := g.kube()
	if err != nil {
		return nil, err
	}
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var agentPods map[string]*corev1.Pod // by node; nil: every node is asked
	if sel.selector != "" {
		const everyNode = "every node is asked, and one whose agent does not answer counts as failing"
		pods, err := kube.CoreV1().Pods(sel.namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.selector})
		switch {
		case err != nil:
			fmt.Fprintf(warn, "Warning: cannot list the agent pods (%v): %s\n", err, everyNode)
		case len(pods.Items) == 0:
			fmt.Fprintf(warn, "Warning: no pod matches --agent-selector=%s in %s: %s\n", sel.selector, sel.where(), everyNode)
		default:
			agentPods = byNode(pods.Items)
		}
	}
	// Asked together, statusParallel at a time: one after another, each
	// node whose agent does not answer (down, or none there) would hold the
	// rest back for --request-timeout.
	out := make([]render.NodeStatus, len(nodes.Items))
	sem := make(chan struct{}, statusParallel)
	var wg sync.WaitGroup
	for i := range nodes.Items {
		n := &nodes.Items[i]
		out[i].Node = n.Name
		pod := agentPods[n.Name]
		if agentPods != nil && pod == nil {
			out[i].Agent = render.AgentNotScheduled
			continue
		}
		if pod != nil {
			out[i].Pod, out[i].PodState = pod.Namespace+"/"+pod.Name, podState(pod)
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i].Agent = render.AgentNotAnswering
			c, err := g.agentOn(n)
			if err != nil {
				out[i].Error = err.Error()
				return
			}
			st, err := c.Status(ctx)
			switch {
			case err != nil:
				out[i].Error = err.Error()
			case st.Node != n.Name:
				// The node's address leads to another node's agent (a
				// forwarded or shared port): this node's is not reached.
				out[i].Error = fmt.Sprintf("the agent at %s serves node %q", c.Where(), st.Node)
			default:
				out[i].Status, out[i].Agent = &st, render.AgentAnswered
			}
		})
	}
	wg.Wait()
	return out, nil
}

// where names the namespaces searched, for warnings.
func (p agentPods) where() string {
	if p.namespace == "" {
		return "any namespace"
	}
	return "namespace " + p.namespace + " (--agent-namespace)"
}

// statusParallel is how many agents status --all-nodes asks at once.
const statusParallel = 16

// failing names the nodes whose agent should have answered and did not,
// or is not ready.
func failing(nodes []render.NodeStatus) error {
	var errs []error
	for _, n := range nodes {
		switch {
		case n.Agent == render.AgentNotAnswering:
			errs = append(errs, fmt.Errorf("node %s: agent not answering: %s", n.Node, n.Error))
		case n.Agent == render.AgentAnswered && !n.Ready:
			errs = append(errs, fmt.Errorf("node %s: agent not ready: %s", n.Node, n.NotReady))
		}
	}
	return errors.Join(errs...)
}

// byNode maps each node to its agent pod, a ready one where a rolling
// update has two.
func byNode(pods []corev1.Pod) map[string]*corev1.Pod {
	out := map[string]*corev1.Pod{}
	for i := range pods {
		p := &pods[i]
		node := podNode(p)
		if node == "" {
			continue
		}
		if cur := out[node]; cur == nil || !podReady(cur) && podReady(p) {
			out[node] = p
		}
	}
	return out
}

// podNode is the node a pod runs on or, before the scheduler binds it, the
// node a DaemonSet created it for: the DaemonSet controller pins each pod
// to its node by a required node affinity on the field metadata.name.
func podNode(p *corev1.Pod) string {
	if p.Spec.NodeName != "" {
		return p.Spec.NodeName
	}
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, f := range term.MatchFields {
				if f.Key == metav1.ObjectNameField && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
					return f.Values[0]
				}
			}
		}
	}
	return ""
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podState is the pod's phase and readiness: "Running, ready".
func podState(p *corev1.Pod) string {
	phase := string(p.Status.Phase)
	if phase == "" {
		phase = string(corev1.PodPending)
	}
	if podReady(p) {
		return phase + ", ready"
	}
	return phase + ", not ready"
}
