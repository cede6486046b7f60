package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/datapath/bpffs"
	"github.com/sockmesh/sockmesh/datapath/cgroup2"
	"github.com/sockmesh/sockmesh/datapath/podns"
)

func TestMain(m *testing.M) {
	Main(m, map[string]func([]string) error{"whereami": whereami, "wait": wait})
}

// wait runs until it is killed.
func wait([]string) error {
	time.Sleep(24 * time.Hour)
	return errors.New("not killed in a day")
}

// whereami prints the child's netns and cgroup v2 path.
func whereami([]string) error {
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return err
	}
	root, err := cgroup2.Root()
	if err != nil {
		return err
	}
	cg, err := cgroup2.ProcessPath(root, 0)
	if err != nil {
		return err
	}
	fmt.Println(ns, cg)
	return nil
}

func TestNetNS(t *testing.T) {
	ns := NewNetNS(t)
	addrs, err := ns.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if !a.IsLoopback() {
			t.Errorf("fresh netns has address %s, want only loopback", a)
		}
	}
	// Loopback is up: a listener and a dial inside work.
	ln, err := ns.Listen(context.Background(), nil, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := ns.Dial(nil, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial inside netns: %v", err)
	}
	c.Close()
	// ...and the listener is not in the test's own netns.
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Error("dial from the test's netns reached a listener inside the sandbox netns")
	}
	own, err := podns.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	a, errA := own.Cookie()
	b, errB := ns.Cookie()
	if errA != nil || errB != nil || a == b {
		t.Errorf("cookies: own %d (%v), sandbox %d (%v); want two different ones", a, errA, b, errB)
	}
}

// TestNoThreadLeftInForeignNetNS runs many Do calls at once and then checks
// that every thread of the process is back in the process's own netns.
func TestNoThreadLeftInForeignNetNS(t *testing.T) {
	ns := NewNetNS(t)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if err := ns.Do(func() error { return nil }); err != nil {
				t.Error(err)
			}
		})
		errc := ns.Go(func() error { return errors.New("fn error") })
		wg.Go(func() {
			if err := <-errc; err == nil || err.Error() != "fn error" {
				t.Errorf("Go returned %v, want fn's error", err)
			}
		})
	}
	wg.Wait()
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		got, err := os.Readlink(filepath.Join("/proc/self/task", task.Name(), "ns", "net"))
		if err != nil {
			continue // the thread exited
		}
		if got != own {
			t.Errorf("thread %s is in %s, want %s", task.Name(), got, own)
		}
	}
}

func TestVeth(t *testing.T) {
	a, b := NewNetNS(t), NewNetNS(t)
	ipA, ipB := netip.MustParseAddr("fd00:1::1"), netip.MustParseAddr("fd00:1::2")
	NewVeth(t, a, b, []netip.Prefix{netip.PrefixFrom(ipA, 64)}, []netip.Prefix{netip.PrefixFrom(ipB, 64)})
	ln, err := b.Listen(context.Background(), nil, "tcp", netip.AddrPortFrom(ipB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			io.WriteString(c, "hi")
			c.Close()
		}
	}()
	c, err := a.Dial(nil, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial across veth: %v", err)
	}
	defer c.Close()
	if got, _ := io.ReadAll(c); string(got) != "hi" {
		t.Errorf("read %q across veth, want hi", got)
	}
}

func TestStartInNetNSAndCgroup(t *testing.T) {
	ns := NewNetNS(t)
	cg := NewCgroup(t)
	var out strings.Builder
	cmd := HelperCommand(t, "whereami")
	cmd.Stdout = &out
	if err := Start(t, cmd, ns, cg).Wait(); err != nil {
		t.Fatal(err)
	}
	wantNS, err := os.Readlink(filepath.Join(podns.NamedDir, ns.Name))
	if err != nil {
		// A bind mount reads as a file, not a link: compare inodes instead.
		ino, err := ns.Inode()
		if err != nil {
			t.Fatal(err)
		}
		wantNS = fmt.Sprintf("net:[%d]", ino)
	}
	if want := wantNS + " " + cg.Path + "\n"; out.String() != want {
		t.Errorf("child is in %q, want %q", out.String(), want)
	}
}

func TestCgroupEnter(t *testing.T) {
	root, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	before, err := cgroup2.ProcessPath(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	var path string
	t.Run("inside", func(t *testing.T) {
		cg := NewCgroup(t)
		path = cg.Path
		cg.Enter(t)
		if got, err := cgroup2.ProcessPath(root, 0); err != nil || got != cg.Path {
			t.Errorf("process cgroup = %s, %v; want %s", got, err, cg.Path)
		}
	})
	if got, err := cgroup2.ProcessPath(root, 0); err != nil || got != before {
		t.Errorf("process cgroup after the test = %s, %v; want %s", got, err, before)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s after the test: %v, want removed", path, err)
	}
}

// TestCleanup checks that everything a test made is gone once it ends,
// and the child process it left running killed.
func TestCleanup(t *testing.T) {
	var nsPath, cgPath, fsPath, vethName string
	var proc *Process
	t.Run("make", func(t *testing.T) {
		a, b := NewNetNS(t), NewNetNS(t)
		nsPath = filepath.Join(podns.NamedDir, a.Name)
		v := NewVeth(t, a, b, nil, nil)
		vethName = v.A
		cgPath = NewCgroup(t).Path
		fsPath = TempBPFFS(t)
		if ok, err := bpffs.IsMounted(fsPath); err != nil || !ok {
			t.Errorf("TempBPFFS %s is not a bpffs: %v", fsPath, err)
		}
		proc = Start(t, HelperCommand(t, "wait"), nil, nil)
	})
	for _, p := range []string{nsPath, cgPath, fsPath} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the test: %v, want removed", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", vethName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("veth %s visible after the test", vethName)
	}
	select {
	case <-proc.done:
	case <-time.After(10 * time.Second): // a hang guard
		proc.Cmd.Process.Kill()
		t.Fatalf("helper process %d still runs after the test ended, want it killed", proc.Cmd.Process.Pid)
	}
	var exit *exec.ExitError
	if !errors.As(proc.err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("helper process ended with %v, want killed", proc.err)
	}
}

// TestClaimAddrs: a claim holds every other off its prefixes (another open
// of the lock file, as another process makes, cannot lock it) until its
// test ends, and fails while a namespace holds one of their addresses. It
// uses 10.228.0.0/16, which nothing else in this repository uses.
func TestClaimAddrs(t *testing.T) {
	p := netip.MustParsePrefix("10.228.0.0/16")
	locked := func() bool {
		t.Helper()
		f, err := lockAddrs(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		free, err := tryLock(f)
		if err != nil {
			t.Fatal(err)
		}
		return !free
	}
	t.Run("held", func(t *testing.T) {
		ClaimAddrs(t, p)
		if !locked() {
			t.Errorf("%s not locked while claimed", p)
		}
	})
	if locked() {
		t.Errorf("%s still locked after the claiming test ended", p)
	}

	ns := NewNetNS(t)
	ns.AddAddr(t, "lo", netip.MustParsePrefix("10.228.0.1/32"))
	ft := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ClaimAddrs(ft, p)
	}()
	<-done
	if !strings.Contains(ft.msg, ns.Name) || !strings.Contains(ft.msg, "10.228.0.1") {
		t.Errorf("claim while %s holds 10.228.0.1: %q, want a failure naming both", ns.Name, ft.msg)
	}
}

// fatalTB records the message of Fatal and Fatalf and ends the goroutine,
// as testing.T does.
type fatalTB struct {
	TB
	msg string
}

func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
