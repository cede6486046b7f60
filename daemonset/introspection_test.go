package daemonset_test

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/daemonset"
	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/internal/yamldocs"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/pki"
)

const (
	// component is the opt-in TCP introspection component, from this
	// package's directory.
	component = "introspection-tcp"
	// tlsSecret holds the agents' certificate, as a kubernetes.io/tls
	// Secret (cert-manager's) does: tls.crt, tls.key.
	tlsSecret = "sockmesh-introspection"
	// tokenSecret holds the bearer token: token.
	tokenSecret = "sockmesh-introspection-token"
)

// introspectionFiles are the files the agent reads, by flag, and where
// each comes from: Secret and key.
var introspectionFiles = []struct{ flag, secret, key string }{
	{"--introspection-tls-cert", tlsSecret, corev1.TLSCertKey},
	{"--introspection-tls-key", tlsSecret, corev1.TLSPrivateKeyKey},
	{"--introspection-token-file", tokenSecret, "token"},
}

// operatorRights are what `sockmeshctl status --all-nodes` and `explain
// --agent-port` read to reach the agents (cmd/sockmeshctl allStatuses,
// agentFor): the Nodes, cluster-wide (get: explain's one), and the agent
// pods, in the agent's namespace only.
var (
	operatorNodeRights = map[string][]string{"/nodes": {"get", "list"}}
	operatorPodRights  = map[string][]string{"/pods": {"list"}}
)

// TestIntrospectionTCPComponent builds daemonset/ with and without the
// component introspection-tcp through kubectl's kustomize, as an operator
// does, and checks that the component only adds: TCP introspection on the
// node's address with TLS and a token from the Secret, mounted read-only
// and rotatable, and the operators' roles; every other object and field is
// the default install's.
func TestIntrospectionTCPComponent(t *testing.T) {
	base := byKey(kustomize(t, ""))
	with := byKey(kustomize(t, component))

	// The default install, kustomized, is the files as written.
	if diff := cmp.Diff(byKey(objects(t)), base); diff != "" {
		t.Errorf("kustomize daemonset/ differs from its files (-files +built):\n%s", diff)
	}
	const dsKey = "DaemonSet/sockmesh-system/sockmesh"
	added := []string{"ClusterRole//sockmeshctl-status", "Role/sockmesh-system/sockmeshctl-status"}
	for k, o := range with {
		switch {
		case slices.Contains(added, k), k == dsKey:
		case base[k] == nil:
			t.Errorf("the component adds %s", k)
		default:
			if diff := cmp.Diff(base[k], o); diff != "" {
				t.Errorf("the component changes %s (-default +with):\n%s", k, diff)
			}
		}
	}
	for k := range base {
		if with[k] == nil {
			t.Errorf("the component removes %s", k)
		}
	}

	ds := typed[appsv1.DaemonSet](t, []map[string]any{with[dsKey]}, "DaemonSet")[0]
	checkIntrospectionTCP(t, &ds)
	// Without what it adds, the DaemonSet is the default one.
	stripIntrospectionTCP(&ds)
	if diff := cmp.Diff(typed[appsv1.DaemonSet](t, []map[string]any{base[dsKey]}, "DaemonSet")[0], ds); diff != "" {
		t.Errorf("the component changes the DaemonSet beyond TCP introspection (-default +with, additions removed):\n%s", diff)
	}

	roles := []map[string]any{with[added[0]], with[added[1]]}
	cr := typed[rbacv1.ClusterRole](t, roles, "ClusterRole")[0]
	checkRules(t, "ClusterRole", cr.Name, cr.Rules, operatorNodeRights)
	role := typed[rbacv1.Role](t, roles, "Role")[0]
	checkRules(t, "Role", role.Name, role.Rules, operatorPodRights)
	if role.Namespace != "sockmesh-system" {
		t.Errorf("Role %s in %q, want the agents' namespace, sockmesh-system", role.Name, role.Namespace)
	}
	checkOperatorBindings(t, cr.Name, role)
	checkCertManagerExample(t)
}

