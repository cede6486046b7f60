package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/datapath/bpffs"
	"github.com/sockmesh/sockmesh/datapath/podns"
)

// Datapath is the loaded (or adopted) eBPF state. Its methods are safe for
// concurrent use: single-entry ones are map operations the kernel serialises
// per element; the reconciling ones (SetServices, SetEnrolments) and Close
// take a lock.
type Datapath struct {
	mu        sync.Mutex // serialises reconciles and Close
	cfg       Config
	log       *slog.Logger
	objs      objects
	links     map[string]link.Link // by hook name
	reg       prometheus.Registerer
	collector prometheus.Collector
	pins      *os.File  // the pin directory, for its lock (owner.go)
	ownerMap  *ebpf.Map // sm_owner (owner.go)
	owners    *ebpf.Map // sm_owners (owner.go)
	closed    bool
	// proxyNetNS is the cookie of the netns Open ran in, the agent's: its
	// proxy dials from there, so only there does its mark mean its socket.
	proxyNetNS uint64
	// superseded: a newer agent took the datapath over (owner.go).
	superseded bool
	// retaking: a take-back has not finished (owner.go).
	retaking bool
	// latest is the last write of each kind of reconcile (owner.go).
	latest map[string]func() error
}

// objects are the parts of the generated collection that production loads:
// every map, the hook programs and, with Config.Accelerate, the sk_msg
// program (not the SEC("syscall") test shims).
type objects struct {
	sockmeshMaps
	hookPrograms
	accelPrograms // nil programs unless Config.Accelerate
}

// hookPrograms run on every node: they need nothing newer than the kernel
// doc.go names.
type hookPrograms struct {
	Connect4     *ebpf.Program `ebpf:"sm_connect4"`
	Connect6     *ebpf.Program `ebpf:"sm_connect6"`
	Getpeername4 *ebpf.Program `ebpf:"sm_getpeername4"`
	Getpeername6 *ebpf.Program `ebpf:"sm_getpeername6"`
	Getsockopt   *ebpf.Program `ebpf:"sm_getsockopt"`
	Sockops      *ebpf.Program `ebpf:"sm_sockops"`
}

// accelPrograms need the kernel acceleration needs (checkAccel): sm_msg
// reads sk_psock.msg_tot_len, which older kernels lack, so the program
// would not even load there.
type accelPrograms struct {
	Msg *ebpf.Program `ebpf:"sm_msg"`
}

// loadTarget is what LoadAndAssign fills for a datapath that does or does
// not accelerate.
func (o *objects) loadTarget(accelerate bool) any {
	if accelerate {
		return o
	}
	return &struct {
		Maps  *sockmeshMaps
		Hooks *hookPrograms
	}{&o.sockmeshMaps, &o.hookPrograms}
}

func (o *objects) Close() error {
	return errors.Join(o.sockmeshMaps.Close(), o.Connect4.Close(), o.Connect6.Close(),
		o.Getpeername4.Close(), o.Getpeername6.Close(), o.Getsockopt.Close(), o.Sockops.Close(), o.Msg.Close())
}

// hook is one of our attach points; name is its pin name and report label.
// redirects: its program decides capture (the connect hooks); the others
// act only on sockets a connect program redirected.
type hook struct {
	name      string
	attach    ebpf.AttachType
	prog      func(*objects) *ebpf.Program
	redirects bool
}

// hooks lists our attach points (a read-only table). sockops comes before
// connect so that by the time a connection can be redirected its handoff is
// already tracked.
var hooks = []hook{
	{"sockops", ebpf.AttachCGroupSockOps, func(o *objects) *ebpf.Program { return o.Sockops }, false},
	{"getsockopt", ebpf.AttachCGroupGetsockopt, func(o *objects) *ebpf.Program { return o.Getsockopt }, false},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(o *objects) *ebpf.Program { return o.Getpeername4 }, false},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, func(o *objects) *ebpf.Program { return o.Getpeername6 }, false},
	{"connect4", ebpf.AttachCGroupInet4Connect, func(o *objects) *ebpf.Program { return o.Connect4 }, true},
	{"connect6", ebpf.AttachCGroupInet6Connect, func(o *objects) *ebpf.Program { return o.Connect6 }, true},
}

