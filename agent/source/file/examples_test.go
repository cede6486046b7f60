package file

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestExamplesDemo reads examples/demo (make demo's default) with the file
// source and translates it: every file must parse, every policy and
// XBackend be accepted, and every backend property land in the Snapshot.
func TestExamplesDemo(t *testing.T) {
	s := newSource(t, "../../../examples/demo")
	s.reload()
	if errs := s.Errors(); len(errs) != 0 {
		t.Fatalf("examples/demo does not load: %v", errs)
	}
	in := s.Input()
	in.Now = time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	in.Node = translate.Node{
		Name:         "demo-node",
		IPs:          []netip.Addr{netip.MustParseAddr("192.168.50.1")},
		PodCIDRs:     []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
	}
	in.Resolved = map[string][]netip.Addr{"partner.demo.sockmesh.test": {netip.MustParseAddr("198.51.100.7")}}
	res, err := translate.Translate(in)
	if err != nil {
		t.Fatalf("Translate(examples/demo): %v", err)
	}
	if _, err := snapshot.New(1, res.Frontends, res.Backends, res.Workloads); err != nil {
		t.Fatalf("snapshot.New: %v", err)
	}

	want := map[string]snapshot.Protocol{
		"demo/payments:443": snapshot.ProtocolAuto,
		"demo/partner:80":   snapshot.ProtocolHTTP2,
		"demo/grpc:9000":    snapshot.ProtocolH2C,
		"demo/chat:80":      snapshot.ProtocolWS,
	}
	backends := map[snapshot.BackendRef]snapshot.Backend{}
	for _, b := range res.Backends {
		backends[b.Ref] = b
		if b.Invalid != nil {
			t.Errorf("backend %s is invalid: %s: %s", b.Ref, b.Invalid.Reason, b.Invalid.Message)
		}
		if len(b.Endpoints) == 0 {
			t.Errorf("backend %s has no endpoints", b.Ref)
		}
	}
	for _, f := range res.Frontends {
		key := fmt.Sprintf("%s:%d", f.Service, f.Port)
		proto, ok := want[key]
		if !ok {
			t.Errorf("unexpected frontend %s", key)
			continue
		}
		delete(want, key)
		if got := backends[f.Backend].Protocol; got != proto {
			t.Errorf("frontend %s protocol = %q, want %q", key, got, proto)
		}
	}
	for key := range want {
		t.Errorf("frontend %s missing", key)
	}
	if tls := backends[snapshot.BackendRef{Kind: snapshot.KindXBackend, Namespace: "demo", Name: "partner-api", Port: 443}].TLS; tls == nil || tls.Mode != snapshot.TLSMutual {
		t.Errorf("partner-api TLS = %+v, want mutual TLS", tls)
	}
	if tls := backends[snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "demo", Name: "payments", Port: 443}].TLS; tls == nil || tls.RootsPEM == "" {
		t.Errorf("payments TLS = %+v, want TLS with the ConfigMap's CA", tls)
	}
	// Every policy and XBackend has a status to check: an empty map would
	// pass the loops below.
	if len(res.Status.BackendTLSPolicies) != len(in.BackendTLSPolicies) || len(in.BackendTLSPolicies) == 0 {
		t.Errorf("status for %d BackendTLSPolicies, want one for each of the %d", len(res.Status.BackendTLSPolicies), len(in.BackendTLSPolicies))
	}
	if len(res.Status.XBackends) != len(in.XBackends) || len(in.XBackends) == 0 {
		t.Errorf("status for %d XBackends, want one for each of the %d", len(res.Status.XBackends), len(in.XBackends))
	}
	for k, ancestors := range res.Status.BackendTLSPolicies {
		if len(ancestors) == 0 {
			t.Errorf("BackendTLSPolicy %s has no ancestors", k)
		}
		for _, a := range ancestors {
			for _, c := range a.Conditions {
				if c.Status != "True" {
					t.Errorf("BackendTLSPolicy %s: %s=%s %s: %s", k, c.Type, c.Status, c.Reason, c.Message)
				}
			}
		}
	}
	for k, ancestors := range res.Status.XBackends {
		if len(ancestors) == 0 {
			t.Errorf("XBackend %s has no ancestors", k)
		}
		for _, a := range ancestors {
			for _, c := range a.Conditions {
				if c.Status != "True" {
					t.Errorf("XBackend %s: %s=%s %s: %s", k, c.Type, c.Status, c.Reason, c.Message)
				}
			}
		}
	}
	if len(res.Workloads) != 1 || !res.Workloads[0].Enrolled {
		t.Errorf("Workloads = %+v, want the enrolled client", res.Workloads)
	}
	if m, ok := res.Status.XMeshes["sockmesh"]; !ok || len(m.Conditions) == 0 || m.Conditions[0].Status != "True" {
		t.Errorf("XMesh sockmesh status = %+v, want Accepted", m)
	}
}
