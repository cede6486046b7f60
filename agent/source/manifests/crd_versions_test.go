package manifests_test

import (
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/test/apiserver"
)

// TestOlderServedVersionsAreV1: the v1.7.0 CRDs serve BackendTLSPolicy as
// v1alpha3 and HTTPRoute and ReferenceGrant as v1beta1 beside v1, with v1's
// schema. A manifest of such a version decodes, as the API server takes
// it, to the v1 object the API server serves for it: v1's type and
// apiVersion, the spec the API server stores (its defaults applied); with
// the warnings the API server gives on its create (kubectl prints them),
// for BackendTLSPolicy v1alpha3, which its CRD deprecates.
func TestOlderServedVersionsAreV1(t *testing.T) {
	const ns = "crd"
	env, dec := startCRDServer(t, ns)
	for name, doc := range map[string]string{
		"BackendTLSPolicy v1alpha3": "apiVersion: gateway.networking.k8s.io/v1alpha3\nkind: BackendTLSPolicy\nmetadata: {name: t, namespace: crd}\n" +
			`spec: {targetRefs: [{group: "", kind: Service, name: api}], validation: {hostname: api.example.com, wellKnownCACertificates: System}}`,
		"HTTPRoute v1beta1": "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: HTTPRoute\nmetadata: {name: h, namespace: crd}\n" +
			`spec: {parentRefs: [{group: "", kind: Service, name: api}], rules: [{matches: [{path: {value: /v1}}], backendRefs: [{name: api, port: 80}]}]}`,
		"ReferenceGrant v1beta1": "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: crd}\n" +
			`spec: {from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: other}], to: [{group: "", kind: Service}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			objs, warnings, err := dec.DecodeWithWarnings(strings.NewReader(doc))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			server := warningsOnCreate(t, env, ns, doc)
			var texts []string
			for _, w := range warnings {
				texts = append(texts, w.Text)
			}
			if !slices.Equal(texts, server) {
				t.Errorf("Decode warnings = %q, want the API server's %q", texts, server)
			}
			if strings.HasSuffix(name, "v1alpha3") && len(server) == 0 {
				t.Error("the API server gave no warning for a version its CRD deprecates")
			}
			var u unstructured.Unstructured
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatal(err)
			}
			v1 := schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: resourceOf(t, u.GetKind())}
			stored, err := env.Dynamic.Resource(v1).Namespace(ns).Get(t.Context(), u.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want := v1Object(t, u.GetKind())
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(stored.Object, want); err != nil {
				t.Fatal(err)
			}
			if got, want := reflect.TypeOf(objs[0]), reflect.TypeOf(want); got != want {
				t.Fatalf("Decode returned a %v, want the v1 %v", got, want)
			}
			if got := objs[0].GetObjectKind().GroupVersionKind().GroupVersion().String(); got != "gateway.networking.k8s.io/v1" {
				t.Errorf("decoded apiVersion = %s, want gateway.networking.k8s.io/v1", got)
			}
			if diff := cmp.Diff(specOf(t, want), specOf(t, objs[0])); diff != "" {
				t.Errorf("decoded spec differs from the API server's v1 (-server +decoded):\n%s", diff)
			}
		})
	}
}

// warningsOnCreate has env's API server create doc in ns and returns the
// warnings it answered with.
func warningsOnCreate(t *testing.T, env *apiserver.Env, ns, doc string) []string {
	t.Helper()
	var got warningsSeen
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = &got
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := createWith(t, dyn, ns, doc); err != nil {
		t.Fatalf("the API server's create: %v", err)
	}
	return got.texts
}

// warningsSeen records the warnings of a client's answers.
type warningsSeen struct {
	mu    sync.Mutex
	texts []string
}

func (w *warningsSeen) HandleWarningHeader(_ int, _, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.texts = append(w.texts, text)
}

// v1Object is a new v1 Gateway API object of kind.
func v1Object(t *testing.T, kind string) runtime.Object {
	t.Helper()
	switch kind {
	case "BackendTLSPolicy":
		return &gwv1.BackendTLSPolicy{}
	case "HTTPRoute":
		return &gwv1.HTTPRoute{}
	case "ReferenceGrant":
		return &gwv1.ReferenceGrant{}
	}
	t.Fatalf("no v1 type for %s", kind)
	return nil
}

// TestUnknownFieldRefusedAsKubectlApply: a field no schema knows (a typo)
// is refused, as kubectl apply's default strict field validation has the
// API server refuse it, naming the field — not pruned, as a create
// without field validation would: a misspelt field in a policy would
// otherwise vanish without a word.
func TestUnknownFieldRefusedAsKubectlApply(t *testing.T) {
	const ns = "crd"
	env, dec := startCRDServer(t, ns)
	for field, doc := range map[string]string{
		"spec.hostnamez": "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: h, namespace: crd}\n" +
			`spec: {parentRefs: [{group: "", kind: Service, name: api}], hostnamez: [a.example.com]}`,
		"spec.ports[0].prot": "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {ports: [{port: 80, prot: TCP}]}",
	} {
		t.Run(field, func(t *testing.T) {
			var u unstructured.Unstructured
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatal(err)
			}
			gvk := u.GroupVersionKind()
			gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resourceOf(t, gvk.Kind)}
			_, err := env.Dynamic.Resource(gvr).Namespace(ns).Create(t.Context(), &u, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
			want := `unknown field "` + field + `"`
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("the API server's strict create: %v, want %s", err, want)
			}
			if _, err := dec.Decode(strings.NewReader(doc)); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Decode: %v, want %s", err, want)
			}
		})
	}
}
