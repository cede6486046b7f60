package translate

import (
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/routes"
)

// TestObjectPanicContained: a panic while judging one object (a bug its
// data reached; here the fault hook's nil map, for each kind in turn) is
// contained to that object. It is listed in Failures with the stack of the
// panic, judged invalid with a status that names an internal error (its
// references unjudged: ResolvedRefs=Unknown), closed
// for what it governs (a BackendTLSPolicy's, an XBackend's or a Service's
// TLS ports fail closed, never plaintext), and every other object is
// translated as without the panic. Before, the panic ended the whole
// translation, and the agent kept its last Snapshot until the object was
// fixed.
func TestObjectPanicContained(t *testing.T) {
	in := containInput()
	base, err := Translate(in)
	if err != nil {
		t.Fatal(err)
	}
	const internal = "internal error: assignment to entry in nil map"
	for _, tc := range []struct {
		broken snapshot.ObjectRef
		// closed is the Service port that must now fail closed; none:
		// the object governs no TLS.
		closed  string
		check   func(t *testing.T, res Result)
		changed []string // the Services whose frontends may differ
		// governs is the Service the failure names (Failure.Services).
		governs string
	}{{
		broken:  snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: "ns", Name: "tls"},
		governs: "secure",
		closed:  "secure",
		changed: []string{"secure"},
		check: func(t *testing.T, res Result) {
			checkFailed(t, res.Status.BackendTLSPolicies[types.NamespacedName{Namespace: "ns", Name: "tls"}][0].Conditions, "Invalid", internal)
		},
	}, {
		broken:  snapshot.ObjectRef{Kind: "Service", Namespace: "ns", Name: "secure2"},
		governs: "secure2",
		closed:  "secure2",
		changed: []string{"secure2"},
	}, {
		broken:  snapshot.ObjectRef{Kind: "XBackend", Namespace: "ns", Name: "xb"},
		governs: "ext",
		closed:  "ext",
		changed: []string{"ext"},
		check: func(t *testing.T, res Result) {
			checkFailed(t, res.Status.XBackends[types.NamespacedName{Namespace: "ns", Name: "xb"}][0].Conditions, "Invalid", internal)
		},
	}, {
		broken:  snapshot.ObjectRef{Kind: "HTTPRoute", Namespace: "ns", Name: "route"},
		governs: "h2",
		changed: []string{"h2"},
		check: func(t *testing.T, res Result) {
			parents := res.Status.HTTPRoutes[types.NamespacedName{Namespace: "ns", Name: "route"}]
			if len(parents) != 1 {
				t.Fatalf("route parents %+v, want one entry", parents)
			}
			checkFailed(t, parents[0].Conditions, string(gwv1.RouteReasonUnsupportedValue), internal)
			if f := frontendOf(res, "h2"); f == nil || f.Routes != nil {
				t.Errorf("h2 frontend %+v, want it captured (appProtocol h2c) without the route", f)
			}
		},
	}, {
		broken:  snapshot.ObjectRef{Kind: "XBackendTrafficPolicy", Namespace: "ns", Name: "traffic"},
		governs: "h2",
		changed: []string{"h2"},
		check: func(t *testing.T, res Result) {
			checkFailed(t, res.Status.XBackendTrafficPolicies[types.NamespacedName{Namespace: "ns", Name: "traffic"}][0].Conditions, "Invalid", internal)
			for _, b := range res.Backends {
				if b.RetryConstraint != nil {
					t.Errorf("backend %s has the failed policy's retry constraint", b.Ref)
				}
			}
		},
	}} {
		t.Run(tc.broken.Kind, func(t *testing.T) {
			res, err := translateWith(in, func(ref snapshot.ObjectRef) {
				if ref == tc.broken {
					// A classic bug: the inner map was never made.
					seen := map[string]map[string]int{}
					seen[ref.Namespace][ref.Name]++
				}
			})
			if err != nil {
				t.Fatalf("translate with %s panicking: %v", tc.broken, err)
			}
			if len(res.Failures) != 1 || res.Failures[0].Object != tc.broken || !strings.Contains(res.Failures[0].Stack, "contain_test.go") {
				t.Fatalf("Failures = %+v, want %s alone, with the stack of its panic", res.Failures, tc.broken)
			}
			if want := []snapshot.ObjectRef{{Namespace: "ns", Name: tc.governs}}; !reflect.DeepEqual(res.Failures[0].Services, want) {
				t.Errorf("Failure.Services = %v, want %v", res.Failures[0].Services, want)
			}
			for _, f := range base.Frontends {
				if !slices.Contains(tc.changed, f.Service.Name) && !reflect.DeepEqual(frontendOf(res, f.Service.Name), &f) {
					t.Errorf("frontend of %s changed by %s's panic:\n got %+v\nwant %+v", f.Service.Name, tc.broken, frontendOf(res, f.Service.Name), f)
				}
			}
			if tc.closed != "" {
				f := frontendOf(res, tc.closed)
				if f == nil || f.FailurePolicy != snapshot.FailClosed {
					t.Fatalf("frontend of %s = %+v, want it captured and FailClosed", tc.closed, f)
				}
				b := backendOf(res, f.Backend)
				if b.Invalid == nil || !strings.Contains(b.Invalid.Message, internal) || b.TLS != nil {
					t.Errorf("backend of %s = %+v, want Invalid for the internal error", tc.closed, b)
				}
			}
			if tc.check != nil {
				tc.check(t, res)
			}
		})
	}
}

