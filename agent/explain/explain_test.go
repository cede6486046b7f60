package explain

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/internal/manifesttest"
	"github.com/sockmesh/sockmesh/test/pki"
)

// node translates testdata/node.yaml for node-a in zone-a, as the agent would.
func node(t *testing.T) *snapshot.Snapshot {
	t.Helper()
	// Now: the fixture's CA is made now (manifesttest), and translate judges
	// a CA certificate's validity at Input.Now.
	in := translate.Input{Now: time.Now(), Node: translate.Node{Name: "node-a", Zone: "zone-a"}}
	in.ReferenceGrants = []*gwv1.ReferenceGrant{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "other-to-app"},
		Spec: gwv1.ReferenceGrantSpec{
			From: []gwv1.ReferenceGrantFrom{{Group: gwv1.GroupName, Kind: "HTTPRoute", Namespace: "other"}},
			To:   []gwv1.ReferenceGrantTo{{Group: "", Kind: "Service"}},
		},
	}}
	manifesttest.Load(t, "testdata/node.yaml", "explain test CA", &in)
	res, err := translate.Translate(in)
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.New(7, res.Frontends, res.Backends, res.Workloads)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ref(ns, name string) snapshot.ObjectRef { return snapshot.ObjectRef{Namespace: ns, Name: name} }

func refp(ns, name string) *snapshot.ObjectRef { r := ref(ns, name); return &r }

// state is node-a's agent: the snapshot applied, the client and consumer
// pods enrolled, app/starting's namespace not found yet, and pair counters
// that count every address's redirects as its last byte.
func state(snap *snapshot.Snapshot) State {
	proxy := datapath.Proxy{NetNSCookie: 1, V4: netip.MustParseAddrPort("10.0.0.1:15001")}
	return State{
		Node:     "node-a",
		Snapshot: snap,
		Pods: []enrol.Pod{
			{Pod: ref("app", "client"), State: enrol.Enrolled, NetNSCookie: 100, NetNS: "/proc/10/ns/net", Proxy: proxy},
			{Pod: ref("app", "starting"), State: enrol.Pending, Reason: "no network namespace holds 10.244.0.13"},
			{Pod: ref("other", "consumer"), State: enrol.Enrolled, NetNSCookie: 101, Proxy: proxy},
		},
		Services:   datapath.ServicesFromSnapshot(snap),
		Enrolments: map[uint64]datapath.Proxy{100: proxy, 101: proxy},
		PairCounter: func(netns uint64, a netip.AddrPort) (map[datapath.Decision]uint64, error) {
			if netns != 100 && netns != 101 {
				return nil, errors.New("unexpected netns")
			}
			return map[datapath.Decision]uint64{datapath.Redirected: uint64(a.Addr().As4()[3]), datapath.SkippedProxyStale: 1}, nil
		},
	}
}

