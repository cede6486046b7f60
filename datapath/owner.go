package datapath

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The datapath belongs to the agent whose programs its links run: the last
// to Open it. While a DaemonSet rolling update runs two agents on a node
// (maxSurge), the older keeps serving its connections but must stop
// writing the maps, or its view (an older build's, another proxy mode's)
// and the newer one's would take turns, and whichever wrote last would
// stay. An exclusive lock on the pin directory orders them: Open updates
// the links under it, and each reconcile checks under it that this process
// still owns the datapath, so no write of the older agent lands after the
// newer one took over. Heartbeats are not guarded: both proxies serve.

// lockPins takes the pin directory's lock (flock: released if the process
// dies) and returns its release.
func (d *Datapath) lockPins() (func(), error) {
	if err := unix.Flock(int(d.pins.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lock %s: %w", d.pins.Name(), err)
	}
	return func() { unix.Flock(int(d.pins.Fd()), unix.LOCK_UN) }, nil
}

// openPins opens the pin directory for its lock.
func openPins(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open pin directory for its lock: %w", err)
	}
	return f, nil
}

// owner returns the ID of the connect4 program the pinned link runs, and
// this process's.
func (d *Datapath) owner() (running, ours ebpf.ProgramID, err error) {
	l, ok := d.links["connect4"]
	if !ok {
		return 0, 0, fmt.Errorf("datapath closed")
	}
	info, err := l.Info()
	if err != nil {
		return 0, 0, fmt.Errorf("read the connect4 link: %w", err)
	}
	pinfo, err := d.objs.Connect4.Info()
	if err != nil {
		return 0, 0, fmt.Errorf("read our connect4 program: %w", err)
	}
	ours, _ = pinfo.ID()
	return info.Program, ours, nil
}

// reconcile runs write, with d.mu held, if this process still owns the
// datapath, under the pin lock; a superseded one writes nothing and says
// so once.
func (d *Datapath) reconcile(what string, write func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	unlock, err := d.lockPins()
	if err != nil {
		return err
	}
	defer unlock()
	running, ours, err := d.owner()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if running != ours {
		if !d.superseded {
			d.superseded = true
			d.log.Info("a newer agent runs the datapath: this one leaves the maps to it",
				"running_program_id", running, "own_program_id", ours)
		}
		return nil
	}
	return write()
}
