// Package sockio makes the reads and writes of a proxied TCP connection
// plain non-blocking system calls that the Go scheduler does not track.
//
// net.Conn's Read and Write enter the runtime's system-call state around
// each call: the goroutine's P is marked as in a system call, and sysmon,
// which polls every 20 µs while any P is, hands the P to another thread
// when a call outlasts a tick. On loopback a write runs the receiver's TCP
// input too, and on a machine whose cores are shared with the backend and
// the client the thread is often descheduled mid-call, so those hand-offs
// (a futex wake, a thread switch, sysmon kept at its fastest poll) cost the
// proxy more than the calls themselves. The sockets are non-blocking, so a
// call never waits: Conn makes it with syscall.RawSyscall inside the
// connection's RawConn callbacks, which keep the netpoller's waiting,
// deadlines and close semantics of net.Conn.
package sockio

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Conn is a TCP connection whose Read and Write are raw system calls. The
// rest of *net.TCPConn (deadlines, SetLinger, SyscallConn, Close) is its
// own.
type Conn struct {
	*net.TCPConn
	rc   syscall.RawConn
	r, w call
	// readPooled is ReadPooled's callback, bound once.
	readPooled func(fd uintptr) bool
	// ended is set by the Read that met the end of the stream (Ended).
	ended bool
	// shut is set once CloseWrite has shut the write half.
	shut atomic.Bool
	// taken is Progress's count.
	taken atomic.Uint64
}

// call is one direction's system call in progress (one at a time), with
// its poller wait and callback bound once: a closure per call would be
// allocated, as RawConn's callbacks escape.
type call struct {
	mu sync.Mutex
	// noWait makes a read that finds nothing return ErrWouldBlock rather
	// than wait in the poller (see NoWait).
	noWait bool
	wait   func(func(fd uintptr) bool) error // RawConn's Read or Write
	fn     func(fd uintptr) bool             // readOnce or writeAll
	p      []byte
	n      int
	errno  syscall.Errno
	// bufs and bp are ReadPooled's: where it takes a buffer, and the one
	// it filled.
	bufs Buffers
	bp   *[]byte
}

// run makes the call on p and returns what its callback recorded.
func (k *call) run(p []byte) (int, syscall.Errno, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.p, k.n, k.errno = p, 0, 0
	err := k.wait(k.fn)
	k.p = nil
	return k.n, k.errno, err
}

// Wrap returns c as a Conn, or c itself when its descriptor is not
// reachable.
func Wrap(c *net.TCPConn) net.Conn {
	rc, err := c.SyscallConn()
	if err != nil {
		return c
	}
	w := &Conn{TCPConn: c, rc: rc}
	w.r.wait, w.r.fn = rc.Read, w.readOnce
	w.w.wait, w.w.fn = rc.Write, w.writeAll
	w.readPooled = w.readPooledOnce
	return w
}

// NetConn returns the connection underneath (crypto/tls's convention).
func (c *Conn) NetConn() net.Conn { return c.TCPConn }

// maxRW bounds one call, as internal/poll does (some kernels fail larger).
const maxRW = 1 << 30

// Read reads like net.Conn's Read: it waits in the netpoller while nothing
// is there, and returns io.EOF at the end of the stream.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, errno, err := c.r.run(p)
	switch {
	case err != nil:
		return 0, err
	case errno == syscall.EAGAIN:
		return 0, ErrWouldBlock
	case errno != 0:
		return 0, c.opError("read", errno)
	case n == 0:
		c.ended = true
		return 0, io.EOF
	}
	return n, nil
}

// Ended reports whether a Read met the end of the stream (the peer's FIN).
// Beneath crypto/tls it tells a TLS stream cut short from one that ended
// cleanly, which crypto/tls's Read reports alike (io.EOF, when the FIN
// comes at a record boundary): after a close_notify, crypto/tls reads no
// further. For the goroutine reading c.
func (c *Conn) Ended() bool { return c.ended }

// NoWait switches c's reads to return ErrWouldBlock when nothing is there
// to read, instead of waiting for something. With it, a read through the
// layers above c (crypto/tls, a bufio.Reader) returns what those layers
// hold, or what has arrived on the socket, or ErrWouldBlock, in at most one
// system call: how a pool finds that a peer spoke on an idle connection.
// Not while a read is in progress.
func (c *Conn) NoWait(on bool) { c.r.noWait = on }

// Buffers lends the buffers of ReadPooled (relay.Pool is one).
type Buffers interface {
	Get() *[]byte
	Put(*[]byte)
}

