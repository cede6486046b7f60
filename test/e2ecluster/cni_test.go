package e2ecluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/agent/cniconf"
	"github.com/sockmesh/sockmesh/agent/cniwire"
	"github.com/sockmesh/sockmesh/test/cluster/node"
)

const cniNS = "e2e-cni"

// TestCNIHandover proves the opt-in component daemonset/cni under the
// node's kubelet and containerd: a pod whose very first action is a
// plaintext request to a Service whose BackendTLSPolicy asks for TLS is
// answered through the proxy, the backend seeing TLS, and the agent
// enrolled the pod when sockmesh-cni handed its network namespace over
// while containerd made its sandbox, before any of its containers ran —
// not later, from the address the API server publishes, which here may
// come before the app's first connection or after it: the first call's
// answer alone cannot tell the component's work apart. The component
// points at the node's own CNI directories; the test's cleanup unchains
// the plugin (`sockmesh uninstall --cni-conf-dir`) and checks the conflist
// is as it found it.
func TestCNIHandover(t *testing.T) {
	n := cluster(t)
	requireAgentImage(t)
	cgroupRoot := cgroup2Root(t)
	baseline := attachedPrograms(t, cgroupRoot)
	installCRDs(t, n)
	createNamespace(t, n, cniNS)
	deployTLSEcho(t, n, cniNS)
	if _, err := n.Kube.CoreV1().Services(cniNS).Create(t.Context(), service(cniNS, "tls", "tls-echo", 8443, ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createBackendTLSPolicy(t, n, cniNS, "tls")
	readyPod(t, n, cniNS, "tls-echo")
	agentDiag := func() string { return agentLogs(n) }

	keepNodeCNI(t, n, cgroupRoot, baseline)
	if _, err := n.Kubectl(t.Context(), "apply", "--server-side", "-k", cniKustomization(t, n)); err != nil {
		t.Fatal(err)
	}
	waitDaemonSetReady(t, n, agentNS, agentDS, 3*time.Minute)
	waitFor(t, time.Minute, "BackendTLSPolicy status Accepted", func(ctx context.Context) error {
		return policyAccepted(ctx, n, cniNS, "tls")
	}, agentDiag)
	waitFor(t, time.Minute, "containerd running sockmesh-cni last", func(ctx context.Context) error {
		plugins, err := n.CNIPlugins(ctx)
		if err == nil && (len(plugins) == 0 || plugins[len(plugins)-1] != cniconf.PluginType) {
			err = fmt.Errorf("containerd's plugins for the pod network: %q", plugins)
		}
		return err
	}, agentDiag)

	const pod = "first-call"
	res := firstCall(t, n, pod, "http://"+clusterIP(t, n, cniNS, "tls")+"/first")
	rep, err := res.Report()
	if err == nil && res.Status != http.StatusOK {
		err = fmt.Errorf("status %d", res.Status)
	}
	if err == nil {
		err = wantTLS(rep)
	}
	if err != nil {
		t.Errorf("the pod's first call: %v (%d %q %q)\n%s", err, res.Status, res.Text, res.Error, agentDiag())
	} else {
		t.Logf("the pod's first request reached the backend in %s (SNI %s) from %s", rep.TLS.Version, rep.TLS.ServerName, rep.RemoteAddr)
	}
	if err := enrolledByHandover(t, n, cniNS+"/"+pod); err != nil {
		t.Errorf("pod %s/%s: %v\n%s", cniNS, pod, err, agentDiag())
	}
	if v := agentMetric(t, n, `sockmesh_cni_handovers_total{result="captured"}`); v < 1 {
		t.Errorf("sockmesh_cni_handovers_total{result=captured} = %v, want the pod's handover", v)
	}
}

// enrolledByHandover reports whether the agent's log says it enrolled pod
// (namespace/name) as sockmesh-cni handed it over (agent/enrol's Adopt).
func enrolledByHandover(t *testing.T, n *node.Node, pod string) error {
	t.Helper()
	out, err := n.Kubectl(t.Context(), "logs", "-n", agentNS, "daemonset/"+agentDS, "-c", "agent")
	if err != nil {
		return err
	}
	var seen []string
	for line := range strings.Lines(string(out)) {
		var r struct{ Msg, Pod, Reason string }
		if json.Unmarshal([]byte(line), &r) != nil || r.Pod != pod {
			continue
		}
		if r.Msg == "pod enrolled" && r.Reason == "handed over by the CNI plugin" {
			return nil
		}
		seen = append(seen, strings.TrimSpace(line))
	}
	return fmt.Errorf("the agent did not log its enrolment by handover; its records of the pod: %q", seen)
}

// cniKustomization writes a kustomization, as a user would: daemonset/
// with the component cni, its host paths those of the node's runtime.
// It returns its directory.
func cniKustomization(t *testing.T, n *node.Node) string {
	t.Helper()
	abs, err := filepath.Abs("../../daemonset")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	base, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"kustomization.yaml": fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [%s]
components: [%s]
patches: [{path: node-cni.yaml}]
`, base, filepath.Join(base, "cni")),
		"node-cni.yaml": fmt.Sprintf(`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: %s, namespace: %s}
spec:
  template:
    spec:
      volumes:
        - {name: cni-conf, hostPath: {path: %s}}
        - {name: cni-bin, hostPath: {path: %s}}
`, agentDS, agentNS, n.CNIConfDir, n.CNIBinDir),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// firstCall runs a pod named name whose one container's first action is a
// plaintext HTTP/1.1 request to url (appclient call), and returns what it
// got, from the container's log.
func firstCall(t *testing.T, n *node.Node, name, url string) Result {
	t.Helper()
	pods := n.Kube.CoreV1().Pods(cniNS)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "app", Image: appImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"call", url, "http1"},
			}},
		},
	}
	if _, err := pods.Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "pod "+cniNS+"/"+name+" done", func(ctx context.Context) error {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodSucceeded {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	}, namespaceDiag(n, cniNS))
	out, err := pods.GetLogs(name, &corev1.PodLogOptions{}).DoRaw(t.Context())
	if err != nil {
		t.Fatalf("logs of pod %s: %v", name, err)
	}
	var res Result
	if err := json.Unmarshal(bytes.TrimSpace(out), &res.Result); err != nil {
		t.Fatalf("pod %s's answer %q: %v", name, out, err)
	}
	return res
}

// keepNodeCNI registers the cleanup that leaves the node as the test found
// it, whatever the test got to: the agent deleted, its pinned programs and
// sockmesh-cni's entry and binary removed (`sockmesh uninstall
// --cni-conf-dir`), the conflist as it was — later tests' pods would wait
// for an agent otherwise — and the handover socket's directory gone.
func keepNodeCNI(t *testing.T, n *node.Node, cgroupRoot string, baseline map[ebpf.AttachType]int) {
	t.Helper()
	confs, err := filepath.Glob(filepath.Join(n.CNIConfDir, "*.conflist"))
	if err != nil || len(confs) != 1 {
		t.Fatalf("the node's conflists: %q (%v), want one", confs, err)
	}
	conf := confs[0]
	before, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	sockDir := filepath.Dir(cniwire.DefaultSocket)
	_, err = os.Stat(sockDir)
	sockDirAbsent := errors.Is(err, fs.ErrNotExist)
	t.Cleanup(func() {
		uninstall(t, n, cgroupRoot, baseline, "--cni-conf-dir="+n.CNIConfDir, "--cni-bin-dir="+n.CNIBinDir)
		after, err := os.ReadFile(conf)
		if err != nil || !sameJSON(before, after) {
			t.Errorf("%s after uninstall (%v):\n%s\nwant, as before the test:\n%s", conf, err, after, before)
			if err := os.WriteFile(conf, before, 0o644); err != nil {
				t.Errorf("restore %s: %v", conf, err)
			}
		}
		if _, err := os.Lstat(filepath.Join(n.CNIBinDir, cniconf.PluginType)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left in %s after uninstall (%v)", cniconf.PluginType, n.CNIBinDir, err)
		}
		if sockDirAbsent {
			if err := os.RemoveAll(sockDir); err != nil {
				t.Error(err)
			}
		}
	})
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a, b []byte) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	ja, _ := json.Marshal(va)
	jb, _ := json.Marshal(vb)
	return bytes.Equal(ja, jb)
}
