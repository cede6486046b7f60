package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
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
//
// If the newer agent dies while the older still runs (a build that
// crashes after it opened the datapath), the older takes the datapath back
// at its next heartbeat: it attaches its programs again and writes its
// latest services and enrolments. The sm_owner map, which this package
// creates and pins beside the programs' maps, says which process opened
// the datapath last and with which program, so that a process gone can be
// told from one running; an owner it does not name (a build before it) or
// cannot see (another PID namespace) counts as running. With three agents
// (an update started during another), the newer of the two left takes it
// back, whichever heartbeat comes first: the sm_owners map lists the
// owners still running, newest first.
//
// A newer agent given another --cgroup moves the links there: the pins
// then hold links of its own, and the older agent's connect links,
// detached, no longer capture anything (its other links serve its proxy
// until it closes the datapath: attach). So ownership is read from the
// pins, and a take-back attaches afresh on this process's cgroup,
// detaching the exited agent's programs from its own.

// ownerRecord is the sm_owner map's one value, and sm_owners' values.
type ownerRecord struct {
	PID    uint32
	ProgID uint32 // its connect4 program
	// Start is when the process started (clock ticks after boot, field
	// 22 of /proc/PID/stat): a PID alone may have been reused.
	Start uint64
	// PIDNS is the inode of the process's PID namespace: a PID means
	// nothing in another one (an agent run without hostPID).
	PIDNS uint64
}

// ownersLen is how many running owners sm_owners remembers.
const ownersLen = 8

// openOwnerMap opens (or creates) the pinned owner map name in dir, with
// room for n records.
func openOwnerMap(dir, name string, n uint32) (*ebpf.Map, error) {
	m, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{
		Name: name, Type: ebpf.Array, KeySize: 4, ValueSize: 24, MaxEntries: n, Pinning: ebpf.PinByName,
	}, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		return nil, fmt.Errorf("open the owner map %s in %s: %w", name, dir, err)
	}
	return m, nil
}

// processStart returns when process pid started, or an error wrapping
// os.ErrNotExist when there is no such process.
func processStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces;
	// field 22 is the 20th after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return strconv.ParseUint(string(fields[19]), 10, 64)
}

// pidNamespace returns the inode of this process's PID namespace.
func pidNamespace() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0, fmt.Errorf("stat /proc/self/ns/pid: %w", err)
	}
	return st.Ino, nil
}

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
// this process's. The pinned link, not the one this process holds: a newer
// agent attached to another cgroup pins links of its own and detaches ours,
// which go on naming our program. running is 0 while a hook has no pinned
// link.
func (d *Datapath) owner() (running, ours ebpf.ProgramID, err error) {
	if d.closed {
		return 0, 0, errors.New("datapath closed")
	}
	pinfo, err := d.objs.Connect4.Info()
	if err != nil {
		return 0, 0, fmt.Errorf("read our connect4 program: %w", err)
	}
	ours, _ = pinfo.ID()
	for _, h := range hooks {
		if !exists(filepath.Join(d.cfg.pinDir(), "links", h.name)) {
			return 0, ours, nil // no one runs the datapath (ownerGone)
		}
	}
	l, err := link.LoadPinnedLink(filepath.Join(d.cfg.pinDir(), "links", "connect4"), nil)
	if err != nil {
		return 0, 0, fmt.Errorf("read the pinned connect4 link: %w", err)
	}
	info, err := l.Info()
	l.Close()
	if err != nil {
		return 0, 0, fmt.Errorf("read the pinned connect4 link: %w", err)
	}
	return info.Program, ours, nil
}

// claim records this process as the owner, in sm_owners and sm_owner.
// Called under the pin lock.
func (d *Datapath) claim() error {
	rec, err := d.record()
	if err != nil {
		return err
	}
	if err := d.lead(rec); err != nil {
		return err
	}
	if err := d.ownerMap.Put(uint32(0), rec); err != nil {
		return fmt.Errorf("claim the datapath: %w", err)
	}
	return nil
}

// record returns this process's owner record.
func (d *Datapath) record() (ownerRecord, error) {
	_, ours, err := d.owner()
	if err != nil {
		return ownerRecord{}, err
	}
	start, err := processStart(os.Getpid())
	if err != nil {
		return ownerRecord{}, fmt.Errorf("claim the datapath: %w", err)
	}
	pidns, err := pidNamespace()
	if err != nil {
		return ownerRecord{}, fmt.Errorf("claim the datapath: %w", err)
	}
	return ownerRecord{PID: uint32(os.Getpid()), ProgID: uint32(ours), Start: start, PIDNS: pidns}, nil
}