// checkFailed checks the conditions of a failed object's status entry:
// Accepted=False/reason and ResolvedRefs=Unknown/InternalError, each
// saying message. Before, ResolvedRefs was True: all references resolved,
// though none was judged.
func checkFailed(t *testing.T, conds []metav1.Condition, reason, message string) {
	t.Helper()
	if len(conds) == 0 || conds[0].Type != condAccepted || conds[0].Status != metav1.ConditionFalse ||
		conds[0].Reason != reason || !strings.Contains(conds[0].Message, message) {
		t.Errorf("conditions %+v, want Accepted=False/%s saying %q", conds, reason, message)
	}
	i := slices.IndexFunc(conds, func(c metav1.Condition) bool { return c.Type == condResolvedRefs })
	if i < 0 || conds[i].Status != metav1.ConditionUnknown || conds[i].Reason != ReasonInternalError || !strings.Contains(conds[i].Message, message) {
		t.Errorf("conditions %+v, want ResolvedRefs=Unknown/%s saying %q", conds, ReasonInternalError, message)
	}
}

func frontendOf(res Result, service string) *snapshot.Frontend {
	for i := range res.Frontends {
		if res.Frontends[i].Service.Name == service {
			return &res.Frontends[i]
		}
	}
	return nil
}

func backendOf(res Result, ref snapshot.BackendRef) snapshot.Backend {
	for _, b := range res.Backends {
		if b.Ref == ref {
			return b
		}
	}
	return snapshot.Backend{}
}

// containInput: two Services with a BackendTLSPolicy each, one with
// appProtocol h2c, a route and a traffic policy on it, and one that stands
// for an XBackend.
func containInput() Input {
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "ns", Name: name, Generation: 1}
	}
	svc := func(name, ip, appProtocol string, port int32) *corev1.Service {
		s := &corev1.Service{ObjectMeta: meta(name), Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "p", Port: port, Protocol: corev1.ProtocolTCP}}}}
		if appProtocol != "" {
			s.Spec.Ports[0].AppProtocol = &appProtocol
		}
		return s
	}
	system := gwv1.WellKnownCACertificatesSystem
	policy := func(name, target string) *gwv1.BackendTLSPolicy {
		return &gwv1.BackendTLSPolicy{ObjectMeta: meta(name), Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{
				Kind: "Service", Name: gwv1.ObjectName(target)}}},
			Validation: gwv1.BackendTLSPolicyValidation{WellKnownCACertificates: &system, Hostname: gwv1.PreciseHostname(target + ".example")},
		}}
	}
	ext := svc("ext", "10.96.0.4", "", 443)
	ext.Annotations = map[string]string{AnnotationXBackend: "xb"}
	group, kind, port := gwv1.Group(""), gwv1.Kind("Service"), gwv1.PortNumber(80)
	percent := 30
	return Input{
		Now:                time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		Services:           []*corev1.Service{svc("secure", "10.96.0.1", "", 443), svc("secure2", "10.96.0.2", "", 443), svc("h2", "10.96.0.3", "kubernetes.io/h2c", 80), ext},
		BackendTLSPolicies: []*gwv1.BackendTLSPolicy{policy("tls", "secure"), policy("tls2", "secure2")},
		HTTPRoutes: []*gwv1.HTTPRoute{{ObjectMeta: meta("route"), Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Group: &group, Kind: &kind, Name: "h2", Port: &port}}},
			Rules: []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{
				Name: "h2", Port: &port}}}}}},
		}}},
		XBackends: []*gwxv1alpha1.XBackend{{ObjectMeta: meta("xb"), Spec: gwxv1alpha1.BackendSpec{
			Type: gwxv1alpha1.BackendTypeExternalHostname, ExternalHostname: &gwxv1alpha1.ExternalHostnameBackend{Hostname: "api.example.com"},
			Port: gwxv1alpha1.BackendPort{Number: 443},
		}}},
		XBackendTrafficPolicies: []*gwxv1alpha1.XBackendTrafficPolicy{{ObjectMeta: meta("traffic"), Spec: gwxv1alpha1.BackendTrafficPolicySpec{
			TargetRefs:      []gwv1.LocalPolicyTargetReference{{Kind: "Service", Name: "h2"}},
			RetryConstraint: &gwxv1alpha1.RetryConstraint{Budget: &gwxv1alpha1.BudgetDetails{Percent: &percent}},
		}}},
	}
}