// Open loads the programs with cfg's settings and attaches them, adopting
// the state pinned by an earlier run (see the package documentation). log
// may be nil; reg may be nil, otherwise the datapath's metrics are
// registered on it. It returns an error wrapping ebpf.ErrMapIncompatible when
// pinned maps have a layout this build cannot use: Uninstall first.
//
// Open must run in the network namespace the proxy dials its upstreams
// from (the agent's own, not inside podns.NS.Do): the programs skip sockets
// carrying Config.ProxyMark in that namespace only.
func Open(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Datapath, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	proxyNetNS, err := podns.CurrentCookie()
	if err != nil {
		return nil, fmt.Errorf("open datapath: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "datapath")
	if cfg.Accelerate {
		if err := checkAccel(cfg.kernelTypes); err != nil {
			return nil, err
		}
	}
	if err := bpffs.Ensure(cfg.BPFFS); err != nil {
		return nil, err
	}
	dir := cfg.pinDir()
	for _, sub := range []string{"links", "progs"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("create pin directory: %w", err)
		}
	}

	spec, err := loadSockmesh()
	if err != nil {
		return nil, err
	}
	if err := configure(spec, cfg, proxyNetNS); err != nil {
		return nil, err
	}
	pins, err := openPins(dir)
	if err != nil {
		return nil, err
	}
	d := &Datapath{cfg: cfg, proxyNetNS: proxyNetNS, log: log, links: make(map[string]link.Link), reg: reg, pins: pins,
		latest: make(map[string]func() error)}
	if err := d.load(spec); err != nil {
		pins.Close()
		return nil, err
	}
	others, err := d.Conflicts()
	if err != nil {
		log.Warn("cannot list other programs on our hooks", "err", err)
	}
	logConflicts(log, others) // those found before an error too
	if reg != nil {
		d.collector = newCollector(d)
		if err := reg.Register(d.collector); err != nil {
			d.Close()
			return nil, fmt.Errorf("register datapath metrics: %w", err)
		}
	}
	log.Info("datapath ready", "cgroup", cfg.Cgroup, "pin_dir", dir, "proxy_netns_cookie", proxyNetNS)
	return d, nil
}

// load loads the objects, adopting pinned maps, and attaches the programs,
// taking the datapath over from an agent still running (owner.go).
func (d *Datapath) load(spec *ebpf.CollectionSpec) error {
	dir := d.cfg.pinDir()
	unlock, err := d.lockPins()
	if err != nil {
		return err
	}
	defer unlock()
	err = spec.LoadAndAssign(d.objs.loadTarget(d.cfg.Accelerate), &ebpf.CollectionOptions{
		Maps:     ebpf.MapOptions{PinPath: dir},
		Programs: ebpf.ProgramOptions{KernelTypes: d.cfg.kernelTypes},
	})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("load eBPF programs: %w\nverifier log:\n%+v", err, ve)
		}
		return fmt.Errorf("load eBPF objects pinned in %s: %w", dir, err)
	}
	if d.ownerMap, err = openOwnerMap(dir, "sm_owner", 1); err != nil {
		d.objs.Close()
		return err
	}
	if d.owners, err = openOwnerMap(dir, "sm_owners", ownersLen); err != nil {
		d.objs.Close()
		d.ownerMap.Close()
		return err
	}
	// Claimed before the links run our programs: they outlive this
	// process, pinned, and were it to die before naming itself their owner
	// the running agent could not tell them from a live agent's and would
	// leave the maps to no one (owner.go). A failed Open gives the record
	// back.
	restore, err := d.saveOwners()
	if err != nil {
		return errors.Join(err, d.closeObjects())
	}
	if err := d.claim(); err != nil {
		return errors.Join(err, restore(), d.closeObjects())
	}
	settle, err := d.attachAll()
	if err != nil {
		return errors.Join(err, restore(), d.closeObjects())
	}
	for _, step := range []func() error{d.pinPrograms, d.setupAccel} {
		if err := step(); err != nil {
			return errors.Join(err, settle(true), restore(), d.closeObjects())
		}
	}
	return settle(false)
}

// configure sets the programs' load-time constants; proxyNetNS is the
// cookie of the netns the proxy dials from.
func configure(spec *ebpf.CollectionSpec, cfg Config, proxyNetNS uint64) error {
	if cfg.servicesMaxEntries != 0 {
		spec.Maps[sockmeshMapSmServices].MaxEntries = cfg.servicesMaxEntries
	}
	var accelerate uint32
	if cfg.Accelerate {
		accelerate = 1
	}
	vars := map[string]any{
		sockmeshVarSmProxyMark:         cfg.ProxyMark,
		sockmeshVarSmProxyNetns:        proxyNetNS,
		sockmeshVarSmHeartbeatMaxAgeNs: uint64(cfg.HeartbeatMaxAge.Nanoseconds()),
		sockmeshVarSmAccelerate:        accelerate,
	}
	for name, v := range vars {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("configure eBPF programs: variable %s missing", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("configure eBPF programs: set %s: %w", name, err)
		}
	}
	return nil
}

