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
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	vip := cniAgent(t, n, cniNS)
	agentDiag := func() string { return agentLogs(n) }

	const pod = "first-call"
	res := firstCall(t, n, pod, "http://"+vip+"/first")
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

// cniAgent readies what a handover test needs: in namespace ns the TLS
// echo behind Service tls, whose BackendTLSPolicy is accepted; the agent
// with the component daemonset/cni, chained last in the node's CNI
// configuration (undone at cleanup, keepNodeCNI). It returns the Service's
// cluster IP.
func cniAgent(t *testing.T, n *node.Node, ns string) string {
	t.Helper()
	cgroupRoot := cgroup2Root(t)
	baseline := attachedPrograms(t, cgroupRoot)
	installCRDs(t, n)
	createNamespace(t, n, ns)
	deployTLSEcho(t, n, ns)
	if _, err := n.Kube.CoreV1().Services(ns).Create(t.Context(), service(ns, "tls", "tls-echo", 8443, ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createBackendTLSPolicy(t, n, ns, "tls")
	readyPod(t, n, ns, "tls-echo")
	agentDiag := func() string { return agentLogs(n) }

	keepNodeCNI(t, n, cgroupRoot, baseline)
	if _, err := n.Kubectl(t.Context(), "apply", "--server-side", "-k", cniKustomization(t, n)); err != nil {
		t.Fatal(err)
	}
	waitDaemonSetReady(t, n, agentNS, agentDS, 3*time.Minute)
	waitFor(t, time.Minute, "BackendTLSPolicy status Accepted", func(ctx context.Context) error {
		return policyAccepted(ctx, n, ns, "tls")
	}, agentDiag)
	waitFor(t, time.Minute, "containerd running sockmesh-cni last", func(ctx context.Context) error {
		plugins, err := n.CNIPlugins(ctx)
		if err == nil && (len(plugins) == 0 || plugins[len(plugins)-1] != cniconf.PluginType) {
			err = fmt.Errorf("containerd's plugins for the pod network: %q", plugins)
		}
		return err
	}, agentDiag)
	return clusterIP(t, n, ns, "tls")
}

// enrolledByHandover reports whether the agent's log says it enrolled pod
// (namespace/name) as sockmesh-cni handed it over (agent/enrol's Adopt).
func enrolledByHandover(t *testing.T, n *node.Node, pod string) error {
	t.Helper()
	return agentLogged(t, n, pod, "pod enrolled", "handed over by the CNI plugin")
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

const cniRolloutNS = "e2e-cni-rollout"

// TestCNIHandoverRollout proves that a handover outlives the agent it was
// made to (agent/enrol's records): a pod handed over to the agent a
// rolling update then replaces, whose app's first action, once the new
// agent alone runs, is a plaintext request to a Service whose
// BackendTLSPolicy asks for TLS, is answered through the proxy in TLS.
// The API server has no address for the pod throughout — an admission
// policy refuses the kubelet's status with one until the call is made —
// so that the new agent knows where the pod is from the old one's record
// alone: without it, its first write of the enrolment map drops the pod,
// and the request goes out in plaintext. (Unheld, the kubelet publishes
// the address within a second or two, long before a rolling update ends,
// and the test could not tell the record's work apart.)
func TestCNIHandoverRollout(t *testing.T) {
	n := cluster(t)
	requireAgentImage(t)
	vip := cniAgent(t, n, cniRolloutNS)
	holdPodAddresses(t, n, cniRolloutNS)
	agentDiag := func() string { return agentLogs(n) }

	const pod = "late-call"
	gate := t.TempDir()
	if err := os.Chmod(gate, 0o755); err != nil { // the app may run as any user
		t.Fatal(err)
	}
	pods := n.Kube.CoreV1().Pods(cniRolloutNS)
	if _, err := pods.Create(t.Context(), lateCallPod(pod, "http://"+vip+"/late", gate), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	record := waitRecord(t, cniRolloutNS+"/"+pod, agentDiag)
	t.Logf("the old agent recorded the pod's handover in %s", record)

	before := agentPods(t, n)
	agents := watchAgents(t, n)
	restartAgents(t, n)
	waitDaemonSetReady(t, n, agentNS, agentDS, 3*time.Minute)
	waitAgentsGone(t, n, before, agents)
	agents.stop()
	p, err := pods.Get(t.Context(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.PodIP != "" {
		t.Fatalf("the API server has the pod's address %s before its app's call: the new agent may have it from there, not from the record", p.Status.PodIP)
	}

	if err := os.WriteFile(filepath.Join(gate, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := podAnswer(t, n, cniRolloutNS, pod)
	if err := tlsAnswer(res); err != nil {
		t.Errorf("the pod's first call, after the rolling update: %v (%d %q %q)\n%s", err, res.Status, res.Text, res.Error, agents.report())
	} else {
		rep, _ := res.Report()
		t.Logf("the pod's first request reached the backend in %s (SNI %s) through the new agent", rep.TLS.Version, rep.TLS.ServerName)
	}
	if err := agentLogged(t, n, cniRolloutNS+"/"+pod, "pod handover taken over", ""); err != nil {
		t.Errorf("the new agent: %v\n%s", err, agents.report())
	}
}

// holdPodAddresses makes the API server refuse, until the test ends, the
// kubelet's status of a pod in ns labelled holdAddressLabel when it
// carries the pod's address: a ValidatingAdmissionPolicy. It returns once
// the policy is in force (a dry-run status with an address is refused).
func holdPodAddresses(t *testing.T, n *node.Node, ns string) {
	t.Helper()
	const name = "e2e-hold-pod-address"
	ctx := t.Context()
	vaps := n.Kube.AdmissionregistrationV1()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: new(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods/status"}},
					},
				}},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "!has(object.status.podIP)",
				Message:    "the test holds this pod's address back",
			}},
		},
	}
	if _, err := vaps.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := vaps.ValidatingAdmissionPolicies().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete admission policy %s: %v", name, err)
		}
	})
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
				ObjectSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{holdAddressLabel: "true"}},
			},
		},
	}
	if _, err := vaps.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := vaps.ValidatingAdmissionPolicyBindings().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete admission policy binding %s: %v", name, err)
		}
	})

	// A pod no node runs, to try the policy on.
	pods := n.Kube.CoreV1().Pods(ns)
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "address-held", Labels: map[string]string{holdAddressLabel: "true"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"e2e.sockmesh.dev/no-such-node": "true"},
			Containers:   []corev1.Container{{Name: "app", Image: appImage, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if _, err := pods.Create(ctx, probe, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the admission policy holding pod addresses in force", func(ctx context.Context) error {
		p, err := pods.Get(ctx, probe.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Status.PodIP = "192.0.2.1"
		_, err = pods.UpdateStatus(ctx, p, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return errors.New("a status with an address was accepted")
		}
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
			return err
		}
		return nil
	}, nil)
	if err := pods.Delete(ctx, probe.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
}

// holdAddressLabel marks the pods whose address holdPodAddresses holds
// back.
const holdAddressLabel = "e2e.sockmesh.dev/hold-address"

// lateCallPod is a pod whose one container's first action is a plaintext
// HTTP/1.1 request to url (appclient call), made once the test creates the
// file go in gate, a directory of the node's; its address is held back
// (holdAddressLabel).
func lateCallPod(name, url, gate string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{holdAddressLabel: "true"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			Volumes: []corev1.Volume{{
				Name:         "gate",
				VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: gate}},
			}},
			Containers: []corev1.Container{{
				Name: "app", Image: appImage, ImagePullPolicy: corev1.PullNever,
				Args:         []string{"call", "-after=/gate/go", url, "http1"},
				VolumeMounts: []corev1.VolumeMount{{Name: "gate", MountPath: "/gate", ReadOnly: true}},
			}},
		},
	}
}

