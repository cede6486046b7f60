package takeover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

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
