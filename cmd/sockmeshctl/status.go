package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/ctl/render"
)

func newStatusCommand(g *globals) *cobra.Command {
	var allNodes bool
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
one agent).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := g.format()
			if err != nil {
				return err
			}
			// Each request has --request-timeout: no bound on them all,
			// which nodes that do not answer would spend for those that do.
			sts, err := statuses(cmd.Context(), g, allNodes)
			if len(sts) == 0 {
				return err
			}
			if err := render.Print(cmd.OutOrStdout(), f, sts, func(w io.Writer) error { return render.Status(w, sts) }); err != nil {
				return err
			}
			return err // nodes that did not answer, after those that did
		},
	}
	cmd.Flags().BoolVar(&allNodes, "all-nodes", false, "ask every node's agent (needs --agent-port and the API server; not with --agent-address)")
	return cmd
}

func statuses(ctx context.Context, g *globals, allNodes bool) ([]introspect.Status, error) {
	if !allNodes {
		c, err := g.agentFor(ctx, "")
		if err != nil {
			return nil, err
		}
		st, err := c.Status(ctx)
		if err != nil {
			return nil, err
		}
		return []introspect.Status{st}, nil
	}
	// --agent-address names one agent: every node's answer would be its.
	if g.agentAddress != "" {
		return nil, errors.New("--all-nodes asks each node's agent at its InternalIP and --agent-port; drop --agent-address")
	}
	if g.agentPort == 0 {
		return nil, errors.New("--all-nodes needs --agent-port")
	}
	kube, _, err := g.kube()
	if err != nil {
		return nil, err
	}
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	// Asked together, statusParallel at a time: one after another, each
	// node whose agent does not answer (down, or none there) would hold the
	// rest back for --request-timeout.
	answers := make([]*introspect.Status, len(nodes.Items))
	errs := make([]error, len(nodes.Items))
	sem := make(chan struct{}, statusParallel)
	var wg sync.WaitGroup
	for i := range nodes.Items {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			n := &nodes.Items[i]
			c, err := g.agentOn(n)
			if err == nil {
				var st introspect.Status
				if st, err = c.Status(ctx); err == nil {
					answers[i] = &st
					return
				}
			}
			errs[i] = fmt.Errorf("node %s: %w", n.Name, err)
		})
	}
	wg.Wait()
	var out []introspect.Status
	for _, st := range answers {
		if st != nil {
			out = append(out, *st)
		}
	}
	return out, errors.Join(errs...)
}

// statusParallel is how many agents status --all-nodes asks at once.
const statusParallel = 16
