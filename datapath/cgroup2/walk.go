package cgroup2

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// ErrTooMany is wrapped by Walk's error when the tree below its root holds
// more cgroups than its limit.
var ErrTooMany = errors.New("too many cgroups")

// Walk calls visit for each cgroup below root (root itself excluded), a
// parent before its children and siblings in name order, with the cgroup's
// path relative to root and its directory, open for the call. It holds one
// directory open at a time, whatever the depth.
//
// A cgroup removed while Walk runs is skipped with its sub-tree: one gone
// when Walk opens or lists it, and one whose visit returns an error wrapping
// fs.ErrNotExist (the kernel answers ENOENT for a removed cgroup's
// directory still open). Any other error of visit stops the walk and is
// returned as it is. After visiting limit cgroups Walk stops with ErrTooMany.
func Walk(root string, limit int, visit func(rel string, dir *os.File) error) error {
	w := walker{root: root, limit: limit, visit: visit}
	dir, err := openDir(root)
	if err != nil {
		return err
	}
	names, err := subdirs(dir)
	dir.Close()
	if err != nil {
		return err
	}
	return w.below("", names)
}

type walker struct {
	root    string
	limit   int
	visited int
	visit   func(rel string, dir *os.File) error
}

// below walks the cgroups names, the children of rel, and their sub-trees.
func (w *walker) below(rel string, names []string) error {
	for _, name := range names {
		if w.visited == w.limit {
			return fmt.Errorf("walk cgroups below %s: %w, stopped after %d", w.root, ErrTooMany, w.limit)
		}
		w.visited++
		sub := filepath.Join(rel, name)
		children, err := w.enter(sub)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since its parent was listed
		}
		if err != nil {
			return err
		}
		if err := w.below(sub, children); err != nil {
			return err
		}
	}
	return nil
}

// enter visits the cgroup rel and lists its children.
func (w *walker) enter(rel string) ([]string, error) {
	dir, err := openDir(filepath.Join(w.root, rel))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	if err := w.visit(rel, dir); err != nil {
		return nil, err
	}
	return subdirs(dir)
}

// openDir opens the directory path. os.Open would try to add it to Go's
// poller: five system calls more a cgroup (four fcntl, an epoll_ctl).
func openDir(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("walk cgroups: open %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// subdirs returns the names of the cgroups directly below dir, sorted.
func subdirs(dir *os.File) ([]string, error) {
	entries, err := dir.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("list cgroup %s: %w", dir.Name(), err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}