// TestRouteJoinPanicContained: a panic while joining the routes attached
// to one Service port (here the fault hook's nil map, before the join of
// ns/h2 port 80) is contained to that port. Its route table stays, and
// answers every request with an error — 500, or UNAVAILABLE where a
// GRPCRoute attaches — never the Service unrouted, past the routes'
// filters; each route attached there is listed in Failures and says
// Accepted=False and ResolvedRefs=Unknown toward the port; every other
// port gets its table as without the panic. Before, the panic ended the
// whole translation, and the agent kept its last Snapshot for every
// object.
func TestRouteJoinPanicContained(t *testing.T) {
	in := containInput()
	// Another Service with a route, whose table must not change.
	other := in.Services[2].DeepCopy()
	other.Name, other.Spec.ClusterIP, other.Spec.ClusterIPs = "h2b", "10.96.0.5", []string{"10.96.0.5"}
	in.Services = append(in.Services, other)
	otherRoute := in.HTTPRoutes[0].DeepCopy()
	otherRoute.Name, otherRoute.Spec.ParentRefs[0].Name = "route-b", "h2b"
	in.HTTPRoutes = append(in.HTTPRoutes, otherRoute)
	grpcRoute := &gwv1.GRPCRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "calls", Generation: 1}, Spec: gwv1.GRPCRouteSpec{
		CommonRouteSpec: in.HTTPRoutes[0].Spec.CommonRouteSpec,
		Rules:           []gwv1.GRPCRouteRule{{BackendRefs: []gwv1.GRPCBackendRef{{BackendRef: in.HTTPRoutes[0].Spec.Rules[0].BackendRefs[0].BackendRef}}}},
	}}
	broken := snapshot.ObjectRef{Kind: faultRouteJoin, Namespace: "ns", Name: "h2:80"}
	const internal = "internal error: assignment to entry in nil map"
	for _, tc := range []struct {
		name      string
		grpc      []*gwv1.GRPCRoute
		failed    []snapshot.ObjectRef // the routes Failures names, in order
		status    int
		grpcCode  int
		routeKind snapshot.RouteKind
	}{
		{name: "HTTPRoute", failed: []snapshot.ObjectRef{{Kind: "HTTPRoute", Namespace: "ns", Name: "route"}},
			status: 500, grpcCode: routes.GRPCUnavailable, routeKind: snapshot.KindHTTPRoute},
		{name: "with a GRPCRoute", grpc: []*gwv1.GRPCRoute{grpcRoute},
			failed: []snapshot.ObjectRef{{Kind: "HTTPRoute", Namespace: "ns", Name: "route"}, {Kind: "GRPCRoute", Namespace: "ns", Name: "calls"}},
			status: 503, grpcCode: routes.GRPCUnavailable, routeKind: snapshot.KindGRPCRoute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := in
			in.GRPCRoutes = tc.grpc
			base, err := Translate(in)
			if err != nil {
				t.Fatal(err)
			}
			res, err := translateWith(in, func(ref snapshot.ObjectRef) {
				if ref == broken {
					seen := map[string]map[string]int{}
					seen[ref.Namespace][ref.Name]++
				}
			})
			if err != nil {
				t.Fatalf("translate with the join at %s panicking: %v", broken.Name, err)
			}
			var failed []snapshot.ObjectRef
			for _, f := range res.Failures {
				failed = append(failed, f.Object)
				if want := []snapshot.ObjectRef{{Namespace: "ns", Name: "h2"}}; !reflect.DeepEqual(f.Services, want) || !strings.Contains(f.Stack, "contain_test.go") {
					t.Errorf("Failure %s: Services %v, stack %q; want %v and the stack of the panic", f.Object, f.Services, f.Stack, want)
				}
			}
			if !slices.Equal(failed, tc.failed) {
				t.Fatalf("Failures name %v, want %v", failed, tc.failed)
			}
			for _, ref := range tc.failed {
				entries := res.Status.HTTPRoutes[types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}]
				if ref.Kind == "GRPCRoute" {
					entries = res.Status.GRPCRoutes[types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}]
				}
				if len(entries) != 1 {
					t.Fatalf("%s has %d parent entries, want 1", ref, len(entries))
				}
				checkFailed(t, entries[0].Conditions, string(gwv1.RouteReasonUnsupportedValue), internal)
			}
			for _, f := range base.Frontends {
				if f.Service.Name != "h2" && !reflect.DeepEqual(frontendOf(res, f.Service.Name), &f) {
					t.Errorf("frontend of %s changed by the join's panic at h2:\n got %+v\nwant %+v", f.Service.Name, frontendOf(res, f.Service.Name), f)
				}
			}
			snap, err := snapshot.New(1, res.Frontends, res.Backends, res.Workloads)
			if err != nil {
				t.Fatal(err)
			}
			f, ok := snap.Frontend(netip.MustParseAddrPort("10.96.0.3:80"))
			if !ok || f.Routes == nil {
				t.Fatalf("h2:80 = %+v, want it captured with its route table", f)
			}
			for _, path := range []string{"/", "/svc.Echo/Call"} {
				req := routes.Request{Method: http.MethodPost, Path: path, Host: "h2", Header: http.Header{}}
				var d routes.Decision
				routes.Compile(snap).Lookup(f, "ns").Decide(&req, routes.GlobalRand{}, &d)
				if d.Action != routes.Respond || d.Status != tc.status || d.GRPCStatus != tc.grpcCode || d.Rule == nil ||
					d.Rule.Route != tc.failed[0] || d.Rule.Invalid == nil || !strings.Contains(d.Rule.Invalid.Message, internal) {
					t.Errorf("POST %s to h2:80: %v %d (gRPC %d), rule %+v; want Respond %d (gRPC %d) by %s's failed rule",
						path, d.Action, d.Status, d.GRPCStatus, d.Rule, tc.status, tc.grpcCode, tc.failed[0])
				}
			}
			if k := f.Routes.Producer.Kind; k != tc.routeKind {
				t.Errorf("h2:80's route set is of kind %s, want %s", k, tc.routeKind)
			}
		})
	}
}

