package datapath

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/internal/testenv"
)

// TestGeneratedObjectIsFresh reruns gen.go's bpf2go command into a temporary
// directory and fails when the committed output differs: someone changed
// ../bpf without running `make generate`, or the toolchain no longer
// reproduces the committed object byte for byte.
func TestGeneratedObjectIsFresh(t *testing.T) {
	if _, err := exec.LookPath("clang"); err != nil {
		testenv.SkipOrFail(t, "clang not installed: cannot check the committed eBPF object")
	}
	args := generateArgs(t)
	out := t.TempDir()
	// bpf2go writes into -output-dir instead of the package directory.
	args = append([]string{args[0], "-output-dir", out}, args[1:]...)
	cmd := exec.Command("go", append([]string{"tool"}, args...)...)
	cmd.Env = append(os.Environ(), "GOPACKAGE=datapath", "GOFILE=gen.go")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go tool %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	for _, name := range []string{"sockmesh_bpfel.go", "sockmesh_bpfel.o"} {
		fresh, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fresh, committed) {
			t.Errorf("%s is stale: run `make generate` and commit the result "+
				"(or this machine's %s is not the one the object was generated with)", name, clangVersion())
		}
	}
}

// generateArgs returns the arguments after "go tool" of gen.go's
// //go:generate line, unquoting double-quoted ones.
func generateArgs(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(src), "\n") {
		rest, ok := strings.CutPrefix(line, "//go:generate go tool ")
		if !ok {
			continue
		}
		var args []string
		for i, part := range strings.Split(rest, `"`) {
			if i%2 == 1 {
				args = append(args, part) // inside quotes: one argument
			} else {
				args = append(args, strings.Fields(part)...)
			}
		}
		return args
	}
	t.Fatal("gen.go has no //go:generate go tool line")
	return nil
}

func clangVersion() string {
	out, err := exec.Command("clang", "--version").Output()
	if err != nil {
		return "clang"
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return first
}
