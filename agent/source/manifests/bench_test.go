package manifests_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
)

// largeRoute is an HTTPRoute the CRD admits of about 3 MB as YAML, near
// MaxDocumentBytes: 8 rules of 16 matches of 16 header matches, each
// value 1,400 bytes.
func largeRoute(tb testing.TB) []byte {
	tb.Helper()
	var rules []string
	for r := range 8 {
		var matches []string
		for m := range 16 {
			var headers []string
			for h := range 16 {
				headers = append(headers, fmt.Sprintf("      - name: x-h%d\n        value: %s\n", h, strings.Repeat(string(rune('a'+(r+m+h)%26)), 1400)))
			}
			matches = append(matches, fmt.Sprintf("    - path: {type: PathPrefix, value: /r%d/m%d}\n      headers:\n%s", r, m, strings.Join(headers, "")))
		}
		rules = append(rules, "  - matches:\n"+strings.Join(matches, "")+"    backendRefs: [{name: s, port: 80}]\n")
	}
	doc := "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: large, namespace: apps}\nspec:\n  parentRefs: [{group: \"\", kind: Service, name: s}]\n  rules:\n" + strings.Join(rules, "")
	if len(doc) > manifests.MaxDocumentBytes {
		tb.Fatalf("large route is %d bytes, over MaxDocumentBytes", len(doc))
	}
	return []byte(doc)
}

// BenchmarkDecodeLargeRoute decodes and admits a 3 MB HTTPRoute written as
// YAML and as JSON: YAML's extra cost is its one conversion to JSON.
func BenchmarkDecodeLargeRoute(b *testing.B) {
	dec, err := manifests.NewDecoder()
	if err != nil {
		b.Fatal(err)
	}
	asYAML := largeRoute(b)
	asJSON, err := yaml.YAMLToJSON(asYAML)
	if err != nil {
		b.Fatal(err)
	}
	if !json.Valid(asJSON) {
		b.Fatal("route as JSON is not valid JSON")
	}
	for _, bc := range []struct {
		name string
		doc  []byte
	}{{"yaml", asYAML}, {"json", asJSON}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.doc)))
			b.ReportAllocs()
			for b.Loop() {
				objs, err := dec.Decode(bytes.NewReader(bc.doc))
				if err != nil || len(objs) != 1 {
					b.Fatalf("Decode = %d objects, %.300v; want the route", len(objs), err)
				}
			}
		})
	}
}
