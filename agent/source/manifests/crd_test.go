package manifests_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/apiserver"
)

// TestCRDRefusalsAreInvalid: each case is one XBackend,
// XBackendTrafficPolicy or BackendTLSPolicy that the v1.7 experimental CRD
// refuses — the real API server is asked, so a case it would accept fails
// instead of passing for nothing. The file source's decoder refuses it too,
// naming the fields the API server names; and translate, handed it
// unchecked as a cluster with other CRDs (another version or channel) could
// serve it, finds it Invalid on every status entry.
func TestCRDRefusalsAreInvalid(t *testing.T) {
	const ns = "crd"
	xbackend := func(spec string) string {
		return "apiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XBackend\nmetadata: {name: x, namespace: crd}\nspec: " + spec
	}
	policy := func(spec string) string {
		return "apiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XBackendTrafficPolicy\nmetadata: {name: p, namespace: crd}\nspec: " + spec
	}
	tlsPolicy := func(targetRef string) string {
		return "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {name: t, namespace: crd}\nspec: " +
			"{targetRefs: [" + targetRef + "], validation: {hostname: api.example.com, wellKnownCACertificates: System}}"
	}
	selector := `type: EndpointSelector, endpointSelector: {matchLabels: {app: a}}, port: {number: 80}`
	external := `type: ExternalHostname, externalHostname: {hostname: a.example.com}, port: {number: 443}`
	list := func(n int, item string) string {
		items := make([]string, n)
		for i := range items {
			items[i] = fmt.Sprintf(item, i)
		}
		return "[" + strings.Join(items, ", ") + "]"
	}
	api := `{group: "", kind: Service, name: api}`
	cases := map[string]string{
		"session without cookie":   xbackend(`{` + selector + `, sessionPersistence: {absoluteTimeout: 1h}}`),
		"session defaults only":    xbackend(`{` + selector + `, sessionPersistence: {}}`),
		"cookie lifetime":          xbackend(`{` + selector + `, sessionPersistence: {cookie: {lifetimeType: Forever}}}`),
		"cookie path 1025":         xbackend(`{` + selector + `, sessionPersistence: {cookie: {path: /` + strings.Repeat("é", 1024) + `}}}`),
		"empty cookie name":        xbackend(`{` + selector + `, sessionPersistence: {cookie: {name: ""}}}`),
		"session on external":      xbackend(`{` + external + `, sessionPersistence: {cookie: {}}}`),
		"65 matchLabels":           xbackend(`{type: EndpointSelector, port: {number: 80}, endpointSelector: {matchLabels: {` + strings.Trim(list(65, "l%d: v"), "[]") + `}}}`),
		"no port number":           xbackend(`{` + strings.Replace(selector, "{number: 80}", "{}", 1) + `}`),
		"cluster.local hostname":   xbackend(`{type: ExternalHostname, externalHostname: {hostname: api.cluster.local}, port: {number: 443}}`),
		"h2c with tls":             xbackend(`{` + external + `, protocol: H2C, tls: {mode: ServerOnly, validation: {hostname: a.example.com, wellKnownCACertificates: System}}}`),
		"http2 without tls":        xbackend(`{` + external + `, protocol: HTTP2}`),
		"client cert without mode": xbackend(`{` + external + `, tls: {mode: ServerOnly, clientCertificateRef: {name: c}, validation: {hostname: a.example.com, wellKnownCACertificates: System}}}`),
		"6 subjectAltNames": xbackend(`{` + external + `, tls: {mode: ServerOnly, validation: {hostname: a.example.com, wellKnownCACertificates: System, subjectAltNames: ` +
			list(6, "{type: Hostname, hostname: s%d.example.com}") + `}}}`),
		"9 caCertificateRefs": xbackend(`{` + external + `, tls: {mode: ServerOnly, validation: {hostname: a.example.com, caCertificateRefs: ` +
			list(9, `{group: "", kind: ConfigMap, name: ca%d}`) + `}}}`),
		"empty caCertificateRefs":       xbackend(`{` + external + `, tls: {mode: ServerOnly, validation: {hostname: a.example.com, wellKnownCACertificates: System, caCertificateRefs: []}}}`),
		"empty wellKnownCACertificates": xbackend(`{` + external + `, tls: {mode: ServerOnly, validation: {hostname: a.example.com, wellKnownCACertificates: "", caCertificateRefs: [{group: "", kind: ConfigMap, name: ca}]}}}`),
		"target twice":                  policy(`{targetRefs: [` + api + `, ` + api + `], retryConstraint: {}}`),
		"17 targets":                    policy(`{targetRefs: ` + list(17, `{group: "", kind: Service, name: api%d}`) + `, retryConstraint: {}}`),
		"budget percent":                policy(`{targetRefs: [` + api + `], retryConstraint: {budget: {percent: 101}}}`),
		"budget interval":               policy(`{targetRefs: [` + api + `], retryConstraint: {budget: {interval: 2h}}}`),
		"policy session":                policy(`{targetRefs: [` + api + `], sessionPersistence: {type: Header}}`),
		"target without kind":           policy(`{targetRefs: [{group: "", kind: "", name: api}], retryConstraint: {}}`),
		"target kind with a dot":        policy(`{targetRefs: [{group: "", kind: Service.v1, name: api}], retryConstraint: {}}`),
		"target group in capitals":      policy(`{targetRefs: [{group: Gateway.Networking.X-K8s.io, kind: XBackend, name: x}], retryConstraint: {}}`),
		"target without name":           policy(`{targetRefs: [{group: "", kind: Service, name: ""}], retryConstraint: {}}`),
		"TLS target without kind":       tlsPolicy(`{group: "", kind: "", name: api}`),
		"TLS target group with _":       tlsPolicy(`{group: core_v1, kind: Service, name: api}`),
		"TLS target kind with a space":  tlsPolicy(`{group: "", kind: "Ser vice", name: api}`),
		"min retry rate zero":           policy(`{targetRefs: [` + api + `], retryConstraint: {minRetryRate: {count: 1, interval: 0s}}}`),
	}

	env, dec := startCRDServer(t, ns)
	// The Services the objects need for a status entry: one standing for
	// the XBackend, and every policy target.
	services := "apiVersion: v1\nkind: Service\nmetadata: {name: front, namespace: crd, annotations: {sockmesh.io/xbackend: x}}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n"
	for i := range 18 {
		name := fmt.Sprintf("api%d", i)
		if i == 17 {
			name = "api"
		}
		services += fmt.Sprintf("---\napiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: crd}\nspec: {clusterIP: 10.96.1.%d, ports: [{port: 80}]}\n", name, i+1)
	}

	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			res := translateRefused(t, env, dec, ns, services, doc)
			var conds [][]metav1.Condition
			for _, a := range res.Status.XBackends[types.NamespacedName{Namespace: ns, Name: "x"}] {
				conds = append(conds, a.Conditions)
			}
			for _, a := range res.Status.XBackendTrafficPolicies[types.NamespacedName{Namespace: ns, Name: "p"}] {
				conds = append(conds, a.Conditions)
			}
			for _, a := range res.Status.BackendTLSPolicies[types.NamespacedName{Namespace: ns, Name: "t"}] {
				conds = append(conds, a.Conditions)
			}
			if len(conds) == 0 {
				t.Fatal("translate wrote no status entry")
			}
			for i, c := range conds {
				if a := meta.FindStatusCondition(c, "Accepted"); a == nil || a.Status != metav1.ConditionFalse || a.Reason != "Invalid" {
					t.Fatalf("translate's Accepted (status entry %d of %d) = %+v, want False/Invalid", i+1, len(conds), a)
				}
			}
		})
	}
}

