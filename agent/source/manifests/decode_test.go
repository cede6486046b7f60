package manifests_test

import (
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/pki"
)

func TestDecode(t *testing.T) {
	dec, err := manifests.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCA("decode")
	if err != nil {
		t.Fatal(err)
	}
	bundle := strconv.Quote(string(ca.CertPEM))
	for _, tc := range []struct {
		name     string
		in       string
		wantKeys []string
		wantErr  string
	}{
		{name: "empty", in: "", wantKeys: nil},
		{name: "comments and separators only", in: "# nothing\n---\n---\n# more\n", wantKeys: nil},
		{
			name: "every kind translate reads",
			in: `apiVersion: v1
kind: Service
metadata: {name: s}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: apps}
addressType: IPv4
endpoints: []
---
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: apps}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c, namespace: apps}
---
apiVersion: v1
kind: Secret
metadata: {name: x, namespace: apps}
---
apiVersion: certificates.k8s.io/v1
kind: ClusterTrustBundle
metadata: {name: "example.com:signer:v1"}
spec: {signerName: example.com/signer, trustBundle: ` + bundle + `}
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: b, namespace: apps}
spec: {targetRefs: [{group: "", kind: Service, name: s}], validation: {hostname: a.example.com, wellKnownCACertificates: System}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: h, namespace: apps}
spec: {}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: g, namespace: apps}
spec: {}
---
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackend
metadata: {name: xb, namespace: apps}
spec: {type: ExternalHostname, externalHostname: {hostname: a.example.com}, port: {number: 443}}
---
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackendTrafficPolicy
metadata: {name: xbtp, namespace: apps}
spec: {targetRefs: [{group: "", kind: Service, name: s}]}
---
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XMesh
metadata: {name: mesh}
spec: {controllerName: sockmesh.io/mesh-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: rg, namespace: apps}
spec: {from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: other}], to: [{group: "", kind: Service}]}
`,
			wantKeys: []string{"Service default/s", "EndpointSlice apps/s-1", "Namespace apps", "Pod apps/p",
				"ConfigMap apps/c", "Secret apps/x", "ClusterTrustBundle example.com:signer:v1", "BackendTLSPolicy apps/b",
				"HTTPRoute apps/h", "GRPCRoute apps/g", "XBackend apps/xb", "XBackendTrafficPolicy apps/xbtp", "XMesh mesh",
				"ReferenceGrant apps/rg"},
		},
		{
			name:     "a List is expanded; JSON works",
			in:       `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}},{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b"}}]}`,
			wantKeys: []string{"ConfigMap default/a", "ConfigMap default/b"},
		},
		{name: "unknown field", in: "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {prots: []}\n", wantErr: `document 1: decode kind Service (apiVersion v1): strict decoding error: unknown field "spec.prots"`},
		{name: "kind sockmesh does not read", in: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n", wantErr: "document 2: kind Deployment (apiVersion apps/v1) is not a kind sockmesh reads"},
		{name: "unregistered kind", in: "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n", wantErr: `document 1: kind Widget (apiVersion example.com/v1) is not a kind sockmesh reads`},
		// The CRDs serve BackendTLSPolicy as v1alpha3 too, not as v1alpha2.
		{name: "API version the CRDs no longer serve", in: "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: BackendTLSPolicy\nmetadata: {name: w}\n",
			wantErr: "document 1: kind BackendTLSPolicy (apiVersion gateway.networking.k8s.io/v1alpha2): the Gateway API v1.7.0 CRDs serve BackendTLSPolicy as gateway.networking.k8s.io/v1, gateway.networking.k8s.io/v1alpha3 only"},
		{name: "API version the CRDs do not serve yet", in: "apiVersion: gateway.networking.x-k8s.io/v1alpha2\nkind: XBackend\nmetadata: {name: w}\n",
			wantErr: "document 1: kind XBackend (apiVersion gateway.networking.x-k8s.io/v1alpha2): the Gateway API v1.7.0 CRDs serve XBackend as gateway.networking.x-k8s.io/v1alpha1 only"},
		// Refused by the CRDs (TestCRDRefusals has one case per kind, each
		// asked of a real API server): the error names the document, the
		// object and every field, as kubectl apply would.
		{name: "policy without targetRefs", in: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {name: b, namespace: apps}\nspec: {validation: {hostname: a.example.com}}\n",
			wantErr: "document 2: BackendTLSPolicy apps/b: spec.targetRefs: Required value; some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"},
		{name: "traffic policy with empty targetRefs", in: "apiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XBackendTrafficPolicy\nmetadata: {name: p}\nspec: {targetRefs: []}\n",
			wantErr: "document 1: XBackendTrafficPolicy default/p: spec.targetRefs: Invalid value: 0: spec.targetRefs in body should have at least 1 items"},
		{name: "XMesh description over the CRD's 64 characters", in: "apiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XMesh\nmetadata: {name: m}\nspec: {controllerName: sockmesh.io/mesh-controller, description: " + strings.Repeat("x", 65) + "}\n",
			wantErr: "document 1: XMesh m: spec.description: Too long: may not be more than 64 bytes"},
		{name: "a Service name that is no DNS label", in: "apiVersion: v1\nkind: Service\nmetadata: {name: Api}\n",
			wantErr: "document 1: Service default/Api: metadata.name: Invalid value: \"Api\": a lowercase RFC 1123 label must consist of"},
		{name: "broken YAML", in: "apiVersion: v1\nkind: [\n", wantErr: "document 1: decode"},
		{name: "no kind", in: "metadata: {name: a}\n", wantErr: "document 1: decode"},
		// Lists nest up to 8 deep: each level decodes its items again.
		{name: "Lists nested 8 deep", in: nestedLists(8), wantKeys: []string{"ConfigMap default/a"}},
		{name: "Lists nested 9 deep", in: nestedLists(9), wantErr: "a List inside 8 Lists: at most 8 may nest"},
		{name: "bad item in a List", in: "apiVersion: v1\nkind: List\nitems:\n- apiVersion: apps/v1\n  kind: Deployment\n  metadata: {name: d}\n", wantErr: "document 1: items[0]: kind Deployment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := dec.Decode(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Decode error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode error: %v", err)
			}
			var keys []string
			var in translate.Input
			for _, o := range objs {
				keys = append(keys, manifests.Key(o))
				if err := manifests.Add(&in, o); err != nil {
					t.Errorf("Add(%s): %v", manifests.Key(o), err)
				}
			}
			if strings.Join(keys, ",") != strings.Join(tc.wantKeys, ",") {
				t.Errorf("Decode keys = %v, want %v", keys, tc.wantKeys)
			}
		})
	}
}

