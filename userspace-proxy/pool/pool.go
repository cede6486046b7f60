package pool

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// Config bounds a Pool. The zero value is usable.
type Config struct {
	// MaxIdle bounds the idle connections kept per endpoint; 0 means 64,
	// negative keeps none.
	MaxIdle int
	// MaxOpen bounds the connections open per endpoint, idle or in use; Get
	// waits beyond it. 0 means 1024.
	MaxOpen int
	// IdleTimeout closes connections idle this long; 0 means 90 s.
	IdleTimeout time.Duration
	// BufferSize sizes each connection's read and write buffers; 0 means
	// 16 KiB, one full TLS record, so a record is read or written in one go.
	BufferSize int
}

// Conn is a pooled connection with its buffers. Between Get and Put,
// Discard or Detach it belongs to the caller alone.
type Conn struct {
	net.Conn
	// R and W buffer Conn; they travel with it through the pool.
	R *bufio.Reader
	W *bufio.Writer

	ep        *endpoint
	uses      int       // times it went back to the pool
	idleSince time.Time // when it last went back
}

// Reused reports whether c served an earlier caller: a failure before any
// response byte on a reused connection may mean the peer closed it while
// idle, so an idempotent request may be retried on another.
func (c *Conn) Reused() bool { return c.uses > 0 }

// Quiet reports whether the peer of c, an idle connection just taken from
// the pool, has neither closed it nor sent anything since, at the cost of
// a system call. Get checks only connections idle for a while: a caller
// whose request may not be sent twice, and so cannot be retried when a
// reused connection turns out closed, checks the others with Quiet.
func (c *Conn) Quiet() bool { return c.R.Buffered() == 0 && quiet(c.Conn) }

// Pool is a set of per-endpoint pools; safe for concurrent use.
type Pool struct {
	cfg Config
	mu  sync.Mutex
	eps map[netip.AddrPort]*endpoint
	// sweep closes connections idle for IdleTimeout. One timer for the
	// pool, armed while any connection is idle, rather than one per
	// connection: a per-connection timer is stopped and reset on every
	// request, two timer-heap updates per request on the hot path.
	sweep    *time.Timer
	sweeping bool // sweep is armed
}

type endpoint struct {
	addr    netip.AddrPort
	idle    []*Conn // oldest first; Get takes the last
	open    int     // connections counted against MaxOpen, including dials in progress
	waiters []chan *Conn
}

// staleCheckAfter is how long a connection may sit idle before Get checks
// that the peer has not closed it. Servers close idle connections after
// seconds to minutes; a check costs a system call, so recently used
// connections skip it, and a request that finds one closed anyway is
// retried by the caller, or, when it may not be sent twice, checked by the
// caller first (Conn.Quiet).
const staleCheckAfter = time.Second

// New returns an empty Pool.
func New(cfg Config) *Pool {
	if cfg.MaxIdle == 0 {
		cfg.MaxIdle = 64
	}
	if cfg.MaxOpen <= 0 {
		cfg.MaxOpen = 1024
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 90 * time.Second
	}
	if cfg.BufferSize <= 0 {
		cfg.BufferSize = 16 << 10
	}
	p := &Pool{cfg: cfg, eps: make(map[netip.AddrPort]*endpoint)}
	p.sweep = time.AfterFunc(time.Hour, p.expire)
	p.sweep.Stop()
	return p
}

// Get returns an idle connection to addr, or one dialed with dial when addr
// has fewer than MaxOpen connections; otherwise it waits for one to be put
// back or closed, until ctx ends. Idle connections the peer has closed are
// dropped on the way.
func (p *Pool) Get(ctx context.Context, addr netip.AddrPort, dial func(context.Context) (net.Conn, error)) (*Conn, error) {
	for {
		p.mu.Lock()
		ep := p.eps[addr]
		if ep == nil {
			ep = &endpoint{addr: addr}
			p.eps[addr] = ep
		}
		if n := len(ep.idle); n > 0 {
			c := ep.idle[n-1]
			ep.idle[n-1] = nil
			ep.idle = ep.idle[:n-1]
			p.mu.Unlock()
			if time.Since(c.idleSince) < staleCheckAfter || quiet(c.Conn) {
				return c, nil
			}
			p.Discard(c)
			continue
		}
		if ep.open < p.cfg.MaxOpen {
			ep.open++
			p.mu.Unlock()
			return p.dial(ctx, ep, dial)
		}
		w := make(chan *Conn, 1)
		ep.waiters = append(ep.waiters, w)
		p.mu.Unlock()
		select {
		case c := <-w:
			if c != nil {
				return c, nil
			}
			return p.dial(ctx, ep, dial) // a slot was freed for us
		case <-ctx.Done():
			p.mu.Lock()
			if i := slices.Index(ep.waiters, w); i >= 0 {
				ep.waiters = slices.Delete(ep.waiters, i, i+1)
				p.mu.Unlock()
				return nil, ctx.Err()
			}
			p.mu.Unlock()
			// Handed a connection or a slot as ctx ended: pass it on.
			if c := <-w; c != nil {
				p.Put(c)
			} else {
				p.release(ep)
			}
			return nil, ctx.Err()
		}
	}
}

