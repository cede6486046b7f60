package main

import (
	"encoding/json"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/ctl/describe"
	"github.com/sockmesh/sockmesh/ctl/render"
	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/test/apiserver"
)

// TestNamespacedRBAC runs explain and describe as an app team whose RBAC
// is a Role in its own namespace, as is common: it may not list Services
// cluster-wide. explain by address failed outright (forbidden), and
// describe said the team's own Service was "not found". Both now read
// the namespace alone and warn about what they left out.
func TestNamespacedRBAC(t *testing.T) {
	api := apiserver.Start(t)
	ctx := t.Context()
	kube := api.Kube
	const team = "appteam"
	vip, src := createClientAndService(t, kube, "node-a")
	must.Succeed(t)(kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: team, Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "services", "configmaps"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list"}},
			{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"*"}, Verbs: []string{"list"}},
		},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: team, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: team},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: team}},
	}, metav1.CreateOptions{}))
	kubeconfig := impersonating(t, api.Kubeconfig, team, "system:authenticated")

	sock := filepath.Join(t.TempDir(), "agent.sock")
	srv, err := httpapi.NewServer(httpapi.Config{Socket: sock}, src, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)

	flags := []string{"--kubeconfig=" + kubeconfig, "--agent-socket=" + sock, "-n", ns, "-o", "json"}
	out, err := runCtl(append([]string{"explain", "client", vip.String() + ":80"}, flags...)...)
	var e render.Explained
	if err != nil || json.Unmarshal([]byte(out), &e) != nil || e.Query.Service == nil || e.Query.Service.Name != "secure" ||
		!e.Capture.Captured || e.Related == nil || e.Related.Service.Name != "secure" {
		t.Errorf("explain client %s:80 with a namespaced Role: %v; want the Service found in namespace %s and described\n%s", vip, err, ns, out)
	}
	out, err = runCtl(append([]string{"describe", "service", "secure"}, flags...)...)
	var s describe.Service
	if err != nil || json.Unmarshal([]byte(out), &s) != nil || len(s.Ports) != 1 || !s.Ports[0].Captured ||
		!strings.Contains(strings.Join(s.Warnings, "\n"), "cannot list Services cluster-wide (forbidden), only in namespace "+ns) {
		t.Errorf("describe service secure with a namespaced Role: %v; want its captured port and a warning naming what was left out\n%s", err, out)
	}
}

// createClientAndService creates the pod client of namespace ns on node
// and the Service secure, captured (appProtocol h2c), and returns the
// Service's address and the sources of node's agent, whose Snapshot
// captures it.
func createClientAndService(t *testing.T, kube kubernetes.Interface, node string) (netip.Addr, *introspect.Sources) {
	t.Helper()
	ctx := t.Context()
	vip := netip.MustParseAddr("10.96.237.10")
	no := false
	must.Succeed(t)(kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	// No controller manager runs: make the ServiceAccount pods need.
	must.Succeed(t)(kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "client", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "secure", Namespace: ns},
		Spec: corev1.ServiceSpec{ClusterIP: vip.String(), ClusterIPs: []string{vip.String()},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, AppProtocol: ptr("kubernetes.io/h2c")}}},
	}, metav1.CreateOptions{}))
	be := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: ns, Name: "secure", Port: 80}
	snap := must.Value[*snapshot.Snapshot](t)(snapshot.New(3,
		[]snapshot.Frontend{{Service: snapshot.ObjectRef{Namespace: ns, Name: "secure"}, Port: 80, PortName: "http",
			Addresses: []netip.Addr{vip}, Backend: be}},
		[]snapshot.Backend{{Ref: be, Protocol: snapshot.ProtocolH2C}},
		[]snapshot.Workload{{Pod: snapshot.ObjectRef{Namespace: ns, Name: "client"}, Enrolled: true}}))
	return vip, &introspect.Sources{Node: node, Applied: func() (*snapshot.Snapshot, time.Time) { return snap, time.Now() }}
}

// impersonating writes a copy of kubeconfig whose requests impersonate
// user, a member of groups, and returns its path.
func impersonating(t *testing.T, kubeconfig, user string, groups ...string) string {
	t.Helper()
	cfg := must.Value[*clientcmdapi.Config](t)(clientcmd.LoadFromFile(kubeconfig))
	for _, u := range cfg.AuthInfos {
		u.Impersonate, u.ImpersonateGroups = user, groups
	}
	path := filepath.Join(t.TempDir(), "kubeconfig-"+user)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
