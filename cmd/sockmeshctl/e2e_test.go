package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/explain"
	"github.com/sockmesh/sockmesh/agent/introspect"
	kubesource "github.com/sockmesh/sockmesh/agent/source/kubernetes"
	"github.com/sockmesh/sockmesh/ctl/describe"
	"github.com/sockmesh/sockmesh/ctl/render"
	"github.com/sockmesh/sockmesh/ctl/top"
	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/test/echo"
)

// TestCLI runs the real sockmeshctl binary against the real agent binary
// (kubernetes source, leader election, node-IP mode) on a throwaway node,
// with a real API server, and checks what it says about a captured Service
// (secure: TLS originated), an uncaptured one (plain) and a misconfigured
// one (broken: its CA is not a certificate, so it fails closed), about a
// pod that opted out, about the agent's state and traffic, the writes it
// holds back (holdWrites), who may ask, and that docs/metrics.md documents
// every metric the agent registers, and status --all-nodes with
// daemonset/introspection-tcp.
func TestCLI(t *testing.T) {
	e := newEnv(t)
	e.createObjects(t)
	e.holdWrites(t)
	// Serving TCP introspection as daemonset/introspection-tcp has it.
	tcp := introspectionTCPFlags(t, e.nodeIP)
	a := e.startAgent(t, append([]string{"--source=kubernetes", "--kubeconfig=" + e.agentKubeconfig(t), "--leader-elect",
		"--leader-election-namespace=" + ns}, tcp.args...)...)
	a.waitReady(t)

	// Traffic: two requests to secure (TLS originated), one to broken (the
	// proxy answers 503 itself).
	for range 2 {
		code, body := e.get(t, secureVIP, "/hello")
		var rep echo.Report
		if err := json.Unmarshal(body, &rep); code != http.StatusOK || err != nil || rep.TLS == nil || rep.TLS.ServerName != serverName {
			t.Fatalf("GET secure: %d %s; want 200 from the backend in TLS with SNI %s", code, body, serverName)
		}
	}
	if code, body := e.get(t, brokenVIP, "/hello"); code != http.StatusServiceUnavailable {
		t.Fatalf("GET broken: %d %s; want 503", code, body)
	}

	t.Run("explain captured", func(t *testing.T) {
		out := e.ok(t, a, "explain", "-n", ns, "client", "secure:80")
		wantLines(t, out,
			"Verdict:      Redirected",
			"Enrolled:           yes",
			"Captured:        yes: Service app/secure port http (80)",
			"FailClosed: while the proxy is down",
			"Sources:      BackendTLSPolicy/app/secure",
			"TLS:          ServerOnly, policy BackendTLSPolicy/app/secure",
			"SNI:          secure.app.svc",
			"Trust:        CN=sockmeshctl test CA",
			"redirected=2",
			"BackendTLSPolicy/app/secure-newer",
			"Conflicted",
		)
		var got render.Explained
		if err := yaml.Unmarshal([]byte(e.ok(t, a, "explain", "-n", ns, "client", "secure:http", "-o", "yaml")), &got); err != nil {
			t.Fatal(err)
		}
		if got.Verdict != explain.Redirected || got.Node != e.nodeName || got.Backend == nil || got.Backend.TLS == nil ||
			got.Backend.TLS.ServerName != serverName || got.Counters.Decisions[datapath.Redirected] != 2 ||
			!got.Enrolment.Enrolled || got.Related == nil || len(got.Related.Policies) != 2 {
			t.Errorf("explain -o yaml = %+v", got)
		}
	})
	t.Run("explain by address", func(t *testing.T) {
		var got render.Explained
		e.okJSON(t, a, &got, "explain", "app/client", secureVIP.String()+":80")
		if got.Verdict != explain.Redirected || got.Query.Service == nil || got.Query.Service.Name != "secure" ||
			got.Counters.ByAddr[netip.AddrPortFrom(secureVIP, 80)][datapath.Redirected] != 2 {
			t.Errorf("explain by address = %+v, want the Service named and its counters", got)
		}
	})
	t.Run("explain uncaptured", func(t *testing.T) {
		out := e.ok(t, a, "explain", "-n", ns, "client", "plain.app:80")
		wantLines(t, out,
			"Verdict:      NotCaptured",
			"Captured:  no: Service app/plain port 80 is not captured",
			"none: the destination is not captured",
			"Cluster: no BackendTLSPolicy, XBackendTrafficPolicy, XBackend or route names Service app/plain",
		)
		if strings.Contains(out, "Backend:") {
			t.Errorf("an uncaptured Service shows a backend:\n%s", out)
		}
	})
	t.Run("explain misconfigured", func(t *testing.T) {
		out := e.ok(t, a, "explain", "-n", ns, "client", "broken:80")
		wantLines(t, out,
			"Verdict:      FailClosed",
			"refuses them (HTTP 503 or a reset, never plaintext)",
			"Fails closed:  BackendTLSPolicy/app/broken NoValidCACertificate",
			"redirected=1",
			"Accepted=False       NoValidCACertificate",
		)
	})
	t.Run("explain opted out", func(t *testing.T) {
		var got render.Explained
		e.okJSON(t, a, &got, "explain", "-n", ns, "opted", "secure:80")
		if got.Verdict != explain.NotEnrolled || !strings.Contains(got.Enrolment.Reason, "sockmesh.io/capture=disabled") ||
			!got.Capture.Captured || got.Counters.Decisions != nil {
			t.Errorf("explain opted = %+v", got)
		}
	})
	t.Run("explain without the API server", func(t *testing.T) {
		r := e.ctl(t, a, nil, "--kubeconfig=", "explain", "app/client", "app/secure:80")
		if r.err != nil || !strings.Contains(spaces.ReplaceAllString(r.stdout, " "), "Verdict: Redirected") || !strings.Contains(r.stderr, "asking the agent alone") {
			t.Errorf("explain without a kubeconfig: %v\n%s\n%s", r.err, r.stdout, r.stderr)
		}
		r = e.ctl(t, a, nil, "--kubeconfig=", "explain", "app/client", "app/secure:http")
		if r.err == nil || !strings.Contains(r.stderr, "name the port by number") {
			t.Errorf("a named port without the API server: %v\n%s", r.err, r.stderr)
		}
	})
	t.Run("explain errors", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"explain", "-n", ns, "nosuchpod", "secure:80"}, `pods "nosuchpod" not found`},
			{[]string{"explain", "-n", ns, "remote", "secure:80"}, `serves node "` + e.nodeName + `", but pod app/remote runs on node "elsewhere"`},
			{[]string{"explain", "-n", ns, "client", "nosuch:80"}, "no Service app/nosuch"},
			{[]string{"explain", "-n", ns, "client", "secure:8080"}, "no port 8080 in Service app/secure (ports: http/80)"},
			{[]string{"explain", "-n", ns, "client", "secure"}, "want SERVICE:PORT, IPv4:PORT or [IPv6]:PORT"},
			{[]string{"explain", "-n", ns, "client", "secure:80", "-o", "xml"}, "want table, yaml or json"},
		} {
			r := e.ctl(t, a, nil, c.args...)
			if r.err == nil || !strings.Contains(r.stderr, c.want) {
				t.Errorf("sockmeshctl %q: %v, stderr %q; want a failure saying %q", c.args, r.err, r.stderr, c.want)
			}
		}
	})

	t.Run("describe service", func(t *testing.T) {
		out := e.ok(t, a, "describe", "service", "-n", ns, "secure")
		wantLines(t, out,
			"Port http (80): captured at 10.96.236.10",
			"SNI:          secure.app.svc",
			"BackendTLSPolicy/app/secure ",
			"Accepted=True",
			"BackendTLSPolicy/app/secure-newer",
			"Conflicted",
			"BackendTLSPolicy app/secure also targets Service app/secure port(s) 80 and takes precedence",
		)
		out = e.ok(t, a, "describe", "svc", "app/plain")
		wantLines(t, out, "Port http (80): not captured", "Objects naming it: none")
	})
	t.Run("routes", func(t *testing.T) {
		wantLines(t, e.ok(t, a, "explain", "-n", ns, "client", "routed:80"),
			"Verdict: Redirected",
			"Routes: HTTPRoute producer set of namespace app",
			"HTTPRoute/app/to-secure 0 path PathPrefix /api 1 Service/app/secure:80",
			"Backend Service/app/secure:80:",
			"HTTPRoute/app/to-secure",
			"Accepted=True",
		)
		wantLines(t, e.ok(t, a, "describe", "httproute", "-n", ns, "to-secure"),
			"Rules in Service app/routed port 80 (producer set of namespace app):",
			"path PathPrefix /api",
			"SNI: secure.app.svc",
		)
	})
	t.Run("describe policy", func(t *testing.T) {
		var got describe.Policy
		e.okJSON(t, a, &got, "describe", "backendtlspolicy", "-n", ns, "broken")
		if len(got.Policy.Ancestors) != 1 || !slices.ContainsFunc(got.Policy.Ancestors[0].Conditions, func(c describe.Condition) bool {
			return c.Type == "Accepted" && c.Status == "False" && c.Reason == "NoValidCACertificate"
		}) || len(got.Targets) != 1 || got.Targets[0].Ports[0].Backend == nil || got.Targets[0].Ports[0].Backend.Invalid == nil {
			t.Errorf("describe backendtlspolicy broken = %+v", got)
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"describe", "gateway", "x"}, "unknown kind"},
			{[]string{"describe", "httproute", "-n", ns, "nosuch"}, "HTTPRoute app/nosuch: not found"},
			{[]string{"describe", "grpcroute", "-n", ns, "to-secure"}, "GRPCRoute app/to-secure: not found"},
		} {
			if r := e.ctl(t, a, nil, c.args...); r.err == nil || !strings.Contains(r.stderr, c.want) {
				t.Errorf("sockmeshctl %q: %v, stderr %q; want %q", c.args, r.err, r.stderr, c.want)
			}
		}
	})

	t.Run("status", func(t *testing.T) {
		other := attachForeignProgram(t, e.cg.Path)
		out := e.ok(t, a, "status")
		wantLines(t, out, e.nodeName+"   yes", "6/6", "connect4       sm_connect4", "Other programs on our hooks:", "after ours",
			"Optional kinds:", "BackendTLSPolicy gateway.networking.k8s.io/v1 yes -", "XBackend gateway.networking.x-k8s.io/v1alpha1 yes -")
		var sts []introspect.Status
		e.okJSON(t, a, &sts, "status")
		if len(sts) != 1 {
			t.Fatalf("status -o json = %+v", sts)
		}
		st := sts[0]
		// secure, broken, routed and held/web.
		if st.Node != e.nodeName || !st.Ready || st.Snapshot.Version == 0 || st.Snapshot.Frontends != 4 || st.Snapshot.Invalid != 1 ||
			st.Pods.Enrolled != 1 || st.Pods.NotEnrolled != 1 || len(st.Datapath.State.Hooks) != 6 ||
			st.Datapath.Counters[datapath.Redirected] < 3 {
			t.Errorf("status = %+v", st)
		}
		for _, h := range st.Datapath.State.Hooks {
			if !h.Attached || !h.LinkPinned || !h.ProgramPinned || h.ProgramID == 0 || h.LinkID == 0 {
				t.Errorf("hook %+v: want attached and pinned", h)
			}
		}
		if !slices.ContainsFunc(st.Datapath.Conflicts, func(c datapath.Attached) bool {
			return c.ProgramID == other && c.Hook == "connect4" && !c.RunsBeforeOurs
		}) {
			t.Errorf("conflicts = %+v, want program %d on connect4", st.Datapath.Conflicts, other)
		}
		if !slices.ContainsFunc(st.Events, func(ev introspect.Event) bool { return strings.Contains(ev.Attrs["err"], "NoValidCACertificate") }) {
			t.Errorf("events = %+v, want the proxy's fail-closed warning", st.Events)
		}
		if !slices.ContainsFunc(st.Kinds, func(k kubesource.KindStatus) bool { return k.Kind == "HTTPRoute" && k.Watched }) {
			t.Errorf("kinds = %+v, want HTTPRoute watched", st.Kinds)
		}
	})
	t.Run("status of held writes", func(t *testing.T) {
		policies := controlplane.Object{Verb: "patch", Group: gwv1.GroupName, Resource: "backendtlspolicies", Subresource: "status", Namespace: heldNS}
		route := controlplane.Object{Verb: "patch", Group: gwv1.GroupName, Resource: "httproutes", Subresource: "status", Namespace: heldNS, Name: "hooked"}
		var wr *controlplane.Writes
		// The first pass may still be under way; waitFor only bounds it.
		for deadline := time.Now().Add(waitFor); ; time.Sleep(100 * time.Millisecond) {
			var sts []introspect.Status
			e.okJSON(t, a, &sts, "status")
			if wr = sts[0].Writes; wr != nil && len(wr.RBAC) > 0 && len(wr.Backoff) > 0 || time.Now().After(deadline) {
				break
			}
		}
		if wr == nil || !wr.Writing || len(wr.RBAC) != 1 || wr.RBAC[0].Object != policies || wr.RBAC[0].Since.IsZero() ||
			!wr.RBAC[0].Recheck.After(wr.RBAC[0].Since) || len(wr.Backoff) != 1 || wr.Backoff[0].Object != route ||
			wr.Backoff[0].Attempts < 1 || !strings.Contains(wr.Backoff[0].Error, `failed calling webhook "down.example.com"`) {
			t.Fatalf("writes = %+v; want the leader's, BackendTLSPolicy status in held refused by RBAC, the route hooked in backoff", wr)
		}
		wantLines(t, e.ok(t, a, "status"), "yes, 2 held",
			"Writes: status and generated Services, as the leader; held back by RBAC: 1, in backoff: 1",
			"Writes held back by RBAC:", "patch backendtlspolicies/status.gateway.networking.k8s.io held",
			"Objects retried alone with backoff:", "httproutes/status.gateway.networking.k8s.io held/hooked",
			`failed calling webhook "down.example.com"`)
	})

	t.Run("status --all-nodes over TCP", func(t *testing.T) { e.checkStatusAllNodesTCP(t, tcp) })

	t.Run("top", func(t *testing.T) {
		var v top.View
		e.okJSON(t, a, &v, "top", "--count=1", "--interval=100ms")
		i := slices.IndexFunc(v.Services, func(s top.Service) bool { return s.Namespace == ns && s.Service == "secure" })
		if v.Node != e.nodeName || i < 0 || v.Services[i].Total < 2 {
			t.Errorf("top = %+v, want app/secure with its 2 requests", v)
		}
		wantLines(t, e.ok(t, a, "top", "--count=1", "--interval=100ms"), "NAMESPACE   SERVICE", "app         secure", "Datapath decisions/s:")
		// top tells an agent's restart by this gauge (ctl/top).
		wantLines(t, e.ok(t, a, "metrics"), "process_start_time_seconds gauge")
	})

	t.Run("auth", func(t *testing.T) {
		// Not in the socket's group: the socket's mode refuses the connect.
		r := e.ctl(t, a, &syscall.Credential{Uid: nobody, Gid: nobody}, "status")
		if r.err == nil || !strings.Contains(r.stderr, "permission denied") {
			t.Errorf("status as uid %d: %v, stderr %q; want permission denied", nobody, r.err, r.stderr)
		}
		// In the socket's group: served.
		r = e.ctl(t, a, &syscall.Credential{Uid: nobody, Gid: socketGID}, "status")
		if r.err != nil || !strings.Contains(r.stdout, e.nodeName) {
			t.Errorf("status as a member of group %d: %v\n%s", socketGID, r.err, r.stderr)
		}
		// The mode loosened by mistake: the peer-credential check still
		// refuses.
		if err := os.Chmod(a.socket, 0o666); err != nil {
			t.Fatal(err)
		}
		r = e.ctl(t, a, &syscall.Credential{Uid: nobody, Gid: nobody}, "explain", "--kubeconfig=", "app/client", "app/secure:80")
		if err := os.Chmod(a.socket, 0o660); err != nil {
			t.Fatal(err)
		}
		if r.err == nil || !strings.Contains(r.stderr, fmt.Sprintf("uid %d is not allowed", nobody)) || !strings.Contains(r.stderr, "HTTP 403") {
			t.Errorf("explain as uid %d through a loosened socket: %v, stderr %q; want 403", nobody, r.err, r.stderr)
		}
	})

	t.Run("metrics documented", func(t *testing.T) {
		var kubeCatalog []introspect.MetricInfo
		e.okJSON(t, a, &kubeCatalog, "metrics")
		checkCatalog(t, kubeCatalog, "always", "kubernetes", "leader")
		wantLines(t, e.ok(t, a, "metrics"), "sockmesh_build_info gauge goversion,version") // constant labels too
		checkCatalog(t, fileSourceCatalog(t, e), "always", "file")
	})
}

