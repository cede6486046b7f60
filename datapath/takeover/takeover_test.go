package takeover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/internal/testenv"
)

// listen opens a reuseport listener on addr (127.0.0.1:0 for a new port).
func listen(t *testing.T, addr string) *net.TCPListener {
	t.Helper()
	ln, err := ListenConfig(nil).Listen(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.(*net.TCPListener)
}

func mustTake(t *testing.T, ln net.Listener) {
	t.Helper()
	if err := Take(ln); err != nil {
		t.Fatal(err)
	}
}

// joined opens a listener that takes a new address over and another that
// joins it, and returns them and the address.
func joined(t *testing.T) (old, next *net.TCPListener, addr string) {
	t.Helper()
	old = listen(t, "127.0.0.1:0")
	addr = old.Addr().String()
	mustTake(t, old)
	return old, listen(t, addr), addr
}

// dial opens n connections to addr; the kernel completes their handshakes
// whether or not anyone accepts them.
func dial(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var cs []net.Conn
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}

// accepted accepts what ln has waiting (giving the kernel wait to deliver)
// and answers each connection "ok" so that its client can tell it arrived.
func accepted(t *testing.T, ln *net.TCPListener, wait time.Duration) int {
	t.Helper()
	n := 0
	for {
		ln.SetDeadline(time.Now().Add(wait))
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return n
			}
			t.Fatal(err)
		}
		n++
		c.Write([]byte("ok"))
		t.Cleanup(func() { c.Close() })
	}
}

// answered counts the connections whose server said "ok".
func answered(cs []net.Conn) (ok int, errs []error) {
	for _, c := range cs {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 2)
		if _, err := io.ReadFull(c, b); err != nil {
			errs = append(errs, err)
			continue
		}
		ok++
	}
	return ok, errs
}

func TestTakeSteersNewConnections(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 16
	old, next, addr := joined(t) // next not taken: the kernel alone would hash half to it

	cs := dial(t, addr, n)
	if got, stray := accepted(t, old, 200*time.Millisecond), accepted(t, next, 50*time.Millisecond); got != n || stray != 0 {
		t.Errorf("before the new listener takes over: old accepted %d, new %d of %d; want all on the old", got, stray, n)
	}
	answered(cs)

	mustTake(t, next)
	cs = dial(t, addr, n)
	if got, stray := accepted(t, next, 200*time.Millisecond), accepted(t, old, 50*time.Millisecond); got != n || stray != 0 {
		t.Errorf("after the new listener took over: new accepted %d, old %d of %d; want all on the new", got, stray, n)
	}
	if ok, errs := answered(cs); ok != n {
		t.Errorf("%d of %d connections answered: %v", ok, n, errs)
	}
}

// TestClosingListenerHandsOver: connections waiting in the old listener's
// queue when it closes reach the new one; without takeover the kernel
// resets them.
func TestClosingListenerHandsOver(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 16
	for _, withTakeover := range []bool{true, false} {
		t.Run(fmt.Sprintf("takeover=%v", withTakeover), func(t *testing.T) {
			old := listen(t, "127.0.0.1:0")
			addr := old.Addr().String()
			if withTakeover {
				mustTake(t, old)
			}
			cs := dial(t, addr, n) // waiting in the old listener's queue, unaccepted
			next := listen(t, addr)
			if withTakeover {
				mustTake(t, next)
			}
			old.Close()
			got := accepted(t, next, 200*time.Millisecond)
			ok, errs := answered(cs)
			switch {
			case withTakeover && (got != n || ok != n):
				t.Errorf("the new listener accepted %d and answered %d of the %d connections the old one left: %v", got, ok, n, errs)
			case !withTakeover && ok == n:
				t.Errorf("without takeover all %d connections the old listener left still reached the new one: the test cannot tell", n)
			}
		})
	}
}

