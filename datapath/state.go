package datapath

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// State is what the kernel holds for this datapath now: for operators
// (sockmeshctl status), who would otherwise ask bpftool.
type State struct {
	// PinDir is where the programs, links and maps are pinned; Cgroup
	// where the programs attach.
	PinDir string `json:"pinDir"`
	Cgroup string `json:"cgroup"`
	Hooks  []Hook `json:"hooks"`
	Maps   []Map  `json:"maps"`
	// Accelerated: the sk_msg link of Config.Accelerate is pinned.
	Accelerated bool `json:"accelerated"`
}

// Hook is one of our attach points.
type Hook struct {
	// Name is the hook's name: connect4, connect6, getpeername4, ...
	Name        string         `json:"name"`
	ProgramID   ebpf.ProgramID `json:"programID"`
	ProgramName string         `json:"programName"`
	LinkID      link.ID        `json:"linkID"`
	// Attached: the kernel runs our program for processes in Cgroup.
	Attached bool `json:"attached"`
	// LinkPinned and ProgramPinned: their pins exist under PinDir, so the
	// capture outlives this agent process.
	LinkPinned    bool `json:"linkPinned"`
	ProgramPinned bool `json:"programPinned"`
}

// Map is one of our maps.
type Map struct {
	Name       string     `json:"name"`
	ID         ebpf.MapID `json:"id"`
	Type       string     `json:"type"`
	MaxEntries uint32     `json:"maxEntries"`
	Pinned     bool       `json:"pinned"`
}

// State reads the hooks' programs and links and the maps from the kernel
// and the pins from the BPF filesystem.
func (d *Datapath) State() (State, error) {
	s := State{PinDir: d.cfg.pinDir(), Cgroup: d.cfg.Cgroup}
	s.Accelerated = exists(filepath.Join(s.PinDir, "links", accelLink))
	cg, err := os.Open(d.cfg.Cgroup)
	if err != nil {
		return s, fmt.Errorf("open cgroup %s: %w", d.cfg.Cgroup, err)
	}
	defer cg.Close()
	var errs []error
	for _, h := range hooks {
		hs := Hook{Name: h.name,
			LinkPinned:    exists(filepath.Join(s.PinDir, "links", h.name)),
			ProgramPinned: exists(filepath.Join(s.PinDir, "progs", h.name)),
		}
		if info, err := h.prog(&d.objs).Info(); err != nil {
			errs = append(errs, fmt.Errorf("inspect our %s program: %w", h.name, err))
		} else {
			hs.ProgramID, _ = info.ID()
			hs.ProgramName = info.Name
		}
		d.mu.Lock()
		l := d.links[h.name]
		d.mu.Unlock()
		if l != nil {
			if info, err := l.Info(); err != nil {
				errs = append(errs, fmt.Errorf("inspect our %s link: %w", h.name, err))
			} else {
				hs.LinkID = info.ID
			}
		}
		res, err := link.QueryPrograms(link.QueryOptions{
			Target: int(cg.Fd()), Attach: h.attach, QueryFlags: unix.BPF_F_QUERY_EFFECTIVE,
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("query %s programs on %s: %w", h.name, d.cfg.Cgroup, err))
		} else {
			hs.Attached = hs.ProgramID != 0 && slices.ContainsFunc(res.Programs, func(p link.AttachedProgram) bool {
				return p.ID == hs.ProgramID
			})
		}
		s.Hooks = append(s.Hooks, hs)
	}
	for name, m := range d.maps() {
		ms := Map{Name: name, Pinned: exists(filepath.Join(s.PinDir, name))}
		if info, err := m.Info(); err != nil {
			errs = append(errs, fmt.Errorf("inspect map %s: %w", name, err))
		} else {
			ms.ID, _ = info.ID()
			ms.Type, ms.MaxEntries = info.Type.String(), info.MaxEntries
		}
		s.Maps = append(s.Maps, ms)
	}
	slices.SortFunc(s.Maps, func(a, b Map) int { return cmp.Compare(a.Name, b.Name) })
	return s, errors.Join(errs...)
}

// maps names every map of the collection by its pin name (the ebpf struct
// tag bpf2go writes), so a map added to ../bpf is listed without an edit here.
func (d *Datapath) maps() map[string]*ebpf.Map {
	v := reflect.ValueOf(&d.objs.sockmeshMaps).Elem()
	out := make(map[string]*ebpf.Map, v.NumField())
	for i := range v.NumField() {
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok && m != nil {
			out[v.Type().Field(i).Tag.Get("ebpf")] = m
		}
	}
	return out
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
