package translate_test

import (
	"net/http"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/userspace-proxy/routes"
)

// TestGRPCMethodForms checks, on the Snapshot translate builds from
// testdata/gamma/grpc-method-forms.in.yaml and as the proxy decides, that
// GRPCRoute service and method matches take the paths gRPC clients send:
// regular expressions anchored with "^" and "$" (which matched nothing
// once joined into one path expression), a service written fully
// qualified with a leading dot (which matched nothing as "/.pkg.Svc"),
// each expression confined to its own segment of the path (a branch
// matching only with a "/" gone, the rest kept) and ranked by its
// characters without anchors,
// and that a rule writing a binary header gRPC cannot decode answers
// UNAVAILABLE rather than forwarding calls the backend fails INTERNAL.
func TestGRPCMethodForms(t *testing.T) {
	c := newDecisionCase(t, "testdata/gamma/grpc-method-forms.in.yaml")
	set := c.set(t, "", "10.96.18.1:7070")
	for _, tc := range []struct {
		path string
		rule string // the rule forwarding the call; "" for none
		why  routes.Reason
	}{
		{path: "/grpc.health.v1.Health/Check", rule: "anchored"},
		{path: "/grpc.health.v1.Health/Watch", rule: "anchored"},
		{path: "/grpc.health.v1.Health/CheckAll", why: routes.ReasonNoMatch},
		{path: "/xgrpc.health.v1.Health/Check", why: routes.ReasonNoMatch},
		{path: "/shop.v1.Cart/Add", rule: "anchored-alternatives"},
		{path: "/SHOP.V1.CART/Add", rule: "anchored-alternatives"},
		{path: "/shop.v2.Cart/Add", rule: "anchored-alternatives"},
		{path: "/shop.v2.CartX/Add", why: routes.ReasonNoMatch},
		{path: "/cross.Svc/Bar", rule: "service-in-its-segment"},
		{path: "/cross.Svc/Extra/Bar", why: routes.ReasonNoMatch},
		{path: "/cross.Svc/Bar/Bar", why: routes.ReasonNoMatch},
		{path: "/crossm.Svc/Get", rule: "method-in-its-segment"},
		{path: "/crossm.Svc/Get/Extra", why: routes.ReasonNoMatch},
		{path: "/slash.Svc/Get/Any", why: routes.ReasonNoMatch}, // literal-slash is dropped
		{path: "/rank.Svc/Get", rule: "rank-longer"},
		{path: "/rank.Other/Get", rule: "rank-anchored"},
		{path: "/pkg.Orders/Get", rule: "fully-qualified"},
		{path: "/pkg.Orders/Put", why: routes.ReasonNoMatch},
		{path: "/pkg.Stock/Count", rule: "fully-qualified-service-only"},
		{path: "/b/Any", why: routes.ReasonNoMatch}, // inner-anchor is dropped
		{path: "/meta.Ok/Any", rule: "binary-metadata"},
		{path: "/meta.Bad/Any", why: routes.ReasonInvalidRule},
		{path: "/meta.BadResponse/Any", why: routes.ReasonInvalidRule},
		{path: "/fold.Svc/Get", rule: "slash-branch"},
		{path: "/fold.Svc/Get/Get", why: routes.ReasonNoMatch}, // its "/" branch is gone
	} {
		req := routes.Request{Method: http.MethodPost, Path: tc.path, Host: "echo", Header: http.Header{"Content-Type": {"application/grpc"}}}
		var d routes.Decision
		set.Decide(&req, routes.GlobalRand{}, &d)
		switch {
		case tc.rule != "" && (d.Action != routes.Forward || d.Rule.Name != tc.rule):
			t.Errorf("%s: %v (%s, rule %+v), want Forward by rule %s", tc.path, d.Action, d.Reason, d.Rule, tc.rule)
		case tc.rule == "" && (d.Action != routes.Respond || d.Reason != tc.why):
			t.Errorf("%s: %v (%s), want Respond %s", tc.path, d.Action, d.Reason, tc.why)
		}
	}
}

