package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/datapath/cgroup2"
	"github.com/sockmesh/sockmesh/internal/sandbox"
)

func TestConflicts(t *testing.T) {
	cg := sandbox.NewCgroup(t)
	cfg := Config{BPFFS: sandbox.TempBPFFS(t), Cgroup: cg.Path}
	before := loadForeign(t, "smt_before", ebpf.AttachCGroupInet4Connect)
	before.attachTo(t, cg)
	d := openAt(t, cfg, nil)
	after := loadForeign(t, "smt_after", ebpf.AttachCGroupInet4Connect)
	after.attachTo(t, cg)

	got, err := d.Conflicts()
	if err != nil {
		t.Fatal(err)
	}
	want := []Attached{
		{Hook: "connect4", ProgramID: before.id, Name: "smt_before", RunsBeforeOurs: true},
		{Hook: "connect4", ProgramID: after.id, Name: "smt_after", RunsBeforeOurs: false},
	}
	if mine := onlyOf(got, before, after); !slices.Equal(mine, want) {
		t.Errorf("Conflicts() = %+v, want it to hold %+v", got, want)
	}
}

// TestConflictsBelow: programs attached in cgroups below Config.Cgroup (a
// pod's, a container's) run before ours for the processes there. Each is
// listed once, at the cgroup where it is attached; those at Config.Cgroup
// and a sibling's are not listed again.
func TestConflictsBelow(t *testing.T) {
	cg := sandbox.NewCgroup(t)
	cfg := Config{BPFFS: sandbox.TempBPFFS(t), Cgroup: cg.Path}
	kubepods := cg.Sub(t, "kubepods")
	podA, podB := kubepods.Sub(t, "pod-a"), kubepods.Sub(t, "pod-b")
	ctr := podA.Sub(t, "ctr")
	cg.Sub(t, "system")
	sibling := sandbox.NewCgroup(t)

	here := loadForeign(t, "smt_here", ebpf.AttachCGroupInet4Connect)
	pod4 := loadForeign(t, "smt_pod4", ebpf.AttachCGroupInet4Connect)
	pod6 := loadForeign(t, "smt_pod6", ebpf.AttachCGroupInet6Connect)
	here.attachTo(t, cg)
	pod4.attachTo(t, podA)
	pod4.attachTo(t, podB) // one program in two pods: listed at each
	pod6.attachTo(t, ctr)
	pod4.attachTo(t, ctr)
	pod6.attachTo(t, sibling) // not below cfg.Cgroup
	d := openAt(t, cfg, nil)

	got, err := d.Conflicts()
	if err != nil {
		t.Fatal(err)
	}
	want := []Attached{
		{Hook: "connect4", ProgramID: here.id, Name: "smt_here", RunsBeforeOurs: true},
		{Hook: "connect4", ProgramID: pod4.id, Name: "smt_pod4", Cgroup: "kubepods/pod-a", RunsBeforeOurs: true},
		{Hook: "connect4", ProgramID: pod4.id, Name: "smt_pod4", Cgroup: "kubepods/pod-a/ctr", RunsBeforeOurs: true},
		{Hook: "connect6", ProgramID: pod6.id, Name: "smt_pod6", Cgroup: "kubepods/pod-a/ctr", RunsBeforeOurs: true},
		{Hook: "connect4", ProgramID: pod4.id, Name: "smt_pod4", Cgroup: "kubepods/pod-b", RunsBeforeOurs: true},
	}
	if mine := onlyOf(got, here, pod4, pod6); !slices.Equal(mine, want) {
		t.Errorf("Conflicts() = %+v, want it to hold %+v", got, want)
	}
}

// TestConflictsBelowVanishing: cgroups removed during the walk, one after
// its parent was listed and one after it was opened, are skipped, with
// their programs; the walk goes on to the rest.
func TestConflictsBelowVanishing(t *testing.T) {
	cg := sandbox.NewCgroup(t)
	cfg := Config{BPFFS: sandbox.TempBPFFS(t), Cgroup: cg.Path}
	cg.Sub(t, "a")
	b, c, e := cg.Sub(t, "b"), cg.Sub(t, "c"), cg.Sub(t, "e")
	prog := loadForeign(t, "smt_pod4", ebpf.AttachCGroupInet4Connect)
	for _, sub := range []*sandbox.Cgroup{b, c, e} {
		prog.attachTo(t, sub)
	}
	d := openAt(t, cfg, nil)
	ours := make([]ebpf.ProgramID, len(hooks))
	for i, h := range hooks {
		ours[i] = progID(t, h.prog(&d.objs))
	}

	// Conflicts' walk, with cgroups removed as it goes.
	var got []Attached
	err := cgroup2.Walk(cfg.Cgroup, maxCgroupsBelow, func(rel string, dir *os.File) error {
		switch rel {
		case "a": // b is listed, not yet opened
			if err := os.Remove(b.Path); err != nil {
				t.Fatal(err)
			}
		case "c": // c is open, not yet queried
			if err := os.Remove(c.Path); err != nil {
				t.Fatal(err)
			}
		}
		found, err := attachedIn(dir, rel, ours)
		got = append(got, found...)
		return err
	})
	if err != nil {
		t.Fatalf("walk: %v", err)
	}
	want := []Attached{{Hook: "connect4", ProgramID: prog.id, Name: "smt_pod4", Cgroup: "e", RunsBeforeOurs: true}}
	if !slices.Equal(got, want) {
		t.Errorf("programs below = %+v, want %+v", got, want)
	}
}