// startCRDServer starts a real API server with the v1.7 experimental
// Gateway API CRDs and namespace ns, and the decoder the file source uses.
func startCRDServer(t *testing.T, ns string) (*apiserver.Env, *manifests.Decoder) {
	t.Helper()
	env := apiserver.Start(t)
	if _, err := env.Kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dec, err := manifests.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	return env, dec
}

// translateRefused has env's API server and dec refuse doc
// (refusedByBoth) and returns what translate makes of doc beside services
// when they are handed over unchecked, as a cluster whose CRDs let doc
// through would serve them.
func translateRefused(t *testing.T, env *apiserver.Env, dec *manifests.Decoder, ns, services, doc string) translate.Result {
	t.Helper()
	refusedByBoth(t, env, dec, ns, doc)
	unchecked, err := manifests.NewUncheckedDecoder()
	if err != nil {
		t.Fatal(err)
	}
	var in translate.Input
	return translateDocs(t, unchecked, &in, services+"---\n"+doc)
}

// translateDocs decodes docs with dec into in, as the file source does,
// and translates in.
func translateDocs(t *testing.T, dec *manifests.Decoder, in *translate.Input, docs string) translate.Result {
	t.Helper()
	objs, err := dec.Decode(strings.NewReader(docs))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if err := manifests.Add(in, o); err != nil {
			t.Fatal(err)
		}
	}
	res, err := translate.Translate(*in)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// refusedByBoth has env's API server create doc, one object, in ns (if
