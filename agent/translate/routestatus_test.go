package translate_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/userspace-proxy/routes"
)

// routeReasons are the reasons a route parent's conditions may carry: the
// API's for each type (shared_types.go), plus the few sockmesh documents
// where the API names none — Conflicted (GEP-1294's reason for the route
// type that loses a Service port), InvalidBackend (a backend that
// resolves but whose TLS policy or XBackend cannot be honoured) and its
// own condition type for rules that get no request.
var routeReasons = map[string][]gwv1.RouteConditionReason{
	"Accepted": {gwv1.RouteReasonAccepted, gwv1.RouteReasonNoMatchingParent, gwv1.RouteReasonUnsupportedValue,
		gwv1.RouteReasonIncompatibleFilters, translate.ReasonConflicted},
	"ResolvedRefs": {gwv1.RouteReasonResolvedRefs, gwv1.RouteReasonRefNotPermitted, gwv1.RouteReasonInvalidKind,
		gwv1.RouteReasonBackendNotFound, gwv1.RouteReasonUnsupportedProtocol, translate.ReasonInvalidBackend},
	"PartiallyInvalid":               {gwv1.RouteReasonUnsupportedValue, gwv1.RouteReasonIncompatibleFilters},
	translate.ConditionRulesShadowed: {translate.ReasonIdenticalMatches},
}

