package datapath

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/userspace-proxy/origdst"
)

// Unusual workloads: sockets an application may use in ways Go's dialer
// never does. Each connect must be captured as an ordinary one is, or pass
// untouched, and leave no handoff behind.

// TestFastOpen: a TCP Fast Open connect, by sendto(MSG_FASTOPEN) on an
// unconnected socket or by connect() with TCP_FASTOPEN_CONNECT (the SYN
// deferred to the first write), runs connect4 as connect() does. Its
// handoff is published before the SYN leaves, so a proxy whose listener
// takes Fast Open, whose accepted socket is made from the SYN before any
// SYN-ACK (a TFO child), still finds the original destination.
func TestFastOpen(t *testing.T) {
	tp := newTopology(t)
	d := tp.openCapturing(t, Service{Addr: vip4})
	// Server Fast Open without cookies, in the test's node netns only:
	// TFO_SERVER_ENABLE | TFO_SERVER_COOKIE_NOT_REQD (include/net/tcp.h).
	if err := tp.node.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_fastopen", []byte("0x203"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	connects := []struct {
		name    string
		connect func(fd int, data []byte) error
	}{
		{"sendto MSG_FASTOPEN", func(fd int, data []byte) error {
			return unix.Sendto(fd, data, unix.MSG_FASTOPEN, sockaddr4(vip4))
		}},
		{"TCP_FASTOPEN_CONNECT", func(fd int, data []byte) error {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 1); err != nil {
				return err
			}
			if err := unix.Connect(fd, sockaddr4(vip4)); err != nil {
				return fmt.Errorf("connect: %w", err)
			}
			_, err := unix.Write(fd, data)
			return err
		}},
	}
	for _, proxyFastOpen := range []bool{false, true} {
		for _, c := range connects {
			t.Run(fmt.Sprintf("%s/proxy fast open %v", c.name, proxyFastOpen), func(t *testing.T) {
				ln := listenProxy(t, tp.node, tp.nodeProxy().V4)
				defer ln.Close()
				if proxyFastOpen {
					onSocket(t, ln.(syscall.Conn), func(fd int) error {
						return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_FASTOPEN, 16)
					})
				}
				delta := counterDelta(t, d)
				app, err := socketIn(tp.pod, unix.AF_INET, unix.SOCK_STREAM, func(fd int) error {
					return c.connect(fd, []byte("hello"))
				})
				if err != nil {
					t.Fatal(err)
				}
				defer app.Close()
				s, err := ln.Accept()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if got := tfoChild(t, s.(*net.TCPConn)); got != proxyFastOpen {
					t.Fatalf("accepted socket is a Fast Open child: %v, want %v", got, proxyFastOpen)
				}
				if got, err := origdst.Get(s.(*net.TCPConn)); err != nil || got != vip4 {
					t.Errorf("origdst.Get = %v, %v; want %s", got, err, vip4)
				}
				s.SetDeadline(time.Now().Add(ioTimeout))
				if got, err := io.ReadAll(io.LimitReader(s, 5)); err != nil || string(got) != "hello" {
					t.Errorf("proxy read %q, %v; want the data sent with the connect", got, err)
				}
				if peer, err := peerName(app); err != nil || peer != vip4 {
					t.Errorf("getpeername = %v, %v; want %s", peer, err, vip4)
				}
				if got, want := delta(), map[Decision]uint64{Redirected: 1}; !equalMaps(got, want) {
					t.Errorf("counters grew by %v, want %v", got, want)
				}
				wantNoHandoffs(t, d)
			})
		}
	}
}

// tfoChild reports whether the kernel made c from a Fast Open SYN.
func tfoChild(t *testing.T, c *net.TCPConn) bool {
	t.Helper()
	var info *unix.TCPInfo
	onSocket(t, c, func(fd int) (err error) {
		info, err = unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		return err
	})
	const tcpiOptTFOChild = 128 // TCPI_OPT_TFO_CHILD, <linux/tcp.h>
	return info.Options&tcpiOptTFOChild != 0
}