// TestIntrospectionTCPAgainstAPIServer creates the DaemonSet the component
// builds, and the Secrets it mounts as cert-manager and the docs make them,
// in a real kube-apiserver: its validation (the projected volume's sources
// and paths, a kubernetes.io/tls Secret's keys) accepts them.
func TestIntrospectionTCPAgainstAPIServer(t *testing.T) {
	ds := typed[appsv1.DaemonSet](t, []map[string]any{byKey(kustomize(t, component))["DaemonSet/sockmesh-system/sockmesh"]}, "DaemonSet")[0]
	// The agent's init container is privileged, as a kubelet must allow.
	env := apiserver.Start(t, "--allow-privileged=true")
	ctx := t.Context()
	must.Succeed(t)(env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ds.Namespace}}, metav1.CreateOptions{}))
	ca := must.Value[*pki.CA](t)(pki.NewCA("sockmesh introspection CA"))
	leaf := must.Value[*pki.Leaf](t)(ca.Issue(pki.LeafOptions{DNSNames: []string{"agents.sockmesh.internal"}}))
	for _, secret := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: tlsSecret}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: leaf.CertPEM, corev1.TLSPrivateKeyKey: leaf.KeyPEM, "ca.crt": ca.CertPEM}},
		{ObjectMeta: metav1.ObjectMeta{Name: tokenSecret}, Data: map[string][]byte{"token": []byte("operator-token")}},
	} {
		if _, err := env.Kube.CoreV1().Secrets(ds.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			t.Errorf("create Secret %s: %v", secret.Name, err)
		}
	}
	if _, err := env.Kube.AppsV1().DaemonSets(ds.Namespace).Create(ctx, &ds, metav1.CreateOptions{}); err != nil {
		t.Errorf("create the DaemonSet with introspection-tcp: %v", err)
	}
}

// checkIntrospectionTCP checks what the component adds to the agent.
func checkIntrospectionTCP(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	spec := &ds.Spec.Template.Spec
	agent := &spec.Containers[0]
	// status.hostIP is an address of the agent's own network namespace,
	// and the node's InternalIP sockmeshctl dials, only on the host network.
	if !spec.HostNetwork {
		t.Errorf("hostNetwork off: status.hostIP is not an address the agent can listen on")
	}
	if e := envVar(agent, "HOST_IP"); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.hostIP" {
		t.Errorf("HOST_IP = %+v, want status.hostIP", e)
	}
	listen := flagValue(t, agent, "--introspection-listen")
	// The kubelet expands $(HOST_IP); the agent wants host:port.
	for _, ip := range []string{"10.0.0.1", "fd00::1"} {
		host, port, err := net.SplitHostPort(strings.ReplaceAll(listen, "$(HOST_IP)", ip))
		if err != nil || host != ip || port != "15443" {
			t.Errorf("--introspection-listen=%s with host IP %s: host %q port %q (%v), want %[2]s and 15443", listen, ip, host, port, err)
		}
	}

	var vol *corev1.Volume
	for i, v := range spec.Volumes {
		if v.Name == "introspection" {
			vol = &spec.Volumes[i]
		}
	}
	if vol == nil || vol.Projected == nil {
		t.Fatalf("no projected volume introspection: %v", volumeNames(spec.Volumes))
	}
	if m := vol.Projected.DefaultMode; m == nil || *m != 0o400 {
		t.Errorf("projected volume mode %v, want 0400", m)
	}
	i := slices.IndexFunc(agent.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == vol.Name })
	if i < 0 {
		t.Fatalf("the agent does not mount volume %s", vol.Name)
	}
	// A subPath mount is never updated: a rotated token or a renewed
	// certificate would not apply.
	m := agent.VolumeMounts[i]
	if !m.ReadOnly || m.SubPath != "" || m.SubPathExpr != "" {
		t.Errorf("mount %+v, want read-only, without subPath", m)
	}
	projected := projectedKeys(t, vol.Projected)
	for _, f := range introspectionFiles {
		file := flagValue(t, agent, f.flag)
		rel, ok := strings.CutPrefix(file, m.MountPath+"/")
		if !ok {
			t.Errorf("%s=%s, want a file of the mount %s", f.flag, file, m.MountPath)
			continue
		}
		if got, want := projected[rel], (secretKey{f.secret, f.key}); got != want {
			t.Errorf("%s=%s is key %q of Secret %q, want key %q of Secret %q", f.flag, file, got.key, got.secret, want.key, want.secret)
		}
	}
	if len(projected) != len(introspectionFiles) {
		t.Errorf("the volume holds %v, want only the files the agent reads", projected)
	}
}

