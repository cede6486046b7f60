package datapath

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/origdst"
)

// accelBudget is SM_ACCEL_BUDGET in bpf/sockmesh.h.
const accelBudget = 256 << 10

// maxQueued bounds what an app may write to a connection that pushes back
// before its writes block: the budget and TCP's buffers.
const maxQueued = 32 << 20

// openAccel loads the datapath with acceleration, captures vip4 for the pod
// and sends it to an in-pod proxy on 127.0.0.1:proxyPort, as the bench and
// in-pod mode do.
func openAccel(t *testing.T, tp *topology) (*Datapath, netip.AddrPort) {
	t.Helper()
	tp.cfg.Accelerate = true
	d := tp.open(t)
	if err := d.SetServices([]Service{{Addr: vip4}}); err != nil {
		t.Fatal(err)
	}
	listen := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), proxyPort)
	if err := d.Enrol(tp.podCookie, Proxy{NetNSCookie: tp.podCookie, V4: listen}); err != nil {
		t.Fatal(err)
	}
	return d, listen
}

// startEchoProxy stands in for the proxy: it greets each redirected
// connection with "proxy <orig>\n", then echoes with plain reads and writes
// (never io.Copy between sockets: an accelerated socket must not be spliced).
// Before echoing it waits for gate, when gate is not nil.
func startEchoProxy(t *testing.T, tp *topology, addr netip.AddrPort, gate <-chan struct{}) {
	t.Helper()
	tcpserve.Serve(t, listenProxy(t, tp.pod, addr), func(c net.Conn) {
		orig, err := origdst.Get(c.(*net.TCPConn))
		if err != nil {
			io.WriteString(c, "noorig\n")
			return
		}
		fmt.Fprintf(c, "proxy %s\n", orig)
		if gate != nil {
			<-gate
		}
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				c.(*net.TCPConn).CloseWrite()
				return
			}
		}
	})
}

// dialGreeted connects from the pod to vip4 and reads the proxy's greeting.
func dialGreeted(t *testing.T, tp *topology) (*net.TCPConn, *bufio.Reader) {
	t.Helper()
	c, err := tp.pod.Dial(&net.Dialer{Timeout: ioTimeout}, "tcp", vip4.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(ioTimeout))
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || line != "proxy "+vip4.String()+"\n" {
		t.Fatalf("greeting %q, %v", line, err)
	}
	return c.(*net.TCPConn), r
}

// tcpBytesSent is how many bytes the socket's TCP stack sent: accelerated
// bytes never pass through it.
func tcpBytesSent(t *testing.T, c *net.TCPConn) uint64 {
	t.Helper()
	var info *unix.TCPInfo
	onSocket(t, c, func(fd int) (err error) {
		info, err = unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		return err
	})
	return info.Bytes_sent
}

// onSocket runs f on c's descriptor and fails the test on any error.
func onSocket(t *testing.T, c syscall.Conn, f func(fd int) error) {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ferr error
	if err := raw.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		t.Fatal(err)
	}
	if ferr != nil {
		t.Fatal(ferr)
	}
}

// wantEchoed half-closes the app's side and checks that the proxy echoed
// want, every byte in order.
func wantEchoed(t *testing.T, c *net.TCPConn, r *bufio.Reader, want []byte) {
	t.Helper()
	c.SetDeadline(time.Now().Add(ioTimeout))
	c.CloseWrite()
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("echoed %d bytes, want the %d written, in order", len(got), len(want))
	}
}

// unread is what the socket has received that its owner has not read
// (FIONREAD): with acceleration, what the peer handed over.
func unread(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	var n int
	onSocket(t, c, func(fd int) (err error) {
		n, err = unix.IoctlGetInt(fd, unix.SIOCINQ)
		return err
	})
	return n
}

// pattern is n bytes that differ at every offset a reordering could hit.
func pattern(n int) []byte {
	b := make([]byte, 0, n+16)
	for i := 0; len(b) < n; i++ {
		b = fmt.Appendf(b, "%015d\n", i)
	}
	return b[:n]
}