// TestConflictsTooManyBelow: past maxCgroupsBelow cgroups Conflicts stops
// with cgroup2.ErrTooMany and still returns what it found before, and Open
// warns that it could not list them all and logs those it did find. The
// tree is the real size (a second to make and remove here), so the test
// holds for the limit the agent runs with.
func TestConflictsTooManyBelow(t *testing.T) {
	cg := sandbox.NewCgroup(t)
	cfg := Config{BPFFS: sandbox.TempBPFFS(t), Cgroup: cg.Path}
	first := cg.Sub(t, "a-first") // walked first: siblings go in name order
	prog := loadForeign(t, "smt_first", ebpf.AttachCGroupInet4Connect)
	prog.attachTo(t, first)
	for i := range maxCgroupsBelow {
		cg.Sub(t, fmt.Sprintf("pod-%05d", i))
	}

	var buf bytes.Buffer
	d, err := Open(cfg, slog.New(slog.NewTextHandler(&buf, nil)), nil)
	if err != nil {
		t.Fatalf("open datapath: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Uninstall(); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	logged := buf.String()
	for _, w := range []string{
		fmt.Sprintf(`msg="cannot list other programs on our hooks" .*err=".*stopped after %d"`, maxCgroupsBelow),
		`program_name=smt_first .* cgroup=a-first cgroups=1`,
	} {
		if !regexp.MustCompile(w).MatchString(logged) {
			t.Errorf("Open logged no line matching %q:\n%s", w, logged)
		}
	}

	got, err := d.Conflicts()
	if !errors.Is(err, cgroup2.ErrTooMany) {
		t.Errorf("Conflicts() error = %v, want it to wrap cgroup2.ErrTooMany", err)
	}
	want := []Attached{{Hook: "connect4", ProgramID: prog.id, Name: "smt_first", Cgroup: "a-first", RunsBeforeOurs: true}}
	if mine := onlyOf(got, prog); !slices.Equal(mine, want) {
		t.Errorf("Conflicts() = %+v, want it to hold %+v", got, want)
	}
}

// BenchmarkConflicts walks 2,000 empty cgroups below Config.Cgroup, as a
// node's pods' and containers' might be: 250 pods of 7 containers.
func BenchmarkConflicts(b *testing.B) {
	cg := sandbox.NewCgroup(b)
	for p := range 250 {
		pod := cg.Sub(b, fmt.Sprintf("pod-%d", p))
		for c := range 7 {
			pod.Sub(b, fmt.Sprintf("ctr-%d", c))
		}
	}
	d, err := Open(Config{BPFFS: sandbox.TempBPFFS(b), Cgroup: cg.Path}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Uninstall() })
	for b.Loop() {
		if _, err := d.Conflicts(); err != nil {
			b.Fatal(err)
		}
	}
}

// openAt opens the datapath with cfg, logging to t, from inside ns as an
// agent running there would (nil: this process's netns); it is
// uninstalled when t ends.
func openAt(t *testing.T, cfg Config, ns *sandbox.NetNS) *Datapath {
	t.Helper()
	var d *Datapath
	open := func() (err error) {
		d, err = Open(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), nil)
		return err
	}
	var err error
	if ns == nil {
		err = open()
	} else {
		err = ns.Do(open)
	}
	if err != nil {
		t.Fatalf("open datapath: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Uninstall(); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	return d
}

// foreign is a cgroup/connect program that lets every connect through, as
// another agent's might.
type foreign struct {
	prog   *ebpf.Program
	attach ebpf.AttachType
	id     ebpf.ProgramID
}

// loadForeign loads a foreign program, closed when t ends.
func loadForeign(t *testing.T, name string, attach ebpf.AttachType) foreign {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         name,
		Type:         ebpf.CGroupSockAddr,
		AttachType:   attach,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}, // allow
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return foreign{prog: prog, attach: attach, id: progID(t, prog)}
}

// attachTo attaches f to cg until t ends.
func (f foreign) attachTo(t *testing.T, cg *sandbox.Cgroup) {
	t.Helper()
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cg.Path, Attach: f.attach, Program: f.prog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
}

func progID(t *testing.T, prog *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// onlyOf returns the entries of got that list one of progs: programs
// attached above a test's cgroup (another agent on this machine) may be
// listed too.
func onlyOf(got []Attached, progs ...foreign) []Attached {
	return slices.DeleteFunc(slices.Clone(got), func(a Attached) bool {
		return !slices.ContainsFunc(progs, func(f foreign) bool { return f.id == a.ProgramID })
	})
}

// TestLogConflicts: Open's warnings name each other program once per hook,
// one attached below our cgroup with the first cgroup and how many; it
// logged a line per cgroup, one per pod for a program on every pod's.
func TestLogConflicts(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	logConflicts(log, []Attached{
		{Hook: "connect4", ProgramID: 7, Name: "lb", RunsBeforeOurs: true},
		{Hook: "connect4", ProgramID: 9, Name: "guard", Cgroup: "pod-a", RunsBeforeOurs: true},
		{Hook: "connect4", ProgramID: 9, Name: "guard", Cgroup: "pod-b", RunsBeforeOurs: true},
		{Hook: "connect6", ProgramID: 9, Name: "guard", Cgroup: "pod-a", RunsBeforeOurs: true},
		{Hook: "connect4", ProgramID: 9, Name: "guard", Cgroup: "pod-c", RunsBeforeOurs: true},
	})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{"hook=connect4 program_id=7 ", "hook=connect4 program_id=9 .* cgroup=pod-a cgroups=3$", "hook=connect6 program_id=9 .* cgroup=pod-a cgroups=1$"}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if !regexp.MustCompile(w).MatchString(lines[i]) {
			t.Errorf("line %d %q, want it to match %q", i, lines[i], w)
		}
	}
}

// TestOtherSockopsFlagsKept: another sockops program on our cgroup asks
// for callbacks on the sockets it sees (here RTT, at connect, before ours
// runs); ours, asking for state callbacks on a redirected application's
// socket, must add its flag to those, not replace them (the helper sets
// the socket's whole flag word).
func TestOtherSockopsFlagsKept(t *testing.T) {
	tp := newTopology(t)
	other, seen := loadFlagsRecorder(t)
	other.attachTo(t, tp.cg)
	d := tp.openCapturing(t, Service{Addr: vip4})
	startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4}, map[netip.AddrPort]netip.AddrPort{vip4: tp.server4})

	v, err := dialAndGreet(tp.pod, vip4, nil)
	wantRedirected(t, v, err, vip4)
	wantNoHandoffs(t, d)
	// Two active sockets: the application's, redirected (ours asks for
	// state callbacks), and the proxy's upstream (ours asks for nothing).
	want := map[uint32]uint64{
		unix.BPF_SOCK_OPS_RTT_CB_FLAG | unix.BPF_SOCK_OPS_STATE_CB_FLAG: 1,
		unix.BPF_SOCK_OPS_RTT_CB_FLAG:                                   1,
	}
	if got := seen(); !equalMaps(got, want) {
		t.Errorf("callback flags of the established active sockets = %v (count by flags), want %v", got, want)
	}
}

