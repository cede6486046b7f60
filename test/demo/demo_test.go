package main

import (
	"bytes"
	"context"
	"fmt"
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
	build, cancel := buildContext(t)
	defer cancel()
	for _, name := range []string{"sockmesh", "sockmesh-echo"} {
		if err := node.BuildBinary(build, "github.com/sockmesh/sockmesh/cmd/"+name, filepath.Join(bin, name)); err != nil {
			if build.Err() != nil {
				err = fmt.Errorf("%w: %w", context.Cause(build), err)
			}
			t.Fatal(err)
		}
	}
	// The limit starts once the binaries are built: a demo that hangs
	// fails here, its namespaces removed by the cleanups.
	ctx, cancel := context.WithTimeout(t.Context(), demoLimit)
	defer cancel()
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

const (
	// demoLimit bounds the demo's run, not its build: scenarios that
	// pass take well under a minute.
	demoLimit = 5 * time.Minute
	// cleanupGrace is left after the demo's limit for its cleanups and
	// the report.
	cleanupGrace = 30 * time.Second
)

// buildContext bounds the build by what the test's deadline (go test
// -timeout) leaves for it after the demo's run. A fixed budget (5 minutes
// for build and run) ran out while other packages compiled on 2 cores;
// the build's own time depends on the machine and its cache, the test's
// deadline on what the caller allows. A hung build still fails the test,
// with the build's output, before the timeout's panic, which would run no
// cleanups. Without a deadline (-timeout 0) the build is unbounded, as
// asked.
func buildContext(t *testing.T) (context.Context, context.CancelFunc) {
	t.Helper()
	deadline, ok := t.Deadline()
	if !ok {
		return context.WithCancel(t.Context())
	}
	built := deadline.Add(-demoLimit - cleanupGrace)
	if time.Until(built) <= 0 {
		t.Fatalf("go test -timeout leaves no time to build before the demo's %v and its cleanups: give it more", demoLimit+cleanupGrace)
	}
	return context.WithDeadlineCause(t.Context(), built,
		fmt.Errorf("the build ran past %v, what go test -timeout leaves it before the demo's run", built.Format(time.TimeOnly)))
}
