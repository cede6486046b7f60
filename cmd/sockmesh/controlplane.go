package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/leader"
	"github.com/sockmesh/sockmesh/agent/resolve"
	"github.com/sockmesh/sockmesh/agent/selectorsvc"
	"github.com/sockmesh/sockmesh/agent/source"
	"github.com/sockmesh/sockmesh/agent/source/file"
	kubesource "github.com/sockmesh/sockmesh/agent/source/kubernetes"
	"github.com/sockmesh/sockmesh/agent/status"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/datapath/podns"
)

// newControlPlane builds the config source, the resolver, the watch of
// host's addresses (the node's) and, for the kubernetes source, the status
// and generated-Service writers (behind the leader lease with
// --leader-elect), and the control plane that runs them; kinds is the
// kubernetes source's Kinds (nil for the file source). ctx bounds the first
// read of host's addresses.
func newControlPlane(ctx context.Context, s settings, host *podns.NS, log *slog.Logger, reg prometheus.Registerer) (_ *controlplane.ControlPlane, kinds func() []kubesource.KindStatus, _ error) {
	res, err := resolve.New(s.dns, log, reg)
	if err != nil {
		return nil, nil, err
	}
	// Every address of the node, not only the proxy's listeners (none in
	// in-pod mode) nor the few a Node object lists: a connection to any of
	// them, a second interface's or a bridge's, reaches the node's own
	// services.
	addrs, err := host.WatchAddrs(ctx, log)
	if err != nil {
		return nil, nil, fmt.Errorf("find the node's addresses: %w", err)
	}
	cfg := controlplane.Config{Node: s.node, NodeAddrs: addrs, Resolver: res}
	cfg.Node.Name = s.nodeName

	var src source.Source
	switch s.source {
	case "file":
		if src, err = file.New(file.Config{Dir: s.manifests}, log, reg); err != nil {
			return nil, nil, err
		}
	case "kubernetes":
		rc, err := restConfig(s.kubeconfig)
		if err != nil {
			return nil, nil, err
		}
		rc.QPS, rc.Burst = s.kubeQPS, s.kubeBurst
		kube, gw, err := kubesource.NewClients(rc)
		if err != nil {
			return nil, nil, err
		}
		ks, err := kubesource.New(kubesource.Config{NodeName: s.nodeName}, kube, gw, log, reg)
		if err != nil {
			return nil, nil, err
		}
		src, kinds = ks, ks.Kinds
		sw, err := status.New(status.Config{}, gw, log, reg)
		if err != nil {
			return nil, nil, err
		}
		svcs, err := selectorsvc.New(selectorsvc.Config{}, kube, log, reg)
		if err != nil {
			return nil, nil, err
		}
		cfg.Access = controlplane.SelfAccess(kube.AuthorizationV1())
		cfg.Writers = []controlplane.Writer{
			controlplane.WriterFunc(func(ctx context.Context, in translate.Input, r translate.Result, g *controlplane.Gate) error {
				return sw.Write(ctx, in, r.Status, g)
			}),
			controlplane.WriterFunc(func(ctx context.Context, in translate.Input, r translate.Result, g *controlplane.Gate) error {
				return svcs.Apply(ctx, in, r.EndpointSelectorServices, g)
			}),
		}
		if s.leaderElect {
			leaseKube, err := leaseClient(rc)
			if err != nil {
				return nil, nil, err
			}
			el, err := leader.New(leader.Config{Namespace: s.leaderNS, Identity: leaderIdentity(s)}, leaseKube, log, reg)
			if err != nil {
				return nil, nil, err
			}
			cfg.Leader = el
		} else {
			log.Warn("no leader election (--leader-elect): this agent writes status and generated Services; run no other agent that does, or their answers take turns")
		}
	}
	cp, err := controlplane.New(cfg, src, log, reg)
	return cp, kinds, err
}

// restConfig loads --kubeconfig, else $KUBECONFIG or ~/.kube/config, else
// the in-cluster service account.
func restConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubernetes client config: %w", err)
	}
	rc = rest.CopyConfig(rc)
	rest.AddUserAgent(rc, "sockmesh-agent/"+buildVersion())
	return rc, nil
}

// leaseRequestTimeout bounds each request of the leader elector's client.
// client-go sends the acquiring requests with no deadline, and bounds a
// renewal and the release at shutdown only by RenewDeadline (10 s) as a
// whole: over a connection to an API server that hangs (an outage, a
// partition: when nodes get drained) one request would eat it all. At 5 s a
// hung renewal is retried once before the lease is lost, and the release
// gives up 5 s after shutdown began (10 s if the Get answers and the Update
// hangs), while the proxy drains (agent.run does not wait for it).
const leaseRequestTimeout = 5 * time.Second

// leaseClient returns the elector's client: rc with leaseRequestTimeout.
func leaseClient(rc *rest.Config) (k8s.Interface, error) {
	rc = rest.CopyConfig(rc)
	rc.Timeout = leaseRequestTimeout
	kube, err := k8s.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create leader election client: %w", err)
	}
	return kube, nil
}

// leaderIdentity names this agent in the Lease: the node, and the pod when
// known (two agents may overlap on a node during a rollout). Without a pod
// name the host name is no help (with hostNetwork two agents on a node share
// the node's) and two agents with one identity would both lead: a random
// suffix tells them apart.
func leaderIdentity(s settings) string {
	if s.podName != "" {
		return s.nodeName + "/" + s.podName
	}
	h, _ := os.Hostname()
	return s.nodeName + "/" + h + "_" + rand.Text()
}
