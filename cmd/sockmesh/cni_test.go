package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/agent/cniconf"
	"github.com/sockmesh/sockmesh/agent/cniwire"
	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/sandbox"
)

// earlyYAML is the client pod as the API server has it while the kubelet
// makes its sandbox: Pending, no address. Beside it, a pod that opted out.
const earlyYAML = `apiVersion: v1
kind: Pod
metadata: {name: client, namespace: app, uid: 00000000-0000-4000-8000-0000000000c1}
spec:
  nodeName: %s
  containers: [{name: app, image: app}]
status: {phase: Pending}
---
apiVersion: v1
kind: Pod
metadata: {name: quiet, namespace: app, uid: 00000000-0000-4000-8000-0000000000c2, labels: {sockmesh.io/capture: disabled}}
spec:
  nodeName: %s
  containers: [{name: app, image: app}]
status: {phase: Pending}
`

const netConf = `{"cniVersion": "1.0.0", "name": "smnet", "plugins": [{"type": "bridge", "bridge": "smbr0"}]}`

// TestCNIHandover: an agent with --cni-socket and --cni-conf-dir chains
// sockmesh-cni into the node's network configuration, and a pod handed
// over before the API server has its address is captured at once: its
// first request to a Service whose policy asks for TLS goes out in TLS.
// A pod that opted out is answered not captured. The entry outlives the
// agent; `sockmesh uninstall --cni-conf-dir` removes it.
func TestCNIHandover(t *testing.T) {
	e := newEnv(t)
	e.writeFile(t, "client.yaml", fmt.Sprintf(earlyYAML, testNode, testNode))
	dir := t.TempDir()
	socket := filepath.Join(dir, "run", "cni.sock")
	confDir, binDir, plugin := filepath.Join(dir, "net.d"), filepath.Join(dir, "bin"), filepath.Join(dir, "sockmesh-cni")
	for _, d := range []string{confDir, binDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(plugin, []byte("plugin"), 0o755); err != nil {
		t.Fatal(err)
	}

	a := e.startAgent(t, "--proxy-mode=node-ip", "--proxy-listen="+addrs.Node.String()+":0", "--cni-socket="+socket, "--cni-conf-dir="+confDir, "--cni-bin-dir="+binDir, "--cni-plugin="+plugin,
		"--cni-exempt-namespace=kube-system", "--cni-timeout=20s")
	if _, err := a.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The node's network plugin writes its configuration after the agent
	// started: the agent chains sockmesh-cni into it then.
	a.logged(t, "that it cannot chain sockmesh-cni yet", func(r agentproc.Record) bool {
		return r.Msg() == "cannot chain sockmesh-cni: pods are captured only once the API server has their address"
	})
	conf := filepath.Join(confDir, "10-smnet.conflist")
	if err := os.WriteFile(conf, []byte(netConf), 0o644); err != nil {
		t.Fatal(err)
	}
	a.logged(t, "sockmesh-cni chained", func(r agentproc.Record) bool { return r.Msg() == "sockmesh-cni chained" })
	want := `{"type":"sockmesh-cni","socket":"` + socket + `","timeout":"20s","exemptNamespaces":["kube-system"]}`
	if got := chained(t, conf); !jsonEqual(t, got, want) {
		t.Errorf("chained entry = %s, want %s", got, want)
	}
	if _, err := os.Stat(filepath.Join(binDir, cniconf.PluginType)); err != nil {
		t.Errorf("plugin binary not installed: %v", err)
	}

	early := cniwire.Pod{Namespace: "app", Name: "client", UID: "00000000-0000-4000-8000-0000000000c1",
		ContainerID: "c1", NetNS: e.client.Path(), IPs: []netip.Addr{addrs.Client.Addr()}}
	if got, err := cniwire.Add(t.Context(), socket, early, openNetNS(t, early.NetNS)); err != nil || !got.Captured {
		t.Fatalf("hand over app/client = %+v, %v; want captured", got, err)
	}
	checkTLSOriginated(t, e.get(t, "/first"))
	// Recorded for the next agent, until the API server has its address.
	if _, err := os.Stat(filepath.Join(cniwire.RecordDir(socket), "c1.json")); err != nil {
		t.Errorf("the handover's record: %v", err)
	}
	pods := report(t, a).Pods
	if i := slices.IndexFunc(pods, func(p enrol.Pod) bool { return p.Pod.Name == "client" }); i < 0 ||
		pods[i].State != enrol.Enrolled || pods[i].NetNSCookie != e.clientCookie {
		t.Errorf("pods = %+v, want app/client Enrolled in netns %d", pods, e.clientCookie)
	}

	quiet := cniwire.Pod{Namespace: "app", Name: "quiet", UID: "00000000-0000-4000-8000-0000000000c2",
		NetNS: e.client.Path(), IPs: []netip.Addr{addrs.Client.Addr()}}
	if got, err := cniwire.Add(t.Context(), socket, quiet, openNetNS(t, quiet.NetNS)); err != nil || got.Captured || !strings.Contains(got.Reason, "disabled") {
		t.Errorf("hand over app/quiet = %+v, %v; want not captured, for its label", got, err)
	}

	a.stop(t)
	if got := chained(t, conf); got == "" {
		t.Error("the chained entry went with the agent: pods would start uncaptured until the next")
	}
	out, err := sandbox.HelperCommand(t, "sockmesh", "uninstall", "--bpffs="+e.bpffs, "--cni-conf-dir="+confDir,
		"--cni-bin-dir="+binDir, "--introspection-socket="+filepath.Join(dir, "none.sock")).CombinedOutput()
	if err != nil {
		t.Fatalf("sockmesh uninstall: %v\n%s", err, out)
	}
	if got := chained(t, conf); got != "" {
		t.Errorf("chained entry after uninstall = %s, want none", got)
	}
}

// openNetNS opens the namespace at path, as the plugin does.
func openNetNS(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// chained returns the sockmesh-cni entry of the network configuration at
// path ("" if none).
func chained(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Plugins []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	for _, p := range c.Plugins {
		if strings.Contains(string(p), `"sockmesh-cni"`) {
			return string(p)
		}
	}
	return ""
}

func jsonEqual(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal([]byte(a), &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}
