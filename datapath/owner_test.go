package datapath

import (
	"context"
	"errors"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/sockmesh/sockmesh/datapath/mark"
	"github.com/sockmesh/sockmesh/datapath/takeover"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/userspace-proxy/origdst"
)

// openOlder opens the datapath as the older of two agents and writes its
// view: vip4 captured, the pod enrolled.
func openOlder(t *testing.T, tp *topology) *Datapath {
	t.Helper()
	older := tp.open(t)
	if err := older.SetServices([]Service{{Addr: vip4}}); err != nil {
		t.Fatal(err)
	}
	if err := older.SetEnrolments(map[uint64]Proxy{tp.podCookie: tp.nodeProxy()}); err != nil {
		t.Fatal(err)
	}
	return older
}

// TestNewerOpenOwnsTheMaps: two agents on one node, as a rolling update
// with maxSurge runs them. Once the newer has opened the datapath the older
// writes nothing, whatever order their writes come in: its view (another
// build's, another proxy mode's) would otherwise stay whenever it wrote
// last.
func TestNewerOpenOwnsTheMaps(t *testing.T) {
	tp := newTopology(t)
	older := openOlder(t, tp)
	newer := tp.open(t)
	for _, c := range []struct {
		name string
		d    *Datapath
		want bool
	}{{"older", older, true}, {"newer", newer, false}} {
		running, ours, err := c.d.owner()
		if err != nil {
			t.Fatal(err)
		}
		if superseded := running != ours; superseded != c.want {
			t.Errorf("%s agent: superseded = %v (links run program %d, its own is %d), want %v", c.name, superseded, running, ours, c.want)
		}
	}

	if err := newer.SetServices([]Service{{Addr: vip6}}); err != nil {
		t.Fatal(err)
	}
	if err := newer.SetEnrolments(map[uint64]Proxy{}); err != nil {
		t.Fatal(err)
	}
	// The older agent writes after the newer: nothing of it may land.
	if err := older.SetServices([]Service{{Addr: vip4}}); err != nil {
		t.Fatal(err)
	}
	if err := older.SetEnrolments(map[uint64]Proxy{tp.podCookie: tp.nodeProxy()}); err != nil {
		t.Fatal(err)
	}
	svcs, err := newer.Services()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(svcs, []Service{{Addr: vip6}}) {
		t.Errorf("services = %v, want the newer agent's [%v]", svcs, vip6)
	}
	enrolled, err := newer.Enrolments()
	if err != nil {
		t.Fatal(err)
	}
	if len(enrolled) != 0 {
		t.Errorf("enrolments = %v, want the newer agent's (none)", slices.Collect(maps.Keys(enrolled)))
	}
}

