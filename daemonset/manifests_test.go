package daemonset_test

import (
	"io/fs"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/daemonset"
	"github.com/sockmesh/sockmesh/internal/yamldocs"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// objects decodes every document of the kustomization's resources, in
// order, checking that the embedded set is exactly what it lists.
func objects(t *testing.T) []map[string]any {
	t.Helper()
	var k struct{ Resources []string }
	data, err := fs.ReadFile(daemonset.Manifests, "kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	embedded, _ := fs.Glob(daemonset.Manifests, "*.yaml")
	want := append([]string{"kustomization.yaml"}, k.Resources...)
	slices.Sort(want)
	if !slices.Equal(embedded, want) {
		t.Errorf("embedded %q, kustomization lists %q: keep the go:embed line in step", embedded, want)
	}
	var objs []map[string]any
	for _, r := range k.Resources {
		data, err := fs.ReadFile(daemonset.Manifests, r)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := yamldocs.Decode(data)
		if err != nil {
			t.Fatalf("decode %s: %v", r, err)
		}
		objs = append(objs, docs...)
	}
	return objs
}

// typed converts the objects of kind into T (strictly: an unknown field is
// a typo the API server would drop).
func typed[T any](t *testing.T, objs []map[string]any, kind string) []T {
	t.Helper()
	var out []T
	for _, m := range objs {
		if m["kind"] != kind {
			continue
		}
		data, _ := yaml.Marshal(m)
		var v T
		if err := yaml.UnmarshalStrict(data, &v); err != nil {
			t.Fatalf("%s %v: %v", kind, m["metadata"], err)
		}
		out = append(out, v)
	}
	return out
}

func TestDaemonSet(t *testing.T) {
	dss := typed[appsv1.DaemonSet](t, objects(t), "DaemonSet")
	if len(dss) != 1 {
		t.Fatalf("%d DaemonSets, want 1", len(dss))
	}
	ds := dss[0]
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || !spec.HostPID {
		t.Errorf("hostNetwork=%v hostPID=%v: node-IP mode and finding pods through /proc need both", spec.HostNetwork, spec.HostPID)
	}
	if spec.ServiceAccountName != "sockmesh" {
		t.Errorf("serviceAccountName = %q", spec.ServiceAccountName)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists || spec.Tolerations[0].Key != "" {
		t.Errorf("tolerations = %+v, want one that tolerates every taint", spec.Tolerations)
	}
	// The next agent starts beside the old one and takes its addresses
	// over (datapath/takeover): no node is ever without a serving proxy.
	if u := ds.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil ||
		u.RollingUpdate.MaxSurge == nil || u.RollingUpdate.MaxSurge.IntValue() != 1 ||
		u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("updateStrategy = %+v, want RollingUpdate with maxSurge 1 and maxUnavailable 0", u)
	}
	if spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds <= 0 {
		t.Errorf("terminationGracePeriodSeconds unset")
	}
	volumes := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			volumes[v.Name] = v.HostPath.Path
		}
	}

	if len(spec.InitContainers) != 1 {
		t.Fatalf("%d init containers, want mount-bpffs only", len(spec.InitContainers))
	}
	init := spec.InitContainers[0]
	if !slices.Equal(init.Args, []string{"mount-bpffs", "--path=/sys/fs/bpf"}) {
		t.Errorf("init args = %q", init.Args)
	}
	if sc := init.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Errorf("init container must be privileged (Bidirectional propagation requires it)")
	}
	checkMount(t, init, volumes, "/sys/fs/bpf", "/sys/fs/bpf", corev1.MountPropagationBidirectional)

	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want the agent only", len(spec.Containers))
	}
	agent := spec.Containers[0]
	sc := agent.SecurityContext
	if sc == nil || (sc.Privileged != nil && *sc.Privileged) {
		t.Fatalf("agent container must not be privileged: %+v", sc)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("agent capabilities must drop ALL first: %+v", sc.Capabilities)
	} else if add := sc.Capabilities.Add; !slices.Equal(add, []corev1.Capability{"BPF", "NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"}) {
		t.Errorf("agent capabilities add %q, want exactly BPF NET_ADMIN SYS_ADMIN SYS_PTRACE", add)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("agent root filesystem should be read-only")
	}
	checkMount(t, agent, volumes, "/sys/fs/bpf", "/sys/fs/bpf", corev1.MountPropagationHostToContainer)
	checkMount(t, agent, volumes, "/sys/fs/cgroup", "/sys/fs/cgroup", "")

	// The flags the agent and this manifest agreed on.
	for _, want := range []string{
		"agent", "--source=kubernetes", "--node-name=$(NODE_NAME)", "--proxy-mode=node-ip",
		"--health-listen=:15021", "--metrics-listen=:15090", "--bpffs=/sys/fs/bpf",
		"--leader-elect", "--leader-election-namespace=$(POD_NAMESPACE)", "--service-cidr=10.96.0.0/12",
		"--log-format=json",
	} {
		if !slices.Contains(agent.Args, want) {
			t.Errorf("agent args %q lack %s", agent.Args, want)
		}
	}
	// TCP introspection is opt-in (introspection-tcp/): the default
	// install serves the API on the node's unix socket alone.
	for _, arg := range agent.Args {
		for _, flag := range []string{"--introspection-listen", "--introspection-tls-", "--introspection-token-file"} {
			if strings.HasPrefix(arg, flag) {
				t.Errorf("agent args hold %s: TCP introspection must stay off by default", arg)
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			t.Errorf("volume %s mounts Secret %s: the default install mounts none", v.Name, v.Secret.SecretName)
		}
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range agent.Env {
		env[e.Name] = e
	}
	if e := env["NODE_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME must come from spec.nodeName: %+v", e)
	}
	if e := env["POD_NAMESPACE"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("POD_NAMESPACE must come from metadata.namespace: %+v", e)
	}
	if e := env["HOST_IPS"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.hostIPs" {
		t.Errorf("HOST_IPS must come from status.hostIPs (node-IP mode listens on each family's address): %+v", e)
	}
	// The agent would re-execute itself to add a missing one.
	for _, setting := range proxy.RuntimeSettings {
		if !slices.Contains(strings.Split(env["GODEBUG"].Value, ","), setting) {
			t.Errorf("GODEBUG = %q, want %s (proxy.RuntimeSettings)", env["GODEBUG"].Value, setting)
		}
	}
	for name, p := range map[string]*corev1.Probe{"liveness": agent.LivenessProbe, "readiness": agent.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.IntValue() != 15021 {
			t.Errorf("%s probe must be an HTTP GET on the health port, 15021: %+v", name, p)
		}
	}
	// An HTTP startup probe passes on the answer of the agent a rolling
	// update replaces, which shares the port until the new one took it
	// (cmd/sockmesh's TestDaemonSetArgs checks the command's flags).
	if p := agent.StartupProbe; p == nil || p.Exec == nil || !slices.Equal(p.Exec.Command[:min(2, len(p.Exec.Command))], []string{"/sockmesh", "probe"}) {
		t.Errorf("startup probe must run /sockmesh probe in the container: %+v", p)
	}
	if agent.ReadinessProbe != nil && agent.ReadinessProbe.HTTPGet != nil && agent.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe path = %q, want /readyz", agent.ReadinessProbe.HTTPGet.Path)
	}
	if agent.LivenessProbe != nil && agent.LivenessProbe.HTTPGet != nil && agent.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe path = %q, want /healthz", agent.LivenessProbe.HTTPGet.Path)
	}
	// With hostNetwork a declared port becomes a hostPort, and a hostPort
	// keeps the surge pod off its node.
	if len(agent.Ports) != 0 {
		t.Errorf("ports = %v, want none: the next agent of a rolling update could not be scheduled", agent.Ports)
	}
	for _, arg := range []string{"--health-listen=:15021", "--metrics-listen=:15090"} {
		if !slices.Contains(agent.Args, arg) {
			t.Errorf("args = %q, want %s", agent.Args, arg)
		}
	}
	if agent.Resources.Requests.Cpu().IsZero() || agent.Resources.Requests.Memory().IsZero() || agent.Resources.Limits.Memory().IsZero() {
		t.Errorf("agent resources must request CPU and memory and limit memory: %+v", agent.Resources)
	}
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Image != "localhost/sockmesh:dev" || c.ImagePullPolicy != corev1.PullNever {
			t.Errorf("container %s: image %s pull %s, want localhost/sockmesh:dev with Never (no registry)", c.Name, c.Image, c.ImagePullPolicy)
		}
	}
}

