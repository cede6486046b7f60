package render

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/explain"
	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	kubesource "github.com/sockmesh/sockmesh/agent/source/kubernetes"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/ctl/describe"
	"github.com/sockmesh/sockmesh/ctl/top"
	"github.com/sockmesh/sockmesh/datapath"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func ref(kind, ns, name string) snapshot.ObjectRef {
	return snapshot.ObjectRef{Kind: kind, Namespace: ns, Name: name}
}

// statusFixture is status --all-nodes: two agents that answered, a
// control-plane node without one, and a node whose agent does not answer.
func statusFixture() []NodeStatus {
	var out []NodeStatus
	for _, st := range agentsFixture() {
		out = append(out, NodeStatus{Status: &st, Node: st.Node, Agent: AgentAnswered, Pod: "sockmesh-system/sockmesh-" + st.Node, PodState: "Running, ready"})
	}
	return append(out, NodeStatus{Node: "control-plane", Agent: AgentNotScheduled},
		NodeStatus{Node: "node-c", Agent: AgentNotAnswering, Pod: "sockmesh-system/sockmesh-x7k2p", PodState: "Pending, not ready",
			Error: "agent 10.0.0.3:9443: dial tcp 10.0.0.3:9443: connect: connection refused"})
}

func agentsFixture() []introspect.Status {
	hooks := []datapath.Hook{}
	for i, name := range []string{"sockops", "getsockopt", "getpeername4", "getpeername6", "connect4", "connect6"} {
		hooks = append(hooks, datapath.Hook{Name: name, ProgramName: "sm_" + name, ProgramID: ebpf.ProgramID(100 + i),
			LinkID: link.ID(200 + i), Attached: name != "connect6", LinkPinned: true, ProgramPinned: name != "sockops"})
	}
	return []introspect.Status{{
		Node: "node-a", Mode: "node-ip", Version: "v1.2.3", Time: t0, Ready: false,
		NotReady: "[-]heartbeat failed: datapath heartbeat stale for 6s",
		Snapshot: introspect.SnapshotStatus{Version: 12, AppliedAt: t0.Add(-95 * time.Second), Frontends: 3, Backends: 3, Invalid: 1, Workloads: 5},
		Datapath: introspect.DatapathStatus{
			State: datapath.State{PinDir: "/sys/fs/bpf/sockmesh", Cgroup: "/sys/fs/cgroup/unified", Hooks: hooks},
			Conflicts: []datapath.Attached{
				{Hook: "connect4", ProgramID: 77, Name: "cil_sock4_connect", RunsBeforeOurs: true},
				{Hook: "getpeername4", ProgramID: 78, RunsBeforeOurs: false},
				{Hook: "connect6", ProgramID: 79, Name: "sec_connect6", Cgroup: "kubepods/pod-a", RunsBeforeOurs: true},
			},
			Services: 4, Enrolments: 2,
			Counters: map[datapath.Decision]uint64{datapath.Redirected: 1042, datapath.SkippedNotEnrolled: 99, datapath.DeniedNoProxy: 0},
		},
		Proxy: introspect.ProxyStatus{ActiveConnections: map[string]float64{"l4_tls": 3, "http1": 1, "l7": 0}, SnapshotVersion: 12, EjectedEndpoints: 1},
		Pods: introspect.PodsStatus{Enrolled: 2, Pending: 1, NotEnrolled: 2, Unsettled: []enrol.Pod{
			{Pod: ref("", "app", "starting"), State: enrol.Pending, Since: t0.Add(-30 * time.Second), Reason: "no network namespace holds 10.244.0.13"},
		}},
		Kinds: []kubesource.KindStatus{
			{Kind: "ClusterTrustBundle", GroupVersion: "certificates.k8s.io/v1", Reason: kubesource.KindNotServed},
			{Kind: "BackendTLSPolicy", GroupVersion: "gateway.networking.k8s.io/v1", Watched: true},
			{Kind: "XBackend", GroupVersion: "gateway.networking.x-k8s.io/v1alpha1", Reason: kubesource.KindForbidden,
				Error: `xbackends.gateway.networking.x-k8s.io is forbidden: User "system:serviceaccount:sockmesh-system:sockmesh" cannot list resource "xbackends"`},
		},
		Writes: &controlplane.Writes{Writing: true,
			RBAC: []controlplane.HeldResource{{Object: controlplane.Object{Verb: "patch", Group: "gateway.networking.k8s.io",
				Resource: "backendtlspolicies", Subresource: "status", Namespace: "team-a"}, Since: t0.Add(-12 * time.Minute), Recheck: t0.Add(3 * time.Minute)}},
			RBACMore: 1,
			Backoff: []controlplane.HeldObject{
				{Object: controlplane.Object{Verb: "patch", Group: "gateway.networking.k8s.io", Resource: "httproutes", Subresource: "status", Namespace: "app", Name: "split"},
					Error:    `write status of HTTPRoute app/split: Internal error occurred: failed calling webhook "check.example.com": failed to call webhook: Post "https://check.example.com/validate?timeout=10s": context deadline exceeded`,
					Attempts: 4, Retry: t0.Add(8 * time.Second)},
				{Object: controlplane.Object{Verb: "create", Resource: "services", Namespace: "app", Name: "sockmesh-xb-"},
					Error:    `create Service app/sockmesh-xb-: Operation cannot be fulfilled on services "sockmesh-xb-": the object has been modified`,
					Attempts: 1, Retry: t0.Add(time.Second)},
			},
			BackoffMore: 2,
		},
		Events: []introspect.Event{
			{Time: t0.Add(-3 * time.Minute), Level: "WARN", Component: "datapath", Message: "other connect program runs before ours and may rewrite service addresses first"},
			{Time: t0.Add(-10 * time.Second), Level: "ERROR", Component: "apply", Message: "apply failed", Attrs: map[string]string{"err": "enrol netns 9: EPERM"}},
		},
		EventsTotal: 7,
		TranslateFailures: []translate.Failure{{Object: ref("HTTPRoute", "app", "split"), Panic: "assignment to entry in nil map",
			Stack: "goroutine 1 [running]:\nrouting.go:12", Services: []snapshot.ObjectRef{{Namespace: "app", Name: "secure"}}}},
	}, {
		// Not the leader: another agent writes.
		Node: "node-b", Mode: "node-ip", Version: "v1.2.3", Time: t0, Ready: true,
		Snapshot: introspect.SnapshotStatus{Version: 12, AppliedAt: t0.Add(-90 * time.Second), Frontends: 3, Backends: 3, Workloads: 1},
		Writes:   &controlplane.Writes{},
	}}
}

