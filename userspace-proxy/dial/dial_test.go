package dial_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath/mark"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// TestDirectMarks: Direct's sockets carry the mark the datapath skips —
// mark.Proxy unless configured otherwise, none when Unmarked — and come
// back as sockio Conns, which the relay and the pools read without a
// buffer while idle.
func TestDirectMarks(t *testing.T) {
	ns := sandbox.NewNetNS(t)
	ln, err := ns.Listen(context.Background(), nil, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ep := snapshot.Endpoint{Addr: ln.Addr().(*net.TCPAddr).AddrPort()}
	for _, tc := range []struct {
		name string
		cfg  dial.Config
		want uint32
	}{
		{"default", dial.Config{}, mark.Proxy},
		{"configured", dial.Config{Mark: 0x1234}, 0x1234},
		{"unmarked", dial.Config{Unmarked: true, Mark: 0x1234}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c net.Conn
			if err := ns.Do(func() (err error) {
				c, err = dial.NewDirect(tc.cfg).Dial(t.Context(), ep)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if sockio.Of(c) == nil {
				t.Errorf("Dial returned a %T, want a sockio Conn", c)
			}
			rc, err := sockio.TCP(c).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var got int
			var sockErr error
			rc.Control(func(fd uintptr) { got, sockErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) })
			if sockErr != nil || uint32(got) != tc.want {
				t.Errorf("SO_MARK = %#x, %v; want %#x", got, sockErr, tc.want)
			}
		})
	}
}

// TestDirectRefused: a refused connect is an error that names the
// endpoint and keeps the cause for errors.Is.
func TestDirectRefused(t *testing.T) {
	ns := sandbox.NewNetNS(t)
	ln, err := ns.Listen(context.Background(), nil, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close() // nothing listens there now
	err = ns.Do(func() error {
		c, err := dial.NewDirect(dial.Config{}).Dial(t.Context(), snapshot.Endpoint{Addr: addr})
		if err == nil {
			c.Close()
		}
		return err
	})
	if !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), addr.String()) {
		t.Errorf("Dial to a closed port = %v; want ECONNREFUSED naming %s", err, addr)
	}
}