// checkMount checks that c mounts the hostPath volume of hostPath at path
// with the given propagation.
func checkMount(t *testing.T, c corev1.Container, volumes map[string]string, path, hostPath string, prop corev1.MountPropagationMode) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != path {
			continue
		}
		if volumes[m.Name] != hostPath {
			t.Errorf("%s: %s mounts volume %s, want hostPath %s", c.Name, path, m.Name, hostPath)
		}
		var got corev1.MountPropagationMode
		if m.MountPropagation != nil {
			got = *m.MountPropagation
		}
		if got != prop {
			t.Errorf("%s: %s propagation %q, want %q", c.Name, path, got, prop)
		}
		return
	}
	t.Errorf("%s does not mount %s", c.Name, path)
}

// agentRights are the verbs the agent uses, by "group/resource": list and
// watch for what its informers and reference watches read
// (agent/source/kubernetes); get only where it reads one object before a
// write: agent/status after a conflict, agent/selectorsvc its Services;
// the writes of agent/status (merge patches of status subresources) and
// agent/selectorsvc.
var agentRights = func() map[string][]string {
	r := map[string][]string{}
	for _, res := range []string{
		"/services", "/namespaces", "/pods", "/nodes", "/configmaps", "/secrets",
		"discovery.k8s.io/endpointslices", "certificates.k8s.io/clustertrustbundles",
		"networking.k8s.io/servicecidrs", "gateway.networking.k8s.io/referencegrants",
	} {
		r[res] = []string{"list", "watch"}
	}
	r["/services"] = append(r["/services"], "get", "create", "update", "delete")
	for _, res := range []string{
		"gateway.networking.k8s.io/backendtlspolicies", "gateway.networking.k8s.io/httproutes",
		"gateway.networking.k8s.io/grpcroutes", "gateway.networking.x-k8s.io/xbackends",
		"gateway.networking.x-k8s.io/xbackendtrafficpolicies", "gateway.networking.x-k8s.io/xmeshes",
	} {
		r[res] = []string{"get", "list", "watch"}
		r[res+"/status"] = []string{"patch"}
	}
	return r
}()