// attachAll attaches every hook, adopting pinned links. On failure, and
// when Open fails later (settle(true)), it removes the links it created and
// gives the adopted ones their programs (and progs/ pins) back: this
// process's programs, left running, would pass for a newer agent's, and the
// agent that ran them would leave the maps to nobody (owner.go).
// settle(false) keeps the new state.
func (d *Datapath) attachAll() (settle func(failed bool) error, err error) {
	cg, cgID, err := openCgroup(d.cfg.Cgroup)
	if err != nil {
		return nil, err
	}
	defer cg.Close()

	// prev holds the programs adopted links ran (nil for created links),
	// so that they outlive the update.
	prev := make(map[string]*ebpf.Program)
	settle = func(failed bool) error {
		var errs []error
		for name, l := range d.links {
			if p, ok := prev[name]; !ok || !failed {
				continue
			} else if p == nil {
				errs = append(errs, l.Unpin())
			} else {
				errs = append(errs, l.Update(p), d.pinProgram(name, p))
			}
		}
		for _, p := range prev {
			errs = append(errs, p.Close())
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("restore the links: %w", err)
		}
		return nil
	}
	for _, h := range hooks {
		l, p, err := d.attach(h, cg, cgID)
		if err != nil {
			err = errors.Join(err, settle(true))
			for name, l := range d.links {
				l.Close()
				delete(d.links, name)
			}
			return nil, err
		}
		d.links[h.name] = l
		prev[h.name] = p
	}
	return settle, nil
}

// openCgroup opens the cgroup at path and returns it with its ID.
func openCgroup(path string) (*os.File, uint64, error) {
	cg, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("open cgroup %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(cg.Fd()), &st); err != nil {
		cg.Close()
		return nil, 0, fmt.Errorf("stat cgroup %s: %w", path, err)
	}
	// On cgroup v2 the directory's inode number is the cgroup ID that link
	// info reports.
	return cg, st.Ino, nil
}

// attach adopts h's pinned link, returning the program it ran, or creates
// and pins a link (prev nil).
func (d *Datapath) attach(h hook, cg *os.File, cgID uint64) (l link.Link, prev *ebpf.Program, err error) {
	path := filepath.Join(d.cfg.pinDir(), "links", h.name)
	prog := h.prog(&d.objs)
	if _, err := os.Stat(path); err == nil {
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("adopt %s link: %w", h.name, err)
		}
		info, err := l.Info()
		if err == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == cgID {
			prev, err := ebpf.NewProgramFromID(info.Program)
			if err != nil {
				l.Close()
				return nil, nil, fmt.Errorf("adopt %s link: open its program: %w", h.name, err)
			}
			if err := l.Update(prog); err != nil {
				prev.Close()
				l.Close()
				return nil, nil, fmt.Errorf("update %s link: %w", h.name, err)
			}
			d.log.Info("adopted pinned link", "hook", h.name, "link_id", info.ID)
			return l, prev, nil
		}
		// Pinned for another cgroup: Config.Cgroup changed since, in a
		// restart or in a rolling update whose older agent still runs. The
		// datapath moves here whole, the older agent's connect programs
		// detached rather than left capturing beside ours: on nested
		// cgroups both would run, and the second, seeing the proxy's
		// address, forgets the original destination the first kept
		// (sm_connect); and an operator who changed --cgroup expects
		// capture where it now points, as after a restart (owner.go).
		// Its other links are only unpinned: they stay attached while the
		// older agent holds them, until it closes the datapath. Its proxy,
		// which this cgroup may not hold, accepts redirected connections
		// until this agent takes its addresses over, and one of a build
		// without OrigDst gets their original destinations only from
		// sockops and getsockopt programs on its own cgroup (the accepted
		// socket's). These programs act only on sockets a connect program
		// redirected, and two on nested cgroups write the same values
		// (with Config.Accelerate, an application's socket joined twice
		// sends over TCP: correct, not accelerated).
		d.log.Info("moving pinned link to another cgroup", "hook", h.name, "cgroup", d.cfg.Cgroup)
		var detach error
		if h.redirects {
			detach = l.Detach()
		}
		if err := errors.Join(detach, l.Unpin(), l.Close()); err != nil {
			return nil, nil, fmt.Errorf("remove %s link of another cgroup: %w", h.name, err)
		}
	}
	raw, err := link.AttachRawLink(link.RawLinkOptions{Target: int(cg.Fd()), Program: prog, Attach: h.attach})
	if err != nil {
		return nil, nil, fmt.Errorf("attach %s to %s: %w", h.name, d.cfg.Cgroup, err)
	}
	if err := raw.Pin(path); err != nil {
		raw.Close()
		return nil, nil, fmt.Errorf("pin %s link: %w", h.name, err)
	}
	return raw, nil, nil
}