// loadFlagsRecorder loads a sockops program, closed when t ends, that asks
// for RTT callbacks on each active socket at connect and counts the
// sockets established, by the callback flags they hold then (the low four
// bits); seen reads those counts.
func loadFlagsRecorder(t *testing.T) (f foreign, seen func() map[uint32]uint64) {
	t.Helper()
	kernel, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatal(err)
	}
	var ops *btf.Struct
	if err := kernel.TypeByName("bpf_sock_ops", &ops); err != nil {
		t.Fatal(err)
	}
	var flagsOff int16 = -1
	for _, m := range ops.Members {
		if m.Name == "bpf_sock_ops_cb_flags" {
			flagsOff = int16(m.Offset.Bytes())
		}
	}
	if flagsOff < 0 {
		t.Fatal("struct bpf_sock_ops has no bpf_sock_ops_cb_flags")
	}
	const slots = 16
	counts, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: slots})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { counts.Close() })
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:       "smt_flags",
		Type:       ebpf.SockOps,
		AttachType: ebpf.AttachCGroupSockOps,
		License:    "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.LoadMem(asm.R2, asm.R6, 0, asm.Word), // op
			asm.JEq.Imm(asm.R2, unix.BPF_SOCK_OPS_TCP_CONNECT_CB, "connect"),
			asm.JEq.Imm(asm.R2, unix.BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, "established"),
			asm.Ja.Label("out"),

			asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("connect"),
			asm.Mov.Imm(asm.R2, unix.BPF_SOCK_OPS_RTT_CB_FLAG),
			asm.FnSockOpsCbFlagsSet.Call(),
			asm.Ja.Label("out"),

			asm.LoadMem(asm.R2, asm.R6, flagsOff, asm.Word).WithSymbol("established"),
			asm.And.Imm(asm.R2, slots-1),
			asm.StoreMem(asm.RFP, -4, asm.R2, asm.Word),
			asm.LoadMapPtr(asm.R1, counts.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),

			asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	seen = func() map[uint32]uint64 {
		out := map[uint32]uint64{}
		for k := range uint32(slots) {
			var n uint64
			if err := counts.Lookup(k, &n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				out[k] = n
			}
		}
		return out
	}
	return foreign{prog: prog, attach: ebpf.AttachCGroupSockOps, id: progID(t, prog)}, seen
}