func volumeNames(vols []corev1.Volume) []string {
	var names []string
	for _, v := range vols {
		names = append(names, v.Name)
	}
	return names
}

type secretKey struct{ secret, key string }

// projectedKeys maps each file of a projected volume of Secrets to its
// Secret and key. Each key is named (an unnamed one would bring in
// whatever else its Secret holds, cert-manager's ca.crt, and could collide
// with another Secret's), and each Secret is required: optional would
// start an agent that then refuses its missing files.
func projectedKeys(t *testing.T, p *corev1.ProjectedVolumeSource) map[string]secretKey {
	t.Helper()
	files := map[string]secretKey{}
	for _, src := range p.Sources {
		s := src.Secret
		if s == nil {
			t.Errorf("projected source %+v, want only Secrets", src)
			continue
		}
		if len(s.Items) == 0 || (s.Optional != nil && *s.Optional) {
			t.Errorf("Secret %s projected with items %v, optional %v; want its keys named, required", s.Name, s.Items, s.Optional)
		}
		for _, it := range s.Items {
			if _, dup := files[it.Path]; dup {
				t.Errorf("file %s projected twice", it.Path)
			}
			files[it.Path] = secretKey{s.Name, it.Key}
		}
	}
	return files
}

// stripIntrospectionTCP removes from ds what the component adds.
func stripIntrospectionTCP(ds *appsv1.DaemonSet) {
	spec := &ds.Spec.Template.Spec
	agent := &spec.Containers[0]
	agent.Args = slices.DeleteFunc(agent.Args, func(a string) bool {
		return slices.ContainsFunc([]string{"--introspection-listen=", "--introspection-tls-cert=", "--introspection-tls-key=", "--introspection-token-file="},
			func(p string) bool { return strings.HasPrefix(a, p) })
	})
	agent.Env = slices.DeleteFunc(agent.Env, func(e corev1.EnvVar) bool { return e.Name == "HOST_IP" })
	agent.VolumeMounts = slices.DeleteFunc(agent.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "introspection" })
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "introspection" })
}