func TestExplain(t *testing.T) {
	snap := node(t)
	tests := []struct {
		name  string
		q     Query
		st    func(State) State
		check func(t *testing.T, e Explanation)
	}{{
		name: "captured by name",
		q:    Query{Pod: ref("app", "client"), Service: refp("app", "secure"), Port: 80},
		check: func(t *testing.T, e Explanation) {
			want(t, e, Redirected, "redirected to the proxy", "the app's own protocol in TLS", "fail-closed")
			if e.Backend == nil || e.Backend.TLS == nil || e.Backend.TLS.ServerName != "secure.app.svc" ||
				e.Backend.TLS.Policy != (snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: "app", Name: "secure"}) ||
				len(e.Backend.TLS.CAs) != 1 || !strings.Contains(e.Backend.TLS.CAs[0].Subject, "explain test CA") ||
				e.Backend.Endpoints != 3 || e.Backend.ReadyEndpoints != 1 || e.Backend.FallbackEndpoints != 1 {
				t.Errorf("backend = %+v", e.Backend)
			}
			if e.Capture.FailurePolicy != snapshot.FailClosed || len(e.Capture.Addrs) != 1 || !e.Capture.Addrs[0].InDatapath {
				t.Errorf("capture = %+v", e.Capture)
			}
			if e.Counters.Decisions[datapath.Redirected] != 10 || e.Counters.Decisions[datapath.SkippedProxyStale] != 1 ||
				e.Counters.ByAddr[netip.MustParseAddrPort("10.96.0.10:80")][datapath.Redirected] != 10 {
				t.Errorf("counters = %+v", e.Counters)
			}
			if !e.Enrolment.Enrolled || e.Enrolment.NetNSCookie != 100 || e.SnapshotVersion != 7 || len(e.Notes) != 0 {
				t.Errorf("enrolment = %+v, notes %q", e.Enrolment, e.Notes)
			}
		},
	}, {
		name: "captured by address",
		q:    Query{Pod: ref("app", "client"), Port: 80, Addrs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}},
		check: func(t *testing.T, e Explanation) {
			want(t, e, Redirected, "app/secure")
		},
	}, {
		name: "not captured",
		q:    Query{Pod: ref("app", "client"), Service: refp("app", "plain"), Port: 80, Addrs: []netip.Addr{netip.MustParseAddr("10.96.0.11")}},
		check: func(t *testing.T, e Explanation) {
			want(t, e, NotCaptured, "Service app/plain port 80 is not captured", "BackendTLSPolicy")
			if e.Backend != nil || e.Counters.Decisions != nil || e.Counters.Unavailable == "" {
				t.Errorf("backend %+v, counters %+v: want none", e.Backend, e.Counters)
			}
		},
	}, {
		// A pod's address, no Service's: the answer spoke of "this Service".
		name: "not captured by address",
		q:    Query{Pod: ref("app", "client"), Port: 80, Addrs: []netip.Addr{netip.MustParseAddr("10.244.0.99")}},
		check: func(t *testing.T, e Explanation) {
			want(t, e, NotCaptured, "10.244.0.99:80 is not captured: sockmesh captures a Service's ClusterIP and port only")
			if strings.Contains(e.Summary, "this Service") {
				t.Errorf("summary %q speaks of a Service never named", e.Summary)
			}
		},
	}, {
		name:  "wrong port",
		q:     Query{Pod: ref("app", "client"), Service: refp("app", "secure"), Port: 81},
		check: func(t *testing.T, e Explanation) { want(t, e, NotCaptured, "port 81") },
	}, {
		name: "invalid CA fails closed",
		q:    Query{Pod: ref("app", "client"), Service: refp("app", "broken"), Port: 80},
		check: func(t *testing.T, e Explanation) {
			want(t, e, FailClosed, "refuses them", "BackendTLSPolicy/app/broken")
			if e.Backend == nil || e.Backend.Invalid == nil || e.Backend.TLS != nil {
				t.Errorf("backend = %+v, want invalid without TLS", e.Backend)
			}
		},
	}, {
		name: "opted out by pod label",
		q:    Query{Pod: ref("app", "opted"), Service: refp("app", "secure"), Port: 80},
		check: func(t *testing.T, e Explanation) {
			want(t, e, NotEnrolled, "the pod has the label sockmesh.io/capture=disabled")
			if !e.Capture.Captured || e.Counters.Decisions != nil {
				t.Errorf("capture %+v counters %+v: want captured, no pair counters", e.Capture, e.Counters)
			}
		},
	}, {
		name: "opted out by namespace label",
		q:    Query{Pod: ref("optout", "legacy"), Service: refp("app", "secure"), Port: 80},
		check: func(t *testing.T, e Explanation) {
			want(t, e, NotEnrolled, "its namespace has the label sockmesh.io/capture=disabled")
		},
	}, {
		name: "namespace not found",
		q:    Query{Pod: ref("app", "starting"), Service: refp("app", "secure"), Port: 80},
		check: func(t *testing.T, e Explanation) {
			want(t, e, NotEnrolled, "network namespace is pending: no network namespace holds 10.244.0.13")
		},
	}, {
		name:  "another node's pod",
		q:     Query{Pod: ref("app", "remote"), Service: refp("app", "secure"), Port: 80},
		check: func(t *testing.T, e Explanation) { want(t, e, UnknownPod, "not one of node node-a's pods") },
	}, {
		name: "producer routes",
		q:    Query{Pod: ref("app", "client"), Service: refp("app", "routed"), Port: 80},
		check: func(t *testing.T, e Explanation) {
			want(t, e, Redirected, "producer HTTPRoute routes (1 rules)")
			if r := e.Routes; r == nil || len(r.Rules) != 1 || r.Rules[0].Route.Name != "to-secure" ||
				!slices.Equal(r.Rules[0].Matches, []string{"path PathPrefix /api"}) || len(r.Backends) != 1 ||
				r.Backends[0].Ref.Name != "secure" {
				t.Errorf("routes = %+v", e.Routes)
			}
		},
	}, {
		name: "consumer routes replace the producer's",
		q:    Query{Pod: ref("other", "consumer"), Service: refp("app", "routed"), Port: 80},
		check: func(t *testing.T, e Explanation) {
			want(t, e, Redirected, "consumer HTTPRoute routes")
			if r := e.Routes; r == nil || r.Rules[0].Route != (snapshot.ObjectRef{Kind: "HTTPRoute", Namespace: "other", Name: "canary"}) {
				t.Errorf("routes = %+v", e.Routes)
			}
			if len(e.Notes) != 1 || !strings.Contains(e.Notes[0], "fail closed") {
				t.Errorf("notes = %q, want the invalid backend named", e.Notes)
			}
		},
	}, {
		name: "datapath behind the snapshot",
		q:    Query{Pod: ref("app", "client"), Service: refp("app", "secure"), Port: 80},
		st: func(st State) State {
			st.Services, st.Enrolments = nil, map[uint64]datapath.Proxy{}
			return st
		},
		check: func(t *testing.T, e Explanation) {
			want(t, e, Redirected)
			if len(e.Notes) != 2 || !strings.Contains(e.Notes[0], "enrolment map lacks netns cookie 100") ||
				!strings.Contains(e.Notes[1], "services map lacks 10.96.0.10:80") {
				t.Errorf("notes = %q", e.Notes)
			}
		},
	}, {
		// Redirected, and the wire would be h2c, but no connection gets
		// through: the answer must say so, not only count 0 endpoints.
		name: "no endpoint",
		q:    Query{Pod: ref("app", "client"), Service: refp("app", "empty"), Port: 80},
		check: func(t *testing.T, e Explanation) {
			want(t, e, Redirected, "HTTP/2 with prior knowledge (h2c)")
			if len(e.Notes) != 1 || !strings.Contains(e.Notes[0], "Service/app/empty:80 has no endpoint ready, nor serving while it terminates") ||
				!strings.Contains(e.Notes[0], "no_endpoints") {
				t.Errorf("notes = %q, want the backend without endpoints named", e.Notes)
			}
		},
	}, {
		// The wire is h2c because of the Service port's appProtocol: the
		// backend named no source ("Sources: -").
		name: "appProtocol is a source",
		q:    Query{Pod: ref("app", "client"), Service: refp("app", "draining"), Port: 80},
		check: func(t *testing.T, e Explanation) {
			svc := snapshot.ObjectRef{Kind: "Service", Namespace: "app", Name: "draining"}
			if e.Backend == nil || !slices.Equal(e.Backend.Sources, []snapshot.ObjectRef{svc}) || e.Backend.AppProtocol != "kubernetes.io/h2c" {
				t.Errorf("backend = %+v, want source %s with appProtocol kubernetes.io/h2c", e.Backend, svc)
			}
		},
	}, {
		name: "a draining endpoint still serves",
		q:    Query{Pod: ref("app", "client"), Service: refp("app", "draining"), Port: 80},
		check: func(t *testing.T, e Explanation) {
			want(t, e, Redirected)
			if e.Backend == nil || e.Backend.Endpoints != 1 || e.Backend.ReadyEndpoints != 0 || e.Backend.DrainingEndpoints != 1 || len(e.Notes) != 0 {
				t.Errorf("backend = %+v, notes %q; want its one endpoint counted draining, no note", e.Backend, e.Notes)
			}
		},
	}, {
		name: "datapath unreadable",
		q:    Query{Pod: ref("app", "client"), Service: refp("app", "secure"), Port: 80},
		st: func(st State) State {
			st.Services, st.ServicesErr = nil, errors.New("list services: iteration aborted")
			st.Enrolments, st.EnrolmentsErr = nil, errors.New("list enrolments: iteration aborted")
			return st
		},
		check: func(t *testing.T, e Explanation) {
			want(t, e, Redirected)
			if len(e.Notes) != 2 || !strings.Contains(e.Notes[0], "enrolment map cannot be read (list enrolments: iteration aborted)") ||
				!strings.Contains(e.Notes[1], "services map cannot be read (list services: iteration aborted)") || !e.Capture.Addrs[0].Unread {
				t.Errorf("notes = %q, capture %+v; want the read errors, not that the maps lack the pod and address", e.Notes, e.Capture)
			}
		},
	}, {
		name:  "no snapshot yet",
		q:     Query{Pod: ref("app", "client"), Service: refp("app", "secure"), Port: 80},
		st:    func(st State) State { st.Snapshot = nil; return st },
		check: func(t *testing.T, e Explanation) { want(t, e, UnknownPod, "snapshot 0") },
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := state(snap)
			if tc.st != nil {
				st = tc.st(st)
			}
			tc.check(t, Explain(tc.q, st))
		})
	}
}

