package describe

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/internal/manifesttest"
)

func cluster(t *testing.T) *Cluster {
	t.Helper()
	in := translate.Input{Now: time.Now()} // the fixture's CA is made now (manifesttest)
	manifesttest.Load(t, "testdata/cluster.yaml", "describe test CA", &in)
	c, err := New(in, []string{"a warning"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func hasCondition(a Ancestor, typ, status, reason string) bool {
	return slices.ContainsFunc(a.Conditions, func(c Condition) bool {
		return c.Type == typ && c.Status == status && c.Reason == reason
	})
}

func TestService(t *testing.T) {
	c := cluster(t)
	s, err := c.Service("app", "secure")
	if err != nil {
		t.Fatal(err)
	}
	// quic shares https's number over UDP, which sockmesh never captures.
	if len(s.Ports) != 3 || !s.Ports[0].Captured || s.Ports[1].Captured || s.Ports[2].Captured || s.Ports[0].Backend == nil ||
		s.Ports[0].Backend.TLS == nil || s.Ports[0].Backend.TLS.ServerName != "secure.app.svc" {
		t.Errorf("ports = %+v: want https captured with the older policy's TLS, metrics and quic not", s.Ports)
	}
	// Oldest first; the newer one lost the conflict, and says to whom.
	if len(s.Policies) != 2 || s.Policies[0].Ref.Name != "secure" || s.Policies[1].Ref.Name != "late" ||
		!hasCondition(s.Policies[0].Ancestors[0], "Accepted", "True", "Accepted") ||
		!hasCondition(s.Policies[1].Ancestors[0], "Accepted", "False", "Conflicted") ||
		!strings.Contains(s.Policies[1].Ancestors[0].Conditions[0].Message, "app/secure") ||
		s.Policies[1].Ancestors[0].Ref != "Service app/secure section https" {
		t.Errorf("policies = %+v", s.Policies)
	}
	if !slices.Equal(s.Warnings, []string{"a warning"}) {
		t.Errorf("warnings = %q", s.Warnings)
	}
	if s.NoClusterIP != "" || s.Ports[0].Protocol != "TCP" || s.Ports[2].Protocol != "UDP" {
		t.Errorf("service = %+v, want a ClusterIP, https TCP and quic UDP", s)
	}

	// Not captured for want of a ClusterIP, not of backend properties.
	ext, err := c.Service("app", "ext")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ext.NoClusterIP, "is an ExternalName Service, a DNS alias for db.example.com with no ClusterIP") ||
		len(ext.Ports) != 1 || ext.Ports[0].Captured {
		t.Errorf("ExternalName service = %+v, want its one port not captured, for want of a ClusterIP", ext)
	}

	routed, err := c.Service("app", "routed")
	if err != nil {
		t.Fatal(err)
	}
	p := routed.Ports[0]
	if !p.Captured || len(p.Routes) != 1 || p.Routes[0].Role != "producer" || len(p.Routes[0].Rules) != 1 ||
		p.Routes[0].Rules[0].Route.Name != "to-secure" || len(p.Routes[0].Backends) != 1 ||
		len(routed.Routes) != 1 || !hasCondition(routed.Routes[0].Ancestors[0], "Accepted", "True", "Accepted") {
		t.Errorf("routed = %+v", routed)
	}

	if _, err := c.Service("app", "nosuch"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Service(nosuch) error = %v, want ErrNotFound", err)
	}
}

func TestBackendTLSPolicy(t *testing.T) {
	c := cluster(t)
	p, err := c.BackendTLSPolicy("app", "late")
	if err != nil {
		t.Fatal(err)
	}
	if p.Hostname != "other.app.svc" || !slices.Equal(p.CARefs, []string{"ConfigMap app/secure-ca"}) ||
		len(p.Policy.Ancestors) != 1 || !hasCondition(p.Policy.Ancestors[0], "Accepted", "False", "Conflicted") ||
		len(p.Targets) != 1 || p.Targets[0].Service.Name != "secure" || len(p.Targets[0].Policies) != 2 ||
		p.Targets[0].Warnings != nil || p.Policy.Created.IsZero() {
		t.Errorf("BackendTLSPolicy(late) = %+v", p)
	}
	if _, err := c.BackendTLSPolicy("app", "nosuch"); !errors.Is(err, ErrNotFound) {
		t.Errorf("error = %v, want ErrNotFound", err)
	}
}

func TestXBackend(t *testing.T) {
	c := cluster(t)
	x, err := c.XBackend("app", "partner")
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Backends) != 1 || x.Backends[0].Hostname != "example.com" || !slices.Equal(x.Services, []string{"app/partner:80"}) ||
		len(x.XBackend.Ancestors) == 0 {
		t.Errorf("XBackend(partner) = %+v", x)
	}
	if _, err := c.XBackend("app", "nosuch"); !errors.Is(err, ErrNotFound) {
		t.Errorf("error = %v, want ErrNotFound", err)
	}
}

func TestHTTPRoute(t *testing.T) {
	c := cluster(t)
	r, err := c.HTTPRoute("app", "to-secure")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Placements) != 1 || r.Placements[0].Service.Name != "routed" || r.Placements[0].Port != 80 ||
		r.Placements[0].Role != "producer" || len(r.Placements[0].Rules) != 1 ||
		!slices.Equal(r.Placements[0].Rules[0].Matches, []string{"path PathPrefix /api"}) ||
		len(r.Route.Ancestors) != 1 || r.Route.Ancestors[0].Ref != "Service app/routed port 80" {
		t.Errorf("HTTPRoute(to-secure) = %+v", r)
	}
	if _, err := c.HTTPRoute("app", "nosuch"); !errors.Is(err, ErrNotFound) {
		t.Errorf("error = %v, want ErrNotFound", err)
	}
}

