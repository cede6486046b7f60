package relay

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// BufferSize is the size of each pooled copy buffer: large enough for four
// full TLS records per write, so bulk transfers make few syscalls.
const BufferSize = 64 << 10

// Pool hands out copy buffers; share one per proxy.
type Pool struct {
	p     sync.Pool
	inUse atomic.Int64
}

// NewPool returns an empty pool of BufferSize buffers.
func NewPool() *Pool { return NewPoolSize(BufferSize) }

// NewPoolSize returns an empty pool of buffers of size bytes.
func NewPoolSize(size int) *Pool {
	return &Pool{p: sync.Pool{New: func() any { b := make([]byte, size); return &b }}}
}

// Get returns one of the pool's buffers.
func (p *Pool) Get() *[]byte {
	p.inUse.Add(1)
	return p.p.Get().(*[]byte)
}

// Put returns b to the pool.
func (p *Pool) Put(b *[]byte) {
	p.inUse.Add(-1)
	p.p.Put(b)
}

// InUse is how many buffers are out of the pool.
func (p *Pool) InUse() int64 { return p.inUse.Load() }

// Result is what one Relay moved.
type Result struct {
	// AToB and BToA are the bytes copied in each direction, also when
	// the relay ended by an error or a panic.
	AToB, BToA int64
	// Err is the first error other than a clean end of stream.
	Err error
}

// Relay copies a→b and b→a until both directions end, then closes both
// streams. A clean end of stream on one side half-closes the other (when it
// can: TCP and TLS connections can); an error on either direction (a reset,
// a broken TLS record, a TLS stream ended without close_notify) aborts
// both at once so the other unblocks: TCP connections are reset, so that a
// peer never takes a stream cut short for a complete one. A write that
// fails is the exception: the other direction reads from the stream that
// failed, and first passes on what that stream's peer sent before it
// failed (a backend's error line ahead of its reset of an upload), for at
// most drainTime, as a socket connected to that peer directly would read
// it; then both are aborted. Streams are usually net.Conns; WebSocket
// bridges pass an upgraded HTTP body or an HTTP/2 stream.
// A panic in either direction is recovered and reported to panics, and
// aborts both streams; its error is Result.Err.
//
// a is the app's stream. Relay turns TCP keep-alive on for the connection
// under it: a relay has no idle timeout (an opaque TCP one, a WebSocket
// after its 101), and the proxy's listeners accept without keep-alive
// (proxy.ListenConfig), so the probes are what finds an app gone without
// a word. b, dialed by the proxy, has it from its dialer.
func Relay(a, b io.ReadWriteCloser, pool *Pool, panics *contain.Reporter) Result {
	keepAlive(a)
	var res Result
	abortBoth := func() { abort(a); abort(b) }
	var drain *time.Timer
	var draining sync.Once
	stop := func(err error, writeFailed bool) {
		switch {
		case err == nil:
		case writeFailed:
			// The other direction reads what came before the failure.
			draining.Do(func() { drain = time.AfterFunc(drainTime, abortBoth) })
		default:
			abortBoth()
		}
	}
	var bToAErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer panics.Recover("relay", &bToAErr, abortBoth)
		var writeFailed bool
		writeFailed, bToAErr = copyHalf(a, b, pool, &res.BToA)
		stop(bToAErr, writeFailed)
	}()
	var aToBErr error
	var writeFailed bool
	func() {
		// Recovered here too: unwinding out of Relay would leave b open,
		// and b→a waiting on it.
		defer panics.Recover("relay", &aToBErr, nil)
		writeFailed, aToBErr = copyHalf(b, a, pool, &res.AToB)
	}()
	stop(aToBErr, writeFailed)
	<-done
	res.Err = errors.Join(aToBErr, bToAErr)
	if drain != nil {
		drain.Stop()
	}
	if res.Err != nil {
		abortBoth()
	}
	a.Close()
	b.Close()
	return res
}

// drainTime bounds how long a relay whose write failed goes on reading
// from the stream that failed.
const drainTime = 5 * time.Second

// copyHalf copies src to dst until src ends, then shuts dst's write half,
// adding the bytes it wrote to *n as it goes: a panic beneath (which Relay
// recovers) leaves in *n what moved before it. writeFailed reports that
// the error was a write to dst's.
func copyHalf(dst, src io.ReadWriteCloser, pool *Pool, n *int64) (writeFailed bool, err error) {
	rd := newSource(src)
	// Also when a panic unwinds: a buffer not given back would count in
	// Pool.InUse (sockmesh_proxy_copy_buffers_in_use) for the proxy's life.
	defer rd.release(pool)
	for {
		bp, nr, rerr := rd.read(pool) // a buffer exactly when nr > 0
		if nr > 0 {
			nw, werr := dst.Write((*bp)[:nr])
			rd.release(pool)
			*n += int64(nw)
			if werr != nil {
				return true, werr
			}
		}
		if rerr == io.EOF && rd.truncated() {
			return false, sockio.ErrTLSTruncated
		}
		if rerr == io.EOF {
			closeWrite(dst)
			return false, nil
		}
		if rerr != nil {
			return false, rerr
		}
	}
}