func TestAccelerate(t *testing.T) {
	tp := newTopology(t)
	d, listen := openAccel(t, tp)
	startEchoProxy(t, tp, listen, nil)
	before, err := d.AccelCounters()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("request and response skip TCP", func(t *testing.T) {
		c, r := dialGreeted(t, tp)
		sent := tcpBytesSent(t, c)
		msg := []byte("ping 0123456789\n")
		for range 1000 {
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			if line, err := r.ReadString('\n'); err != nil || line != string(msg) {
				t.Fatalf("echo %q, %v", line, err)
			}
		}
		// 16 KB went each way; the TCP stack carried at most the handshake.
		if got := tcpBytesSent(t, c) - sent; got != 0 {
			t.Errorf("the app's TCP stack sent %d bytes of 16000; want 0 (accelerated)", got)
		}
	})

	t.Run("stream past the budget stays in order", func(t *testing.T) {
		c, r := dialGreeted(t, tp)
		// One exchange first, so the app's socket is redirecting when the
		// stream starts (a first write over the budget would use TCP from
		// the start).
		io.WriteString(c, "ping\n")
		if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("echo %q, %v", line, err)
		}
		want := pattern(16 << 20)
		errc := make(chan error, 1)
		go func() {
			_, err := c.Write(want)
			c.CloseWrite()
			errc <- err
		}()
		got, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			i := 0
			for i < min(len(got), len(want)) && got[i] == want[i] {
				i++
			}
			t.Fatalf("echoed %d bytes of %d, first difference at %d", len(got), len(want), i)
		}
		if sent := tcpBytesSent(t, c); sent < uint64(len(want)-accelBudget) {
			t.Errorf("the app's TCP stack sent %d bytes; want the stream past the %d-byte budget (%d)",
				sent, accelBudget, len(want)-accelBudget)
		}
	})

	after, err := d.AccelCounters()
	if err != nil {
		t.Fatal(err)
	}
	// Two connections, two sockets each; every one redirected its first
	// message, and the streaming ones ran over their budget.
	if got := after.Joined - before.Joined; got != 4 {
		t.Errorf("joined %d sockets, want 4", got)
	}
	if got := after.Redirected - before.Redirected; got != 4 {
		t.Errorf("%d sockets redirected, want 4", got)
	}
	if got := after.OverBudget - before.OverBudget; got < 1 {
		t.Errorf("%d sockets went over budget, want at least the streaming app's", got)
	}
	if after.PeerMissing != before.PeerMissing {
		t.Errorf("peer missing grew by %d, want 0", after.PeerMissing-before.PeerMissing)
	}
}

// TestAccelPushesBack: a proxy that does not read must stop the app's writes
// after the budget plus TCP's buffers; without the budget the kernel queued
// every byte (791 MiB in 2 s here).
func TestAccelPushesBack(t *testing.T) {
	tp := newTopology(t)
	_, listen := openAccel(t, tp)
	gate := make(chan struct{})
	startEchoProxy(t, tp, listen, gate)
	// Runs before the proxy's cleanup, which waits for its handlers.
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	c, r := dialGreeted(t, tp)

	want := pattern(256 << 20)
	c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	n, err := c.Write(want)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("writing 256 MiB to a proxy that does not read: %d bytes, %v; want a timeout", n, err)
	}
	if n > maxQueued {
		t.Errorf("wrote %d MiB before blocking; want the budget and TCP's buffers (< %d MiB)", n>>20, maxQueued>>20)
	}
	// Nothing written is lost or reordered once the proxy reads.
	release()
	wantEchoed(t, c, r, want[:n])
}

// TestAccelPipeliningBound: an app that keeps writing requests without
// reading the answers must be stopped too. Every request answers the
// proxy's last answer, so neither side's unanswered budget runs out; what
// grows is the app's own receive queue (without the unread rule, 101 MiB
// in 2 s here), so a socket whose queue holds more than the budget unread
// turns to TCP.
func TestAccelPipeliningBound(t *testing.T) {
	tp := newTopology(t)
	_, listen := openAccel(t, tp)
	startEchoProxy(t, tp, listen, nil)
	c, r := dialGreeted(t, tp)

	// Requests of 16 KiB, each under the budget, as a pipelining client
	// writes them.
	want := pattern(256 << 20)
	c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	n := 0
	for n < len(want) {
		m, err := c.Write(want[n : n+16<<10])
		n += m
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		// The proxy answers before the next request.
		for wait := time.Now().Add(20 * time.Millisecond); unread(t, c) < n && time.Now().Before(wait); {
			time.Sleep(20 * time.Microsecond)
		}
	}
	if n == len(want) {
		t.Fatalf("wrote all 256 MiB to an echo without reading the echo; want the writes to block")
	}
	if n > maxQueued {
		t.Errorf("wrote %d MiB before blocking; want the budget and TCP's buffers (< %d MiB)", n>>20, maxQueued>>20)
	}
	wantEchoed(t, c, r, want[:n])
}

