package crdschema

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/sockmesh/sockmesh/test/apiserver"
)

// TestEmbeddedCRDsAreFresh: every embedded CRD is byte for byte the file
// of the gateway-api module go.mod requires, the one daemonset/crds and
// the tests' API server install. When go.mod moves, go generate refreshes
// them.
func TestEmbeddedCRDsAreFresh(t *testing.T) {
	dir, err := apiserver.GatewayAPICRDDir(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	files, err := fs.Glob(crdFiles, "crds/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no CRD embedded")
	}
	for _, name := range files {
		embedded, err := fs.ReadFile(crdFiles, name)
		if err != nil {
			t.Fatal(err)
		}
		upstream, err := os.ReadFile(filepath.Join(dir, filepath.Base(name)))
		if err != nil {
			t.Fatalf("%s is not in the module's CRDs: %v", name, err)
		}
		if !bytes.Equal(embedded, upstream) {
			t.Errorf("%s differs from %s: run `go generate ./agent/source/manifests/crdschema` and commit the result", name, dir)
		}
	}
}

// TestEveryVersionCompiles: each served version compiles (schema, list
// types, CEL rules), which Admit otherwise finds out at its first object,
// and refuses an object without its required spec, as the API server does.
func TestEveryVersionCompiles(t *testing.T) {
	s, err := Embedded()
	if err != nil {
		t.Fatal(err)
	}
	for _, gvk := range s.Kinds() {
		obj := map[string]any{"apiVersion": gvk.GroupVersion().String(), "kind": gvk.Kind, "metadata": map[string]any{"name": "o"}}
		errs, err := s.Admit(gvk, obj)
		if err != nil {
			t.Errorf("Admit(%s): %v", gvk, err)
		} else if len(errs) == 0 {
			t.Errorf("Admit(%s) of an object without spec: no error, want spec required", gvk)
		}
	}
	if _, err := s.Admit(schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "Gateway"}, map[string]any{}); err == nil {
		t.Error("Admit of a kind without an embedded CRD: no error")
	}
}

// TestEmbeddedIsParsedOnce: every Decoder of the process shares one Set,
// so the CRDs are parsed, and each version compiled, once.
func TestEmbeddedIsParsedOnce(t *testing.T) {
	a, err := Embedded()
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := Embedded(); a != b {
		t.Error("Embedded returned another Set on its second call")
	}
}

// BenchmarkLoad is what Embedded costs the first time: parsing every
// embedded CRD.
func BenchmarkLoad(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := load(crdFiles); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCompileHTTPRoute is what the first HTTPRoute v1 admitted costs
// on top: compiling its schema and CEL rules, the largest of the CRDs.
func BenchmarkCompileHTTPRoute(b *testing.B) {
	b.ReportAllocs()
	gvk := schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "HTTPRoute"}
	for b.Loop() {
		b.StopTimer()
		s, err := load(crdFiles)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := s.versions[gvk](); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDeprecated: the versions a CRD deprecates carry the API server's
// warning (the CRD's text, or its default naming the storage version) and
// the storage version to use; those it serves without deprecating, none.
func TestDeprecated(t *testing.T) {
	s, err := Embedded()
	if err != nil {
		t.Fatal(err)
	}
	gw := func(v, kind string) schema.GroupVersionKind {
		return schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: v, Kind: kind}
	}
	v1 := schema.GroupVersion{Group: "gateway.networking.k8s.io", Version: "v1"}
	got, ok := s.Deprecated(gw("v1alpha3", "BackendTLSPolicy"))
	want := Deprecation{Warning: "The v1alpha3 version of BackendTLSPolicy has been deprecated and will be removed in a future release of the API. Please upgrade to v1.", Use: v1}
	if !ok || got != want {
		t.Errorf("Deprecated(BackendTLSPolicy v1alpha3) = %+v, %v, want %+v, true", got, ok, want)
	}
	for _, gvk := range []schema.GroupVersionKind{gw("v1", "BackendTLSPolicy"), gw("v1beta1", "HTTPRoute"), gw("v1beta1", "ReferenceGrant"), gw("v1", "HTTPRoute")} {
		if d, ok := s.Deprecated(gvk); ok {
			t.Errorf("Deprecated(%s) = %+v, want none: its CRD serves it undeprecated", gvk, d)
		}
	}

	// Without the CRD's text, the API server's default.
	crd := strings.Replace(minimalCRD, "  - name: v1alpha1\n", "  - name: v1alpha1\n    deprecated: true\n", 1)
	s, err = load(fstest.MapFS{"crds/x.yaml": {Data: []byte(crd)}})
	if err != nil {
		t.Fatal(err)
	}
	gvk := schema.GroupVersionKind{Group: "example.com", Version: "v1alpha1", Kind: "Widget"}
	want = Deprecation{Warning: "example.com/v1alpha1 Widget is deprecated; use example.com/v1 Widget", Use: schema.GroupVersion{Group: "example.com", Version: "v1"}}
	if got, ok := s.Deprecated(gvk); !ok || got != want {
		t.Errorf("Deprecated(%s) = %+v, %v, want %+v, true", gvk, got, ok, want)
	}
}

// minimalCRD serves Widget as v1 (stored) and v1alpha1.
const minimalCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object}}
  - name: v1alpha1
    served: true
    storage: false
    schema: {openAPIV3Schema: {type: object}}
`