// TestRouteParentConditions checks every route parent entry translate
// writes for the fixtures under testdata against the API's rules for
// RouteParentStatus, whatever the golden says: one entry per parentRef,
// each condition type's
// reason is one the API (or the list above) gives for it, True only with
// the success reason (PartiallyInvalid and sockmesh's RulesShadowed: only
// True, and only beside Accepted=True), a message, the route's generation,
// and Accepted and ResolvedRefs always present.
func TestRouteParentConditions(t *testing.T) {
	fixtures, err := filepath.Glob(filepath.Join("testdata", "*", "*.in.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, path := range fixtures {
		in := loadInput(t, path)
		res, err := translate.Translate(in)
		if err != nil {
			t.Fatalf("Translate(%s): %v", path, err)
		}
		type route struct {
			kind string
			types.NamespacedName
		}
		generations := map[route]int64{}
		for _, r := range in.HTTPRoutes {
			generations[route{"HTTPRoute", types.NamespacedName{Namespace: r.Namespace, Name: r.Name}}] = r.Generation
		}
		for _, r := range in.GRPCRoutes {
			generations[route{"GRPCRoute", types.NamespacedName{Namespace: r.Namespace, Name: r.Name}}] = r.Generation
		}
		for kind, routes := range map[string]map[types.NamespacedName][]gwv1.RouteParentStatus{
			"HTTPRoute": res.Status.HTTPRoutes, "GRPCRoute": res.Status.GRPCRoutes,
		} {
			for name, parents := range routes {
				seen := map[[6]string]bool{}
				for i, p := range parents {
					// The API keys a route's parent entries by
					// parentRef and controllerName.
					if ref := parentKey(p.ParentRef); seen[ref] {
						t.Errorf("%s: %s %s has two entries for parentRef %v", path, kind, name, ref)
					} else {
						seen[ref] = true
					}
					at := fmt.Sprintf("%s: %s %s parents[%d] (%s)", path, kind, name, i, p.ParentRef.Name)
					checkParentConditions(t, at, generations[route{kind, name}], p.Conditions)
					checked++
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no route parent entries in the fixtures")
	}
}

// parentKey spells out a parentRef as written (unset fields "<nil>").
func parentKey(r gwv1.ParentReference) [6]string {
	s := func(p *string) string {
		if p == nil {
			return "<nil>"
		}
		return *p
	}
	port := "<nil>"
	if r.Port != nil {
		port = fmt.Sprint(*r.Port)
	}
	return [6]string{s((*string)(r.Group)), s((*string)(r.Kind)), s((*string)(r.Namespace)), string(r.Name), s((*string)(r.SectionName)), port}
}

func checkParentConditions(t *testing.T, at string, generation int64, conds []metav1.Condition) {
	t.Helper()
	byType := map[string]metav1.Condition{}
	for _, c := range conds {
		if _, dup := byType[c.Type]; dup {
			t.Errorf("%s: condition %s twice", at, c.Type)
		}
		byType[c.Type] = c
		allowed, known := routeReasons[c.Type]
		switch {
		case !known:
			t.Errorf("%s: condition type %s is none of the API's for a route parent", at, c.Type)
		case !slices.Contains(allowed, gwv1.RouteConditionReason(c.Reason)):
			t.Errorf("%s: %s=%s with reason %s, which is not among %v (message %q)", at, c.Type, c.Status, c.Reason, allowed, c.Message)
		}
		success := c.Reason == c.Type // Accepted/Accepted, ResolvedRefs/ResolvedRefs
		onlyTrue := c.Type == "PartiallyInvalid" || c.Type == translate.ConditionRulesShadowed
		if !onlyTrue && (c.Status == metav1.ConditionTrue) != success {
			t.Errorf("%s: %s=%s with reason %s", at, c.Type, c.Status, c.Reason)
		}
		if strings.TrimSpace(c.Message) == "" {
			t.Errorf("%s: %s has no message", at, c.Type)
		}
		if c.ObservedGeneration != generation {
			t.Errorf("%s: %s observedGeneration %d, want the route's %d", at, c.Type, c.ObservedGeneration, generation)
		}
	}
	if rs, ok := byType[translate.ConditionRulesShadowed]; ok && (rs.Status != metav1.ConditionTrue || byType["Accepted"].Status != metav1.ConditionTrue) {
		t.Errorf("%s: %s=%s (%q) beside Accepted=%s", at, rs.Type, rs.Status, rs.Message, byType["Accepted"].Status)
	}
	for _, typ := range []string{"Accepted", "ResolvedRefs"} {
		if _, ok := byType[typ]; !ok {
			t.Errorf("%s: no %s condition", at, typ)
		}
	}
	if pi, ok := byType["PartiallyInvalid"]; ok {
		// The API: "MUST only be set when it is True", never beside a
		// route that is fully invalid or not accepted; the Drop Rule(s)
		// form's message starts "Dropped Rule".
		if pi.Status != metav1.ConditionTrue || byType["Accepted"].Status != metav1.ConditionTrue || !strings.HasPrefix(pi.Message, "Dropped Rule") {
			t.Errorf("%s: PartiallyInvalid=%s (%q) beside Accepted=%s", at, pi.Status, pi.Message, byType["Accepted"].Status)
		}
	}
}

// TestRouteMatchLimitAsTheCRD: a route's matches in all rules are limited
// to 128, counted as the v1.7 CRD counts them — the real API server is
// asked — and translate, handed the route unchecked (no CRD defaults, as a
// cluster with another CRD version could serve it), makes it invalid
// exactly when the API server refuses it. An HTTPRoute rule without
// matches counts one: the CRD defaults it to one PathPrefix "/" match
// before counting, where "matches: []" stays empty; a GRPCRoute's CRD
// gives no default and counts such a rule as none.
func TestRouteMatchLimitAsTheCRD(t *testing.T) {
	const ns = "limits"
	env := apiserver.Start(t)
	if _, err := env.Kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// rules writes one rule per entry of n: n matches, or none when -1
	// ("matches" absent), or "matches: []" when 0.
	rules := func(match string, n ...int) string {
		var rs []string
		for i, count := range n {
			r := "{backendRefs: [{name: echo, port: 80}]"
			if count >= 0 {
				ms := make([]string, count)
				for j := range ms {
					ms[j] = fmt.Sprintf(match, i, j)
				}
				r += ", matches: [" + strings.Join(ms, ", ") + "]"
			}
			rs = append(rs, r+"}")
		}
		return "[" + strings.Join(rs, ", ") + "]"
	}
	route := func(kind string, rs string) string {
		return fmt.Sprintf("apiVersion: gateway.networking.k8s.io/v1\nkind: %s\nmetadata: {name: r, namespace: %s}\n"+
			"spec: {parentRefs: [{group: \"\", kind: Service, name: echo}], rules: %s}\n", kind, ns, rs)
	}
	const (
		path   = "{path: {type: PathPrefix, value: /r%d/m%d}}"
		method = "{method: {service: r%d.m%d}}"
	)
	for _, tc := range []struct {
		name, doc string
		refused   bool
	}{
		{"HTTPRoute 127 and a rule without matches", route("HTTPRoute", rules(path, 64, 63, -1)), false},
		{"HTTPRoute 128 and a rule without matches", route("HTTPRoute", rules(path, 64, 64, -1)), true},
		{"HTTPRoute 128 and a rule with matches: []", route("HTTPRoute", rules(path, 64, 64, 0)), false},
		{"GRPCRoute 128 and a rule without matches", route("GRPCRoute", rules(method, 64, 64, -1)), false},
		{"GRPCRoute 129", route("GRPCRoute", rules(method, 64, 64, 1)), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if refused := createdOrRefused(t, env, ns, tc.doc); refused != tc.refused {
				t.Fatalf("the API server refused it: %v, want %v (the case does not test the boundary)", refused, tc.refused)
			}
			service := fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: echo, namespace: %s}\n"+
				"spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80, appProtocol: kubernetes.io/h2c}]}\n", ns)
			res := translateUnchecked(t, service+"---\n"+tc.doc)
			parents := res.Status.HTTPRoutes[types.NamespacedName{Namespace: ns, Name: "r"}]
			if strings.Contains(tc.doc, "kind: GRPCRoute") {
				parents = res.Status.GRPCRoutes[types.NamespacedName{Namespace: ns, Name: "r"}]
			}
			if len(parents) != 1 {
				t.Fatalf("%d parent entries, want 1", len(parents))
			}
			accepted := meta.FindStatusCondition(parents[0].Conditions, "Accepted")
			invalid := accepted != nil && accepted.Status == metav1.ConditionFalse && strings.Contains(accepted.Message, "more than 128")
			if invalid != tc.refused || !tc.refused && accepted.Status != metav1.ConditionTrue {
				t.Errorf("translate's Accepted = %+v; the API server refused the route: %v", accepted, tc.refused)
			}
		})
	}
}

// createdOrRefused has env's API server create doc, one route in ns, and
// reports whether it refused it as Invalid; one it creates is deleted.
func createdOrRefused(t *testing.T, env *apiserver.Env, ns, doc string) bool {
	t.Helper()
	var u unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	gvr := u.GroupVersionKind().GroupVersion().WithResource(strings.ToLower(u.GetKind()) + "s")
	client := env.Dynamic.Resource(gvr).Namespace(ns)
	_, err := client.Create(t.Context(), &u, metav1.CreateOptions{})
	switch {
	case apierrors.IsInvalid(err):
		return true
	case err != nil:
		t.Fatalf("create %s: %v", u.GetKind(), err)
	}
	if err := client.Delete(t.Context(), u.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete %s: %v", u.GetKind(), err)
	}
	return false
}

// translateUnchecked translates docs decoded without admission, as a
// cluster whose CRDs let them through would serve them.
func translateUnchecked(t *testing.T, docs string) translate.Result {
	t.Helper()
	dec, err := manifests.NewUncheckedDecoder()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := dec.Decode(strings.NewReader(docs))
	if err != nil {
		t.Fatal(err)
	}
	var in translate.Input
	for _, o := range objs {
		if err := manifests.Add(&in, o); err != nil {
			t.Fatal(err)
		}
	}
	res, err := translate.Translate(in)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestRulesShadowedNamed checks, on testdata/gamma/shadowed.in.yaml, that
// sockmesh.io/RulesShadowed names exactly the rules whose every match
// repeats one that takes precedence — a whole newer route, a rule written
// with a trailing "/" and another header case, a rule repeating one of its
// own route's — and no rule that keeps a match of its own, covers less, or
// is another role's; and, as the proxy decides, that the requests those
// rules describe do go to the rules that shadow them.
func TestRulesShadowedNamed(t *testing.T) {
	c := newDecisionCase(t, "testdata/gamma/shadowed.in.yaml")
	res, err := translate.Translate(c.in)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		route          string
		named, unnamed []string // rules the condition names, and does not; named nil: no condition
	}{
		{route: "mesh/older"},
		{route: "mesh/newer", named: []string{"rule 0 (same-as-older) on port(s) 80, repeating HTTPRoute mesh/older", "rule 4 (repeat) on port(s) 80, repeating its rule 3 (own)"},
			unnamed: []string{"partly", "covered-only", "rule 3 (own) on"}},
		{route: "mesh/copy", named: []string{"rule 0 on port(s) 80, repeating HTTPRoute mesh/older"}},
		{route: "web/consumer-copy"},
	} {
		ns, name, _ := strings.Cut(tc.route, "/")
		parents := res.Status.HTTPRoutes[types.NamespacedName{Namespace: ns, Name: name}]
		if len(parents) != 1 {
			t.Fatalf("HTTPRoute %s has %d parent entries, want 1", tc.route, len(parents))
		}
		if a := meta.FindStatusCondition(parents[0].Conditions, "Accepted"); a == nil || a.Status != metav1.ConditionTrue {
			t.Errorf("HTTPRoute %s: Accepted = %+v, want True", tc.route, a)
		}
		cond := meta.FindStatusCondition(parents[0].Conditions, translate.ConditionRulesShadowed)
		if (cond != nil) != (tc.named != nil) {
			t.Errorf("HTTPRoute %s: %s = %+v, want it set: %v", tc.route, translate.ConditionRulesShadowed, cond, tc.named != nil)
			continue
		}
		for _, rule := range tc.named {
			if !strings.Contains(cond.Message, rule) {
				t.Errorf("HTTPRoute %s: %s message %q does not name %q", tc.route, cond.Type, cond.Message, rule)
			}
		}
		for _, rule := range tc.unnamed {
			if strings.Contains(cond.Message, rule) {
				t.Errorf("HTTPRoute %s: %s message %q names %q", tc.route, cond.Type, cond.Message, rule)
			}
		}
	}
	for _, tc := range []struct {
		from, path, env string
		route           string // "Kind/namespace/name" and rule index of the rule that takes the request
		rule            int
	}{
		{path: "/api/items", env: "prod", route: "HTTPRoute/mesh/older", rule: 0},
		{path: "/api", env: "prod", route: "HTTPRoute/mesh/older", rule: 0},
		{path: "/own", route: "HTTPRoute/mesh/newer", rule: 3},
		{path: "/beta", route: "HTTPRoute/mesh/newer", rule: 1},
		{from: "web", path: "/api", env: "prod", route: "HTTPRoute/web/consumer-copy", rule: 0},
	} {
		req := routes.Request{Method: http.MethodGet, Path: tc.path, Host: "echo", Header: http.Header{}}
		if tc.env != "" {
			req.Header.Set("X-Env", tc.env)
		}
		var d routes.Decision
		c.set(t, tc.from, "10.96.22.1:80").Decide(&req, routes.GlobalRand{}, &d)
		if d.Action != routes.Forward || d.Rule.Route.String() != tc.route || d.Rule.Index != tc.rule {
			t.Errorf("GET %s (X-Env %q) from %q: %v (%s, rule %+v), want Forward by %s rule %d", tc.path, tc.env, tc.from, d.Action, d.Reason, d.Rule, tc.route, tc.rule)
		}
	}
}