func backendFixture() explain.Backend {
	return explain.Backend{
		Ref: snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "app", Name: "secure", Port: 443}, Sources: []snapshot.ObjectRef{ref("Service", "app", "secure"), ref("BackendTLSPolicy", "app", "secure")},
		AppProtocol: "kubernetes.io/h2c", Protocol: snapshot.ProtocolHTTP2, Wire: "HTTP/2 in TLS", Endpoints: 4, ReadyEndpoints: 2, FallbackEndpoints: 1, DrainingEndpoints: 1,
		TLS: &explain.TLS{Policy: ref("BackendTLSPolicy", "app", "secure"), Mode: snapshot.TLSServerOnly, ServerName: "secure.app.svc",
			SubjectAltNames: []snapshot.SubjectAltName{{Type: snapshot.SANURI, Value: "spiffe://cluster.local/ns/app/sa/secure"}},
			CAs:             []explain.CACertificate{{Subject: "CN=app CA", NotAfter: t0.Add(365 * 24 * time.Hour)}, {Error: "a private key block, not a certificate"}},
			ALPN:            []string{"h2"}, MinVersion: "TLS 1.3"},
		SessionPersistence: &snapshot.SessionPersistence{Type: snapshot.SessionCookie, Name: "sticky"},
		RetryConstraint: &snapshot.RetryConstraint{BudgetPercent: 20, BudgetInterval: snapshot.Duration(10 * time.Second),
			MinRetryCount: 10, MinRetryInterval: snapshot.Duration(time.Second), Policy: ref("XBackendTrafficPolicy", "app", "budget")},
	}
}

