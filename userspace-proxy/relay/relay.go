package relay

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"

	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// BufferSize is the size of each pooled copy buffer: large enough for four
// full TLS records per write, so bulk transfers make few syscalls.
const BufferSize = 64 << 10

// Pool hands out copy buffers; share one per proxy.
type Pool struct {
	p sync.Pool
}

// NewPool returns an empty buffer pool.
func NewPool() *Pool {
	return &Pool{p: sync.Pool{New: func() any { b := make([]byte, BufferSize); return &b }}}
}

// Get returns a buffer of BufferSize bytes.
func (p *Pool) Get() *[]byte { return p.p.Get().(*[]byte) }

// Put returns b to the pool.
func (p *Pool) Put(b *[]byte) { p.p.Put(b) }

// Result is what one Relay moved.
type Result struct {
	// AToB and BToA are the bytes copied in each direction.
	AToB, BToA int64
	// Err is the first error other than a clean end of stream.
	Err error
}

// Relay copies a→b and b→a until both directions end, then closes both
// streams. A clean end of stream on one side half-closes the other (when it
// can: TCP and TLS connections can); an error on either direction (a reset,
// a broken TLS record) aborts both at once so the other unblocks: TCP
// connections are reset, so that a peer never takes a stream cut short for
// a complete one. Streams are usually net.Conns; WebSocket bridges pass an
// upgraded HTTP body or an HTTP/2 stream.
// A panic in the b→a goroutine is recovered and reported to panics, and
// aborts both streams; its error is Result.Err.
func Relay(a, b io.ReadWriteCloser, pool *Pool, panics *contain.Reporter) Result {
	var res Result
	var bToAErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer panics.Recover("relay", &bToAErr, func() { abort(a); abort(b) })
		res.BToA, bToAErr = copyHalf(a, b, pool)
		if bToAErr != nil {
			abort(a)
			abort(b)
		}
	}()
	var aToBErr error
	res.AToB, aToBErr = copyHalf(b, a, pool)
	if aToBErr != nil {
		abort(a)
		abort(b)
	}
	<-done
	a.Close()
	b.Close()
	res.Err = errors.Join(aToBErr, bToAErr)
	return res
}

// copyHalf copies src to dst until src ends, then shuts dst's write half.
func copyHalf(dst, src io.ReadWriteCloser, pool *Pool) (int64, error) {
	bp := pool.Get()
	defer pool.Put(bp)
	buf := *bp
	var n int64
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				return n, werr
			}
		}
		if rerr == io.EOF {
			closeWrite(dst)
			return n, nil
		}
		if rerr != nil {
			return n, rerr
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