// checkOperatorBindings checks operators.example.yaml: it binds one set of
// subjects to both the ClusterRole and the Role, in the Role's namespace.
func checkOperatorBindings(t *testing.T, clusterRole string, role rbacv1.Role) {
	t.Helper()
	objs := operatorBindings(t)
	crbs := typed[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding")
	rbs := typed[rbacv1.RoleBinding](t, objs, "RoleBinding")
	if len(crbs) != 1 || len(rbs) != 1 || len(objs) != 2 {
		t.Fatalf("operators.example.yaml: %d objects, %d ClusterRoleBindings, %d RoleBindings; want one of each", len(objs), len(crbs), len(rbs))
	}
	if r := crbs[0].RoleRef; r.Kind != "ClusterRole" || r.Name != clusterRole {
		t.Errorf("ClusterRoleBinding %s binds %+v, want ClusterRole %s", crbs[0].Name, r, clusterRole)
	}
	if r := rbs[0].RoleRef; r.Kind != "Role" || r.Name != role.Name || rbs[0].Namespace != role.Namespace {
		t.Errorf("RoleBinding %s/%s binds %+v, want Role %s/%s", rbs[0].Namespace, rbs[0].Name, r, role.Namespace, role.Name)
	}
	if len(crbs[0].Subjects) == 0 || !slices.Equal(crbs[0].Subjects, rbs[0].Subjects) {
		t.Errorf("subjects %+v and %+v, want the same operators in both", crbs[0].Subjects, rbs[0].Subjects)
	}
}

// checkCertManagerExample checks cert-manager.example.yaml: a
// Certificate writes the Secret the agents mount, in their namespace, for
// the name the docs pass --agent-server-name, usable to serve TLS, from an
// issuer the file defines.
func checkCertManagerExample(t *testing.T) {
	t.Helper()
	issuers := map[string]bool{}
	var cert map[string]any
	for _, o := range componentDocs(t, "cert-manager.example.yaml") {
		md, _ := o["metadata"].(map[string]any)
		spec, _ := o["spec"].(map[string]any)
		if md["namespace"] != "sockmesh-system" {
			t.Errorf("cert-manager.example.yaml: %v %v in namespace %v, want sockmesh-system", o["kind"], md["name"], md["namespace"])
		}
		switch {
		case o["kind"] == "Issuer":
			issuers[fmt.Sprint(md["name"])] = true
		case o["kind"] == "Certificate" && spec["secretName"] == tlsSecret:
			cert = spec
		}
	}
	if cert == nil {
		t.Fatalf("cert-manager.example.yaml: no Certificate writes Secret %s", tlsSecret)
	}
	dnsNames, _ := cert["dnsNames"].([]any)
	usages, _ := cert["usages"].([]any)
	issuer, _ := cert["issuerRef"].(map[string]any)
	if !slices.Contains(dnsNames, any("agents.sockmesh.internal")) || !slices.Contains(usages, any("server auth")) ||
		issuer["kind"] != "Issuer" || !issuers[fmt.Sprint(issuer["name"])] {
		t.Errorf("cert-manager.example.yaml: Certificate for %s: %v; want dnsNames agents.sockmesh.internal (docs/introspection.md), usage server auth, an Issuer of the file", tlsSecret, cert)
	}
}

// operatorBindings decodes operators.example.yaml.
func operatorBindings(t *testing.T) []map[string]any {
	t.Helper()
	return componentDocs(t, "operators.example.yaml")
}

// componentDocs decodes file of the component's directory.
func componentDocs(t *testing.T, file string) []map[string]any {
	t.Helper()
	data, err := fs.ReadFile(daemonset.IntrospectionTCP, component+"/"+file)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := yamldocs.Decode(data)
	if err != nil {
		t.Fatalf("decode %s: %v", file, err)
	}
	return objs
}

// componentRoles decodes the component's RBAC, as embedded.
func componentRoles(t *testing.T) []map[string]any {
	t.Helper()
	return componentDocs(t, "rbac.yaml")
}

// kustomize runs `kubectl kustomize` (the kubectl of test/apiserver's
// binaries) on a kustomization of daemonset/, with the component of that
// directory or none (""), and decodes what it prints.
func kustomize(t *testing.T, component string) []map[string]any {
	t.Helper()
	bins, err := apiserver.FindBinaries()
	if errors.Is(err, apiserver.ErrNoBinaries) {
		testenv.SkipOrFail(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	// kustomize takes no absolute path.
	rel, err := filepath.Rel(dir, here)
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("resources: [%s]\n", rel)
	if component != "" {
		k += fmt.Sprintf("components: [%s]\n", filepath.Join(rel, component))
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), bins.Kubectl, "kustomize", dir).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		t.Fatalf("kubectl kustomize (%s): %v", strings.TrimSpace(k), err)
	}
	objs, err := yamldocs.Decode(out)
	if err != nil {
		t.Fatalf("decode kubectl kustomize's output: %v", err)
	}
	return objs
}

// byKey maps objects by kind/namespace/name.
func byKey(objs []map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, o := range objs {
		md, _ := o["metadata"].(map[string]any)
		out[fmt.Sprintf("%v/%v/%v", o["kind"], valueOr(md["namespace"]), md["name"])] = o
	}
	return out
}

func valueOr(v any) any {
	if v == nil {
		return ""
	}
	return v
}

func envVar(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// flagValue is the value of the one argument --flag=VALUE of c.
func flagValue(t *testing.T, c *corev1.Container, flag string) string {
	t.Helper()
	var values []string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			values = append(values, v)
		}
	}
	if len(values) != 1 {
		t.Fatalf("agent args %q: %s given %d times, want once", c.Args, flag, len(values))
	}
	return values[0]
}
