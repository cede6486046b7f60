package manifests_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// TestPolicyExamples: every YAML example of docs/policies.md, the app
// teams' guide, decodes strictly (no misspelt field) and is accepted by a
// real API server with the v1.7 experimental CRDs (their schemas and CEL
// rules), so the guide never shows a policy users cannot apply.
func TestPolicyExamples(t *testing.T) {
	guide, err := os.ReadFile("../../../docs/policies.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(guide), -1)
	if len(blocks) == 0 {
		t.Fatal("docs/policies.md has no YAML example")
	}
	// The examples live in one namespace, which the server has.
	const ns = "shop"
	env, dec := startCRDServer(t, ns)
	for _, b := range blocks {
		doc := b[1]
		if _, err := dec.Decode(strings.NewReader(doc)); err != nil {
			t.Errorf("strict decoding: %v\n%s", err, doc)
			continue
		}
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		if u.GetNamespace() != ns {
			t.Fatalf("an example in namespace %q: keep them in %q", u.GetNamespace(), ns)
		}
		gvk := u.GroupVersionKind()
		gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resourceOf(t, gvk.Kind)}
		if _, err := env.Dynamic.Resource(gvr).Namespace(u.GetNamespace()).Create(t.Context(), &u, metav1.CreateOptions{}); err != nil {
			t.Errorf("the API server refuses the %s example: %v", gvk.Kind, err)
		}
	}
}
