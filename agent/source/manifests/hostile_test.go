package manifests_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
)

// TestDecodeHostileInput: files an operator gets wrong or an attacker
// writes decode to a clear error naming the document, without a panic, a
// hang or unbounded memory; valid oddities (a BOM, CRLF, a separator
// inside a block scalar, JSON, aliases) decode as kubectl apply reads them.
func TestDecodeHostileInput(t *testing.T) {
	dec, err := manifests.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	const cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n"
	cmB := strings.Replace(cm, "name: a", "name: b", 1)
	laughs := cm + "data:\n  a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
	for i, name := range "bcdefghi" {
		prev := string("abcdefghi"[i])
		laughs += fmt.Sprintf("  %c: &%c [%s]\n", name, name, strings.TrimSuffix(strings.Repeat("*"+prev+",", 9), ","))
	}
	// A ConfigMap document of exactly n bytes.
	sized := func(name string, n int) string {
		head := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s}\ndata: {x: \"", name)
		return head + strings.Repeat("y", n-len(head)-3) + "\"}\n"
	}
	for _, tc := range []struct {
		name     string
		in       string
		wantKeys []string
		wantErr  string
		// wantData, when set, is ConfigMap a's data.x.
		wantData string
	}{
		{name: "aliases expanding a billion times", in: laughs, wantErr: "document 1: decode: yaml: document contains excessive aliasing"},
		{name: "an alias used twice", in: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, labels: &l {k: v}, annotations: *l}\n", wantKeys: []string{"ConfigMap default/a"}},
		{name: "YAML nested 100,000 deep", in: cm + "data: {x: " + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + "}\n", wantErr: "document 1: decode: yaml: line 4: exceeded max depth of 10000"},
		{name: "JSON nested 100,000 deep", in: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":` + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + "}", wantErr: "document 1: decode: couldn't get version/kind; json parse error: exceeded max depth"},
		{name: "a document of MaxDocumentBytes", in: sized("a", manifests.MaxDocumentBytes), wantKeys: []string{"ConfigMap default/a"}},
		{name: "a document over MaxDocumentBytes", in: cmB + "---\n" + sized("a", manifests.MaxDocumentBytes+1),
			wantErr: fmt.Sprintf("document 2: %d bytes, over the %d an API server takes in a request", manifests.MaxDocumentBytes+1, manifests.MaxDocumentBytes)},
		{name: "a separator in an indented block scalar", in: cm + "data:\n  x: |\n    a\n    ---\n    b\n", wantKeys: []string{"ConfigMap default/a"}, wantData: "a\n---\nb\n"},
		{name: "a separator at column 0 ends a block scalar", in: cm + "data:\n  x: |\n    a\n---\n    b\n", wantErr: "document 2: decode: not an object: a document is a mapping with apiVersion, kind and metadata"},
		{name: "a byte order mark", in: "\ufeff" + cm + "---\n\ufeff" + cmB, wantKeys: []string{"ConfigMap default/a", "ConfigMap default/b"}},
		{name: "CRLF line ends", in: strings.ReplaceAll(cm+"data:\n  x: |\n    a\n    b\n---\n"+cmB, "\n", "\r\n"), wantKeys: []string{"ConfigMap default/a", "ConfigMap default/b"}, wantData: "a\nb\n"},
		{name: "JSON", in: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"x":"j"}}`, wantKeys: []string{"ConfigMap default/a"}, wantData: "j"},
		{name: "JSON with a key twice", in: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","name":"b"}}`, wantErr: `document 1: decode kind ConfigMap (apiVersion v1): strict decoding error: duplicate field "metadata.name"`},
		{name: "YAML with a key twice", in: cm + "data: {x: a, x: b}\n", wantErr: `document 1: decode kind ConfigMap (apiVersion v1): strict decoding error: yaml: unmarshal errors:` + "\n" + `  line 4: key "x" already set in map`},
		{name: "a List", in: "apiVersion: v1\nkind: List\nitems:\n- " + strings.ReplaceAll(cm, "\n", "\n  ") + "\n", wantKeys: []string{"ConfigMap default/a"}},
		{name: "a file cut short mid-document", in: cmB + "---\n" + cm + "data:\n  x: \"abc", wantErr: "document 2: decode: yaml: line 6: found unexpected end of stream"},
		{name: "a scalar document", in: "just words\n", wantErr: "document 1: decode: not an object"},
		{name: "a sequence document", in: "- " + strings.ReplaceAll(cm, "\n", "\n  "), wantErr: "document 1: decode: not an object"},
		// The decoder's own messages quote the whole document.
		{name: "no kind, in a large document", in: "apiVersion: v1\nmetadata: {name: a}\ndata: {x: " + strings.Repeat("y", 1<<20) + "}\n", wantErr: "document 1: decode: kind is missing"},
		{name: "no apiVersion", in: "kind: ConfigMap\nmetadata: {name: a}\n", wantErr: "document 1: decode: apiVersion is missing"},
		{name: "generateName", in: "apiVersion: v1\nkind: ConfigMap\nmetadata: {generateName: a-}\n", wantErr: `document 1: ConfigMap default/: metadata.name: Required value: generateName "a-" makes a new name at each create; kubectl apply refuses it too`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := dec.Decode(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) {
					t.Fatalf("Decode error = %.300v, want one starting %q", err, tc.wantErr)
				}
				if len(err.Error()) > 1000 {
					t.Errorf("Decode error is %d bytes long, want it short: %.300s…", len(err.Error()), err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode error: %.300v", err)
			}
			var keys []string
			for _, o := range objs {
				keys = append(keys, manifests.Key(o))
			}
			if strings.Join(keys, ",") != strings.Join(tc.wantKeys, ",") {
				t.Errorf("Decode keys = %v, want %v", keys, tc.wantKeys)
			}
			if tc.wantData != "" {
				if got := objs[0].(*corev1.ConfigMap).Data["x"]; got != tc.wantData {
					t.Errorf("data.x = %q, want %q", got, tc.wantData)
				}
			}
		})
	}
}