// TestDecodeSecretStringData checks that stringData lands in data, as the
// API server would put it, overriding data for the same key.
func TestDecodeSecretStringData(t *testing.T) {
	dec, err := manifests.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := dec.Decode(strings.NewReader(`apiVersion: v1
kind: Secret
metadata: {name: s, namespace: apps}
data: {tls.key: b2xk, other: eA==}
stringData: {tls.key: new}
`))
	if err != nil {
		t.Fatal(err)
	}
	s := objs[0].(*corev1.Secret)
	if got := string(s.Data["tls.key"]); got != "new" {
		t.Errorf("data[tls.key] = %q, want %q", got, "new")
	}
	if got := string(s.Data["other"]); got != "x" {
		t.Errorf("data[other] = %q, want %q", got, "x")
	}
	if s.StringData != nil {
		t.Errorf("stringData = %v, want it moved into data", s.StringData)
	}
}

// TestDecodeReferenceGrant: v1 and v1beta1 ReferenceGrants both arrive in
// Input.ReferenceGrants as v1, with their spec whole and the default
// namespace applied; a v1beta1 kind the CRDs do not serve as v1beta1
// stays unknown.
func TestDecodeReferenceGrant(t *testing.T) {
	dec, err := manifests.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := dec.Decode(strings.NewReader(`apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: v1-grant, namespace: backends}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: clients}]
  to: [{group: "", kind: Service, name: echo}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: beta-grant}
spec:
  from: [{group: gateway.networking.k8s.io, kind: GRPCRoute, namespace: other}]
  to: [{group: gateway.networking.x-k8s.io, kind: XBackend}]
`))
	if err != nil {
		t.Fatal(err)
	}
	var in translate.Input
	for _, o := range objs {
		if err := manifests.Add(&in, o); err != nil {
			t.Fatalf("Add(%s): %v", manifests.Key(o), err)
		}
	}
	if len(in.ReferenceGrants) != 2 {
		t.Fatalf("ReferenceGrants = %d, want 2", len(in.ReferenceGrants))
	}
	for i, want := range []struct {
		ns, name, fromKind, fromNS, toGroup, toKind, toName string
	}{
		{"backends", "v1-grant", "HTTPRoute", "clients", "", "Service", "echo"},
		{"default", "beta-grant", "GRPCRoute", "other", "gateway.networking.x-k8s.io", "XBackend", ""},
	} {
		g := in.ReferenceGrants[i]
		name := ""
		if g.Spec.To[0].Name != nil {
			name = string(*g.Spec.To[0].Name)
		}
		if g.Namespace != want.ns || g.Name != want.name || g.APIVersion != "gateway.networking.k8s.io/v1" ||
			string(g.Spec.From[0].Kind) != want.fromKind || string(g.Spec.From[0].Namespace) != want.fromNS ||
			string(g.Spec.To[0].Group) != want.toGroup || string(g.Spec.To[0].Kind) != want.toKind || name != want.toName {
			t.Errorf("grant %d = %s/%s (%s) %+v, want %+v", i, g.Namespace, g.Name, g.APIVersion, g.Spec, want)
		}
	}
	if got := manifests.Key(objs[1]); got != "ReferenceGrant default/beta-grant" {
		t.Errorf("Key(v1beta1 grant) = %q", got)
	}
	_, err = dec.Decode(strings.NewReader("apiVersion: gateway.networking.k8s.io/v1beta1\nkind: GRPCRoute\nmetadata: {name: h}\n"))
	if err == nil || !strings.Contains(err.Error(), "the Gateway API v1.7.0 CRDs serve GRPCRoute as gateway.networking.k8s.io/v1 only") {
		t.Errorf("v1beta1 GRPCRoute: %v, want the versions served", err)
	}
	_, err = dec.Decode(strings.NewReader("apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g}\nspec: {form: []}\n"))
	if err == nil || !strings.Contains(err.Error(), `unknown field "spec.form"`) {
		t.Errorf("misspelt v1beta1 field: %v, want a strict decoding error", err)
	}
}

func TestAddRejectsOtherKinds(t *testing.T) {
	if err := manifests.Add(&translate.Input{}, &corev1.Node{}); err == nil {
		t.Error("Add(*corev1.Node) = nil, want an error")
	}
}

// nestedLists is a ConfigMap inside n Lists, each the only item of the
// one around it.
func nestedLists(n int) string {
	return strings.Repeat(`{"apiVersion":"v1","kind":"List","items":[`, n) +
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}` + strings.Repeat(`]}`, n)
}