// TestNewerOnAnotherCgroupOwnsTheMaps: the newer agent attaches to another
// cgroup (its --cgroup changed in the update), which moves the pinned links
// there and detaches the older agent's. The older, whose links still name
// its programs, must still leave the maps to the newer one.
func TestNewerOnAnotherCgroupOwnsTheMaps(t *testing.T) {
	tp := newTopology(t)
	newerCfg := tp.cfg
	newerCfg.Cgroup = sandbox.NewCgroup(t).Path
	older := openOlder(t, tp)
	newer, err := Open(newerCfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Close()
	if err := newer.SetServices([]Service{{Addr: vip6}}); err != nil {
		t.Fatal(err)
	}
	// The older agent writes after the newer: nothing of it may land.
	if err := older.SetServices([]Service{{Addr: vip4}}); err != nil {
		t.Fatal(err)
	}
	if err := older.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	if svcs, err := newer.Services(); err != nil || !slices.Equal(svcs, []Service{{Addr: vip6}}) {
		t.Errorf("services = %v, %v; want the newer agent's [%v]", svcs, err, vip6)
	}
	wantAttached(t, newer, true, true)
	// Its other programs run on until it closes the datapath: its proxy
	// still serves (TestOlderProxyOnAnotherCgroup).
	wantAttached(t, older, false, true)
}

// TestOlderProxyOnAnotherCgroup: the newer agent attaches to another
// cgroup that holds the pods but not the older agent's proxy (the
// DaemonSet's --cgroup changed in the update). Until the newer agent takes
// the proxy's address over, the older agent's listener accepts the pods'
// redirected connections: its proxy must still read their original
// destinations with getsockopt, or it closes them (an earlier build's
// proxy has no Datapath.OrigDst to turn to). Once the older agent closes
// the datapath, as it does when it exits, none of its programs stays
// behind.
func TestOlderProxyOnAnotherCgroup(t *testing.T) {
	tp := newTopology(t)
	pods := sandbox.NewCgroup(t)
	newerCfg := tp.cfg
	newerCfg.Cgroup = pods.Path
	older := openOlder(t, tp)
	// The older agent's proxy listens from its own cgroup, tp.cg.
	p := startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4}, map[netip.AddrPort]netip.AddrPort{vip4: tp.server4})
	runLoader(t, loaderJob{Config: newerCfg, Cookie: tp.podCookie, Proxy: tp.nodeProxy(),
		Services: []Service{{Addr: vip4}}})

	pods.Enter(t) // the application's socket is made in the newer agent's cgroup
	v, err := dialAndGreet(tp.pod, vip4, nil)
	if a := p.next(t); a.err != nil {
		t.Errorf("the older agent's proxy read no original destination: %v", a.err)
	}
	wantRedirected(t, v, err, vip4)

	if err := older.Close(); err != nil {
		t.Fatal(err)
	}
	cg, err := os.Open(tp.cfg.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	for _, h := range hooks {
		left, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.Fd()), Attach: h.attach})
		if err != nil {
			t.Fatal(err)
		}
		if len(left.Programs) != 0 {
			t.Errorf("%s programs on the older agent's cgroup after it closed: %v, want none", h.name, left.Programs)
		}
	}
}

// TestHandedOverFromAnotherCgroup: a redirected connection waits in the
// queue of the older agent's listener when the newer agent, on another
// cgroup, takes the proxy's address over; the older agent's listener
// closes, which hands the connection to the newer's (takeover), and the
// older agent exits before the newer accepts it. No getsockopt program
// runs any more for the connection's cgroup, the one the older agent's
// listener was made in, but the newer agent's proxy must still learn its
// original destination, or it closes the connection.
func TestHandedOverFromAnotherCgroup(t *testing.T) {
	tp := newTopology(t)
	pods := sandbox.NewCgroup(t)
	newerCfg := tp.cfg
	newerCfg.Cgroup = pods.Path
	older := openOlder(t, tp)
	listen := func() *net.TCPListener {
		t.Helper()
		ln, err := tp.node.Listen(context.Background(), takeover.ListenConfig(nil), "tcp", tp.nodeProxy().V4.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		if err := takeover.Take(ln); err != nil {
			t.Fatal(err)
		}
		return ln.(*net.TCPListener)
	}
	olderLn := listen()
	newer, err := Open(newerCfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Close()

	pods.Enter(t) // the application's sockets and the newer agent's listener
	app, err := tp.pod.Dial(&net.Dialer{Timeout: ioTimeout}, "tcp", vip4.String())
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	newerLn := listen()
	olderLn.Close()
	if err := older.Close(); err != nil {
		t.Fatal(err)
	}
	newerLn.SetDeadline(time.Now().Add(ioTimeout))
	c, err := newerLn.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := origdst.Get(c); !errors.Is(err, origdst.ErrNotRedirected) {
		t.Fatalf("getsockopt answered (%v): the connection's cgroup still runs a getsockopt program, the test cannot tell", err)
	}
	if got, err := newer.OrigDst(c); err != nil || got != vip4 {
		t.Errorf("the newer agent's OrigDst = %v, %v; want %v", got, err, vip4)
	}
}

// TestTakenBackFromAnotherCgroup: the newer agent that exits had attached
// to another cgroup. The older agent's heartbeat takes the datapath back
// to its own cgroup, where capture works again, and detaches the exited
// agent's programs from the other.
func TestTakenBackFromAnotherCgroup(t *testing.T) {
	tp := newTopology(t)
	newerCfg := tp.cfg
	newerCfg.Cgroup = sandbox.NewCgroup(t).Path
	older := openOlder(t, tp)
	runLoader(t, loaderJob{Config: newerCfg, Cookie: 12345, Proxy: tp.nodeProxy(),
		Services: []Service{{Addr: vip6}}})

	if err := older.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	wantAttached(t, older, true, true)
	wantOwnPins(t, tp, older, "")
	if svcs, err := older.Services(); err != nil || !slices.Equal(svcs, []Service{{Addr: vip4}}) {
		t.Errorf("services = %v, %v; want the older agent's latest [%v]", svcs, err, vip4)
	}
	startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4}, map[netip.AddrPort]netip.AddrPort{vip4: tp.server4})
	v, err := dialAndGreet(tp.pod, vip4, nil)
	wantRedirected(t, v, err, vip4)
	cg, err := os.Open(newerCfg.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	others, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.Fd()), Attach: ebpf.AttachCGroupInet4Connect})
	if err != nil {
		t.Fatal(err)
	}
	if len(others.Programs) != 0 {
		t.Errorf("programs on the exited agent's cgroup: %v, want none", others.Programs)
	}
}

