package manifests_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// FuzzDecode reads arbitrary manifest files as the file source does: the
// decoder must not panic, what it returns must be of a kind translate
// reads, and translate must take it without an error (the agent never
// stops on a file an operator got wrong). Seeded with the examples and
// translate's fixtures.
func FuzzDecode(f *testing.F) {
	var seeds []string
	for _, pattern := range []string{"../../../examples/*/*.yaml", "../../translate/testdata/*/*.in.yaml"} {
		paths, err := filepath.Glob(pattern)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, paths...)
	}
	if len(seeds) == 0 {
		f.Fatal("no seed manifests found")
	}
	for _, path := range seeds {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	dec, err := manifests.NewDecoder()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, file []byte) {
		objs, err := dec.Decode(bytes.NewReader(file))
		if err != nil {
			return
		}
		var in translate.Input
		for _, o := range objs {
			if err := manifests.Add(&in, o); err != nil {
				t.Fatalf("Decode returned %s, which translate does not read: %v", manifests.Key(o), err)
			}
		}
		if _, err := translate.Translate(in); err != nil {
			t.Fatalf("Translate of decoded manifests: %v", err)
		}
	})
}
