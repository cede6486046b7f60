package manifests_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestStatusInFileIsDropped: a Gateway API object's status in a file is
// nobody's: the API server drops it on create (the CRDs have a status
// subresource), before validation, so a status its schema refuses does
// not refuse the object. The decoder drops it too — else a status copied
// from another cluster, whose 16 ancestors of other controllers leave a
// policy no room, would keep the policy from its target.
func TestStatusInFileIsDropped(t *testing.T) {
	const ns = "crd"
	env, dec := startCRDServer(t, ns)
	ancestors := make([]string, 16)
	for i := range ancestors {
		ancestors[i] = fmt.Sprintf(`{ancestorRef: {group: gateway.networking.k8s.io, kind: Gateway, name: g%d}, controllerName: example.com/other, `+
			`conditions: [{type: Accepted, status: "True", reason: Accepted, message: "", lastTransitionTime: "2026-01-01T00:00:00Z"}]}`, i)
	}
	policy := "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {name: t, namespace: crd}\n" +
		`spec: {targetRefs: [{group: "", kind: Service, name: api}], validation: {hostname: api.example.com, wellKnownCACertificates: System}}` + "\n" +
		"status: {ancestors: [" + strings.Join(ancestors, ", ") + "]}\n"
	// An empty conditions list, which the schema refuses (at least 1).
	route := "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: h, namespace: crd}\n" +
		`spec: {parentRefs: [{group: "", kind: Service, name: api}]}` + "\n" +
		`status: {parents: [{parentRef: {name: x}, controllerName: example.com/other, conditions: []}]}` + "\n"
	for name, doc := range map[string]string{"BackendTLSPolicy": policy, "HTTPRoute with a status its schema refuses": route} {
		t.Run(name, func(t *testing.T) {
			client, err := create(t, env, ns, doc)
			if err != nil {
				t.Fatalf("the API server's create: %v", err)
			}
			var u unstructured.Unstructured
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatal(err)
			}
			stored, err := client.Get(t.Context(), u.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if s, ok := stored.Object["status"]; ok {
				t.Fatalf("the API server stored status %v, want none (the case tests nothing)", s)
			}
			objs, err := dec.Decode(strings.NewReader(doc))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if status := reflect.ValueOf(objs[0]).Elem().FieldByName("Status"); !status.IsZero() {
				t.Errorf("decoded status = %+v, want none, as the API server stores", status.Interface())
			}
		})
	}

	// Fixtures standing for a cluster's objects keep it, checked.
	keeping, err := manifests.NewDecoderKeepingStatus()
	if err != nil {
		t.Fatal(err)
	}
	if objs, err := keeping.Decode(strings.NewReader(policy)); err != nil || len(objs[0].(*gwv1.BackendTLSPolicy).Status.Ancestors) != 16 {
		t.Errorf("NewDecoderKeepingStatus: %v, want the policy with its 16 ancestors", err)
	}
	if _, err := keeping.Decode(strings.NewReader(route)); err == nil || !strings.Contains(err.Error(), "status.parents[0].conditions") {
		t.Errorf("NewDecoderKeepingStatus of a status its schema refuses: %v, want refused", err)
	}

	services := "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: crd}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 443}]}\n"
	res := translateDocs(t, dec, &translate.Input{}, services+"---\n"+policy)
	entries := res.Status.BackendTLSPolicies[types.NamespacedName{Namespace: ns, Name: "t"}]
	if len(entries) != 1 || meta.FindStatusCondition(entries[0].Conditions, "Accepted") == nil {
		t.Errorf("translate's status of the policy = %+v, want its Service's entry: the file's status holds no room", entries)
	}
}