// TestGRPCRouteRoles checks, on the Snapshot translate builds from
// testdata/gamma/grpc-consumer-producer.in.yaml and as the proxy decides,
// that a consumer route replaces the producer routes for its namespace's
// clients whatever the two kinds (GEP-1294 merges routes only within one
// role), and that a GRPCRoute wins over an HTTPRoute of the same role.
func TestGRPCRouteRoles(t *testing.T) {
	c := newDecisionCase(t, "testdata/gamma/grpc-consumer-producer.in.yaml")
	for _, tc := range []struct {
		from, to string
		route    string // "Kind/namespace/name" of the route that takes the call
	}{
		{from: "web", to: "10.96.19.1:7070", route: "HTTPRoute/web/web-route"},
		{from: "other", to: "10.96.19.1:7070", route: "GRPCRoute/mesh/rpc"},
		{from: "mesh", to: "10.96.19.1:7070", route: "GRPCRoute/mesh/rpc"},
		{from: "", to: "10.96.19.1:7070", route: "GRPCRoute/mesh/rpc"}, // a host-network client
		{from: "both", to: "10.96.19.1:7070", route: "GRPCRoute/both/both-grpc"},
		{from: "rpc", to: "10.96.19.2:7070", route: "GRPCRoute/rpc/rpc-route"},
		{from: "web", to: "10.96.19.2:7070", route: "HTTPRoute/mesh/orders-http"},
	} {
		req := routes.Request{Method: http.MethodPost, Path: "/shop.Cart/Get", Host: "echo", Header: http.Header{"Content-Type": {"application/grpc"}}}
		var d routes.Decision
		c.set(t, tc.from, tc.to).Decide(&req, routes.GlobalRand{}, &d)
		if d.Action != routes.Forward || d.Rule == nil || d.Rule.Route.String() != tc.route {
			t.Errorf("call to %s from namespace %q: %v (%s, rule %+v), want Forward by %s", tc.to, tc.from, d.Action, d.Reason, d.Rule, tc.route)
		}
	}
}

// TestUnacceptedGRPCRouteTakesNoPort checks, on the Snapshot translate
// builds from testdata/gamma/grpc-unaccepted.in.yaml and as the proxy
// decides, that a GRPCRoute no rule of which can be honoured takes no port
// from an accepted HTTPRoute: the call goes where the HTTPRoute sends it,
// and the HTTPRoute is Accepted, naming no GRPCRoute. Where no accepted
// HTTPRoute attaches, the GRPCRoute still governs and its failing rule
// answers (fail closed).
func TestUnacceptedGRPCRouteTakesNoPort(t *testing.T) {
	c := newDecisionCase(t, "testdata/gamma/grpc-unaccepted.in.yaml")
	for _, tc := range []struct {
		to    string
		route string // "Kind/namespace/name" of the route that forwards the call; "" for one answered
	}{
		{to: "10.96.21.1:80", route: "HTTPRoute/mesh/web"},
		{to: "10.96.21.2:80"}, // solo: broken alone
		{to: "10.96.21.3:80"}, // both: both-http is not accepted either
	} {
		req := routes.Request{Method: http.MethodPost, Path: "/shop.Cart/Get", Host: "echo", Header: http.Header{"Content-Type": {"application/grpc"}}}
		var d routes.Decision
		c.set(t, "", tc.to).Decide(&req, routes.GlobalRand{}, &d)
		switch {
		case tc.route != "" && (d.Action != routes.Forward || d.Rule.Route.String() != tc.route):
			t.Errorf("call to %s: %v (%s, rule %+v), want Forward by %s", tc.to, d.Action, d.Reason, d.Rule, tc.route)
		case tc.route == "" && (d.Action != routes.Respond || d.Reason != routes.ReasonInvalidRule || d.Rule.Route.String() != "GRPCRoute/mesh/broken"):
			t.Errorf("call to %s: %v (%s, rule %+v), want Respond %s by GRPCRoute/mesh/broken", tc.to, d.Action, d.Reason, d.Rule, routes.ReasonInvalidRule)
		}
	}
	res, err := translate.Translate(c.in)
	if err != nil {
		t.Fatal(err)
	}
	web := res.Status.HTTPRoutes[types.NamespacedName{Namespace: "mesh", Name: "web"}]
	if len(web) != 1 {
		t.Fatalf("HTTPRoute mesh/web has %d parent entries, want 1", len(web))
	}
	if a := meta.FindStatusCondition(web[0].Conditions, "Accepted"); a == nil || a.Status != metav1.ConditionTrue || strings.Contains(a.Message, "GRPCRoute") {
		t.Errorf("HTTPRoute mesh/web's Accepted = %+v, want True naming no GRPCRoute", a)
	}
}
