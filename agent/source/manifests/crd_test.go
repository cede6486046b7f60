package manifests_test

import (
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

// TestCRDRefusalsAreInvalid: manifests from the file source never meet the
// CRDs' schema and CEL rules, so translate checks them again. Each case is
// one XBackend, XBackendTrafficPolicy or BackendTLSPolicy that the v1.7
// experimental CRD refuses — the real API server is asked, so a case it
// would accept fails instead of passing for nothing — and that translate
// must find Invalid on every status entry, or, for a policy without
// targets, that the decoder refuses.
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

	// A policy without targets would have no status entry to say it is
	// Invalid: the decoder refuses it instead, naming it, and the file
	// source reports that (its errors, a Warn line, a metric).
	for name, doc := range map[string]string{
		"TLS policy without targetRefs":        "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {name: t, namespace: crd}\nspec: {validation: {hostname: api.example.com, wellKnownCACertificates: System}}",
		"traffic policy with empty targetRefs": policy(`{targetRefs: [], retryConstraint: {}}`),
	} {
		t.Run(name, func(t *testing.T) {
			createRefused(t, env, ns, doc)
			if _, err := dec.Decode(strings.NewReader(doc)); err == nil || !strings.Contains(err.Error(), "spec.targetRefs is empty") {
				t.Fatalf("Decode error = %v, want one saying spec.targetRefs is empty", err)
			}
		})
	}
	// Nothing in sockmesh reads an XMesh's description, so translate has
	// nothing to refuse: the decoder refuses it, naming the field.
	t.Run("XMesh description of 65 characters", func(t *testing.T) {
		doc := "apiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XMesh\nmetadata: {name: m}\n" +
			"spec: {controllerName: sockmesh.io/mesh-controller, description: " + strings.Repeat("é", 65) + "}"
		createRefused(t, env, ns, doc)
		const want = "XMesh m: spec.description is 65 characters, where the CRD allows at most 64"
		if _, err := dec.Decode(strings.NewReader(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Decode error = %v, want one saying %q", err, want)
		}
		at64 := strings.Replace(doc, strings.Repeat("é", 65), strings.Repeat("é", 64), 1)
		if _, err := dec.Decode(strings.NewReader(at64)); err != nil {
			t.Fatalf("Decode of a description of 64 characters: %v", err)
		}
	})

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

// translateRefused has env's API server refuse doc (createRefused) and
// returns what translate makes of doc beside services when the file source
// hands them over.
func translateRefused(t *testing.T, env *apiserver.Env, dec *manifests.Decoder, ns, services, doc string) translate.Result {
	t.Helper()
	createRefused(t, env, ns, doc)
	var in translate.Input
	return translateDocs(t, dec, &in, services+"---\n"+doc)
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

// createRefused has env's API server create doc in ns, which it must
// refuse: a case it accepts is no CRD refusal.
func createRefused(t *testing.T, env *apiserver.Env, ns, doc string) {
	t.Helper()
	var u unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	gvk := u.GroupVersionKind()
	gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resourceOf(t, gvk.Kind)}
	var client dynamic.ResourceInterface = env.Dynamic.Resource(gvr).Namespace(ns)
	if gvk.Kind == "XMesh" { // cluster-scoped
		client = env.Dynamic.Resource(gvr)
	}
	if _, err := client.Create(t.Context(), &u, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("the API server's create: err = %v, want Invalid (the case is not one the CRD refuses)", err)
	}
}

// resourceOf is the API resource of the Gateway API kind the tests create.
func resourceOf(t *testing.T, kind string) string {
	t.Helper()
	r, ok := map[string]string{
		"BackendTLSPolicy": "backendtlspolicies", "XBackendTrafficPolicy": "xbackendtrafficpolicies",
		"XBackend": "xbackends", "HTTPRoute": "httproutes", "GRPCRoute": "grpcroutes", "XMesh": "xmeshes",
	}[kind]
	if !ok {
		t.Fatalf("no API resource known for kind %q: add it to resourceOf", kind)
	}
	return r
}
