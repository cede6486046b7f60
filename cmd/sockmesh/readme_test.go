package main

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// TestREADMEClusterExample: the README's in-cluster command line starts an
// agent as written, also where no pod's environment gives it
// $POD_NAMESPACE (a node's shell, a developer's machine).
func TestREADMEClusterExample(t *testing.T) {
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{"NODE_NAME": "node-a"}
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cmd, comment, ok := strings.Cut(sc.Text(), "#")
		if !ok || strings.TrimSpace(comment) != "in a cluster" {
			continue
		}
		args, ok := strings.CutPrefix(strings.TrimSpace(cmd), "sockmesh agent ")
		if !ok {
			t.Fatalf("README's in-cluster line %q: not a sockmesh agent command", cmd)
		}
		found = true
		expanded := os.Expand(args, func(k string) string { return env[k] })
		if _, err := parse(t, env, "", strings.Fields(expanded)...); err != nil {
			t.Errorf("README's in-cluster example %q: %v", strings.TrimSpace(cmd), err)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Fatal("README has no command line commented \"in a cluster\"")
	}
}