// leaseRights are what client-go's LeaseLock does with the leader Lease
// (agent/leader), in the agent's namespace only.
var leaseRights = map[string][]string{"coordination.k8s.io/leases": {"get", "create", "update"}}

// TestRBACLeastPrivilege keeps the agent's rights to exactly what its code
// uses (agentRights, leaseRights): no wildcards, no verb it never sends
// (not even get on what it only lists: Secrets above all), no Events
// (nothing in the agent records one); and to no less, since a missing
// read makes its kind Forbidden and a missing write fails.
func TestRBACLeastPrivilege(t *testing.T) {
	objs := objects(t)
	crs := typed[rbacv1.ClusterRole](t, objs, "ClusterRole")
	if len(crs) != 1 {
		t.Fatalf("%d ClusterRoles, want 1", len(crs))
	}
	checkRules(t, "ClusterRole", crs[0].Name, crs[0].Rules, agentRights)
	roles := typed[rbacv1.Role](t, objs, "Role")
	if len(roles) != 1 {
		t.Fatalf("%d Roles, want 1, for the leader election Lease", len(roles))
	}
	if roles[0].Namespace != "sockmesh-system" {
		t.Errorf("Role %s in namespace %q, want sockmesh-system", roles[0].Name, roles[0].Namespace)
	}
	checkRules(t, "Role", roles[0].Name, roles[0].Rules, leaseRights)
	for _, b := range typed[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding") {
		for _, s := range b.Subjects {
			if s.Kind != "ServiceAccount" || s.Name != "sockmesh" || s.Namespace != "sockmesh-system" {
				t.Errorf("ClusterRoleBinding %s binds %+v, want only the sockmesh ServiceAccount", b.Name, s)
			}
		}
	}
}

// checkRules checks that rules grant exactly need, by "group/resource":
// no wildcard, no non-resource URL, no verb beyond need and none short of
// it.
func checkRules(t *testing.T, kind, name string, rules []rbacv1.PolicyRule, need map[string][]string) {
	t.Helper()
	granted := map[string][]string{}
	for _, r := range rules {
		for _, v := range r.Verbs {
			if v == "*" {
				t.Errorf("%s %s: wildcard verb", kind, name)
			}
		}
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("%s %s: non-resource URLs %q", kind, name, r.NonResourceURLs)
		}
		if len(r.ResourceNames) > 0 {
			t.Errorf("%s %s: resourceNames %q: the test does not model them", kind, name, r.ResourceNames)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				if res == "*" || g == "*" {
					t.Errorf("%s %s: wildcard resource %q/%q", kind, name, g, res)
				}
				key := g + "/" + res
				for _, v := range r.Verbs {
					if !slices.Contains(need[key], v) {
						t.Errorf("%s %s may %s %s: not something its user does", kind, name, v, key)
					}
					granted[key] = append(granted[key], v)
				}
			}
		}
	}
	for res, verbs := range need {
		for _, v := range verbs {
			if !slices.Contains(granted[res], v) {
				t.Errorf("%s %s lacks %s %s, which its user needs", kind, name, v, res)
			}
		}
	}
}

// TestObjectsHaveKinds catches a document a typo made kind-less (kubectl
// would refuse it only at apply time).
func TestObjectsHaveKinds(t *testing.T) {
	for _, m := range objects(t) {
		var tm runtime.TypeMeta
		data, _ := yaml.Marshal(m)
		yaml.Unmarshal(data, &tm)
		if tm.Kind == "" || tm.APIVersion == "" {
			t.Errorf("object without kind or apiVersion: %v", m["metadata"])
		}
	}
}