func explainFixture() Explained {
	be := backendFixture()
	broken := explain.Backend{Ref: snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "app", Name: "broken", Port: 80}, Wire: "the app's own protocol in cleartext",
		Invalid: &snapshot.Invalid{Policy: ref("BackendTLSPolicy", "app", "broken"), Reason: "NoValidCACertificate", Message: "ConfigMap app/broken-ca: ca.crt holds no PEM certificate"}}
	addr := netip.MustParseAddrPort("10.96.0.10:443")
	return Explained{
		Explanation: explain.Explanation{
			Node: "node-a", SnapshotVersion: 12, Verdict: explain.Redirected,
			Query:     explain.Query{Pod: ref("", "app", "client"), Service: &snapshot.ObjectRef{Namespace: "app", Name: "secure"}, Port: 443, Addrs: []netip.Addr{addr.Addr()}},
			Summary:   "connections from app/client to app/secure are redirected to the proxy, which applies the producer HTTPRoute routes (2 rules); fail-closed: while the proxy is down, connects are refused",
			Enrolment: explain.Enrolment{Enrolled: true, State: enrol.Enrolled, IPs: []netip.Addr{netip.MustParseAddr("10.244.0.10")}, NetNS: "/proc/4242/ns/net", NetNSCookie: 8193, Proxy: datapath.Proxy{NetNSCookie: 1, V4: netip.MustParseAddrPort("10.0.0.1:15001")}},
			Capture:   explain.Capture{Captured: true, Service: &snapshot.ObjectRef{Namespace: "app", Name: "secure"}, PortName: "https", FailurePolicy: snapshot.FailClosed, Addrs: []explain.CapturedAddr{{Addr: addr, InDatapath: true}}},
			Backend:   &be,
			Routes: &explain.Routes{Kind: snapshot.KindHTTPRoute, Role: "producer", Namespace: "app", Rules: []explain.Rule{
				{Route: ref("HTTPRoute", "app", "split"), Index: 0, Name: "api", Matches: []string{"path PathPrefix /api, method GET"}, Backends: []string{"90 Service/app/secure:443", "10 Service/app/broken:80"}},
				{Route: ref("HTTPRoute", "app", "split"), Index: 1},
			}, Backends: []explain.Backend{broken, be}},
			Counters: explain.Counters{Decisions: map[datapath.Decision]uint64{datapath.Redirected: 12, datapath.SkippedProxyStale: 1},
				ByAddr: map[netip.AddrPort]map[datapath.Decision]uint64{addr: {datapath.Redirected: 12, datapath.SkippedProxyStale: 1}}},
			Notes: []string{"requests routed to Service/app/broken:80 fail closed (HTTP 503): BackendTLSPolicy/app/broken NoValidCACertificate: ConfigMap app/broken-ca: ca.crt holds no PEM certificate"},
		},
		Related: serviceFixture(),
	}
}

func serviceFixture() *describe.Service {
	be := backendFixture()
	cond := func(typ, status, reason, msg string) describe.Condition {
		return describe.Condition{Type: typ, Status: status, Reason: reason, Message: msg}
	}
	return &describe.Service{
		Service: snapshot.ObjectRef{Namespace: "app", Name: "secure"},
		Ports: []describe.Port{
			{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, Captured: true, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, FailurePolicy: snapshot.FailClosed, Backend: &be},
			{Name: "metrics", Port: 9090, Protocol: corev1.ProtocolTCP},
			{Name: "quic", Port: 443, Protocol: corev1.ProtocolUDP},
		},
		Policies: []describe.Object{
			{Ref: ref("BackendTLSPolicy", "app", "secure"), Created: t0.Add(-time.Hour), Ancestors: []describe.Ancestor{{Ref: "Service app/secure",
				Conditions: []describe.Condition{cond("Accepted", "True", "Accepted", "policy applies"), cond("ResolvedRefs", "True", "ResolvedRefs", "all references resolved")}}}},
			{Ref: ref("BackendTLSPolicy", "app", "late"), Created: t0, Ancestors: []describe.Ancestor{{Ref: "Service app/secure",
				Conditions: []describe.Condition{cond("Accepted", "False", "Conflicted", "BackendTLSPolicy app/secure also targets Service app/secure port(s) 443 and takes precedence (older, then first by namespace/name)")}}}},
		},
		TrafficPolicies: []describe.Object{
			{Ref: ref("XBackendTrafficPolicy", "app", "full"), Created: t0.Add(-2 * time.Hour), Ancestors: []describe.Ancestor{{Ref: "Service app/secure",
				NoStatus: "the policy's status has no room for this target (it holds at most 16 ancestors, 16 of them other controllers'): " +
					"the Gateway API makes the policy unimplementable here; it is not applied to this backend"}}},
			{Ref: ref("XBackendTrafficPolicy", "app", "budget"), Created: t0, Ancestors: []describe.Ancestor{{Ref: "Service app/secure",
				Conditions: []describe.Condition{cond("Accepted", "True", "Accepted", "policy applies to the requests sockmesh sends to this backend")}}}},
		},
		Routes:   []describe.Object{{Ref: ref("HTTPRoute", "app", "split")}},
		Warnings: []string{"cannot list ClusterTrustBundles (forbidden): what depends on them may be shown wrong"},
	}
}

