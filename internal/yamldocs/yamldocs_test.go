package yamldocs_test

import (
	"slices"
	"testing"

	"github.com/sockmesh/sockmesh/internal/yamldocs"
)

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		names   []string
		wantErr bool
	}{
		{"empty", "", nil, false},
		{"one", "kind: A\nmetadata: {name: a}\n", []string{"a"}, false},
		{"empty documents left out", "---\n# only a comment\n---\nkind: A\nmetadata: {name: a}\n---\n---\nkind: B\nmetadata: {name: b}\n", []string{"a", "b"}, false},
		{"json", `{"kind": "A", "metadata": {"name": "a"}}`, []string{"a"}, false},
		{"malformed second document", "kind: A\nmetadata: {name: a}\n---\nkind: [unclosed\n", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := yamldocs.Decode([]byte(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("Decode() error = %v, want error %v", err, tc.wantErr)
			}
			var names []string
			for _, o := range objs {
				names = append(names, o["metadata"].(map[string]any)["name"].(string))
			}
			if !slices.Equal(names, tc.names) {
				t.Errorf("Decode() names = %q, want %q", names, tc.names)
			}
		})
	}
}