// namespaced), which it must refuse, and dec decode it, which must fail
// with "document 1: Kind namespace/name: " and every field the API server
// names in its refusal, with the API server's words (its schema's, its CEL
// rules' messages).
func refusedByBoth(t *testing.T, env *apiserver.Env, dec *manifests.Decoder, ns, doc string) {
	t.Helper()
	refusal := createRefused(t, env, ns, doc)
	_, err := dec.Decode(strings.NewReader(doc))
	if err == nil {
		t.Fatalf("Decode accepted what the API server refuses: %v", refusal)
	}
	var u unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	key := u.GetKind() + " " + u.GetName()
	if u.GetNamespace() != "" {
		key = u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
	}
	if want := "document 1: " + key + ": "; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Decode error = %v, want it to start %q", err, want)
	}
	for _, c := range refusal.Status().Details.Causes {
		if c.Field != "" && c.Field != "<nil>" && !strings.Contains(err.Error(), c.Field+": "+c.Message) {
			t.Errorf("Decode error = %v, want it to say %s: %s, as the API server does: %v", err, c.Field, c.Message, refusal)
		}
	}
}

// createRefused has env's API server create doc in ns (if namespaced) and
// returns its refusal, which must be Invalid: a case it accepts is no
// refusal.
func createRefused(t *testing.T, env *apiserver.Env, ns, doc string) *apierrors.StatusError {
	t.Helper()
	_, err := create(t, env, ns, doc)
	var refusal *apierrors.StatusError
	if !apierrors.IsInvalid(err) || !errors.As(err, &refusal) {
		t.Fatalf("the API server's create: err = %v, want Invalid (the case is not one the API server refuses)", err)
	}
	return refusal
}

// createAccepted has env's API server create doc in ns (if namespaced),
// which it must accept, and deletes it again.
func createAccepted(t *testing.T, env *apiserver.Env, ns, doc string) {
	t.Helper()
	client, err := create(t, env, ns, doc)
	if err != nil {
		t.Fatalf("the API server's create: %v", err)
	}
	var u unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := client.Delete(t.Context(), u.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete %s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// create has env's API server create doc in ns (if namespaced), returning
// the client for doc's resource and the server's answer.
func create(t *testing.T, env *apiserver.Env, ns, doc string) (dynamic.ResourceInterface, error) {
	t.Helper()
	return createWith(t, env.Dynamic, ns, doc)
}

// createWith is create through client dyn.
func createWith(t *testing.T, dyn dynamic.Interface, ns, doc string) (dynamic.ResourceInterface, error) {
	t.Helper()
	var u unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	gvk := u.GroupVersionKind()
	gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resourceOf(t, gvk.Kind)}
	var client dynamic.ResourceInterface = dyn.Resource(gvr).Namespace(ns)
	if clusterScoped[gvk.Kind] {
		client = dyn.Resource(gvr)
	}
	_, err := client.Create(t.Context(), &u, metav1.CreateOptions{})
	return client, err
}

// clusterScoped holds the kinds the tests create that have no namespace.
var clusterScoped = map[string]bool{"XMesh": true, "Namespace": true, "ClusterTrustBundle": true}

// resourceOf is the API resource of a kind the tests create.
func resourceOf(t *testing.T, kind string) string {
	t.Helper()
	r, ok := map[string]string{
		"BackendTLSPolicy": "backendtlspolicies", "XBackendTrafficPolicy": "xbackendtrafficpolicies",
		"XBackend": "xbackends", "HTTPRoute": "httproutes", "GRPCRoute": "grpcroutes", "XMesh": "xmeshes",
		"ReferenceGrant": "referencegrants", "Service": "services", "EndpointSlice": "endpointslices",
		"Namespace": "namespaces", "Pod": "pods", "ConfigMap": "configmaps", "Secret": "secrets",
		"ClusterTrustBundle": "clustertrustbundles",
	}[kind]
	if !ok {
		t.Fatalf("no API resource known for kind %q: add it to resourceOf", kind)
	}
	return r
}
