package datapath

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Attached is another program on one of our hooks, as seen from the cgroup
// we attach to (its own programs and those inherited from ancestors).
type Attached struct {
	Hook      string         `json:"hook"` // our hook name: connect4, connect6, getpeername4, ...
	ProgramID ebpf.ProgramID `json:"programID"`
	Name      string         `json:"name"` // the program's name, possibly truncated by the kernel
	// RunsBeforeOurs: the kernel runs it before our program on this hook.
	// On connect4/6 such a program may already have rewritten a Service
	// address (socket load balancing, as Cilium does), so ours never sees it.
	RunsBeforeOurs bool `json:"runsBeforeOurs"`
}

// Conflicts lists the programs other than ours that run on our hooks for
// processes in our cgroup itself, in the order the kernel runs them: those
// attached there and at its ancestors. Programs attached in cgroups below it,
// which run first for the processes there, are not listed (see doc.go).
func (d *Datapath) Conflicts() ([]Attached, error) {
	cg, err := os.Open(d.cfg.Cgroup)
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", d.cfg.Cgroup, err)
	}
	defer cg.Close()

	var out []Attached
	for _, h := range hooks {
		info, err := h.prog(&d.objs).Info()
		if err != nil {
			return nil, fmt.Errorf("inspect our %s program: %w", h.name, err)
		}
		ours, _ := info.ID()
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
			if p.ID == ours {
				before = false
				continue
			}
			a := Attached{Hook: h.name, ProgramID: p.ID, RunsBeforeOurs: before}
			if prog, err := ebpf.NewProgramFromID(p.ID); err == nil {
				if pi, err := prog.Info(); err == nil {
					a.Name = pi.Name
				}
				prog.Close()
			}
			out = append(out, a)
		}
	}
	return out, nil
}
