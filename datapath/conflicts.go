package datapath

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/datapath/cgroup2"
)

// Attached is another program on one of our hooks that runs for processes
// in the cgroup we attach to or below it.
type Attached struct {
	Hook      string         `json:"hook"` // our hook name: connect4, connect6, getpeername4, ...
	ProgramID ebpf.ProgramID `json:"programID"`
	Name      string         `json:"name"` // the program's name, possibly truncated by the kernel
	// Cgroup is where the program is attached when that is below the
	// cgroup we attach to, relative to it (a pod's cgroup, say): it runs
	// for the processes there and below. Empty for a program attached at
	// our cgroup or an ancestor, which runs for every process ours does.
	Cgroup string `json:"cgroup,omitempty"`
	// RunsBeforeOurs: the kernel runs it before our program on this hook
	// (for the processes in Cgroup, when set: always, as the kernel runs a
	// cgroup's programs before its ancestors'). On connect4/6 such a
	// program may already have rewritten a Service address (socket load
	// balancing, as Cilium does), so ours never sees it.
	RunsBeforeOurs bool `json:"runsBeforeOurs"`
}

// maxCgroupsBelow bounds the walk of Conflicts below Config.Cgroup, which
// Open and every introspection report (sockmeshctl status) pay for: eleven
// system calls a cgroup (a query per hook, open, list, close), measured
// here 25 µs a cgroup, 50 ms for 2,000 (BenchmarkConflicts), so at most
// about a quarter of a second. A node's pods and containers, a few each,
// and its services come to a few thousand.
const maxCgroupsBelow = 10000

// Conflicts lists the programs other than ours that run on our hooks for
// processes in Config.Cgroup or below it. First those that run for all of
// them, attached at Config.Cgroup or its ancestors, in the order the kernel
// runs them; then those attached in cgroups below it, each once at the
// cgroup where it is attached (a parent before its children, siblings in
// name order), which run before ours for the processes there. Cgroups
// removed during the walk are skipped; after maxCgroupsBelow cgroups it
// stops with an error wrapping cgroup2.ErrTooMany. With an error of the
// walk, Conflicts returns what it found before it too.
func (d *Datapath) Conflicts() ([]Attached, error) {
	ours := make([]ebpf.ProgramID, len(hooks))
	for i, h := range hooks {
		info, err := h.prog(&d.objs).Info()
		if err != nil {
			return nil, fmt.Errorf("inspect our %s program: %w", h.name, err)
		}
		ours[i], _ = info.ID()
	}
	out, err := d.inherited(ours)
	if err != nil {
		return nil, err
	}
	err = cgroup2.Walk(d.cfg.Cgroup, maxCgroupsBelow, func(rel string, cg *os.File) error {
		found, err := attachedIn(cg, rel, ours)
		out = append(out, found...)
		return err
	})
	if err != nil {
		return out, fmt.Errorf("list programs below cgroup %s: %w", d.cfg.Cgroup, err)
	}
	return out, nil
}

// inherited lists the programs other than ours (ours: their IDs, by hook)
// that run for processes in Config.Cgroup itself.
func (d *Datapath) inherited(ours []ebpf.ProgramID) ([]Attached, error) {
	cg, err := os.Open(d.cfg.Cgroup)
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", d.cfg.Cgroup, err)
	}
	defer cg.Close()

	var out []Attached
	for i, h := range hooks {
		// BPF_F_QUERY_EFFECTIVE returns the programs that run, in the order
		// they run: this cgroup's first, then its ancestors'.
		res, err := link.QueryPrograms(link.QueryOptions{
			Target:     int(cg.Fd()),
			Attach:     h.attach,
			QueryFlags: unix.BPF_F_QUERY_EFFECTIVE,
		})
		if err != nil {
			return nil, fmt.Errorf("query %s programs on %s: %w", h.name, d.cfg.Cgroup, err)
		}
		before := true
		for _, p := range res.Programs {
			if p.ID == ours[i] {
				before = false
				continue
			}
			out = append(out, Attached{Hook: h.name, ProgramID: p.ID, Name: programName(p.ID), RunsBeforeOurs: before})
		}
	}
	return out, nil
}

// attachedIn lists the programs other than ours attached directly to the
// cgroup cg, at rel below Config.Cgroup. Its error wraps ENOENT when the
// cgroup has been removed.
func attachedIn(cg *os.File, rel string, ours []ebpf.ProgramID) ([]Attached, error) {
	var out []Attached
	fd := int(cg.Fd())
	for i, h := range hooks {
		res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: h.attach})
		if err != nil {
			return nil, fmt.Errorf("query %s programs on %s: %w", h.name, cg.Name(), err)
		}
		for _, p := range res.Programs {
			if p.ID != ours[i] {
				out = append(out, Attached{Hook: h.name, ProgramID: p.ID, Name: programName(p.ID), Cgroup: rel, RunsBeforeOurs: true})
			}
		}
	}
	return out, nil
}

// programName is the name of the program id, or empty if it cannot be read
// (it may have been unloaded since it was listed).
func programName(id ebpf.ProgramID) string {
	prog, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return ""
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return ""
	}
	return info.Name
}
