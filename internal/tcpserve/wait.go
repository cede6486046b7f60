package tcpserve

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// WaitSocket waits until done, asked of c's descriptor, reports true: for
// a state of the socket no call returns, such as bytes queued or a reset
// taken. It fails t after 10 s (a hang guard) or when done fails.
func WaitSocket(t testing.TB, c *net.TCPConn, done func(fd int) (bool, error)) {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		var ok bool
		var derr error
		if err := raw.Control(func(fd uintptr) { ok, derr = done(int(fd)) }); err != nil {
			t.Fatal(err)
		}
		if derr != nil {
			t.Fatal(derr)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the socket did not get there in 10 s")
		}
	}
}

// WaitQueued waits until c's receive queue holds at least n bytes: they
// arrived, and a read takes them without waiting.
func WaitQueued(t testing.TB, c *net.TCPConn, n int64) {
	t.Helper()
	WaitSocket(t, c, func(fd int) (bool, error) {
		queued, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
		return int64(queued) >= n, err
	})
}