// lead writes sm_owners: rec, then the earlier owners still running. The
// others are dropped, or a crash-looping agent's restarts would push the
// running ones out. Called under the pin lock.
func (d *Datapath) lead(rec ownerRecord) error {
	recs := []ownerRecord{rec}
	for i := range uint32(ownersLen) {
		var prev ownerRecord
		if err := d.owners.Lookup(i, &prev); err != nil {
			return fmt.Errorf("claim the datapath: read the owners map: %w", err)
		}
		if prev.PID == 0 || len(recs) == ownersLen {
			break
		}
		// One it cannot check (a process exiting as it is read) is kept.
		if running, err := isRunning(prev, rec.PIDNS); (err != nil || running) && prev != rec {
			recs = append(recs, prev)
		}
	}
	for i := range uint32(ownersLen) {
		var r ownerRecord
		if int(i) < len(recs) {
			r = recs[i]
		}
		if err := d.owners.Put(i, r); err != nil {
			return fmt.Errorf("claim the datapath: write the owners map: %w", err)
		}
	}
	return nil
}

// saveOwners returns a function that writes back what sm_owner and
// sm_owners hold now. Called under the pin lock.
func (d *Datapath) saveOwners() (restore func() error, err error) {
	var owner ownerRecord
	if err := d.ownerMap.Lookup(uint32(0), &owner); err != nil {
		return nil, fmt.Errorf("read the owner map: %w", err)
	}
	owners := make([]ownerRecord, ownersLen)
	for i := range owners {
		if err := d.owners.Lookup(uint32(i), &owners[i]); err != nil {
			return nil, fmt.Errorf("read the owners map: %w", err)
		}
	}
	return func() error {
		errs := []error{d.ownerMap.Put(uint32(0), owner)}
		for i, r := range owners {
			errs = append(errs, d.owners.Put(uint32(i), r))
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("restore the owner maps: %w", err)
		}
		return nil
	}, nil
}

// isRunning reports whether the process rec names runs. One in another PID
// namespace than pidns, which it cannot see, counts as running.
func isRunning(rec ownerRecord, pidns uint64) (bool, error) {
	if rec.PIDNS != pidns {
		return true, nil
	}
	start, err := processStart(int(rec.PID))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return start == rec.Start, nil
}

// nextInLine reports whether this process, whose program is ours, is the
// latest owner in sm_owners still running: the one to take the datapath
// back from an owner gone. An older one leaves it to a newer, whose view
// is the later (one draining before it exits counts too: the take-back
// waits for it). Called under the pin lock.
func (d *Datapath) nextInLine(ours ebpf.ProgramID) (bool, error) {
	pidns, err := pidNamespace()
	if err != nil {
		return false, err
	}
	for i := range uint32(ownersLen) {
		var rec ownerRecord
		if err := d.owners.Lookup(i, &rec); err != nil {
			return false, fmt.Errorf("read the owners map: %w", err)
		}
		if rec.PID == 0 {
			break
		}
		if ebpf.ProgramID(rec.ProgID) == ours && rec.PID == uint32(os.Getpid()) {
			return true, nil
		}
		if running, err := isRunning(rec, pidns); err != nil || running {
			return false, err
		}
	}
	return true, nil // no owner it remembers runs (or a build before it wrote none)
}

// ownerGone reports whether the process that runs program running has
// exited. Called under the pin lock.
func (d *Datapath) ownerGone(running ebpf.ProgramID) (bool, error) {
	// A hook without a pinned link: an Open on another cgroup detached
	// ours, then failed or died before its own links were pinned. That
	// hook runs nothing until this process attaches again.
	if running == 0 {
		return true, nil
	}
	rec, found, err := d.recordOf(running)
	if err != nil || !found {
		return false, err // an owner no record names: take it for running
	}
	pidns, err := pidNamespace()
	if err != nil {
		return false, err
	}
	alive, err := isRunning(rec, pidns)
	return !alive, err
}

// recordOf returns the record of the process whose program is prog:
// sm_owner's, or else one in sm_owners, where an agent taking the datapath
// back names itself before sm_owner does (takeBack).
func (d *Datapath) recordOf(prog ebpf.ProgramID) (rec ownerRecord, found bool, err error) {
	names := func(r ownerRecord) bool { return r.PID != 0 && ebpf.ProgramID(r.ProgID) == prog }
	if err := d.ownerMap.Lookup(uint32(0), &rec); err != nil {
		return rec, false, fmt.Errorf("read the owner map: %w", err)
	}
	if names(rec) {
		return rec, true, nil
	}
	for i := range uint32(ownersLen) {
		if err := d.owners.Lookup(i, &rec); err != nil {
			return rec, false, fmt.Errorf("read the owners map: %w", err)
		}
		if names(rec) {
			return rec, true, nil
		}
	}
	return ownerRecord{}, false, nil
}

