package main

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// TestIntrospectionDocCommands: every command line of docs/introspection.md's
// opening block names a sockmeshctl command, with flags it has and as many
// arguments as it takes, so that an operator who copies one gets an answer
// rather than a usage error.
func TestIntrospectionDocCommands(t *testing.T) {
	raw, err := os.ReadFile("../../docs/introspection.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(raw), "```\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("docs/introspection.md has no command block")
	}
	n := 0
	for line := range strings.Lines(block) {
		cmdline, _, _ := strings.Cut(line, "#")
		args := strings.Fields(cmdline)
		if len(args) == 0 || args[0] != "sockmeshctl" {
			t.Errorf("%q in the command block is no sockmeshctl command line", strings.TrimSpace(line))
			continue
		}
		n++
		cmd, rest, err := newRootCommand().Find(args[1:])
		if err != nil || cmd.Parent() == nil {
			t.Errorf("%q: no such command (%v)", strings.TrimSpace(cmdline), err)
			continue
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Errorf("%q: %v", strings.TrimSpace(cmdline), err)
			continue
		}
		pos := cmd.Flags().Args()
		if err := cmd.ValidateArgs(pos); err != nil {
			t.Errorf("%q: %v", strings.TrimSpace(cmdline), err)
		}
		// ValidArgs (describe's kinds) name what the first argument may be.
		if len(cmd.ValidArgs) > 0 && len(pos) > 0 && !slices.Contains(cmd.ValidArgs, pos[0]) {
			t.Errorf("%q: %s is none of %v", strings.TrimSpace(cmdline), pos[0], cmd.ValidArgs)
		}
	}
	if n == 0 {
		t.Fatal("docs/introspection.md's command block has no sockmeshctl command line")
	}
}
