package manifests_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestCRDDefaultsApplied: an object the decoder returns has the spec the
// real API server stores for the same manifest, its CRD's defaults
// applied (an HTTPRoute path match's type, a backendRef's kind and weight,
// a retry budget, a session cookie's lifetime and path, an XBackend's TLS mode), so a manifest means in a
// file what it means in a cluster.
func TestCRDDefaultsApplied(t *testing.T) {
	const ns = "crd"
	env, dec := startCRDServer(t, ns)
	for name, doc := range map[string]string{
		"HTTPRoute": "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: h, namespace: crd}\n" +
			`spec: {parentRefs: [{group: "", kind: Service, name: api}], rules: [{matches: [{path: {value: /v1}, headers: [{name: x, value: v}]}], backendRefs: [{name: api, port: 80}]}]}`,
		"HTTPRoute without rules": "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: e, namespace: crd}\n" +
			`spec: {parentRefs: [{group: "", kind: Service, name: api}]}`,
		"GRPCRoute": "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: crd}\n" +
			`spec: {parentRefs: [{group: "", kind: Service, name: api}], rules: [{matches: [{method: {service: a.B}}], backendRefs: [{name: api, port: 80}]}]}`,
		"XBackendTrafficPolicy": "apiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XBackendTrafficPolicy\nmetadata: {name: p, namespace: crd}\n" +
			`spec: {targetRefs: [{group: "", kind: Service, name: api}], retryConstraint: {budget: {}}, sessionPersistence: {cookie: {}}}`,
		"XBackend": "apiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XBackend\nmetadata: {name: x, namespace: crd}\n" +
			`spec: {type: EndpointSelector, endpointSelector: {matchLabels: {app: a}}, port: {number: 80}, sessionPersistence: {cookie: {}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			objs, err := dec.Decode(strings.NewReader(doc))
			if err != nil {
				t.Fatal(err)
			}
			client, err := create(t, env, ns, doc)
			if err != nil {
				t.Fatalf("the API server's create: %v", err)
			}
			stored, err := client.Get(t.Context(), objs[0].(metav1.Object).GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// The stored object in the decoder's type, so that both marshal
			// alike.
			want := reflect.New(reflect.TypeOf(objs[0]).Elem()).Interface()
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(stored.Object, want); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(specOf(t, want), specOf(t, objs[0])); diff != "" {
				t.Errorf("decoded spec differs from the API server's (-server +decoded):\n%s", diff)
			}
		})
	}
}

// specOf is obj's spec as JSON values.
func specOf(t *testing.T, obj any) any {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m["spec"] == nil {
		t.Fatal("no spec")
	}
	return m["spec"]
}