// TestAccelSwitch: the sk_msg link is pinned and adopted like the cgroup
// links, and an Open without Accelerate removes it; capture keeps working.
func TestAccelSwitch(t *testing.T) {
	tp := newTopology(t)
	d, listen := openAccel(t, tp)
	startEchoProxy(t, tp, listen, nil)
	first := pinnedAccelLink(t, tp.cfg)
	if first == 0 {
		t.Fatalf("no pinned %s link after Open with Accelerate", accelLink)
	}
	d.Close()

	d2, err := Open(tp.cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := pinnedAccelLink(t, tp.cfg); got != first {
		t.Errorf("restart: %s link %d, want %d adopted", accelLink, got, first)
	}
	if s, err := d2.State(); err != nil || !s.Accelerated {
		t.Errorf("State() = accelerated %v, %v; want true", s.Accelerated, err)
	}
	echoed := func() (tcpSent uint64) {
		c, r := dialGreeted(t, tp)
		sent := tcpBytesSent(t, c)
		io.WriteString(c, "ping\n")
		if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("echo %q, %v", line, err)
		}
		return tcpBytesSent(t, c) - sent
	}
	if got := echoed(); got != 0 {
		t.Errorf("adopted: TCP sent %d bytes, want 0", got)
	}
	// A connection accelerated before the switch keeps working after it.
	open, openR := dialGreeted(t, tp)
	exchange := func(msg string) {
		t.Helper()
		io.WriteString(open, msg)
		if line, err := openR.ReadString('\n'); err != nil || line != msg {
			t.Fatalf("echo on the open connection %q, %v; want %q", line, err, msg)
		}
	}
	exchange("before\n")
	d2.Close()

	off := tp.cfg
	off.Accelerate = false
	d3, err := Open(off, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d3.Close()
	if id := pinnedAccelLink(t, off); id != 0 {
		t.Errorf("%s link %d still pinned after Open without Accelerate", accelLink, id)
	}
	if got := echoed(); got != 5 {
		t.Errorf("acceleration off: TCP sent %d bytes, want 5", got)
	}
	exchange("after\n")
}

// pinnedAccelLink is the ID of the pinned sk_msg link, 0 when none is pinned.
func pinnedAccelLink(t *testing.T, cfg Config) link.ID {
	t.Helper()
	l, err := link.LoadPinnedLink(filepath.Join(cfg.pinDir(), "links", accelLink), nil)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

// TestAccelUninstall: removing the datapath while a connection is
// accelerated loses none of the bytes handed to a peer that has not read
// them yet, and the connection keeps working. A socket's sk_msg program is
// bound when it joins the sockhash, and the kernel keeps it (and the maps
// it uses) until the socket leaves, so uninstalling only stops new
// connections from joining.
func TestAccelUninstall(t *testing.T) {
	tp := newTopology(t)
	d, listen := openAccel(t, tp)
	gate := make(chan struct{})
	startEchoProxy(t, tp, listen, gate)
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	c, r := dialGreeted(t, tp)

	first := pattern(100 << 10) // under the budget: all of it is handed over
	if _, err := c.Write(first); err != nil {
		t.Fatal(err)
	}
	if sent := tcpBytesSent(t, c); sent != 0 {
		t.Fatalf("the app's TCP stack sent %d bytes; want 0 (handed to the proxy's socket, unread)", sent)
	}
	if err := d.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tp.cfg.pinDir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pin directory after Uninstall: %v; want it gone", err)
	}

	release()
	second := []byte("after uninstall\n")
	if _, err := c.Write(second); err != nil {
		t.Fatal(err)
	}
	wantEchoed(t, c, r, append(first, second...))
}