// fileSourceCatalog runs a second agent, with the file source, on a node
// of its own (netns, cgroup, bpffs), and returns its metric catalog.
func fileSourceCatalog(t *testing.T, e *env) []introspect.MetricInfo {
	t.Helper()
	node := sandbox.NewNetNS(t)
	ip := netip.MustParseAddr("10.236.100.1")
	node.AddAddr(t, "lo", netip.PrefixFrom(ip, 32))
	manifests := t.TempDir()
	f := &env{bins: e.bins, api: e.api, node: node, cg: sandbox.NewCgroup(t), bpffs: sandbox.TempBPFFS(t), nodeName: "file-node", nodeIP: ip}
	b := f.startAgent(t, "--source=file", "--manifests="+manifests)
	if _, err := b.Log.Wait(agentproc.Listening("introspection")); err != nil {
		t.Fatalf("agent never logged the introspection listener: %v", err)
	}
	var catalog []introspect.MetricInfo
	f.okJSON(t, b, &catalog, "metrics")
	return catalog
}

// attachForeignProgram attaches another program to connect4 of cgroup, as
// another agent would, and returns its ID; it is detached when t ends.
func attachForeignProgram(t *testing.T, cgroup string) ebpf.ProgramID {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "other_agent", Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ebpf.AttachCGroupInet4Connect, Program: prog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	info, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// wantLines fails t for each want that out lacks, comparing with runs of
// spaces collapsed (table alignment is the golden tests' business).
func wantLines(t *testing.T, out string, want ...string) {
	t.Helper()
	norm := func(s string) string { return spaces.ReplaceAllString(s, " ") }
	for _, w := range want {
		if !strings.Contains(norm(out), norm(w)) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

var spaces = regexp.MustCompile(` +`)

// docPath is docs/metrics.md from this package.
var docPath = filepath.Join("..", "..", "docs", "metrics.md")