func TestGRPCRoute(t *testing.T) {
	c := cluster(t)
	r, err := c.GRPCRoute("app", "to-rpc")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Placements) != 1 || r.Placements[0].Service.Name != "rpc" || r.Placements[0].Port != 50051 ||
		r.Placements[0].Kind != "GRPCRoute" || len(r.Placements[0].Rules) != 1 || r.Route.Ref.Kind != "GRPCRoute" ||
		len(r.Route.Ancestors) != 1 || !hasCondition(r.Route.Ancestors[0], "Accepted", "True", "Accepted") {
		t.Errorf("GRPCRoute(to-rpc) = %+v", r)
	}
	// A GRPCRoute is not an HTTPRoute of the same name, nor the reverse.
	if _, err := c.HTTPRoute("app", "to-rpc"); !errors.Is(err, ErrNotFound) {
		t.Errorf("HTTPRoute(to-rpc) error = %v, want ErrNotFound", err)
	}
	if _, err := c.GRPCRoute("app", "to-secure"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GRPCRoute(to-secure) error = %v, want ErrNotFound", err)
	}
}

// A policy whose status other controllers fill is applied nowhere it found
// no room, and no condition can say so: describe must.
func TestServiceTrafficPolicies(t *testing.T) {
	c := cluster(t)
	s, err := c.Service("app", "budgeted")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.TrafficPolicies) != 2 {
		t.Fatalf("traffic policies = %+v, want full and budget", s.TrafficPolicies)
	}
	full, budget := s.TrafficPolicies[0], s.TrafficPolicies[1]
	if full.Ref.Name != "full" || len(full.Ancestors) != 1 || full.Ancestors[0].Ref != "Service app/budgeted" ||
		full.Ancestors[0].Conditions != nil || !strings.Contains(full.Ancestors[0].NoStatus, "16 of them other controllers'") ||
		!strings.Contains(full.Ancestors[0].NoStatus, "not applied") {
		t.Errorf("full = %+v, want no status entry toward app/budgeted, saying why", full)
	}
	if budget.Ref.Name != "budget" || len(budget.Ancestors) != 1 || !hasCondition(budget.Ancestors[0], "Accepted", "True", "Accepted") ||
		budget.Ancestors[0].NoStatus != "" {
		t.Errorf("budget = %+v, want Accepted", budget)
	}
}

// TestFailuresDescribed: describe lists the translation's failures that
// concern what it describes — a Service's, those whose Services include it;
// a route's, its own — as sockmeshctl status and explain do. Before, it
// showed none, though its own translation had them.
func TestFailuresDescribed(t *testing.T) {
	c := cluster(t)
	route := snapshot.ObjectRef{Kind: "HTTPRoute", Namespace: "app", Name: "to-secure"}
	failure := translate.Failure{Object: route, Panic: "assignment to entry in nil map", Services: []snapshot.ObjectRef{{Namespace: "app", Name: "routed"}}}
	c.res.Failures = append(c.res.Failures, failure)
	svc, err := c.Service("app", "routed")
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Failures) != 1 || svc.Failures[0].Object != route {
		t.Errorf("Service(routed).Failures = %+v, want the route's", svc.Failures)
	}
	if other, err := c.Service("app", "secure"); err != nil || len(other.Failures) != 0 {
		t.Errorf("Service(secure).Failures = %+v (%v), want none", other.Failures, err)
	}
	r, err := c.HTTPRoute("app", "to-secure")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Failures) != 1 || r.Failures[0].Panic != failure.Panic {
		t.Errorf("HTTPRoute(to-secure).Failures = %+v, want its own", r.Failures)
	}
}