func topFixture() top.View {
	return top.View{Node: "node-a", IntervalSeconds: 2.0004,
		Services: []top.Service{
			{Namespace: "app", Service: "secure", Requests: 120.5, Errors: 0.5, ClientErrors: 2, Total: 40211},
			{Namespace: "app", Service: "idle", Total: 3},
		},
		Decisions:   map[string]float64{"redirected": 30, "skipped_no_service": 4.5, "denied_no_proxy": 0},
		Connections: map[string]float64{"http1": 30}, Failures: map[string]float64{}, Active: map[string]float64{"http1": 12},
	}
}

func metricsFixture() []introspect.MetricInfo {
	return []introspect.MetricInfo{
		{Name: "sockmesh_build_info", Type: "gauge", Help: "Always 1; the labels name the agent's build.", ConstLabels: []string{"goversion", "version"}},
		{Name: "sockmesh_datapath_redirects_total", Type: "counter", Help: "Connect decisions, by decision.", Labels: []string{"decision"}},
		{Name: "sockmesh_enrol_netns_scans_total", Type: "counter", Help: "Scans of the node's network namespaces."},
	}
}

func TestGolden(t *testing.T) {
	explained := explainFixture()
	for _, c := range []struct {
		name  string
		data  any
		table func(io.Writer) error
	}{
		{"status", statusFixture(), func(w io.Writer) error { return Status(w, statusFixture()) }},
		{"explain", explained, func(w io.Writer) error { return Explain(w, explained) }},
		{"describe-service", serviceFixture(), func(w io.Writer) error { return Service(w, serviceFixture()) }},
		{"top", topFixture(), func(w io.Writer) error { return Top(w, topFixture()) }},
		{"metrics", metricsFixture(), func(w io.Writer) error { return Metrics(w, metricsFixture()) }},
	} {
		for _, f := range []Format{Table, YAML} {
			t.Run(c.name+"."+string(f), func(t *testing.T) {
				var buf bytes.Buffer
				if err := Print(&buf, f, c.data, c.table); err != nil {
					t.Fatal(err)
				}
				golden(t, filepath.Join("testdata", c.name+"."+string(f)+".golden"), buf.Bytes())
			})
		}
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./ctl/render -update)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-want +got; go test ./ctl/render -update rewrites it):\n%s", path, diff)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	// What -o json prints, a script reads back into the same types.
	var buf bytes.Buffer
	if err := Print(&buf, JSON, explainFixture(), nil); err != nil {
		t.Fatal(err)
	}
	var back Explained
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Verdict != explain.Redirected || back.Counters.Decisions[datapath.Redirected] != 12 || back.Related == nil ||
		back.Backend.TLS.CAs[0].Subject != "CN=app CA" {
		t.Errorf("round trip = %+v", back)
	}
}