// TestTakenBackWhenTheNewerExits: a newer agent — a process of its own —
// opens the datapath, writes its view and exits, as a build that crashes
// after opening would. The older agent's next heartbeat takes the datapath
// back: its programs run the hooks again, and its latest services and
// enrolments are in the maps.
func TestTakenBackWhenTheNewerExits(t *testing.T) {
	tp := newTopology(t)
	older := openOlder(t, tp)
	const strayCookie = 12345
	runLoader(t, loaderJob{Config: tp.cfg, Cookie: strayCookie, Proxy: tp.nodeProxy(),
		Services: []Service{{Addr: vip6}}})
	if svcs, err := older.Services(); err != nil || !slices.Equal(svcs, []Service{{Addr: vip6}}) {
		t.Fatalf("services after the newer agent = %v, %v; want its [%v]", svcs, err, vip6)
	}

	wantTakenBack(t, older, "after the heartbeat")
	wantOwnPins(t, tp, older, "")
	if svcs, err := older.Services(); err != nil || !slices.Equal(svcs, []Service{{Addr: vip4}}) {
		t.Errorf("services = %v, %v; want the older agent's latest [%v]", svcs, err, vip4)
	}
	enrolled, err := older.Enrolments()
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(enrolled, map[uint64]Proxy{tp.podCookie: tp.nodeProxy()}) {
		t.Errorf("enrolments = %v, want the older agent's latest (the pod's only)", slices.Collect(maps.Keys(enrolled)))
	}
}

// TestMarkHonouredInTheOwnersNetNS: the proxy's mark passes a socket
// through in the netns of the agent whose programs run the links, where
// its proxy dials from. A newer agent in another netns decides the older
// one's marked sockets like any other's, and once the older takes the
// datapath back they pass again.
func TestMarkHonouredInTheOwnersNetNS(t *testing.T) {
	tp := newTopology(t)
	older := tp.open(t) // in the node netns
	// The node netns enrolled (hostNetwork capture), the server captured
	// fail-closed, and no proxy listening: a marked connection that is
	// not passed through is refused.
	svcs := []Service{{Addr: tp.server4}}
	if err := older.SetServices(svcs); err != nil {
		t.Fatal(err)
	}
	if err := older.SetEnrolments(map[uint64]Proxy{tp.nodeCookie: tp.nodeProxy()}); err != nil {
		t.Fatal(err)
	}
	marked := &net.Dialer{Control: mark.Control, Timeout: ioTimeout}
	v, err := dialAndGreet(tp.node, tp.server4, marked)
	wantDirect(t, v, err, tp.server4)

	// The newer agent opens the datapath in this process's netns and exits.
	runLoader(t, loaderJob{Config: tp.cfg, Cookie: tp.nodeCookie, Proxy: tp.nodeProxy(), Services: svcs})
	_, err = dialAndGreet(tp.node, tp.server4, marked)
	wantRefused(t, err)

	wantTakenBack(t, older, "after the heartbeat")
	v, err = dialAndGreet(tp.node, tp.server4, marked)
	wantDirect(t, v, err, tp.server4)
}