// waitRecord waits for the agent's record of pod's handover (namespace/
// name) in the node's handover records and returns its path.
func waitRecord(t *testing.T, pod string, diag func() string) string {
	t.Helper()
	dir := cniwire.RecordDir(cniwire.DefaultSocket)
	var found string
	waitFor(t, 2*time.Minute, "the handover record of pod "+pod, func(context.Context) error {
		paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
		if err != nil {
			return err
		}
		for _, path := range paths {
			data, err := os.ReadFile(path)
			if err != nil {
				continue // removed meanwhile
			}
			var r struct {
				Workload struct {
					Pod struct{ Namespace, Name string }
				}
			}
			if json.Unmarshal(data, &r) == nil && r.Workload.Pod.Namespace+"/"+r.Workload.Pod.Name == pod {
				found = path
				return nil
			}
		}
		return fmt.Errorf("none among %q", paths)
	}, diag)
	return found
}

// podAnswer waits for the answer a pod's appclient call printed, from its
// container's log (the pod's status may not reach the API server).
func podAnswer(t *testing.T, n *node.Node, ns, name string) Result {
	t.Helper()
	var res Result
	waitFor(t, time.Minute, "the answer of pod "+ns+"/"+name, func(ctx context.Context) error {
		out, err := n.Kube.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(out)) == 0 {
			return errors.New("no answer yet")
		}
		return json.Unmarshal(bytes.TrimSpace(out), &res.Result)
	}, namespaceDiag(n, ns))
	return res
}

// agentLogged reports whether the agent's log (its pods' now) has a record
// of msg about pod (namespace/name), with reason unless that is empty.
func agentLogged(t *testing.T, n *node.Node, pod, msg, reason string) error {
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
		if r.Msg == msg && (reason == "" || r.Reason == reason) {
			return nil
		}
		seen = append(seen, strings.TrimSpace(line))
	}
	return fmt.Errorf("the agent did not log %q (%s); its records of the pod: %q", msg, reason, seen)
}