// ReadPooled reads like Read into a buffer it takes from bufs only when
// the read finds something: a reader waiting for bytes holds no buffer
// (an idle relayed connection would otherwise hold one per direction for
// as long as it lives). The buffer holds n bytes and is the caller's to
// put back; it is nil when an error comes without bytes.
func (c *Conn) ReadPooled(bufs Buffers) (*[]byte, int, error) {
	k := &c.r
	k.mu.Lock()
	k.bufs, k.bp, k.n, k.errno = bufs, nil, 0, 0
	err := k.wait(c.readPooled)
	bp, n, errno := k.bp, k.n, k.errno
	k.bufs, k.bp = nil, nil
	k.mu.Unlock()
	switch {
	case err == nil && errno == syscall.EAGAIN:
		err = ErrWouldBlock
	case err == nil && errno != 0:
		err = c.opError("read", errno)
	case err == nil && n == 0:
		err = io.EOF
	}
	if err != nil {
		if bp != nil {
			bufs.Put(bp)
		}
		return nil, 0, err
	}
	return bp, n, nil
}

// PooledReader is a connection that reads with ReadPooled: a Conn, or a
// wrapper over one that serves what it read ahead first and passes the
// rest of its reads through (counting them, say).
type PooledReader interface {
	net.Conn
	ReadPooled(Buffers) (*[]byte, int, error)
}

// Pooled returns c as a PooledReader when c and every wrapper under it
// (NetConn) down to a Conn are PooledReaders, else nil.
func Pooled(c net.Conn) PooledReader {
	top, ok := c.(PooledReader)
	for ok {
		if _, isConn := c.(*Conn); isConn {
			return top
		}
		var u interface{ NetConn() net.Conn }
		if u, ok = c.(interface{ NetConn() net.Conn }); ok {
			c = u.NetConn()
			_, ok = c.(PooledReader)
		}
	}
	return nil
}

// ReadInto reads r into a buffer from bufs, taken for the whole read: for
// a wrapper's read-ahead, which is there without waiting, or a reader
// with no ReadPooled. The buffer is nil when no byte was read.
func ReadInto(r io.Reader, bufs Buffers) (*[]byte, int, error) {
	bp := bufs.Get()
	n, err := r.Read(*bp)
	if n == 0 {
		bufs.Put(bp)
		return nil, 0, err
	}
	return bp, n, err
}

// readPooledOnce is ReadPooled's callback: it takes a buffer for each
// read, and gives it back before the caller waits in the poller.
func (c *Conn) readPooledOnce(fd uintptr) bool {
	k := &c.r
	bp := k.bufs.Get()
	n, errno := c.read(fd, *bp)
	if errno == syscall.EAGAIN && !k.noWait {
		k.bufs.Put(bp)
		return false
	}
	k.bp, k.n, k.errno = bp, n, errno
	return true
}

// ErrTLSTruncated is the end of a TLS stream that came without close_notify
// (RFC 8446 §6.1): the TCP connection's end beneath it (Ended), which
// crypto/tls reads as io.EOF, as it does a close_notify. Whoever, or
// whatever on the path, ended the connection, what came may not be all
// that was sent, so it must not be passed on as a clean end.
var ErrTLSTruncated = fmt.Errorf("tls stream ended without close_notify: %w", io.ErrUnexpectedEOF)

// ErrWouldBlock is the error of a read in NoWait mode that found nothing.
// It is a temporary net.Error, so crypto/tls does not take it for the
// connection's end.
var ErrWouldBlock net.Error = wouldBlock{}

type wouldBlock struct{}

func (wouldBlock) Error() string   { return "sockio: nothing to read" }
func (wouldBlock) Timeout() bool   { return true }
func (wouldBlock) Temporary() bool { return true }

// readOnce is Read's callback: false sends the caller to wait in the
// poller.
func (c *Conn) readOnce(fd uintptr) bool {
	n, errno := c.read(fd, c.r.p)
	if errno == syscall.EAGAIN && !c.r.noWait {
		return false
	}
	c.r.n, c.r.errno = n, errno
	return true
}

// read is sysRead, with the end of a stream the peer reset read as
// ECONNRESET: the kernel reports a reset once, to the first call after it,
// and when that was a write (the relay's other direction, uploading), the
// reads after it find the end of the stream, a clean end to whoever the
// relay passes it on. The socket's state tells: reset, it is closed; ended
// by the peer's FIN, it waits for its own side's close (CLOSE_WAIT), or,
// once that side was shut too, it is closed as well (TIME_WAIT's
// socket), which is why shut counts.
func (c *Conn) read(fd uintptr, p []byte) (int, syscall.Errno) {
	n, errno := sysRead(fd, p)
	if n == 0 && errno == 0 && !c.shut.Load() && tcpState(fd) == tcpClose {
		errno = syscall.ECONNRESET
	}
	return n, errno
}

// tcpClose is TCP_CLOSE, the state of a TCP socket that is reset.
const tcpClose = 7

// tcpState is the TCP state of the socket fd (tcpi_state, TCP_INFO's
// first byte), or 0 when it is unknown.
func tcpState(fd uintptr) uint8 {
	var state uint8
	size := uint32(1)
	syscall.RawSyscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO, uintptr(unsafe.Pointer(&state)), uintptr(unsafe.Pointer(&size)), 0)
	return state
}