// TestTakenBackByTheNewerOfTwoLeft: three agents, as an update started
// during another runs them, and the newest exits — here it crash-loops,
// opening the datapath more times than sm_owners has slots. The newer of
// the two left takes the datapath back, with its view, even when the
// oldest's heartbeat comes first.
func TestTakenBackByTheNewerOfTwoLeft(t *testing.T) {
	tp := newTopology(t)
	oldest := openOlder(t, tp)
	middle := tp.open(t)
	middleSvcs := []Service{{Addr: vip4, FailOpen: true}}
	if err := middle.SetServices(middleSvcs); err != nil {
		t.Fatal(err)
	}
	for range ownersLen {
		runLoader(t, loaderJob{Config: tp.cfg, Cookie: 12345, Proxy: tp.nodeProxy(),
			Services: []Service{{Addr: vip6}}})
	}

	for _, d := range []*Datapath{oldest, middle} {
		if err := d.Heartbeat(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		d    *Datapath
		want bool
	}{{"oldest", oldest, false}, {"middle", middle, true}} {
		running, ours, err := c.d.owner()
		if err != nil {
			t.Fatal(err)
		}
		if owns := running == ours; owns != c.want {
			t.Errorf("%s agent owns the datapath: %v (links run program %d, its own is %d), want %v", c.name, owns, running, ours, c.want)
		}
	}
	if svcs, err := middle.Services(); err != nil || !slices.Equal(svcs, middleSvcs) {
		t.Errorf("services = %v, %v; want the middle agent's %v", svcs, err, middleSvcs)
	}
}

// TestFailedOpenLeavesTheOlderOwner: a newer agent whose Open fails after
// it attached its programs (here: its program pins cannot be replaced)
// must not leave them running the hooks, or the older agent, which cannot
// tell them from a running newer agent's, stops writing the maps for good.
// Nor may the older agent's programs stay detached, as a newer agent on
// another cgroup detaches them, nor the failed agent stay recorded as the
// owner.
func TestFailedOpenLeavesTheOlderOwner(t *testing.T) {
	for _, c := range []struct {
		name        string
		otherCgroup bool
	}{{"same cgroup", false}, {"another cgroup", true}} {
		t.Run(c.name, func(t *testing.T) {
			tp := newTopology(t)
			newerCfg := tp.cfg
			if c.otherCgroup {
				newerCfg.Cgroup = sandbox.NewCgroup(t).Path
			}
			older := openOlder(t, tp)
			pin := filepath.Join(tp.cfg.pinDir(), "progs", "connect6")
			if err := os.Remove(pin); err != nil {
				t.Fatal(err)
			}
			// A non-empty directory: renaming the new program's pin over it fails.
			if err := os.MkdirAll(filepath.Join(pin, "x"), 0o700); err != nil {
				t.Fatal(err)
			}
			records := ownerRecords(t, older)
			if d, err := Open(newerCfg, nil, nil); err == nil {
				d.Close()
				t.Fatal("the newer agent's Open succeeded, want its failure")
			}
			// Or an agent whose Open failed, still running, would pass
			// for the next in line to take the datapath back.
			if got := ownerRecords(t, older); !slices.Equal(got, records) {
				t.Errorf("owner records after the failed Open = %+v, want those before %+v", got, records)
			}
			if err := os.RemoveAll(pin); err != nil {
				t.Fatal(err)
			}
			// On another cgroup the failed Open had detached the older
			// agent's links, which its next heartbeat attaches again.
			wantTakenBack(t, older, "after the failed Open")
			wantAttached(t, older, true, true)
			wantOwnPins(t, tp, older, "connect6") // its pin was in the way
			if err := older.SetServices([]Service{{Addr: vip6}}); err != nil {
				t.Fatal(err)
			}
			if svcs, err := older.Services(); err != nil || !slices.Equal(svcs, []Service{{Addr: vip6}}) {
				t.Errorf("services = %v, %v; want the older agent's [%v]", svcs, err, vip6)
			}
		})
	}
}

// TestCrashedOpenLeavesTheOlderOwner: a newer agent dies in Open once its
// programs run the links, before it would pin them. The older agent takes
// the datapath back at its next heartbeat: the dead agent's programs must
// not pass for a running agent's, which would keep the older one off the
// maps until the newer one restarted.
func TestCrashedOpenLeavesTheOlderOwner(t *testing.T) {
	tp := newTopology(t)
	older := openOlder(t, tp)
	runKilledLoader(t, loaderJob{Config: tp.cfg})
	if running, ours, err := older.owner(); err != nil || running == ours {
		t.Fatalf("links run program %d (the older agent's is %d), %v; want the killed agent's", running, ours, err)
	}

	wantTakenBack(t, older, "after the heartbeat")
	if err := older.SetServices([]Service{{Addr: vip6}}); err != nil {
		t.Fatal(err)
	}
	if svcs, err := older.Services(); err != nil || !slices.Equal(svcs, []Service{{Addr: vip6}}) {
		t.Errorf("services = %v, %v; want the older agent's [%v]", svcs, err, vip6)
	}
}

// TestCrashedTakeBackLeavesTheNextInLine: three agents, as an update
// started during another runs them. The middle one takes the datapath back
// when the newest exits, and dies once its programs run the links again,
// before it would pin them. The oldest, the one left, takes the datapath
// back at its next heartbeat: the dead agent's programs must not pass for
// a running agent's, which would keep it off the maps until the middle one
// restarted.
func TestCrashedTakeBackLeavesTheNextInLine(t *testing.T) {
	tp := newTopology(t)
	oldest := openOlder(t, tp)
	job := loaderJob{Config: tp.cfg, Cookie: 12345, Proxy: tp.nodeProxy(), Services: []Service{{Addr: vip6}}}
	runKilledTakingBack(t, job, func() { runLoader(t, job) })
	if running, ours, err := oldest.owner(); err != nil || running == ours {
		t.Fatalf("links run program %d (the oldest agent's is %d), %v; want the killed agent's", running, ours, err)
	}

	wantTakenBack(t, oldest, "after the heartbeat")
	if svcs, err := oldest.Services(); err != nil || !slices.Equal(svcs, []Service{{Addr: vip4}}) {
		t.Errorf("services = %v, %v; want the oldest agent's latest [%v]", svcs, err, vip4)
	}
}

// TestFailedAttachOnAnotherCgroup: a newer agent on another cgroup moves
// sockops there, then cannot attach getsockopt (the cgroup holds the 64
// programs the kernel allows on a hook), so its Open fails with the older
// agent's sockops link unpinned (the older agent's descriptor keeps it
// attached). The older agent, whose connect4 still runs, attaches and pins
// its programs again at its next heartbeat: unpinned, its sockops would go
// when it exits, and the pinned connect4 left behind would redirect
// connections whose original destinations sockops no longer hands off.
func TestFailedAttachOnAnotherCgroup(t *testing.T) {
	tp := newTopology(t)
	newerCfg := tp.cfg
	newerCfg.Cgroup = sandbox.NewCgroup(t).Path
	fillHook(t, newerCfg.Cgroup, ebpf.CGroupSockopt, ebpf.AttachCGroupGetsockopt)
	older := openOlder(t, tp)
	if d, err := Open(newerCfg, nil, nil); err == nil {
		d.Close()
		t.Fatal("the newer agent's Open succeeded, want its failure")
	}
	if err := older.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	wantAttached(t, older, true, true)
	startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4}, map[netip.AddrPort]netip.AddrPort{vip4: tp.server4})
	v, err := dialAndGreet(tp.pod, vip4, nil)
	wantRedirected(t, v, err, vip4)
}

