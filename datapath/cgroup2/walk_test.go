package cgroup2

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// tree makes the directories rels below a temporary root (Walk reads any
// directory tree as it does cgroups) and returns the root.
func tree(t *testing.T, rels ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, rel := range rels {
		if err := os.MkdirAll(filepath.Join(root, rel), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Files stand beside the cgroups, as the interface files do.
	if err := os.WriteFile(filepath.Join(root, "b", "cgroup.procs"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

var layout = []string{"b/x/deep", "b/a", "a", "c"}

func TestWalk(t *testing.T) {
	root := tree(t, layout...)
	var got []string
	err := Walk(root, 100, func(rel string, dir *os.File) error {
		if dir.Name() != filepath.Join(root, rel) {
			t.Errorf("visit %s with directory %s", rel, dir.Name())
		}
		got = append(got, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a", "b", "b/a", "b/x", "b/x/deep", "c"}
	if !slices.Equal(got, want) {
		t.Errorf("visited %q, want %q", got, want)
	}
}

func TestWalkLimit(t *testing.T) {
	root := tree(t, layout...)
	for _, tc := range []struct {
		limit int
		want  []string
		err   error
	}{
		{0, nil, ErrTooMany},
		{3, []string{"a", "b", "b/a"}, ErrTooMany},
		{6, []string{"a", "b", "b/a", "b/x", "b/x/deep", "c"}, nil},
	} {
		var got []string
		err := Walk(root, tc.limit, func(rel string, _ *os.File) error {
			got = append(got, rel)
			return nil
		})
		if !errors.Is(err, tc.err) || !slices.Equal(got, tc.want) {
			t.Errorf("limit %d: visited %q, %v; want %q, %v", tc.limit, got, err, tc.want, tc.err)
		}
	}
}

// TestWalkVanishing: a cgroup removed after its parent was listed, and one
// whose visit finds it removed, are skipped with their sub-trees.
func TestWalkVanishing(t *testing.T) {
	root := tree(t, layout...)
	var got []string
	err := Walk(root, 100, func(rel string, _ *os.File) error {
		got = append(got, rel)
		switch rel {
		case "a": // b is listed, not yet opened
			if err := os.RemoveAll(filepath.Join(root, "b")); err != nil {
				t.Fatal(err)
			}
		case "c": // as the kernel answers for a removed cgroup
			return fmt.Errorf("query c: %w", fs.ErrNotExist)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "c"}; !slices.Equal(got, want) {
		t.Errorf("visited %q, want %q", got, want)
	}
}

func TestWalkErrors(t *testing.T) {
	root := tree(t, layout...)
	boom := errors.New("boom")
	var got []string
	err := Walk(root, 100, func(rel string, _ *os.File) error {
		got = append(got, rel)
		if rel == "b/a" {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("visit's error: Walk returned %v, want %v", err, boom)
	}
	if want := []string{"a", "b", "b/a"}; !slices.Equal(got, want) {
		t.Errorf("visited %q, want %q", got, want)
	}
	if err := Walk(filepath.Join(root, "nosuch"), 100, nil); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Walk(missing root) = %v, want ErrNotExist", err)
	}
}