// pinPrograms pins (or re-pins) each hook's program under progs/, for
// bpftool and operators; the links keep the programs alive either way.
func (d *Datapath) pinPrograms() error {
	for _, h := range hooks {
		if err := d.pinProgram(h.name, h.prog(&d.objs)); err != nil {
			return err
		}
	}
	return nil
}

// pinProgram pins prog as progs/name, replacing the pin there.
func (d *Datapath) pinProgram(name string, prog *ebpf.Program) error {
	path := filepath.Join(d.cfg.pinDir(), "progs", name)
	// Pin refuses to replace a pin; pin beside it and rename over it.
	// (No dot in the name: bpffs reserves names with dots, EPERM.)
	tmp := path + "-new"
	os.Remove(tmp)
	// Pin a clone: a Program remembers where it pinned and pins nothing
	// when asked for that path again (a take-back re-pins).
	p, err := prog.Clone()
	if err != nil {
		return fmt.Errorf("pin %s program: %w", name, err)
	}
	err = p.Pin(tmp)
	p.Close()
	if err != nil {
		return fmt.Errorf("pin %s program: %w", name, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replace pinned %s program: %w", name, err)
	}
	return nil
}

// Close releases this process's hold on the datapath and unregisters its
// metrics. The pinned links keep capturing; a later Open adopts them. Calls
// after the first do nothing.
func (d *Datapath) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if d.collector != nil {
		d.reg.Unregister(d.collector)
		d.collector = nil
	}
	return errors.Join(d.closeObjects(), d.pins.Close())
}

// closeObjects releases the links and objects this process holds.
func (d *Datapath) closeObjects() error {
	var errs []error
	for name, l := range d.links {
		errs = append(errs, l.Close())
		delete(d.links, name)
	}
	errs = append(errs, d.objs.Close(), d.ownerMap.Close(), d.owners.Close())
	return errors.Join(errs...)
}

// Uninstall detaches every program, removes every pin and closes d: capture
// stops at once, and the maps are freed once no socket storage or process
// holds them.
func (d *Datapath) Uninstall() error {
	return errors.Join(d.Close(), Uninstall(d.cfg))
}

// Uninstall removes the datapath that cfg names without loading it (for a
// CLI, or after Open failed on incompatible pins): it detaches the pinned
// links, even if another process still holds them, and removes the pin
// directory. Nothing pinned is not an error.
func Uninstall(cfg Config) error {
	if cfg.BPFFS == "" {
		cfg.BPFFS = bpffs.DefaultPath
	}
	dir := cfg.pinDir()
	entries, err := os.ReadDir(filepath.Join(dir, "links"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("uninstall: %w", err)
	}
	var errs []error
	for _, e := range entries {
		path := filepath.Join(dir, "links", e.Name())
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("uninstall link %s: %w", e.Name(), err))
			continue
		}
		if err := l.Detach(); err != nil {
			errs = append(errs, fmt.Errorf("uninstall: detach %s: %w", e.Name(), err))
		}
		l.Close()
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("uninstall: remove %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// logConflicts warns of each other program on our hooks once per hook: one
// a security agent attaches to every pod's cgroup would otherwise log a
// line per pod, and push the rest out of the status page's recent events.
// A program below our cgroup names the first cgroup where it is attached
// and how many it is attached in (sockmeshctl status lists them all).
func logConflicts(log *slog.Logger, others []Attached) {
	type key struct {
		hook  string
		id    ebpf.ProgramID
		below bool
	}
	var order []key
	seen := map[key][]Attached{}
	for _, o := range others {
		k := key{o.Hook, o.ProgramID, o.Cgroup != ""}
		if seen[k] == nil {
			order = append(order, k)
		}
		seen[k] = append(seen[k], o)
	}
	for _, k := range order {
		o := seen[k][0]
		msg := "other program attached to a sockmesh hook"
		if o.RunsBeforeOurs && strings.HasPrefix(o.Hook, "connect") {
			msg = "other connect program runs before ours and may rewrite service addresses first"
		}
		attrs := []any{"hook", o.Hook, "program_id", o.ProgramID, "program_name", o.Name, "runs_before_ours", o.RunsBeforeOurs}
		if k.below {
			attrs = append(attrs, "cgroup", o.Cgroup, "cgroups", len(seen[k]))
		}
		log.Warn(msg, attrs...)
	}
}
