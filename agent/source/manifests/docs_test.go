package manifests_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/test/apiserver"
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
	resources := map[string]string{"BackendTLSPolicy": "backendtlspolicies", "XBackend": "xbackends", "HTTPRoute": "httproutes"}
	dec, err := manifests.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	env := apiserver.Start(t)
	namespaces := map[string]bool{}
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
		gvk := u.GroupVersionKind()
		res, ok := resources[gvk.Kind]
		if !ok {
			t.Fatalf("an example of kind %q: add its resource name to the test", gvk.Kind)
		}
		if ns := u.GetNamespace(); !namespaces[ns] {
			if _, err := env.Kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			namespaces[ns] = true
		}
		gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: res}
		if _, err := env.Dynamic.Resource(gvr).Namespace(u.GetNamespace()).Create(t.Context(), &u, metav1.CreateOptions{}); err != nil {
			t.Errorf("the API server refuses the %s example: %v", gvk.Kind, err)
		}
	}
}