func (p *Pool) dial(ctx context.Context, ep *endpoint, dial func(context.Context) (net.Conn, error)) (*Conn, error) {
	nc, err := dial(ctx)
	if err != nil {
		p.release(ep)
		return nil, err
	}
	return &Conn{Conn: nc, R: bufio.NewReaderSize(nc, p.cfg.BufferSize), W: bufio.NewWriterSize(nc, p.cfg.BufferSize), ep: ep}, nil
}

// Put gives c back for reuse: the caller read its last response to the end,
// nothing is buffered in W, and neither side asked to close. A connection
// with bytes left in R is closed instead: the peer sent more than the
// response it was asked for (a legacy server's body after HEAD, 204 or
// 304, a stray CRLF), and the next caller would read them as its own
// response's start. An idle connection must be silent (see quiet), and
// these bytes were read before it went idle.
func (p *Pool) Put(c *Conn) {
	if c.R.Buffered() > 0 {
		p.Discard(c)
		return
	}
	c.uses++
	p.mu.Lock()
	ep := c.ep
	if len(ep.waiters) > 0 {
		w := ep.waiters[0]
		ep.waiters = ep.waiters[1:]
		p.mu.Unlock()
		w <- c
		return
	}
	if len(ep.idle) >= p.cfg.MaxIdle {
		p.mu.Unlock()
		p.Discard(c)
		return
	}
	c.idleSince = time.Now()
	ep.idle = append(ep.idle, c)
	if !p.sweeping {
		p.sweeping = true
		p.sweep.Reset(p.cfg.IdleTimeout)
	}
	p.mu.Unlock()
}

// Discard closes c and frees its slot.
func (p *Pool) Discard(c *Conn) {
	c.Conn.Close()
	p.release(c.ep)
}

// Detach frees c's slot and leaves c open and to the caller (an upgraded
// connection that will never carry HTTP again).
func (p *Pool) Detach(c *Conn) { p.release(c.ep) }

// release frees one slot of ep: a waiter may dial in its place; an
// endpoint with nothing left is forgotten.
func (p *Pool) release(ep *endpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(ep.waiters) > 0 {
		w := ep.waiters[0]
		ep.waiters = ep.waiters[1:]
		w <- nil // the slot passes to the waiter
		return
	}
	ep.open--
	if ep.open == 0 && p.eps[ep.addr] == ep {
		delete(p.eps, ep.addr)
	}
}

// expire closes the connections idle for IdleTimeout or longer, and arms
// the sweep again for the next one to reach it. Idle lists are oldest
// first, so the expired ones are a prefix of each.
func (p *Pool) expire() {
	now := time.Now()
	var expired []*Conn
	p.mu.Lock()
	var next time.Duration
	for _, ep := range p.eps {
		n := 0
		for n < len(ep.idle) && now.Sub(ep.idle[n].idleSince) >= p.cfg.IdleTimeout {
			n++
		}
		expired = append(expired, ep.idle[:n]...)
		ep.idle = slices.Delete(ep.idle, 0, n)
		if len(ep.idle) > 0 {
			if d := p.cfg.IdleTimeout - now.Sub(ep.idle[0].idleSince); next == 0 || d < next {
				next = d
			}
		}
	}
	p.sweeping = next > 0
	if p.sweeping {
		p.sweep.Reset(next)
	}
	p.mu.Unlock()
	for _, c := range expired {
		p.Discard(c)
	}
}

// CloseIdle closes every idle connection (the backend's settings changed,
// or the proxy is shutting down). Connections in use are unaffected.
func (p *Pool) CloseIdle() {
	p.mu.Lock()
	var idle []*Conn
	for _, ep := range p.eps {
		idle = append(idle, ep.idle...)
		clear(ep.idle)
		ep.idle = ep.idle[:0]
	}
	p.mu.Unlock()
	for _, c := range idle {
		p.Discard(c)
	}
}

// Stats returns how many connections to addr are open (idle, in use or
// being dialed) and idle.
func (p *Pool) Stats(addr netip.AddrPort) (open, idle int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ep := p.eps[addr]; ep != nil {
		return ep.open, len(ep.idle)
	}
	return 0, 0
}

// quiet reports whether the peer of an idle connection has neither closed
// it nor sent anything: an idle HTTP/1.1 connection must be silent, so a
// byte (a TLS close_notify, a stray response) or an end of stream means it
// is closing. It peeks without blocking at the socket under any wrappers
// (TLS, counters) that expose it through NetConn, as crypto/tls does;
// anything else is assumed open.
func quiet(c net.Conn) bool {
	tc := sockio.TCP(c)
	if tc == nil {
		return true
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	open := true
	rerr := rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		open = errors.Is(err, syscall.EAGAIN)
		return true
	})
	return open && rerr == nil
}