// TestFailureNamesServicesWithoutRoom: a failed object's Services include
// those its status has no room for (Result.Unrepresented), which it
// governs all the same: here a route whose status holds 32 other
// controllers' parents. Before, Failure.Services left them out, and
// sockmeshctl explain named no failure for them.
func TestFailureNamesServicesWithoutRoom(t *testing.T) {
	in := containInput()
	route := in.HTTPRoutes[0].DeepCopy()
	for i := range maxRouteParents {
		route.Status.Parents = append(route.Status.Parents, gwv1.RouteParentStatus{
			ParentRef: gwv1.ParentReference{Name: gwv1.ObjectName(fmt.Sprintf("gw-%d", i))}, ControllerName: "example.com/other"})
	}
	in.HTTPRoutes = []*gwv1.HTTPRoute{route}
	broken := snapshot.ObjectRef{Kind: "HTTPRoute", Namespace: "ns", Name: "route"}
	res, err := translateWith(in, func(ref snapshot.ObjectRef) {
		if ref == broken {
			seen := map[string]map[string]int{}
			seen[ref.Namespace][ref.Name]++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Unrepresented) != 1 || res.Unrepresented[0].Policy != broken {
		t.Fatalf("Unrepresented = %+v, want the route's one parent", res.Unrepresented)
	}
	want := []snapshot.ObjectRef{{Namespace: "ns", Name: "h2"}}
	if len(res.Failures) != 1 || !reflect.DeepEqual(res.Failures[0].Services, want) {
		t.Errorf("Failures = %+v, want the route's, naming Services %v", res.Failures, want)
	}
}
