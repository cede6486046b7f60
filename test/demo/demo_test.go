package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/test/cluster/node"
)

// TestDemo runs `make demo`'s driver on freshly built binaries and the
// shipped examples: every scenario must pass, and every object it made must
// be gone afterwards (the sandbox cleanups fail the test otherwise).
func TestDemo(t *testing.T) {
	testenv.RequireRoot(t)
	bin := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	for _, name := range []string{"sockmesh", "sockmesh-echo"} {
		if err := node.BuildBinary(ctx, "github.com/sockmesh/sockmesh/cmd/"+name, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	err := run(ctx, t, config{binDir: bin, manifests: "../../examples/demo", out: &out})
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range []string{"payments", "partner", "grpc", "chat"} {
		if !strings.Contains(out.String(), "[PASS] "+svc+",") {
			t.Errorf("the demo output has no passing %s scenario", svc)
		}
	}
	if strings.Contains(out.String(), "[FAIL]") {
		t.Error("the demo output reports a failed scenario")
	}
}