func want(t *testing.T, e Explanation, v Verdict, summary ...string) {
	t.Helper()
	if e.Verdict != v {
		t.Errorf("verdict = %s (%s), want %s", e.Verdict, e.Summary, v)
	}
	for _, s := range summary {
		if !strings.Contains(e.Summary, s) {
			t.Errorf("summary %q lacks %q", e.Summary, s)
		}
	}
}

func TestDescribeBackendNeverShowsKeys(t *testing.T) {
	ca, err := pki.NewCA("client CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "client"})
	if err != nil {
		t.Fatal(err)
	}
	b := DescribeBackend(&snapshot.Backend{
		Protocol: snapshot.ProtocolGRPC,
		TLS: &snapshot.TLS{Mode: snapshot.TLSMutual, ServerName: "x", ClientCertificatePEM: string(leaf.CertPEM),
			ClientKeyPEM: string(leaf.KeyPEM), RootsPEM: string(ca.CertPEM) + string(leaf.KeyPEM), MinVersion: 0x0304},
	})
	if b.TLS.ClientCertificate != "CN=client" || !slices.Equal(b.TLS.ALPN, []string{"h2"}) || b.TLS.MinVersion != "TLS 1.3" ||
		b.Wire != "gRPC (HTTP/2) in TLS" {
		t.Errorf("DescribeBackend = %+v %+v", b, b.TLS)
	}
	if len(b.TLS.CAs) != 2 || b.TLS.CAs[1].Error == "" || strings.Contains(b.TLS.CAs[1].Error, "MII") {
		t.Errorf("CAs = %+v, want the CA and a refusal to show the key block", b.TLS.CAs)
	}
}