// fillHook attaches to the cgroup at path as many programs as the kernel
// allows on one hook (BPF_CGROUP_MAX_PROGS), so that one more fails.
func fillHook(t *testing.T, path string, typ ebpf.ProgramType, attach ebpf.AttachType) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: typ, AttachType: attach, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	cg, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	for range 64 {
		l, err := link.AttachRawLink(link.RawLinkOptions{Target: int(cg.Fd()), Program: prog, Attach: attach})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
}

// TestTakenBackAfterAccelTurnedOff: the newer agent that exits ran without
// Config.Accelerate, so its Open detached the sk_msg link the older agent
// holds. The older agent's heartbeat still takes the datapath back, with
// its acceleration attached again and its latest services written.
func TestTakenBackAfterAccelTurnedOff(t *testing.T) {
	tp := newTopology(t)
	tp.cfg.Accelerate = true
	older := openOlder(t, tp)
	newer := tp.cfg
	newer.Accelerate = false
	runLoader(t, loaderJob{Config: newer, Cookie: 12345, Proxy: tp.nodeProxy(),
		Services: []Service{{Addr: vip6}}})

	if err := older.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	if s, err := older.State(); err != nil || !s.Accelerated {
		t.Errorf("State() = accelerated %v, %v; want true", s.Accelerated, err)
	}
	if svcs, err := older.Services(); err != nil || !slices.Equal(svcs, []Service{{Addr: vip4}}) {
		t.Errorf("services = %v, %v; want the older agent's latest [%v]", svcs, err, vip4)
	}
}

