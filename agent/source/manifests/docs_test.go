package manifests_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/pki"
)

// TestPolicyExamples: every YAML example of docs/policies.md, the app
// teams' guide, decodes strictly (no misspelt field), is accepted by a
// real API server with the v1.7 experimental CRDs (their schemas and CEL
// rules), and, beside the Services, CA and client key pair it names, is
// Accepted by translate with its references resolved and no rule dropped:
// the CRDs let through values only sockmesh judges (its options, its
// rules), so the guide never shows a policy users cannot apply.
func TestPolicyExamples(t *testing.T) {
	guide, err := os.ReadFile("../../../docs/policies.md")
	if err != nil {
		t.Fatal(err)
	}
	examples := yamlBlocks(string(guide))
	if len(examples) == 0 {
		t.Fatal("docs/policies.md has no YAML example")
	}
	// The examples live in one namespace, which the server has.
	const ns = "shop"
	env, dec := startCRDServer(t, ns)
	for _, doc := range examples {
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
	if t.Failed() {
		return
	}
	checkExamplesAccepted(t, dec, examples)
}

// TestDemoExamples: the Gateway API objects of examples/demo, which the
// file source reads and translate checks (agent/source/file's
// TestExamplesDemo), are also what the v1.7 experimental CRDs accept, so
// that they can be applied to a cluster as they are.
func TestDemoExamples(t *testing.T) {
	files, err := filepath.Glob("../../../examples/demo/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const ns = "demo"
	env, _ := startCRDServer(t, ns)
	n := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(raw), -1) {
			var u unstructured.Unstructured
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			gvk := u.GroupVersionKind()
			if !strings.HasPrefix(gvk.Group, "gateway.networking.") {
				continue // core objects: the cluster makes those (EndpointSlices, Pods' status)
			}
			n++
			gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resourceOf(t, gvk.Kind)}
			res := env.Dynamic.Resource(gvr)
			var r dynamic.ResourceInterface = res // XMesh is cluster-scoped
			if u.GetNamespace() != "" {
				r = res.Namespace(u.GetNamespace())
			}
			if _, err := r.Create(t.Context(), &u, metav1.CreateOptions{}); err != nil {
				t.Errorf("%s: the API server refuses %s %s: %v", filepath.Base(f), gvk.Kind, u.GetName(), err)
			}
		}
	}
	if n == 0 {
		t.Fatal("examples/demo has no Gateway API object")
	}
}

// yamlBlocks returns the ```yaml fenced blocks of a Markdown page.
func yamlBlocks(page string) []string {
	var out []string
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(page, -1) {
		out = append(out, m[1])
	}
	return out
}

// exampleCluster is what docs/policies.md's examples name: the Services
// their targets, parents and backendRefs are (partner-api stands for the
// XBackend), in the namespace shop. The CA and the client key pair are
// issued by the test.
const exampleCluster = `
apiVersion: v1
kind: Service
metadata: {name: payments, namespace: shop}
spec: {clusterIP: 10.96.0.10, ports: [{name: https, port: 443, targetPort: 8443}]}
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec: {clusterIP: 10.96.0.11, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Service
metadata: {name: reviews-v1, namespace: shop}
spec: {clusterIP: 10.96.0.12, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Service
metadata: {name: reviews-v2, namespace: shop}
spec: {clusterIP: 10.96.0.13, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Service
metadata: {name: partner-api, namespace: shop, annotations: {sockmesh.io/xbackend: partner}}
spec: {clusterIP: 10.96.0.14, ports: [{name: http, port: 80}]}
`

// checkExamplesAccepted translates the examples in exampleCluster and
// requires a status entry for each, every one of them saying all is well.
func checkExamplesAccepted(t *testing.T, dec *manifests.Decoder, examples []string) {
	t.Helper()
	ca, err := pki.NewCA("payments-ca")
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(pki.LeafOptions{CommonName: "shop-client", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	in := translate.Input{
		Now: time.Now(),
		Node: translate.Node{
			Name: "node-a", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")},
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
		},
		Resolved: map[string][]netip.Addr{"api.partner.example": {netip.MustParseAddr("203.0.113.7")}},
		ConfigMaps: []*corev1.ConfigMap{{
			ObjectMeta: metav1.ObjectMeta{Name: "payments-ca", Namespace: "shop"},
			Data:       map[string]string{"ca.crt": string(ca.CertPEM)},
		}},
		Secrets: []*corev1.Secret{{
			ObjectMeta: metav1.ObjectMeta{Name: "partner-client", Namespace: "shop"},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{"tls.crt": client.CertPEM, "tls.key": client.KeyPEM},
		}},
	}
	res := translateDocs(t, dec, &in, exampleCluster+"---\n"+strings.Join(examples, "---\n"))

	for _, p := range in.BackendTLSPolicies {
		wantWell(t, "BackendTLSPolicy "+p.Name, res.Status.BackendTLSPolicies[key(p)], func(a gwv1.PolicyAncestorStatus) []metav1.Condition { return a.Conditions })
	}
	for _, x := range in.XBackends {
		wantWell(t, "XBackend "+x.Name, res.Status.XBackends[key(x)], func(a gwxv1alpha1.BackendAncestorStatus) []metav1.Condition { return a.Conditions })
	}
	for _, r := range in.HTTPRoutes {
		wantWell(t, "HTTPRoute "+r.Name, res.Status.HTTPRoutes[key(r)], func(p gwv1.RouteParentStatus) []metav1.Condition { return p.Conditions })
	}
	if n := len(in.GRPCRoutes) + len(in.XBackendTrafficPolicies); n != 0 {
		t.Fatalf("docs/policies.md has %d GRPCRoute or XBackendTrafficPolicy examples: check their status here too", n)
	}
	for _, b := range res.Backends {
		if b.Invalid != nil {
			t.Errorf("backend %s fails closed: %s: %s", b.Ref, b.Invalid.Reason, b.Invalid.Message)
		}
	}
}

// wantWell fails unless entries (an object's status entries) are some, and
// every condition of each says all is well.
func wantWell[E any](t *testing.T, what string, entries []E, conditions func(E) []metav1.Condition) {
	t.Helper()
	if len(entries) == 0 {
		t.Errorf("%s: no status entry (does exampleCluster hold what it names?)", what)
	}
	for _, e := range entries {
		for _, c := range conditions(e) {
			// PartiallyInvalid is the one condition whose True is bad news.
			if ok := c.Status == metav1.ConditionTrue; ok == (c.Type == "PartiallyInvalid") {
				t.Errorf("%s: %s=%s (%s): %s", what, c.Type, c.Status, c.Reason, c.Message)
			}
		}
	}
}

// key is how translate's Status maps name an object.
func key(o metav1.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
}
