package main

import (
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// TestDaemonSetArgs: the agent takes the DaemonSet's args as the kubelet
// gives them (each $(VAR) expanded from the container's env, here as the
// downward API fills it on a dual-stack node), and its health listener is
// where the DaemonSet's probes look.
func TestDaemonSetArgs(t *testing.T) {
	data, err := os.ReadFile("../../daemonset/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal(data, &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "agent" })
	if i < 0 {
		t.Fatal("daemonset.yaml has no agent container")
	}
	agent := spec.Containers[i]
	env := map[string]string{}
	downward := map[string]string{ // what the kubelet puts in each env var
		"spec.nodeName": "node-a", "metadata.namespace": "sockmesh-system", "metadata.name": "sockmesh-x1",
		"status.hostIPs": "10.0.0.5,fd00::5",
	}
	for _, e := range agent.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = downward[e.ValueFrom.FieldRef.FieldPath]
		case e.ValueFrom.ResourceFieldRef != nil:
			// In bytes: the default divisor, 1.
			env[e.Name] = strconv.FormatInt(agent.Resources.Limits.Memory().Value(), 10)
		}
	}
	ref := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	var args []string
	for _, a := range agent.Args {
		args = append(args, ref.ReplaceAllStringFunc(a, func(m string) string { return env[m[2:len(m)-1]] }))
	}
	if len(args) == 0 || args[0] != "agent" {
		t.Fatalf("agent container args %q: want the agent command first", agent.Args)
	}
	s, err := parse(t, env, "", args[1:]...)
	if err != nil {
		t.Fatalf("daemonset.yaml's agent args %q: %v", args, err)
	}
	want := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.5:15001"), netip.MustParseAddrPort("[fd00::5]:15001")}
	if !slices.Equal(s.proxyListen, want) {
		t.Errorf("proxy listens on %v, want %v (both of $HOST_IPS' families)", s.proxyListen, want)
	}
	if s.nodeName != "node-a" || s.leaderNS != "sockmesh-system" || s.podName != "sockmesh-x1" {
		t.Errorf("node %q, lease namespace %q, pod %q: want the downward API's", s.nodeName, s.leaderNS, s.podName)
	}
	if limit := agent.Resources.Limits.Memory().Value(); s.softMemoryLimit != int64(float64(limit)*softLimitShare) {
		t.Errorf("soft memory limit %d, want %v of the container's %d", s.softMemoryLimit, softLimitShare, limit)
	}
	health, err := listenAddr(s.healthListen)
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]*corev1.Probe{"startup": agent.StartupProbe, "liveness": agent.LivenessProbe, "readiness": agent.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.IntValue() != int(health.Port()) {
			t.Errorf("%s probe %+v: want an HTTP GET on --health-listen's port %d", name, p, health.Port())
		}
	}
}
