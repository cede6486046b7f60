package translate_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// routeReasons are the reasons a route parent's conditions may carry: the
// API's for each type (shared_types.go), plus the few sockmesh documents
// where the API names none — Conflicted (GEP-1294's reason for the route
// type that loses a Service port) and InvalidBackend (a backend that
// resolves but whose TLS policy or XBackend cannot be honoured).
var routeReasons = map[string][]gwv1.RouteConditionReason{
	"Accepted": {gwv1.RouteReasonAccepted, gwv1.RouteReasonNoMatchingParent, gwv1.RouteReasonUnsupportedValue,
		gwv1.RouteReasonIncompatibleFilters, translate.ReasonConflicted},
	"ResolvedRefs": {gwv1.RouteReasonResolvedRefs, gwv1.RouteReasonRefNotPermitted, gwv1.RouteReasonInvalidKind,
		gwv1.RouteReasonBackendNotFound, gwv1.RouteReasonUnsupportedProtocol, translate.ReasonInvalidBackend},
	"PartiallyInvalid": {gwv1.RouteReasonUnsupportedValue, gwv1.RouteReasonIncompatibleFilters},
}

// TestRouteParentConditions checks every route parent entry translate
// writes for the fixtures under testdata against the API's rules for
// RouteParentStatus, whatever the golden says: one entry per parentRef,
// each condition type's
// reason is one the API (or the list above) gives for it, True only with
// the success reason (PartiallyInvalid: only True, and only beside
// Accepted=True), a message, the route's generation, and Accepted and
// ResolvedRefs always present.
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
		if c.Type != "PartiallyInvalid" && (c.Status == metav1.ConditionTrue) != success {
			t.Errorf("%s: %s=%s with reason %s", at, c.Type, c.Status, c.Reason)
		}
		if strings.TrimSpace(c.Message) == "" {
			t.Errorf("%s: %s has no message", at, c.Type)
		}
		if c.ObservedGeneration != generation {
			t.Errorf("%s: %s observedGeneration %d, want the route's %d", at, c.Type, c.ObservedGeneration, generation)
		}
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
