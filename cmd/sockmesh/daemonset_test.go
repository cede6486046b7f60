package main

import (
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

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
	for name, p := range map[string]*corev1.Probe{"liveness": agent.LivenessProbe, "readiness": agent.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.IntValue() != int(health.Port()) {
			t.Errorf("%s probe %+v: want an HTTP GET on --health-listen's port %d", name, p, health.Port())
		}
	}
	checkStartupProbe(t, agent.StartupProbe, health)
}

// checkStartupProbe: the startup probe runs `sockmesh probe` in the
// container (the image holds the binary at /sockmesh), on an address that
// reaches the health listener, and the kubelet waits longer than the
// probe's own timeout.
func checkStartupProbe(t *testing.T, p *corev1.Probe, health netip.AddrPort) {
	t.Helper()
	if p == nil || p.Exec == nil || len(p.Exec.Command) < 2 || p.Exec.Command[0] != "/sockmesh" || p.Exec.Command[1] != "probe" {
		t.Fatalf("startup probe %+v: want /sockmesh probe, run in the container", p)
	}
	cmd := newProbeCommand()
	if err := cmd.ParseFlags(p.Exec.Command[2:]); err != nil {
		t.Fatalf("startup probe %q: %v", p.Exec.Command, err)
	}
	flags := cmd.Flags()
	addr, err := netip.ParseAddrPort(flags.Lookup("addr").Value.String())
	if err != nil || !addr.Addr().IsLoopback() || addr.Port() != health.Port() ||
		(health.Addr().IsValid() && !health.Addr().IsUnspecified()) {
		t.Errorf("startup probe asks %v (%v): want loopback at --health-listen's port %d, which must listen on every address (%s)",
			addr, err, health.Port(), health)
	}
	timeout, err := flags.GetDuration("timeout")
	if err != nil || timeout >= time.Duration(p.TimeoutSeconds)*time.Second {
		t.Errorf("startup probe's --timeout %v (%v), want below its timeoutSeconds, %d", timeout, err, p.TimeoutSeconds)
	}
}
