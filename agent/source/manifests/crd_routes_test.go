package manifests_test

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestCRDRefusedRoutesAreNotAccepted: a GRPCRoute or HTTPRoute with a
// Service parent that the v1.7 experimental CRD refuses — the real API
// server is asked — is refused by the file source's decoder, naming the
// fields the API server names, and is Accepted=False (UnsupportedValue) on
// every parent when translate is handed it unchecked, as a cluster with
// other CRDs could serve it: the route routes nothing.
func TestCRDRefusedRoutesAreNotAccepted(t *testing.T) {
	const ns = "crd"
	api := `{group: "", kind: Service, name: api, port: 80}`
	route := func(kind, spec string) string {
		return "apiVersion: gateway.networking.k8s.io/v1\nkind: " + kind + "\nmetadata: {name: r, namespace: crd}\nspec: " + spec
	}
	grpc := func(rules string) string { return route("GRPCRoute", `{parentRefs: [`+api+`], rules: `+rules+`}`) }
	list := func(n int, item string) string {
		items := make([]string, n)
		for i := range items {
			items[i] = fmt.Sprintf(item, i)
		}
		return "[" + strings.Join(items, ", ") + "]"
	}
	backend := `backendRefs: [{name: api, port: 80}]`
	cases := map[string]string{
		"dash in exact service":  grpc(`[{matches: [{method: {service: grpc-health.v1, method: Check}}], ` + backend + `}]`),
		"empty exact service":    grpc(`[{matches: [{method: {service: "", method: Check}}], ` + backend + `}]`),
		"dot in exact method":    grpc(`[{matches: [{method: {service: a.B, method: Check.All}}], ` + backend + `}]`),
		"rule name twice":        grpc(`[{name: same, ` + backend + `}, {name: same, ` + backend + `}]`),
		"rule name not a label":  grpc(`[{name: Rule_1, ` + backend + `}]`),
		"65 matches":             grpc(`[{matches: ` + list(65, `{method: {service: s%d}}`) + `, ` + backend + `}]`),
		"17 header matches":      grpc(`[{matches: [{headers: ` + list(17, `{name: x-h%d, value: v}`) + `}], ` + backend + `}]`),
		"17 filters":             grpc(`[{filters: ` + list(17, `{type: RequestMirror, requestMirror: {backendRef: {name: api, port: 80}, percent: %d}}`) + `, ` + backend + `}]`),
		"17 backendRefs":         grpc(`[{backendRefs: ` + list(17, `{name: api, port: 80, weight: %d}`) + `}]`),
		"17 headers set":         grpc(`[{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: ` + list(17, `{name: x-s%d, value: v}`) + `}}], ` + backend + `}]`),
		"wildcard hostname case": route("GRPCRoute", `{parentRefs: [`+api+`], hostnames: ["*.Example.com"], rules: [{`+backend+`}]}`),
		"parent twice":           route("GRPCRoute", `{parentRefs: [`+api+`, `+api+`], rules: [{`+backend+`}]}`),
		"parents disagree":       route("HTTPRoute", `{parentRefs: [`+api+`, {group: "", kind: Service, name: api, sectionName: http}], rules: [{`+backend+`}]}`),
		"empty rules":            route("HTTPRoute", `{parentRefs: [`+api+`], rules: []}`),
		"header match spaces":    route("HTTPRoute", `{parentRefs: [`+api+`], rules: [{matches: [{headers: [{name: x, value: "a  b"}]}], `+backend+`}]}`),
		"header set not ASCII":   route("HTTPRoute", `{parentRefs: [`+api+`], rules: [{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x, value: "é"}]}}], `+backend+`}]}`),
		"remove no name twice":   route("HTTPRoute", `{parentRefs: [`+api+`], rules: [{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {remove: ["a b", "a b"]}}], `+backend+`}]}`),
		"header add led by SP":   grpc(`[{filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: x, value: " v"}]}}], ` + backend + `}]`),
		"parent port 0":          route("GRPCRoute", `{parentRefs: [{group: "", kind: Service, name: api, port: 0}], rules: [{`+backend+`}]}`),
		"parent port 65536":      route("HTTPRoute", `{parentRefs: [`+api+`, {group: "", kind: Service, name: api, port: 65536}], rules: [{`+backend+`}]}`),
		"retry code twice":       route("HTTPRoute", `{parentRefs: [`+api+`], rules: [{retry: {codes: [503, 500, 503]}, `+backend+`}]}`),
	}
	env, dec := startCRDServer(t, ns)
	services := "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: crd}\nspec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}\n"
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			res := translateRefused(t, env, dec, ns, services, doc)
			r := types.NamespacedName{Namespace: ns, Name: "r"}
			parents := append(res.Status.GRPCRoutes[r], res.Status.HTTPRoutes[r]...)
			if len(parents) == 0 {
				t.Fatal("translate wrote no status entry")
			}
			for i, p := range parents {
				if a := meta.FindStatusCondition(p.Conditions, "Accepted"); a == nil || a.Status != metav1.ConditionFalse || a.Reason != "UnsupportedValue" {
					t.Fatalf("translate's Accepted (parent %d of %d) = %+v, want False/UnsupportedValue", i+1, len(parents), a)
				}
			}
		})
	}
}