// TestDisconnectThenConnect: an application socket whose redirected
// connection it ended with connect(AF_UNSPEC) may connect again. To another
// address that connection is not redirected, and getpeername shows where it
// went, not the Service the socket's storage kept; to the Service again it
// is redirected again, with its new original destination.
func TestDisconnectThenConnect(t *testing.T) {
	tp := newTopology(t)
	d := tp.openCapturing(t, Service{Addr: vip4})
	proxy := startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4},
		map[netip.AddrPort]netip.AddrPort{vip4: tp.server4})
	for _, tc := range []struct {
		name  string
		again netip.AddrPort
		greet []string
	}{
		{"elsewhere", tp.server4, []string{"server"}},
		{"the Service again", vip4, []string{"proxy " + vip4.String(), "server"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app, err := socketIn(tp.pod, unix.AF_INET, unix.SOCK_STREAM, func(fd int) error {
				if err := unix.Connect(fd, sockaddr4(vip4)); err != nil {
					return fmt.Errorf("connect to the Service: %w", err)
				}
				if err := disconnect(fd); err != nil {
					return fmt.Errorf("connect(AF_UNSPEC): %w", err)
				}
				if err := unix.Connect(fd, sockaddr4(tc.again)); err != nil {
					return fmt.Errorf("connect again: %w", err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			defer app.Close()
			if got := proxy.next(t); got.orig != vip4 {
				t.Errorf("proxy read original destination %v, %v; want %s", got.orig, got.err, vip4)
			}
			if got, err := readLines(app, len(tc.greet)); err != nil || !slices.Equal(got, tc.greet) {
				t.Errorf("after connecting again to %s: greeting %q, %v; want %q", tc.again, got, err, tc.greet)
			}
			if peer, err := peerName(app); err != nil || peer != tc.again {
				t.Errorf("getpeername after connecting again = %v, %v; want %s", peer, err, tc.again)
			}
			if tc.again == vip4 {
				if got := proxy.next(t); got.orig != vip4 {
					t.Errorf("proxy read original destination %v, %v; want %s", got.orig, got.err, vip4)
				}
			}
			wantNoHandoffs(t, d)
		})
	}
}

// TestUDPPassesThrough: connect() on a UDP socket to a captured address and
// port (DNS over UDP to a Service whose TCP port 53 is captured, say) is no
// connect decision: the hooks leave it to the kernel and count nothing (a
// rewrite would count, as getpeername would hide it).
func TestUDPPassesThrough(t *testing.T) {
	tp := newTopology(t)
	d := tp.openCapturing(t, Service{Addr: vip4})
	delta := counterDelta(t, d)
	var peer netip.AddrPort
	err := tp.pod.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, sockaddr4(vip4)); err != nil {
			return err
		}
		sa, err := unix.Getpeername(fd)
		if err != nil {
			return err
		}
		peer = sockaddrAddrPort(sa)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if peer != vip4 {
		t.Errorf("UDP socket connected to %s, want %s", peer, vip4)
	}
	if got := delta(); len(got) != 0 {
		t.Errorf("counters grew by %v for a UDP connect, want nothing", got)
	}
}

// TestHandoffMapFull: with the handoff map full of entries no connection
// will take (left by sockets that closed unseen), a new connection still
// hands its original destination over: the map is LRU, so the oldest
// entry makes room, where a plain hash map would refuse the write and the
// proxy would close every new connection unserved.
func TestHandoffMapFull(t *testing.T) {
	tp := newTopology(t)
	d := tp.openCapturing(t, Service{Addr: vip4})
	proxy := startProxy(t, tp.node, tp.node, []netip.AddrPort{tp.nodeProxy().V4},
		map[netip.AddrPort]netip.AddrPort{vip4: tp.server4})
	n := int(d.objs.SmHandoff.MaxEntries())
	keys := make([]sockmeshSmHandoffKey, n)
	for i := range keys {
		// netns cookie 1 is the initial netns's, which the topology
		// never uses: no connection here has these keys.
		keys[i] = sockmeshSmHandoffKey{NetnsCookie: 1, ClientPort: uint16(i), ProxyPort: uint16(i >> 16)}
	}
	if _, err := d.objs.SmHandoff.BatchUpdate(keys, make([]sockmeshSmOrigDst, n), nil); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		v, err := dialAndGreet(tp.pod, vip4, nil)
		wantRedirected(t, v, err, vip4)
		if got := proxy.next(t); got.err != nil || got.orig != vip4 {
			t.Errorf("proxy read original destination %v, %v; want %s", got.orig, got.err, vip4)
		}
	}
}

// socketIn makes a socket in ns, hands it to setup (which connects it) and
// returns it as a net.Conn.
func socketIn(ns *sandbox.NetNS, domain, typ int, setup func(fd int) error) (net.Conn, error) {
	var fd int
	err := ns.Do(func() error {
		var err error
		if fd, err = unix.Socket(domain, typ|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		if err := setup(fd); err != nil {
			unix.Close(fd)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "socket")
	defer f.Close()
	return net.FileConn(f)
}

// disconnect is connect(fd, AF_UNSPEC): it ends a TCP connection and leaves
// the socket free to connect again. x/sys/unix has no AF_UNSPEC Sockaddr.
func disconnect(fd int) error {
	var sa unix.RawSockaddrInet4 // Family 0: AF_UNSPEC
	_, _, errno := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), unix.SizeofSockaddrInet4)
	if errno != 0 {
		return errno
	}
	return nil
}

func sockaddr4(a netip.AddrPort) *unix.SockaddrInet4 {
	return &unix.SockaddrInet4{Addr: a.Addr().As4(), Port: int(a.Port())}
}

// readLines reads n lines from c, without their newlines.
func readLines(c net.Conn, n int) ([]string, error) {
	c.SetDeadline(time.Now().Add(ioTimeout))
	var (
		out  []string
		line []byte
		b    [1]byte
	)
	for len(out) < n {
		if _, err := c.Read(b[:]); err != nil {
			return out, errors.Join(fmt.Errorf("after %q", out), err)
		}
		if b[0] != '\n' {
			line = append(line, b[0])
			continue
		}
		out, line = append(out, string(line)), nil
	}
	return out, nil
}
