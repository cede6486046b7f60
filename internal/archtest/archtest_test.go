package archtest

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

type pkg struct {
	ImportPath string
	Name       string
	Dir        string
	Doc        string
	GoFiles    []string
	Deps       []string
}

// listPackages runs `go list -deps=false` over the module with dependencies.
func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "github.com/sockmesh/sockmesh/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestDataPlaneImports keeps the data planes and the Snapshot contract free
// of Kubernetes and Gateway API code (../shared/DESIGN.md, layout table).
func TestDataPlaneImports(t *testing.T) {
	const mod = "github.com/sockmesh/sockmesh/"
	restricted := []string{mod + "datapath", mod + "userspace-proxy", mod + "agent/snapshot"}
	forbidden := []string{"k8s.io/", "sigs.k8s.io/"}
	// Each restricted tree is checked, each package with its dependencies:
	// a renamed tree or a missing Deps field would pass the loop unchecked.
	checked := map[string]int{}
	for _, p := range listPackages(t) {
		if !hasAnyPrefix(p.ImportPath, restricted) {
			continue
		}
		for _, r := range restricted {
			if strings.HasPrefix(p.ImportPath, r) {
				checked[r]++
			}
		}
		if len(p.Deps) == 0 {
			t.Errorf("%s lists no dependencies: nothing to check", p.ImportPath)
		}
		for _, d := range p.Deps {
			if hasAnyPrefix(d, forbidden) {
				t.Errorf("%s depends on %s; data planes must only see agent/snapshot", p.ImportPath, d)
			}
		}
	}
	for _, r := range restricted {
		if checked[r] == 0 {
			t.Errorf("no package under %s: the check covers nothing there", r)
		}
	}
}

// TestPackagesDocumented requires a package comment on every package with
// non-test code.
func TestPackagesDocumented(t *testing.T) {
	for _, p := range listPackages(t) {
		if len(p.GoFiles) > 0 && p.Name != "main" && p.Doc == "" {
			t.Errorf("%s has no package comment (add a doc.go)", p.ImportPath)
		}
	}
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