// TestTakeBackFinishedAfterFailure: the older agent's take-back fails once
// its programs run the links again (here: a program pin cannot be
// replaced). Its next heartbeat finishes it: its latest services are
// written, not left as the exited agent's.
func TestTakeBackFinishedAfterFailure(t *testing.T) {
	tp := newTopology(t)
	older := openOlder(t, tp)
	runLoader(t, loaderJob{Config: tp.cfg, Cookie: 12345, Proxy: tp.nodeProxy(),
		Services: []Service{{Addr: vip6}}})
	pin := filepath.Join(tp.cfg.pinDir(), "progs", "connect6")
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	// A non-empty directory: renaming a program's pin over it fails.
	if err := os.MkdirAll(filepath.Join(pin, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := older.Heartbeat(); err == nil {
		t.Fatal("the heartbeat took the datapath back, want its failure")
	}
	if err := os.RemoveAll(pin); err != nil {
		t.Fatal(err)
	}
	if err := older.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	if svcs, err := older.Services(); err != nil || !slices.Equal(svcs, []Service{{Addr: vip4}}) {
		t.Errorf("services = %v, %v; want the older agent's latest [%v]", svcs, err, vip4)
	}
	if _, err := os.Lstat(pin); err != nil {
		t.Errorf("program pin: %v", err)
	}
}

// ownerRecords returns sm_owner's record, then sm_owners'.
func ownerRecords(t *testing.T, d *Datapath) []ownerRecord {
	t.Helper()
	recs := make([]ownerRecord, 1+ownersLen)
	if err := d.ownerMap.Lookup(uint32(0), &recs[0]); err != nil {
		t.Fatal(err)
	}
	for i := range uint32(ownersLen) {
		if err := d.owners.Lookup(i, &recs[1+i]); err != nil {
			t.Fatal(err)
		}
	}
	return recs
}

// wantOwnPins checks that progs/ pins d's programs (but except's): what
// operators read with bpftool, and what the pins keep loaded.
func wantOwnPins(t *testing.T, tp *topology, d *Datapath, except string) {
	t.Helper()
	for _, h := range hooks {
		if h.name == except {
			continue
		}
		pinned, err := ebpf.LoadPinnedProgram(filepath.Join(tp.cfg.pinDir(), "progs", h.name), nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := pinned.Info()
		pinned.Close()
		if err != nil {
			t.Fatal(err)
		}
		own, err := h.prog(&d.objs).Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		if ownID, _ := own.ID(); id != ownID {
			t.Errorf("progs/%s pins program %d, want this agent's own %d", h.name, id, ownID)
		}
	}
}

// wantTakenBack runs d's heartbeat, after which d's programs must run the
// links again.
func wantTakenBack(t *testing.T, d *Datapath, after string) {
	t.Helper()
	if err := d.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	running, ours, err := d.owner()
	if err != nil {
		t.Fatal(err)
	}
	if running != ours {
		t.Errorf("the links run program %d %s, want the older agent's own %d", running, after, ours)
	}
}

// wantAttached checks whether d's programs run on d's cgroup, as State
// reports them: the connect programs if capture, the others if rest.
func wantAttached(t *testing.T, d *Datapath, capture, rest bool) {
	t.Helper()
	s, err := d.State()
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range s.Hooks {
		if want := hooks[i].redirects && capture || !hooks[i].redirects && rest; h.Attached != want {
			t.Errorf("%s on %s: attached = %v, want %v", h.Name, s.Cgroup, h.Attached, want)
		}
	}
}

// TestHeartbeatWrittenWhenTakeBackFails: the newer agent exited and the
// older one's take-back fails (here its cgroup is gone). Its heartbeat is
// written all the same, and the error says so (ErrOwnerCheck): the agent
// must not take its proxy for stale, nor count a failed heartbeat.
func TestHeartbeatWrittenWhenTakeBackFails(t *testing.T) {
	tp := newTopology(t)
	olderCfg := tp.cfg
	olderCfg.Cgroup = sandbox.NewCgroup(t).Path
	older := openAt(t, olderCfg, tp.node)
	runLoader(t, loaderJob{Config: tp.cfg, Cookie: 12345, Proxy: tp.nodeProxy()})
	if err := os.Remove(olderCfg.Cgroup); err != nil {
		t.Fatal(err)
	}
	key, never := uint32(0), uint64(0)
	if err := older.objs.SmHeartbeat.Put(&key, &never); err != nil {
		t.Fatal(err)
	}

	err := older.Heartbeat()
	if !errors.Is(err, ErrOwnerCheck) {
		t.Errorf("Heartbeat() = %v, want an error wrapping ErrOwnerCheck", err)
	}
	var beat uint64
	if err := older.objs.SmHeartbeat.Lookup(&key, &beat); err != nil {
		t.Fatal(err)
	}
	if beat == 0 {
		t.Error("heartbeat not written")
	}
}

// TestWriteLatestWritesEveryKind: taking the datapath back writes every
// kind's latest, whatever another kind's write returned — services a full
// map leaves out (ErrServicesLeftOut) stopped the loop, and the
// enrolments, whenever the map's order put them after, stayed the exited
// agent's. Both kinds fail here, so that whichever goes first, the other
// must still be written.
func TestWriteLatestWritesEveryKind(t *testing.T) {
	errEnrol := errors.New("enrolments: no room")
	written := map[string]bool{}
	d := &Datapath{latest: map[string]func() error{
		"set services": func() error {
			written["services"] = true
			return &servicesFullError{maxEntries: 4, left: []string{"app/dual"}}
		},
		"set enrolments": func() error { written["enrolments"] = true; return errEnrol },
	}}
	err := d.writeLatest()
	if !written["services"] || !written["enrolments"] {
		t.Fatalf("written %v after writeLatest = %v, want both kinds", written, err)
	}
	if !errors.Is(err, ErrServicesLeftOut) || !errors.Is(err, errEnrol) {
		t.Fatalf("writeLatest = %v, want both kinds' errors", err)
	}
}
