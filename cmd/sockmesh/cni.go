package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sockmesh/sockmesh/agent/cniconf"
	"github.com/sockmesh/sockmesh/agent/cnihandover"
	"github.com/sockmesh/sockmesh/agent/cniwire"
	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/datapath/podns"
)

// cniSettings configure the CNI handover: sockmesh-cni hands a pod's
// network namespace over while the kubelet makes its sandbox, and the
// agent enrols it before any of the pod's containers runs.
type cniSettings struct {
	socket  string        // --cni-socket (empty: off)
	confDir string        // --cni-conf-dir (empty: the plugin is not installed)
	binDir  string        // --cni-bin-dir
	plugin  string        // --cni-plugin (empty: beside the agent's binary)
	timeout time.Duration // --cni-timeout
	exempt  []string      // --cni-exempt-namespace
}

// cniEnroller settles sockmesh-cni's handovers: the pod as the agent's
// Snapshot lists it, translate's rule, the Enroller's adoption.
type cniEnroller struct{ en *enrol.Enroller }

func (c cniEnroller) Enrol(ctx context.Context, p cniwire.Pod, netns *os.File) (cniwire.Answer, error) {
	ns, err := podns.FromFile(netns)
	if err != nil {
		return cniwire.Answer{}, err
	}
	w, err := c.en.Workload(ctx, snapshot.ObjectRef{Namespace: p.Namespace, Name: p.Name}, p.UID)
	if err != nil {
		ns.Close()
		return cniwire.Answer{}, err
	}
	if !translate.EnrolledOnceAddressed(w) {
		ns.Close()
		return cniwire.Answer{Reason: w.NotEnrolled}, nil
	}
	w.IPs = p.IPs // the API server may have none yet, or an older sandbox's
	if err := c.en.Adopt(w, ns, p.ContainerID); err != nil {
		return cniwire.Answer{}, err
	}
	return cniwire.Answer{Captured: true}, nil
}

// startCNI opens the handover socket and, with --cni-conf-dir, installs
// the plugin's binary and chains it into the node's CNI configuration:
// after the socket, so that the plugin's first ADD finds it. Serving and
// keeping the entry chained start in run.
func (a *agent) startCNI() error {
	c := &a.s.cni
	var err error
	// Made without --cni-socket too: its metric is always there. Its bound
	// on a handover is below the plugin's, so that the plugin's ADD fails
	// with the agent's reason rather than its own deadline.
	cfg := cnihandover.Config{Timeout: c.timeout * 4 / 5}
	if a.cni, err = cnihandover.NewServer(cfg, cniEnroller{a.en}, a.log, a.reg); err != nil {
		return err
	}
	if c.socket == "" {
		return nil
	}
	if a.cniLn, err = cnihandover.Listen(c.socket); err != nil {
		return err
	}
	if c.confDir == "" {
		return nil
	}
	if c.plugin == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find the sockmesh-cni binary beside the agent's: %w", err)
		}
		c.plugin = filepath.Join(filepath.Dir(self), cniconf.PluginType)
	}
	if err := cniconf.InstallBinary(c.plugin, c.binDir); err != nil {
		return err
	}
	a.cniChained = a.chainCNI(errUnchained)
	return nil
}

// errUnchained is the outcome before the first chaining: its success is
// logged.
var errUnchained = errors.New("not chained yet")

// cniChainEvery is how often the agent checks that sockmesh-cni is still
// chained: a node's network plugin may write its configuration after the
// agent started (a new node), or rewrite it without the entry (its
// upgrade). Checking reads a small file and writes only when it changed.
const cniChainEvery = 10 * time.Second

// keepCNIChained chains sockmesh-cni again every cniChainEvery until ctx
// ends.
func (a *agent) keepCNIChained(ctx context.Context) {
	if a.s.cni.confDir == "" {
		return
	}
	t := time.NewTicker(cniChainEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.cniChained = a.chainCNI(a.cniChained)
	}
}

// chainCNI chains sockmesh-cni and logs when the outcome differs from
// last's; it returns the new outcome.
func (a *agent) chainCNI(last error) error {
	c := a.s.cni
	path, err := cniconf.Chain(c.confDir, map[string]any{"socket": c.socket, "timeout": c.timeout.String(), "exemptNamespaces": c.exempt})
	switch {
	case err == nil && last != nil:
		a.log.Info("sockmesh-cni chained", "conf", path, "socket", c.socket)
	case err != nil && (last == nil || err.Error() != last.Error()):
		// Capture goes on without it, from when the API server has a pod's
		// address (docs/failures.md).
		a.log.Warn("cannot chain sockmesh-cni: pods are captured only once the API server has their address",
			"conf_dir", c.confDir, "err", err)
	}
	return err
}

// serveCNI serves the handover socket until close.
func (a *agent) serveCNI() error {
	if a.cniLn == nil {
		return nil
	}
	return a.cni.Serve(a.cniLn)
}

// closeCNI stops the handovers: those under way fail, and the kubelet's
// retry reaches the next agent. The chained entry stays (`sockmesh
// uninstall` removes it): pods wait for the next agent rather than start
// uncaptured.
func (a *agent) closeCNI() {
	if a.cni != nil {
		a.cni.Close()
	}
	if a.cniLn != nil {
		a.cniLn.Close() // served or not (start failed after Listen)
	}
}

// records is where the Enroller records the pods handed over, for the
// next agent (empty without --cni-socket).
func (c cniSettings) records() string {
	if c.socket == "" {
		return ""
	}
	return cniwire.RecordDir(c.socket)
}