// TestNewestClosedFallsBack: once the listener that took over closes, the
// ones left get the new connections.
func TestNewestClosedFallsBack(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 16
	old, next, addr := joined(t)
	mustTake(t, next)
	next.Close()
	cs := dial(t, addr, n)
	if got := accepted(t, old, 200*time.Millisecond); got != n {
		t.Errorf("after the newest listener closed, the old one accepted %d of %d", got, n)
	}
	if ok, errs := answered(cs); ok != n {
		t.Errorf("%d of %d connections answered: %v", ok, n, errs)
	}
}

// TestNewestClosedSteersToTheNextNewest: three listeners took the address
// in turn, as an update started during another runs three agents. Once the
// newest closes, the connections waiting in its queue and the new ones all
// go to the listener that took it before, the next newest agent's, not
// over the two left: the oldest agent serves an older snapshot. Also on an
// address that more rolling updates than the steering has slots took
// before.
func TestNewestClosedSteersToTheNextNewest(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 16
	for _, updates := range []int{0, slots + 1} {
		t.Run(fmt.Sprintf("updates=%d", updates), func(t *testing.T) {
			oldest, middle, addr := joined(t)
			for range updates {
				mustTake(t, middle)
				oldest.Close()
				oldest, middle = middle, listen(t, addr)
			}
			mustTake(t, middle)
			newest := listen(t, addr)
			mustTake(t, newest)
			cs := dial(t, addr, n) // waiting in the newest listener's queue
			newest.Close()
			cs = append(cs, dial(t, addr, n)...)
			if got, stray := accepted(t, middle, 200*time.Millisecond), accepted(t, oldest, 50*time.Millisecond); got != 2*n || stray != 0 {
				t.Errorf("after the newest listener closed: the next newest accepted %d, the oldest %d of %d; want all on the next newest", got, stray, 2*n)
			}
			if ok, errs := answered(cs); ok != 2*n {
				t.Errorf("%d of %d connections answered: %v", ok, 2*n, errs)
			}
		})
	}
}

// TestConcurrentTakes: two listeners take one address at once, as two
// agents take the in-pod listener of a pod created while they overlap, on
// a new address and on one a listener took before. The first taker stops
// once it has read the group, before it loads its program; the second
// takes meanwhile as far as it can (to the end, or to the first's lock).
// Both must join the steering: the new connections go to one of them, and
// once it closes to the other, not to the listener that joined first.
func TestConcurrentTakes(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 16
	// cilium/ebpf's feature probes, run once, load programs of their own.
	mustTake(t, listen(t, "127.0.0.1:0"))
	for _, takenBefore := range []bool{false, true} {
		t.Run(fmt.Sprintf("takenBefore=%v", takenBefore), func(t *testing.T) {
			first := listen(t, "127.0.0.1:0")
			addr := first.Addr().String()
			if takenBefore {
				mustTake(t, first)
			}
			a, b := listen(t, addr), listen(t, addr)
			aStopped, aResume, aDone := takeStopped(t, a, unix.SYS_BPF, 0, unix.BPF_PROG_LOAD)
			select {
			case <-aStopped:
			case err := <-aDone:
				t.Fatalf("the first taker did not stop at its program load: %v", err)
			}
			bStopped, bResume, bDone := takeStopped(t, b, unix.SYS_FLOCK, 1, unix.LOCK_EX)
			select {
			case <-bStopped:
				bResume() // and it waits for the lock
			case err := <-bDone:
				bDone = holding(err)
			}
			aResume()
			for _, done := range []<-chan error{aDone, bDone} {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}

			cs := dial(t, addr, n)
			gotA, gotB := accepted(t, a, 200*time.Millisecond), accepted(t, b, 50*time.Millisecond)
			if stray := accepted(t, first, 50*time.Millisecond); max(gotA, gotB) != n || stray != 0 {
				t.Fatalf("the takers accepted %d and %d, the first listener %d of %d; want all on one taker", gotA, gotB, stray, n)
			}
			newest, next := a, b
			if gotB == n {
				newest, next = b, a
			}
			newest.Close()
			cs = append(cs, dial(t, addr, n)...)
			if got, stray := accepted(t, next, 200*time.Millisecond), accepted(t, first, 50*time.Millisecond); got != n || stray != 0 {
				t.Errorf("after the newest taker closed, the other accepted %d, the first listener %d of %d; want all on the other taker", got, stray, n)
			}
			if ok, errs := answered(cs); ok != 2*n {
				t.Errorf("%d of %d connections answered: %v", ok, 2*n, errs)
			}
		})
	}
}