func TestParseFormat(t *testing.T) {
	for in, want := range map[string]Format{"": Table, "table": Table, "yaml": YAML, "json": JSON} {
		if got, err := ParseFormat(in); err != nil || got != want {
			t.Errorf("ParseFormat(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseFormat("wide"); err == nil {
		t.Error(`ParseFormat("wide"): no error`)
	}
}

// TestLargeGauges: whole-number gauges (the proxy's Snapshot version, its
// open connections) printed with %g turned exponential past 999,999:
// "serving v1.234567e+06" beside "Snapshot: v1234567".
func TestLargeGauges(t *testing.T) {
	st := introspect.Status{Node: "n", Time: t0,
		Snapshot: introspect.SnapshotStatus{Version: 1234567, AppliedAt: t0},
		Proxy: introspect.ProxyStatus{SnapshotVersion: 1234567, ActiveConnections: map[string]float64{"l4": 2000000},
			EjectedEndpoints: 1000000}}
	var buf bytes.Buffer
	if err := Status(&buf, []NodeStatus{{Status: &st, Node: st.Node, Agent: AgentAnswered}}); err != nil {
		t.Fatal(err)
	}
	if err := Top(&buf, top.View{Active: map[string]float64{"l4": 2000000}}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"serving v1234567,", "active connections l4=2000000,", "failed connects 1000000", "Proxy open now:        l4=2000000"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "e+0") {
		t.Errorf("output has a number in exponent form:\n%s", out)
	}
}

// TestObjectWithoutStatus: an object translate gave no status still shows
// when it was created (it showed "-", as if unknown).
func TestObjectWithoutStatus(t *testing.T) {
	var buf bytes.Buffer
	p := &describe.Policy{Policy: describe.Object{Ref: ref("BackendTLSPolicy", "app", "orphan"), Created: t0}, Hostname: "x.app.svc"}
	if err := Policy(&buf, p); err != nil {
		t.Fatal(err)
	}
	if want := "BackendTLSPolicy/app/orphan   2026-11-22 10:00:00   -"; !strings.Contains(buf.String(), want) {
		t.Errorf("Policy() lacks %q:\n%s", want, buf.String())
	}
}

// TestCountersPartlyUnread: when an address's pair counters cannot be read
// the sums lack its counts; the table said nothing of it (a "-" that
// read as no connect at all).
func TestCountersPartlyUnread(t *testing.T) {
	e := explainFixture()
	e.Counters = explain.Counters{Decisions: map[datapath.Decision]uint64{}, ByAddr: map[netip.AddrPort]map[datapath.Decision]uint64{},
		Unavailable: "read pair counter: operation not permitted"}
	var buf bytes.Buffer
	if err := Explain(&buf, e); err != nil {
		t.Fatal(err)
	}
	if want := "Not counted:        read pair counter: operation not permitted"; !strings.Contains(buf.String(), want) {
		t.Errorf("Explain() lacks %q:\n%s", want, buf.String())
	}
}

// TestServiceWithoutClusterIP: describe said an ExternalName Service's
// port with appProtocol h2c was not captured for want of backend
// properties, and nothing at all of one without ports.
func TestServiceWithoutClusterIP(t *testing.T) {
	why := "is an ExternalName Service, a DNS alias for db.example.com with no ClusterIP, so sockmesh never captures connections to it"
	for _, s := range []*describe.Service{
		{Service: ref("", "app", "ext"), NoClusterIP: why,
			Ports: []describe.Port{{Name: "grpc", Port: 9000, Protocol: corev1.ProtocolTCP, AppProtocol: "kubernetes.io/h2c"}}},
		{Service: ref("", "app", "ext"), NoClusterIP: why},
	} {
		var buf bytes.Buffer
		if err := Service(&buf, s); err != nil {
			t.Fatal(err)
		}
		want := []string{"Not captured: it " + why}
		if len(s.Ports) > 0 {
			want = append(want, "Port grpc (9000), appProtocol kubernetes.io/h2c: not captured (the Service has no ClusterIP)")
		}
		for _, w := range want {
			if !strings.Contains(buf.String(), w) {
				t.Errorf("Service() lacks %q:\n%s", w, buf.String())
			}
		}
	}
}

// TestDescribeFailures: describe writes the failures it found as status
// does, a table of kind, object, Services and panic. Before, describe
// wrote none.
func TestDescribeFailures(t *testing.T) {
	s := serviceFixture()
	s.Failures = []translate.Failure{{Object: ref("HTTPRoute", "app", "split"), Panic: "assignment to entry in nil map",
		Services: []snapshot.ObjectRef{{Namespace: "app", Name: "secure"}}}}
	var buf bytes.Buffer
	if err := Service(&buf, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Objects whose translation panicked", "HTTPRoute   app/split   app/secure   assignment to entry in nil map"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("Service() lacks %q:\n%s", want, buf.String())
		}
	}
}
