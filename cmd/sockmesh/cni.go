package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sockmesh/sockmesh/agent/cniconf"
	"github.com/sockmesh/sockmesh/agent/cnihandover"
	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/datapath/podns"
)

// cniSettings configure the CNI handover: sockmesh-cni hands a pod's
// network namespace over while the kubelet makes its sandbox, and the
// agent enrols it before any of the pod's containers runs.
type cniSettings struct {
	socket  string   // --cni-socket (empty: off)
	confDir string   // --cni-conf-dir (empty: the plugin is not installed)
	binDir  string   // --cni-bin-dir
	plugin  string   // --cni-plugin (empty: beside the agent's binary)
	exempt  []string // --cni-exempt-namespace
}

// cniEnroller settles sockmesh-cni's handovers: the pod as the agent's
// Snapshot lists it, translate's rule, the Enroller's adoption.
type cniEnroller struct{ en *enrol.Enroller }

func (c cniEnroller) Enrol(ctx context.Context, p cnihandover.Pod, netns *os.File) (cnihandover.Answer, error) {
	ns, err := podns.FromFile(netns)
	if err != nil {
		return cnihandover.Answer{}, err
	}
	w, err := c.en.Workload(ctx, snapshot.ObjectRef{Namespace: p.Namespace, Name: p.Name}, p.UID)
	if err != nil {
		ns.Close()
		return cnihandover.Answer{}, err
	}
	if !translate.EnrolledOnceAddressed(w) {
		ns.Close()
		return cnihandover.Answer{Reason: w.NotEnrolled}, nil
	}
	w.IPs = p.IPs // the API server may have none yet, or an older sandbox's
	if err := c.en.Adopt(w, ns); err != nil {
		return cnihandover.Answer{}, err
	}
	return cnihandover.Answer{Captured: true}, nil
}

// startCNI opens the handover socket and, with --cni-conf-dir, chains the
// plugin into the node's CNI configuration: after the socket, so that the
// plugin's first ADD finds it. Serving starts in run.
func (a *agent) startCNI() error {
	c := a.s.cni
	if c.socket == "" {
		return nil
	}
	var err error
	if a.cni, err = cnihandover.NewServer(cnihandover.Config{}, cniEnroller{a.en}, a.log, a.reg); err != nil {
		return err
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
	path, err := cniconf.Install(cniconf.Config{ConfDir: c.confDir, BinDir: c.binDir, Binary: c.plugin,
		Entry: map[string]any{"socket": c.socket, "exemptNamespaces": c.exempt}})
	if err != nil {
		return fmt.Errorf("chain sockmesh-cni: %w", err)
	}
	a.log.Info("sockmesh-cni chained", "conf", path, "socket", c.socket)
	return nil
}

// serveCNI serves the handover socket until close.
func (a *agent) serveCNI() error {
	if a.cni == nil {
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