// holding returns a channel that holds err.
func holding(err error) <-chan error {
	c := make(chan error, 1)
	c <- err
	return c
}

// takeStopped runs Take(ln) on a thread of its own, which the kernel stops
// at its first call of syscall nr whose argument arg is val (a seccomp
// user notification). It returns a channel closed once the thread stops
// there, the function that lets it go on, and Take's result.
func takeStopped(t *testing.T, ln net.Listener, nr, arg, val uint32) (stopped <-chan struct{}, resume func(), done <-chan error) {
	t.Helper()
	res, notify := make(chan error, 1), make(chan int, 1)
	go func() {
		// Never unlocked: the filtered thread exits with the goroutine.
		runtime.LockOSThread()
		fd, err := stopAt(nr, arg, val)
		notify <- fd
		if err != nil {
			res <- err
			return
		}
		res <- Take(ln)
	}()
	fd := <-notify
	if fd < 0 {
		t.Fatal(<-res)
	}
	// A thread still stopped then gets ENOSYS.
	t.Cleanup(func() { unix.Close(fd) })
	stop := make(chan struct{})
	var req seccompNotif
	go func() {
		// POLLHUP once the thread has exited, never stopped.
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, -1); err != nil || pfd[0].Revents&unix.POLLIN == 0 {
			return
		}
		if ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&req)) == nil {
			close(stop)
		}
	}()
	resume = func() {
		resp := seccompNotifResp{ID: req.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		if err := ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp)); err != nil {
			t.Fatalf("resume the stopped taker: %v", err)
		}
	}
	return stop, resume, res
}

// seccompNotif and seccompNotifResp are the kernel's struct seccomp_notif
// and seccomp_notif_resp.
type seccompNotif struct {
	ID    uint64
	PID   uint32
	Flags uint32
	Data  [64]byte // struct seccomp_data
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// stopAt installs on the calling thread a seccomp filter under which its
// calls of syscall nr whose argument arg is val wait for the returned
// notification descriptor's answer.
func stopAt(nr, arg, val uint32) (int, error) {
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: nr, Jf: 3},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 16 + 8*arg}, // the argument's low half
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: val, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_USER_NOTIF},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER,
		uintptr(unsafe.Pointer(&prog)))
	if errno != 0 {
		return -1, fmt.Errorf("install the seccomp filter: %w", errno)
	}
	return int(fd), nil
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

// TestListenSaysWhoHoldsTheAddress: an address held without SO_REUSEPORT
// (an agent of an older build) cannot be shared, and the error says why.
func TestListenSaysWhoHoldsTheAddress(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, err = Listen(context.Background(), nil, held.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "without SO_REUSEPORT") {
		t.Errorf("Listen on an address held without SO_REUSEPORT: %v, want an error that says so", err)
	}
}

func TestTakeNeedsReuseport(t *testing.T) {
	testenv.RequireRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := Take(ln); err == nil {
		t.Error("Take on a listener without SO_REUSEPORT succeeded")
	}
}

// BenchmarkConnect: a loopback connection, dialed, accepted and closed, on
// a listener alone and on one that took its address over, whose program
// runs for each connection's SYN.
func BenchmarkConnect(b *testing.B) {
	testenv.RequireRoot(b)
	for _, taken := range []bool{false, true} {
		b.Run(fmt.Sprintf("taken=%v", taken), func(b *testing.B) {
			ln, err := ListenConfig(nil).Listen(context.Background(), "tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			if taken {
				if err := Take(ln); err != nil {
					b.Fatal(err)
				}
			}
			addr := ln.Addr().String()
			for b.Loop() {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				s, err := ln.Accept()
				if err != nil {
					b.Fatal(err)
				}
				s.Close()
				c.Close()
			}
		})
	}
}