// source reads one direction of a relay, and takes a copy buffer only
// once there are bytes to put in it where it can: idle relayed
// connections — a database client's pool of them, an idle gRPC channel, a
// WebSocket — then hold no buffer, where they held one of BufferSize per
// direction for as long as they lived (for a few thousand connections
// across a node's pods, the proxy's memory limit). How depends on what is
// under the stream:
//
//   - the proxy's TCP connection under wrappers that pass reads through
//     (sockio.Pooled: a sniffed connection's replay, an upgraded one's
//     buffered reader, byte counters): sockio's ReadPooled takes a buffer
//     only when a read finds bytes, at no extra system call;
//   - anything else — TLS over such a connection, an HTTP/2 stream — waits
//     in a read of one byte (crypto/tls holds the record that byte came
//     in, HTTP/2 the DATA frame), and then what came with it is read into
//     a buffer: beneath TLS every record at hand, without waiting
//     (sockio's NoWait), on an HTTP/2 stream the rest of the frame,
//     usually without waiting (a DATA frame arrives whole; after a frame
//     of one byte the read waits for the next, buffer held).
type source struct {
	r      io.Reader
	pooled sockio.PooledReader
	// under is the connection beneath a TLS layer, read without waiting
	// after a probe.
	under *sockio.Conn
	probe [1]byte
	// held is the buffer read took last, until release gives it back.
	held *[]byte
}

func newSource(r io.Reader) *source {
	s := &source{r: r}
	c, ok := r.(net.Conn)
	if !ok {
		return s
	}
	if s.pooled = sockio.Pooled(c); s.pooled != nil {
		return s
	}
	// TLS under wrappers that pass reads through. A handshake still to
	// come would fail on reads that do not wait; the proxy hands relays
	// finished ones.
	for {
		if tc, ok := c.(*tls.Conn); ok {
			if tc.ConnectionState().HandshakeComplete {
				s.under = sockio.Of(tc.NetConn())
			}
			return s
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if _, through := c.(sockio.PooledReader); !ok || !through {
			return s
		}
		c = u.NetConn()
	}
}

// truncated reports whether the end of stream read last was the TCP
// connection's beneath TLS rather than the TLS stream's own.
func (s *source) truncated() bool { return s.under != nil && s.under.Ended() }

// read returns the stream's next bytes in a buffer from pool (nil when
// there are none), or an error. The buffer is held until release.
func (s *source) read(pool *Pool) (*[]byte, int, error) {
	if s.pooled != nil {
		bp, n, err := s.pooled.ReadPooled(pool)
		s.held = bp
		return bp, n, err
	}
	n, err := s.r.Read(s.probe[:])
	if n == 0 {
		return nil, 0, err
	}
	bp := pool.Get()
	s.held = bp
	(*bp)[0] = s.probe[0]
	if err != nil {
		return bp, 1, err
	}
	if s.under == nil {
		var m int
		m, err = s.r.Read((*bp)[1:])
		return bp, 1 + m, err
	}
	// Beneath TLS a read returns one record's bytes at most (16 KiB): read
	// on while more are at hand, so that a bulk transfer goes out in few
	// large writes rather than one per record.
	s.under.NoWait(true)
	defer s.under.NoWait(false)
	n = 1
	for n < len(*bp) {
		var m int
		m, err = s.r.Read((*bp)[n:])
		n += m
		if err != nil || m == 0 {
			break
		}
	}
	if errors.Is(err, sockio.ErrWouldBlock) {
		err = nil
	}
	return bp, n, err
}

// release gives the buffer read last back to pool.
func (s *source) release(pool *Pool) {
	if s.held != nil {
		pool.Put(s.held)
		s.held = nil
	}
}

// keepAlive turns TCP keep-alive on, with Go's default timing (a probe
// after 15 s idle, then every 15 s, 9 unanswered end it), for the TCP
// connection under c's wrappers, if any.
func keepAlive(c io.ReadWriteCloser) {
	if nc, ok := c.(net.Conn); ok {
		if tc := sockio.TCP(nc); tc != nil {
			tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true})
		}
	}
}

// abort closes c, with a reset when it is a connection (sockio.Reset): a
// plain close would end the peer's stream cleanly, as if everything had
// been sent.
func abort(c io.Closer) {
	if nc, ok := c.(net.Conn); ok {
		sockio.Reset(nc)
		return
	}
	c.Close()
}

type closeWriter interface{ CloseWrite() error }

// closeWrite shuts the write half of c: for TLS a close_notify alert and
// then the TCP write half, so the peer sees the end either way.
func closeWrite(c io.Writer) {
	if tc, ok := c.(*tls.Conn); ok {
		tc.CloseWrite()
		closeWrite(tc.NetConn())
		return
	}
	if cw, ok := c.(closeWriter); ok {
		cw.CloseWrite()
		return
	}
	// Wrappers (a sniffed connection replaying its first bytes) expose the
	// connection underneath the way crypto/tls does.
	if u, ok := c.(interface{ NetConn() net.Conn }); ok {
		closeWrite(u.NetConn())
	}
}

// BufferedConn is a connection whose reads first return what R already
// buffered from it (bytes read with an HTTP head, before an upgrade or a
// hijack). NetConn exposes the connection for half-close.
type BufferedConn struct {
	net.Conn
	R *bufio.Reader
}

func (c *BufferedConn) Read(p []byte) (int, error) { return c.R.Read(p) }

// NetConn returns the connection underneath.
func (c *BufferedConn) NetConn() net.Conn { return c.Conn }

// ReadPooled serves what R holds, then reads the connection underneath
// (which must be a sockio.PooledReader) as R would.
func (c *BufferedConn) ReadPooled(bufs sockio.Buffers) (*[]byte, int, error) {
	if c.R.Buffered() > 0 {
		return sockio.ReadInto(c.R, bufs)
	}
	return c.Conn.(sockio.PooledReader).ReadPooled(bufs)
}