// owned reports, with d.mu and the pin lock held, whether this process
// owns the datapath, and whether it just took it back from an owner gone.
func (d *Datapath) owned() (mine, tookBack bool, err error) {
	running, ours, err := d.owner()
	if err != nil {
		return false, false, err
	}
	// d.retaking: a take-back failed part way, perhaps once the links ran
	// our programs again; it is finished before anything else is written.
	if running == ours && !d.retaking {
		return true, false, nil
	}
	if running != ours {
		gone, err := d.ownerGone(running)
		if err == nil && gone {
			// The latest earlier owner still running takes it back.
			gone, err = d.nextInLine(ours)
		}
		if err != nil || !gone {
			if err == nil && !d.superseded {
				d.superseded = true
				d.log.Info("a newer agent runs the datapath: this one leaves the maps to it",
					"running_program_id", running, "own_program_id", ours)
			}
			return false, false, err
		}
	}
	d.retaking = true
	if err := d.takeBack(); err != nil {
		return false, false, err
	}
	d.retaking, d.superseded = false, false
	msg := "the agent that took the datapath over has exited: this one runs it again"
	if running == 0 {
		msg = "hooks had no pinned link (another agent's Open failed part way): this one attached its programs again"
	}
	d.log.Warn(msg, "exited_program_id", running, "own_program_id", ours)
	return true, true, nil
}

// takeBack attaches and pins this process's programs again and claims the
// datapath.
func (d *Datapath) takeBack() error {
	// This process heads sm_owners before its programs run the links, and
	// sm_owner names the exited owner until the end: were this process to
	// die part way, the links run the exited owner's programs or ours, each
	// named by a record of a process gone, and the next in line takes the
	// datapath back (ownerGone). One that fails part way, still heading
	// sm_owners, is next in line and retries.
	rec, err := d.record()
	if err != nil {
		return err
	}
	if err := d.lead(rec); err != nil {
		return err
	}
	cg, cgID, err := openCgroup(d.cfg.Cgroup)
	if err != nil {
		return fmt.Errorf("take the datapath back: %w", err)
	}
	defer cg.Close()
	// As Open does: an exited agent that ran on another cgroup moved the
	// pinned links there and detached ours, which no update revives.
	for _, h := range hooks {
		l, prev, err := d.attach(h, cg, cgID)
		if err != nil {
			return fmt.Errorf("take the datapath back: %w", err)
		}
		if prev != nil {
			prev.Close()
		}
		d.links[h.name].Close()
		d.links[h.name] = l
	}
	// The pins under progs/ name the exited agent's programs, which they
	// would keep loaded, and show operators what no longer runs.
	if err := d.pinPrograms(); err != nil {
		return fmt.Errorf("take the datapath back: %w", err)
	}
	// The sk_msg link is set up afresh: an agent that ran without
	// Config.Accelerate detached ours, and one that ran with it may have
	// left its own pinned.
	if l, ok := d.links[accelLink]; ok {
		l.Close()
		delete(d.links, accelLink)
	}
	if err := d.setupAccel(); err != nil {
		return fmt.Errorf("take the datapath back: %w", err)
	}
	return d.claim()
}

// reconcile runs write under the pin lock if this process owns the
// datapath, and keeps it as the latest of its kind (what), to write again
// when this process takes the datapath back.
func (d *Datapath) reconcile(what string, write func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.latest[what] = write
	unlock, err := d.lockPins()
	if err != nil {
		return err
	}
	defer unlock()
	mine, tookBack, err := d.owned()
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", what, err)
	case tookBack:
		return d.writeLatest()
	case mine:
		return write()
	}
	return nil
}

// checkOwner notices, between reconciles, that a newer agent took the
// datapath over, or that it exited, and then takes the datapath back with
// the latest services and enrolments.
func (d *Datapath) checkOwner() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	// Unlocked, a newer agent's Open may be moving the pins: only what is
	// surely ours skips the lock.
	if running, ours, err := d.owner(); err == nil && running == ours && !d.retaking {
		return nil
	}
	unlock, err := d.lockPins()
	if err != nil {
		return err
	}
	defer unlock()
	if _, tookBack, err := d.owned(); err != nil || !tookBack {
		return err
	}
	return d.writeLatest()
}

// writeLatest writes what every kind of reconcile wrote last, each kind
// whatever another's write returned: services left out of a full map
// (ErrServicesLeftOut) must not keep the enrolments from being written.
func (d *Datapath) writeLatest() error {
	var errs []error
	for _, what := range slices.Sorted(maps.Keys(d.latest)) {
		if err := d.latest[what](); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	return errors.Join(errs...)
}
