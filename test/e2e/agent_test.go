package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/ctl/agentclient"
	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/metricsum"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	clusternode "github.com/sockmesh/sockmesh/test/cluster/node"
)

// buildAgent builds cmd/sockmesh once for the run, into a temporary
// directory, as the image's static binary is built.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sockmesh")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if err := clusternode.BuildBinary(ctx, "github.com/sockmesh/sockmesh/cmd/sockmesh", bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// agent is one run of the agent binary on a node.
type agent struct {
	*agentproc.Agent
	n *node
	// p and exited are the Agent's Process and Exited, which scenarios
	// read.
	p      *sandbox.Process
	exited <-chan struct{}
	socket string // its introspection socket
}

// startAgent runs `sockmesh agent` in the node's namespace and cgroup (its
// proxy's sockets need the getsockopt and sockops programs attached there)
// and waits until it logged its health listener. Cleanup stops it
// gracefully and then runs `sockmesh uninstall`, as an operator removing
// the agent would.
func (n *node) startAgent(t *testing.T) *agent {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "agent.sock")
	args := []string{"agent",
		"--source=kubernetes", "--kubeconfig=" + n.kubeconfig, "--node-name=" + n.name,
		"--proxy-mode=" + string(n.mode),
		"--health-listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
		"--bpffs=" + n.bpffs, "--cgroup=" + n.cg.Path,
		"--leader-elect", "--leader-election-namespace=" + leaderNamespace,
		"--service-cidr=" + strings.Join(serviceCIDRs, ","), "--pod-cidr=" + strings.Join(podCIDRs, ","),
		"--dns-server=" + n.dnsAddr.String(),
		"--log-format=json", "--drain-timeout=5s",
		// Not the host's /run/sockmesh: every test agent has its own socket.
		"--introspection-socket=" + socket,
	}
	if n.mode == inPod {
		// In-pod nodes run with acceleration, node-IP nodes without, so
		// every scenario of both modes covers both datapaths.
		args = append(args, "--accelerate")
	}
	cmd := exec.Command(n.c.agentBin, args...)
	// The pod name makes the Lease identity differ between runs on a node.
	// The node's addresses come as daemonset/ passes a dual-stack node's
	// status.hostIPs: node-IP mode's listeners are --proxy-listen's
	// default, one per family (on port proxyPort).
	cmd.Env = append(os.Environ(), "POD_NAME="+sandbox.Name(), "HOST_IPS="+n.ip4.String()+","+n.ip6.String())
	a := &agent{n: n, socket: socket, Agent: agentproc.Start(t, agentproc.Config{
		Name: "agent " + n.name, Cmd: cmd, NetNS: n.ns, Cgroup: n.cg,
		KeepLines: 2000, FailureLines: 150, Timeout: waitFor,
	})}
	a.p, a.exited = a.Process, a.Exited()
	// After sandbox's kill, so it runs first: a graceful stop, then
	// uninstall. A test that stopped the agent itself skips both.
	t.Cleanup(func() {
		select {
		case <-a.exited:
			return
		default:
		}
		if err := a.Stop(); err != nil {
			t.Error(err)
		}
		if n.agent != a {
			return // a newer agent on this node uninstalls
		}
		out, err := exec.Command(n.c.agentBin, "uninstall", "--bpffs="+n.bpffs).CombinedOutput()
		if err != nil {
			t.Errorf("sockmesh uninstall: %v\n%s", err, out)
		}
	})
	return a
}

// served is how many connections the agent's proxy has served
// (sockmesh_proxy_connections_total, every path).
func (a *agent) served(t testing.TB) float64 {
	t.Helper()
	return metricsum.Sum(t, a.metrics(t), "sockmesh_proxy_connections_total", nil)
}

// metrics scrapes the agent's metrics once, for metricsum to read: the
// values it gives were all read in that scrape.
func (a *agent) metrics(t testing.TB) prometheus.Gatherer {
	t.Helper()
	c, err := agentclient.New(agentclient.Config{Socket: a.socket})
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := c.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	scraped := slices.Collect(maps.Values(mfs))
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return scraped, nil })
}

// waitReady polls /readyz until it answers 200.
func (a *agent) waitReady(t testing.TB) {
	t.Helper()
	if _, err := a.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (a *agent) stop() error { return a.Stop() }

// report asks the agent for its introspection report (SIGUSR1).
func (a *agent) report(t testing.TB) introspect.Report {
	t.Helper()
	rep, err := a.Report()
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// waitSnapshot polls the agent's report until cond accepts the Snapshot it
// serves (the data planes have it then: the report shows the applied one).
func (a *agent) waitSnapshot(t testing.TB, what string, cond func(*snapshot.Snapshot) error) {
	t.Helper()
	eventually(t, "agent "+a.n.name+" serving "+what, func() error {
		rep := a.report(t)
		if rep.Snapshot == nil {
			return errors.New("no snapshot applied")
		}
		return cond(rep.Snapshot)
	})
}

// waitEnrolled waits until the agent has enrolled pod h, and returns its
// enrolment.
func (a *agent) waitEnrolled(t testing.TB, h *host) enrol.Pod {
	t.Helper()
	var got enrol.Pod
	eventually(t, "agent "+a.n.name+" enrolling "+h.namespace+"/"+h.name, func() error {
		rep := a.report(t)
		for _, p := range rep.Pods {
			if p.Pod.Namespace == h.namespace && p.Pod.Name == h.name {
				if p.State != enrol.Enrolled {
					return fmt.Errorf("%s: %s", p.State, p.Reason)
				}
				got = p
				return nil
			}
		}
		return errors.New("pod not in the report")
	})
	return got
}
