// Package manifesttest loads YAML fixtures into a translate.Input for
// tests, with a freshly made CA certificate where the fixture says CA_PEM
// (a line of its own, inside a block scalar indented four spaces). It is
// for tests only.
package manifesttest

import (
	"os"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/pki"
)

// Load decodes the manifests in file, with a CA named caName in place of
// CA_PEM, and adds them to in, failing t on any error.
func Load(t testing.TB, file, caName string, in *translate.Input) {
	t.Helper()
	ca, err := pki.NewCA(caName)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pemText := "    " + strings.ReplaceAll(strings.TrimSpace(string(ca.CertPEM)), "\n", "\n    ")
	// Fixtures stand for a cluster's objects: their status is kept.
	dec, err := manifests.NewDecoderKeepingStatus()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := dec.Decode(strings.NewReader(strings.Replace(string(raw), "\nCA_PEM\n", "\n"+pemText+"\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if err := manifests.Add(in, o); err != nil {
			t.Fatal(err)
		}
	}
}
