package mark_test

import (
	"context"
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/datapath/mark"
	"github.com/sockmesh/sockmesh/internal/sandbox"
)

func TestControl(t *testing.T) {
	ns := sandbox.NewNetNS(t)
	ln, err := ns.Listen(context.Background(), nil, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	check := func(d *net.Dialer, want uint32) {
		t.Helper()
		c, err := ns.Dial(d, "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rc, _ := c.(*net.TCPConn).SyscallConn()
		var got int
		var sockErr error
		rc.Control(func(fd uintptr) { got, sockErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) })
		if sockErr != nil || uint32(got) != want {
			t.Errorf("SO_MARK = %#x, %v; want %#x", got, sockErr, want)
		}
	}
	check(&net.Dialer{Control: mark.Control}, mark.Proxy)
	check(&net.Dialer{Control: mark.ControlWith(0x1234)}, 0x1234)
	check(&net.Dialer{}, 0)
}