// sysRead is one read(2) of fd into p (at most maxRW bytes), made again
// when interrupted.
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	if len(p) > maxRW {
		p = p[:maxRW]
	}
	for {
		n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if errno != syscall.EINTR {
			return int(n), errno
		}
	}
}

// Write writes all of p, waiting in the netpoller while the socket's
// buffer is full.
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, errno, err := c.w.run(p)
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, c.opError("write", errno)
	}
	return n, nil
}

// Progress counts the bytes the kernel took of Writes that waited for room
// in the socket's buffer, as each of them waits again: it grows while a
// Write to a peer that reads slowly is under way, and stays as it is while
// the peer reads nothing. The bytes after a Write's last wait, and those of
// Writes that never wait, are left out: those pay nothing for it. For a
// watchdog that tells the two peers apart without a deadline per Write.
func (c *Conn) Progress() uint64 { return c.taken.Load() }

// writeAll is Write's callback: false (the socket's buffer is full) sends
// the caller to wait in the poller, once what this call wrote is counted
// in Progress.
func (c *Conn) writeAll(fd uintptr) bool {
	from := c.w.n
	for c.w.n < len(c.w.p) {
		b := c.w.p[c.w.n:]
		if len(b) > maxRW {
			b = b[:maxRW]
		}
		n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		switch errno {
		case 0:
			c.w.n += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			if c.w.n > from {
				c.taken.Add(uint64(c.w.n - from))
			}
			return false
		default:
			c.w.errno = errno
			return true
		}
	}
	return true
}

// CloseWrite shuts the write half in a raw call, like Write: what is
// queued and the FIN leave now (on loopback, sending them runs the
// receiver's TCP input).
func (c *Conn) CloseWrite() error {
	// Before the call: on loopback the peer may answer the FIN with its
	// own before the call returns, and a read on the other direction would
	// then find the socket closed (read), as a reset leaves it.
	c.shut.Store(true)
	var errno syscall.Errno
	if err := c.rc.Control(func(fd uintptr) {
		_, _, errno = syscall.RawSyscall(syscall.SYS_SHUTDOWN, fd, syscall.SHUT_WR, 0)
	}); err != nil {
		return err
	}
	if errno != 0 {
		return c.opError("shutdown", errno)
	}
	return nil
}

func (c *Conn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}

// TCP returns the TCP connection under c's wrappers (those that expose the
// connection underneath through NetConn, as crypto/tls does), or nil.
func TCP(c net.Conn) *net.TCPConn {
	for {
		if tc, ok := c.(*net.TCPConn); ok {
			return tc
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
}

// Of returns the Conn under c's wrappers (those that expose the connection
// underneath through NetConn, as crypto/tls does), or nil.
func Of(c net.Conn) *Conn {
	for {
		if sc, ok := c.(*Conn); ok {
			return sc
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
}

// Cork sets TCP_CORK on the TCP connection under c, in a raw call: what is
// written then waits for the corked segment to fill or for the connection
// to be shut.
func Cork(c net.Conn) {
	tc := TCP(c)
	if tc == nil {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		on := int32(1)
		syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_CORK, uintptr(unsafe.Pointer(&on)), 4, 0)
	})
}

// AwaitHangup waits, reading nothing, until the peer of the TCP connection
// under c's wrappers ends its stream (FIN) or resets it, and returns nil
// then; otherwise it returns what ended the wait: c's read deadline
// (os.ErrDeadlineExceeded), c's close, or ErrNotTCP. Bytes the peer sent
// before its end stay unread: a reader that must not consume them (a
// request body held for later) can still learn that the peer left, which
// a read finds only behind them. Not while another read of c is in
// progress.
func AwaitHangup(c net.Conn) error {
	tc := TCP(c)
	if tc == nil {
		return ErrNotTCP
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return fmt.Errorf("await hangup: %w", err)
	}
	// The netpoller wakes the read on each change of the socket (Go
	// registers EPOLLRDHUP, edge-triggered): a false return waits for
	// the next one, so bytes that come do not make this spin.
	return rc.Read(hungUp)
}

// ErrNotTCP: no TCP connection is under a net.Conn's wrappers.
var ErrNotTCP = errors.New("sockio: no TCP connection under the net.Conn")

// hungUp reports whether the peer of socket fd ended its stream or reset
// it (or the socket failed), without reading.
func hungUp(fd uintptr) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	for {
		n, err := unix.Poll(fds, 0)
		if err != unix.EINTR {
			return err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		}
	}
}

// Reset closes c with a TCP reset (SO_LINGER 0) when a TCP connection is
// under its wrappers, else plainly: a peer must never take a stream the
// proxy cut short, or refused, for a complete one, as it would a clean end
// of a close-delimited HTTP/1.0 body or of opaque bytes. The TCP connection
// is closed first, as crypto/tls's Close would otherwise send close_notify,
// a clean end, before the reset; closing c then lets its wrappers account
// for it.
func Reset(c net.Conn) {
	if tc := TCP(c); tc != nil {
		tc.SetLinger(0)
		tc.Close()
	}
	c.Close()
}
