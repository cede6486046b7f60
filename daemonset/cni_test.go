package daemonset_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/agent/cniwire"
	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/test/apiserver"
)

// cniArgs are what the component cni adds to the agent's arguments.
var cniArgs = []string{
	"--cni-socket=" + cniwire.DefaultSocket,
	"--cni-conf-dir=/host/etc/cni/net.d",
	"--cni-bin-dir=/host/opt/cni/bin",
}

// TestCNIComponent builds daemonset/ with the opt-in component cni through
// kubectl's kustomize and checks that it only adds the CNI handover to the
// agent: its flags, the host's CNI directories mounted where they name, and
// a socket on the host's /run/sockmesh, where the plugin (run on the host)
// finds it. A real kube-apiserver accepts the DaemonSet.
func TestCNIComponent(t *testing.T) {
	const dsKey = "DaemonSet/sockmesh-system/sockmesh"
	base, with := byKey(kustomize(t, "")), byKey(kustomize(t, "cni"))
	for k, o := range with {
		if k != dsKey && cmp.Diff(base[k], o) != "" {
			t.Errorf("the component changes or adds %s", k)
		}
	}
	if len(with) != len(base) {
		t.Errorf("the component builds %d objects, the default %d", len(with), len(base))
	}
	ds := typed[appsv1.DaemonSet](t, []map[string]any{with[dsKey]}, "DaemonSet")[0]
	spec := &ds.Spec.Template.Spec
	agent := &spec.Containers[0]
	if n := len(agent.Args); n < len(cniArgs) || !slices.Equal(agent.Args[n-len(cniArgs):], cniArgs) {
		t.Errorf("agent args end %v, want %v", agent.Args, cniArgs)
	}
	hostPathOf := func(mountPath string) string {
		for _, m := range agent.VolumeMounts {
			if mountPath != m.MountPath && !strings.HasPrefix(mountPath, m.MountPath+"/") {
				continue
			}
			for _, v := range spec.Volumes {
				if v.Name == m.Name && v.HostPath != nil && !m.ReadOnly {
					return v.HostPath.Path + strings.TrimPrefix(mountPath, m.MountPath)
				}
			}
		}
		return ""
	}
	for mount, host := range map[string]string{
		"/host/etc/cni/net.d": "/etc/cni/net.d",
		"/host/opt/cni/bin":   "/opt/cni/bin",
		cniwire.DefaultSocket: cniwire.DefaultSocket, // the plugin's entry names the agent's path
	} {
		if got := hostPathOf(mount); got != host {
			t.Errorf("the agent's %s is the host's %q (read-write), want %s", mount, got, host)
		}
	}

	// Without what it adds, the DaemonSet is the default one.
	agent.Args = agent.Args[:len(agent.Args)-len(cniArgs)]
	agent.VolumeMounts = slices.DeleteFunc(agent.VolumeMounts, func(m corev1.VolumeMount) bool { return strings.HasPrefix(m.Name, "cni-") })
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool { return strings.HasPrefix(v.Name, "cni-") })
	if diff := cmp.Diff(typed[appsv1.DaemonSet](t, []map[string]any{base[dsKey]}, "DaemonSet")[0], ds); diff != "" {
		t.Errorf("the component changes the DaemonSet beyond the CNI handover (-default +with, additions removed):\n%s", diff)
	}

	created := typed[appsv1.DaemonSet](t, []map[string]any{with[dsKey]}, "DaemonSet")[0]
	env := apiserver.Start(t, "--allow-privileged=true")
	must.Succeed(t)(env.Kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: created.Namespace}}, metav1.CreateOptions{}))
	if _, err := env.Kube.AppsV1().DaemonSets(created.Namespace).Create(t.Context(), &created, metav1.CreateOptions{}); err != nil {
		t.Errorf("create the DaemonSet with cni: %v", err)
	}
}
