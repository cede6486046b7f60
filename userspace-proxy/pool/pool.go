package pool

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// Config bounds a Pool. The zero value is usable.
type Config struct {
	// MaxIdle bounds the connections an endpoint keeps idle for longer
	// than trimAfter; 0 means 64, negative keeps none. Past a burst more
	// wait for reuse until then: closed as they came back, they made a
	// load steadily above MaxIdle dial, and handshake, a connection for
	// most of its requests (200 keep-alive clients through one endpoint:
	// a third of nginx's requests/s, the proxy's CPU mostly handshakes).
	MaxIdle int
	// MaxOpen bounds the connections open per endpoint, idle or in use; Get
	// waits beyond it. 0 means 1024. One Client may hold at most its share
	// of them (ClientShare), and its Gets beyond wait as at MaxOpen.
	MaxOpen int
	// ClientShare is the fraction of MaxOpen one Client may hold, rounded
	// up to a whole connection: the rest stays for the other clients,
	// which are then served while one holds its share in exchanges that
	// do not end. 0 or less (NaN too) means 7/8, all but an eighth (896 of
	// 1024; all of fewer than 8); 1 or more, all of them.
	ClientShare float64
	// MaxWait bounds how long Get waits for one of an endpoint's MaxOpen
	// connections to come free, after which it fails with ErrBusy; 0
	// means 10 s.
	MaxWait time.Duration
	// IdleTimeout closes connections idle this long; 0 means 90 s.
	IdleTimeout time.Duration
	// BufferSize sizes each connection's read and write buffers; 0 means
	// 16 KiB, one full TLS record, so a record is read or written in one go.
	BufferSize int
	// Dropped, when set, is told of each connection closed because its
	// peer did not stay silent after an answer (see Conn.silent), its
	// Until passed, or HandOver did not keep it.
	Dropped func(DropReason)
	// AtShare, when set, is told of each Get that fails with ErrBusy after
	// it began to wait with its Client holding its share (MaxOpen).
	AtShare func()
	// MaxHeadBytes bounds what R reads from a connection handed out by Get
	// until EndHead: the heads of an answer, informational ones included;
	// 0 means http.DefaultMaxHeaderBytes (1 MiB).
	MaxHeadBytes int
}

// ErrHeadTooLarge is R's error when an answer's heads exceed MaxHeadBytes:
// without a bound, a backend sending header fields (or 1xx answers)
// without end would have the proxy buffer them without end.
var ErrHeadTooLarge = errors.New("answer head too large")

// ErrBusy is Get's error when every connection an endpoint may have
// stayed in use for MaxWait: its requests then fail at once rather than
// queue behind requests that hold the connections (an app that stopped
// sending its body, or reading its answer) for as long as they last.
var ErrBusy = errors.New("every connection to the endpoint stayed busy")

// ErrNotHandedOut marks Get's errors where it handed out no connection and
// dialed none: ctx had ended, or ended while Get waited for one of the
// endpoint's connections to come free, or MaxWait passed (ErrBusy).
// Nothing of the caller's went toward the endpoint: a retry that fails so
// was never sent. The error reads as its cause.
var ErrNotHandedOut = errors.New("no connection handed out")

// notHandedOut is an error of Get's that Is ErrNotHandedOut.
type notHandedOut struct{ err error }

func (e notHandedOut) Error() string        { return e.err.Error() }
func (e notHandedOut) Unwrap() error        { return e.err }
func (e notHandedOut) Is(target error) bool { return target == ErrNotHandedOut }

// Client is whom a Get is for: the app's pod, by name where the caller
// knows it, else by address. Gets with equal Clients are one client's.
// While an endpoint has no connection to spare, the next one freed goes to
// the waiting client that holds the fewest, and no client holds more than
// its share (Get).
type Client struct {
	Namespace, Name string
	Addr            netip.Addr
}

// DropReason says why the pool closed a connection instead of reusing it.
type DropReason int

const (
	// DropClosed: the peer ended the connection while it was idle, as
	// servers do after an idle timeout.
	DropClosed DropReason = iota
	// DropUnsolicited: the peer sent bytes nobody asked for — more than
	// the answer, or an answer with no request: a broken backend, or one
	// that read a request as two (request smuggling in front of it).
	DropUnsolicited
	// DropExpired: what verified the peer expired (Conn.Until).
	DropExpired
	// DropSettingsChanged: the settings it was made under changed, and
	// the new ones would not have made it (HandOver).
	DropSettingsChanged
)

// Conn is a pooled connection with its buffers. Between Get and Put,
// Discard or Detach it belongs to the caller alone.
type Conn struct {
	net.Conn
	// R and W buffer Conn. They travel with it through the pool, except
	// that a connection idle for trimAfter gives them back until Get hands
	// it out again.
	R *bufio.Reader
	W *bufio.Writer
	// Until, unless zero, is when the connection may no longer be handed
	// out: its caller sets it (the end of the certificate chain its TLS
	// handshake verified), and Get closes it from then on instead.
	Until time.Time

	ep *endpoint
	// client is whom it was handed to, while held (under Pool.mu): it
	// counts against that client's share of ep (endpoint.held).
	client    Client
	held      bool
	uses      int         // times it went back to the pool
	idleSince time.Time   // when it last went back
	lim       LimitReader // R reads through it
	// body is what lim reads once the head is read (EndHead): Conn, or
	// beneath TLS a tlsBody.
	body io.Reader
}

// EndHead lifts the bound on what R reads, once the final answer's head
// was read: bodies are not bounded. A body's TLS stream that ends without
// close_notify ends it with sockio.ErrTLSTruncated, not io.EOF: a body
// that runs to the close (an HTTP/1.0 answer without Content-Length) would
// otherwise be passed on whole, however short whoever ended the TCP
// connection cut it.
func (c *Conn) EndHead() { c.lim.R, c.lim.N = c.body, math.MaxInt64 }

// HeadErr is err, the failure of a read of an answer's heads, as
// ErrHeadTooLarge when the read met the bound: the bound cuts the heads'
// bytes where it falls, mid-line as likely as not, and a parser reads
// the cut line as malformed, never reaching the bound's error.
func (c *Conn) HeadErr(err error) error {
	if c.lim.N <= 0 && !errors.Is(err, ErrHeadTooLarge) {
		return fmt.Errorf("%w (%v)", ErrHeadTooLarge, err)
	}
	return err
}

// tlsBody reads a TLS connection, the end of the TCP connection under it
// (a FIN that came without close_notify) being sockio.ErrTLSTruncated.
type tlsBody struct {
	*tls.Conn
	under *sockio.Conn
}

func (b tlsBody) Read(p []byte) (int, error) {
	n, err := b.Conn.Read(p)
	if err == io.EOF && b.under.Ended() {
		err = sockio.ErrTLSTruncated
	}
	return n, err
}

// LimitReader is io.LimitedReader with an error of its own at the limit
// (a head too large, not the end of the stream), and reusable: N is set
// again for each head.
type LimitReader struct {
	R   io.Reader
	N   int64
	Err error
}

func (l *LimitReader) Read(p []byte) (int, error) {
	if l.N <= 0 {
		return 0, l.Err
	}
	if int64(len(p)) > l.N {
		p = p[:l.N]
	}
	n, err := l.R.Read(p)
	l.N -= int64(n)
	return n, err
}

// Reused reports whether c served an earlier caller: a failure before any
// response byte on a reused connection may mean the peer closed it while
// idle, so an idempotent request may be retried on another.
func (c *Conn) Reused() bool { return c.uses > 0 }

// reusable reports whether c, idle, may serve again: its Until has not
// passed and it is silent.
func (c *Conn) reusable() (bool, DropReason) {
	if !c.Until.IsZero() && !time.Now().Before(c.Until) {
		return false, DropExpired
	}
	return c.silent()
}

// silent reports whether nothing has arrived on c, an idle connection
// taken from the pool, since its last answer was read to the end: an idle
// HTTP/1.1 connection must be silent, so a byte means the peer is closing
// (a TLS close_notify, an end of stream) or sent an answer nobody asked
// for, which the next caller would take for its own (response queue
// poisoning: a backend that took one request for two answers both, and
// the second would reach another app). Every reuse pays for the look, a
// read that does not wait (sockio.NoWait; one system call): in the second
// or so after an answer, when checks were once skipped, is just when such
// an answer arrives. The read goes through crypto/tls, where records that
// came in with the answer's last read wait, not in the socket. What it
// takes stays in R, and a connection that is not silent is closed.
// Connections with no sockio.Conn underneath (tests' pipes) are taken as
// silent.
func (c *Conn) silent() (bool, DropReason) {
	if c.R.Buffered() > 0 {
		return false, DropUnsolicited
	}
	sc := sockio.Of(c.Conn)
	if sc == nil {
		return true, 0
	}
	sc.NoWait(true)
	_, err := c.R.Peek(1)
	sc.NoWait(false)
	switch {
	case err == nil:
		return false, DropUnsolicited
	case errors.Is(err, sockio.ErrWouldBlock):
		return true, 0
	}
	return false, DropClosed // an end of stream, a close_notify, a reset
}

// Pool is a set of per-endpoint pools; safe for concurrent use.
type Pool struct {
	cfg Config
	mu  sync.Mutex
	eps map[netip.AddrPort]*endpoint
	// readers and writers hold the buffers of connections long idle.
	readers, writers sync.Pool
	// sweep closes connections idle for IdleTimeout and trims those idle
	// for trimAfter. One timer for the pool, armed while any connection is
	// idle, rather than one per connection: a per-connection timer is
	// stopped and reset on every request, two timer-heap updates per
	// request on the hot path.
	sweep   *time.Timer
	sweepAt time.Time // when sweep fires; zero when it is not armed
	// closed is set by Close: connections put back are closed.
	closed bool
	// share is the most of an endpoint's connections one client may hold
	// (Config.MaxOpen).
	share int
	// heir is the pool that took p's place (HandOver): what p's endpoints
	// hold — connections handed out, slots dialed in — counts against
	// heir's as well (hold, unhold), so that MaxOpen and a client's share
	// hold across a change of the backend's settings. Pools lock in the
	// order they were made: p.mu, then heir's, never the other way.
	heir *Pool
}

type endpoint struct {
	addr netip.AddrPort
	idle []*Conn // oldest first; Get takes the last
	open int     // connections counted against MaxOpen, including dials in progress
	// held counts each client's connections handed out and not given
	// back, and slots it dials in: all of them together are open less
	// idle.
	held map[Client]int
	// waiting are the clients with Gets waiting, each with its own
	// waiters in the order they came; seq numbers them all so.
	waiting []*queue
	seq     uint64
}

// queue is one client's Gets waiting for an endpoint's connection.
type queue struct {
	client  Client
	waiters []waiter
}

// waiter is a Get waiting: c gets the connection it is handed, or nil for
// a slot to dial in.
type waiter struct {
	c   chan *Conn
	seq uint64
}

// hold counts a connection, or a slot, of ep against client, and in
// p's heir as one open and held there; p.mu is held.
func (p *Pool) hold(ep *endpoint, client Client) {
	if ep.held == nil {
		ep.held = make(map[Client]int)
	}
	ep.held[client]++
	if p.heir != nil {
		p.heir.inherit(ep.addr, client, 1)
	}
}

// unhold uncounts what hold counted, in p's heir too, where it frees a
// slot; p.mu is held.
func (p *Pool) unhold(ep *endpoint, client Client) {
	if n := ep.held[client] - 1; n > 0 {
		ep.held[client] = n
	} else {
		delete(ep.held, client)
	}
	if p.heir != nil {
		p.heir.inherit(ep.addr, client, -1)
	}
}

// atShare reports whether client holds share of ep's connections, the
// most one client may; p.mu is held. Only an endpoint with share in use
// looks client up: the fast path's Get finds fewer.
func (ep *endpoint) atShare(client Client, share int) bool {
	return ep.open-len(ep.idle) >= share && ep.held[client] >= share
}

// next takes the waiter due what ep frees now, if any, and holds that
// for its client: the first waiter of the waiting client that holds the
// fewest of ep's connections, or of those that hold as few, the one whose
// first came first, passing over clients that hold share. An endpoint's
// connections serve every pod on the node: in the order Gets came, one
// pod keeping them all busy with more queued held up every other pod's
// Gets behind its queue until MaxWait failed them. So what each waiting
// client holds grows while it is below the others', towards an equal
// part. Nothing can be taken back from a client while its exchanges last
// (answers that never end: event streams, long polls), so none may hold
// more than share: the others always find the rest. p.mu is held.
func (p *Pool) next(ep *endpoint) (chan *Conn, Client, bool) {
	best, fewest := -1, 0
	for i, q := range ep.waiting {
		n := ep.held[q.client]
		if n < p.share && (best < 0 || n < fewest || n == fewest && q.waiters[0].seq < ep.waiting[best].waiters[0].seq) {
			best, fewest = i, n
		}
	}
	if best < 0 {
		return nil, Client{}, false
	}
	q := ep.waiting[best]
	w := q.waiters[0]
	if q.waiters = q.waiters[1:]; len(q.waiters) == 0 {
		ep.waiting = slices.Delete(ep.waiting, best, best+1)
	}
	p.hold(ep, q.client)
	return w.c, q.client, true
}

// enqueue adds a waiter of client; p.mu is held.
func (ep *endpoint) enqueue(client Client, c chan *Conn) {
	ep.seq++
	w := waiter{c: c, seq: ep.seq}
	for _, q := range ep.waiting {
		if q.client == client {
			q.waiters = append(q.waiters, w)
			return
		}
	}
	ep.waiting = append(ep.waiting, &queue{client: client, waiters: []waiter{w}})
}

// dequeue removes client's waiter c, and reports whether it was still
// waiting (nothing was handed to it); p.mu is held.
func (ep *endpoint) dequeue(client Client, c chan *Conn) bool {
	for i, q := range ep.waiting {
		if q.client != client {
			continue
		}
		j := slices.IndexFunc(q.waiters, func(w waiter) bool { return w.c == c })
		if j < 0 {
			return false
		}
		if q.waiters = slices.Delete(q.waiters, j, j+1); len(q.waiters) == 0 {
			ep.waiting = slices.Delete(ep.waiting, i, i+1)
		}
		return true
	}
	return false
}

// New returns an empty Pool.
func New(cfg Config) *Pool {
	if cfg.MaxIdle == 0 {
		cfg.MaxIdle = 64
	}
	if cfg.MaxOpen <= 0 {
		cfg.MaxOpen = 1024
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 10 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 90 * time.Second
	}
	if cfg.BufferSize <= 0 {
		cfg.BufferSize = 16 << 10
	}
	if cfg.MaxHeadBytes <= 0 {
		cfg.MaxHeadBytes = http.DefaultMaxHeaderBytes
	}
	p := &Pool{cfg: cfg, share: clientShare(cfg.MaxOpen, cfg.ClientShare), eps: make(map[netip.AddrPort]*endpoint)}
	p.readers.New = func() any { return bufio.NewReaderSize(nil, cfg.BufferSize) }
	p.writers.New = func() any { return bufio.NewWriterSize(nil, cfg.BufferSize) }
	p.sweep = time.AfterFunc(time.Hour, p.expire)
	p.sweep.Stop()
	return p
}

// defaultClientShare leaves an eighth of an endpoint's connections to the
// other clients: enough that they are served while one holds the rest,
// little enough that one client alone is not held back much.
const defaultClientShare = 7.0 / 8

// clientShare is the most of maxOpen connections one client may hold under
// Config.ClientShare f: at least one, at most all.
func clientShare(maxOpen int, f float64) int {
	if !(f > 0) { // NaN too
		f = defaultClientShare
	}
	// Less a nano-connection, so that a float's error in the product
	// (100 × 7/100 is 7.000000000000001) rounds no whole share up.
	n := int(math.Ceil(float64(maxOpen)*f - 1e-9))
	return min(max(n, 1), maxOpen)
}

// Get returns an idle connection to addr, or one dialed with dial when addr
// has fewer than MaxOpen connections; otherwise, or when client holds its
// share of them (Config.MaxOpen), it waits for one to be put back or
// closed, until ctx ends or MaxWait passed (ErrBusy; either error Is
// ErrNotHandedOut, a failed dial's is dial's own). The connections an
// endpoint frees while clients wait go to the client that holds the
// fewest of its connections (endpoint.next): one client's queue does not
// hold up another's Gets, nor do its exchanges that never end. Idle
// connections the peer has closed are dropped on the way. A ctx that has
// already ended gets none, not even an idle one or one handed over as it
// ended, as from net/http's Transport: the caller's time is up (a route's
// request timeout), and nothing may go out for it.
func (p *Pool) Get(ctx context.Context, addr netip.AddrPort, client Client, dial func(context.Context) (net.Conn, error)) (*Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, notHandedOut{err}
	}
	var busy *time.Timer // made by the first wait
	for {
		p.mu.Lock()
		ep := p.endpoint(addr)
		atShare := ep.atShare(client, p.share)
		if n := len(ep.idle); n > 0 && !atShare {
			c := ep.idle[n-1]
			ep.idle[n-1] = nil
			ep.idle = ep.idle[:n-1]
			p.hold(ep, client)
			c.client, c.held = client, true
			p.mu.Unlock()
			if c.R == nil {
				p.untrim(c)
			}
			if ok, why := c.reusable(); !ok {
				p.drop(c, why)
				continue
			}
			return p.handOut(c), nil
		}
		if ep.open < p.cfg.MaxOpen && !atShare {
			ep.open++
			p.hold(ep, client)
			p.mu.Unlock()
			return p.dial(ctx, ep, client, dial)
		}
		if busy == nil {
			busy = time.NewTimer(p.cfg.MaxWait) // once: a wait the drops restart is still one wait
			defer busy.Stop()
		}
		c, freed, err := p.wait(ctx, ep, client, busy.C)
		switch {
		case err != nil && atShare && errors.Is(err, ErrBusy):
			if p.cfg.AtShare != nil {
				p.cfg.AtShare()
			}
			return nil, notHandedOut{fmt.Errorf("%w, its client holding its share (%d) when it began to wait", err, p.share)}
		case err != nil:
			return nil, notHandedOut{err}
		case freed:
			return p.dial(ctx, ep, client, dial) // a slot was freed for us
		}
		if ok, why := c.reusable(); !ok {
			p.drop(c, why)
			continue
		}
		return p.handOut(c), nil
	}
}

// wait queues client for ep's next connection put back, or slot freed
// (freed), until ctx ends or busy fires (ErrBusy); p.mu is held, and
// released.
func (p *Pool) wait(ctx context.Context, ep *endpoint, client Client, busy <-chan time.Time) (c *Conn, freed bool, err error) {
	w := make(chan *Conn, 1)
	ep.enqueue(client, w)
	p.mu.Unlock()
	select {
	case c := <-w:
		// The select takes either when both are ready: one handed over
		// as ctx ended goes on, as Get gives an ended ctx nothing.
		if err = ctx.Err(); err == nil {
			return c, c == nil, nil
		}
		p.passOn(ep, client, c)
		return nil, false, err
	case <-ctx.Done():
		err = ctx.Err()
	case <-busy:
		err = fmt.Errorf("%s: %w for %v", ep.addr, ErrBusy, p.cfg.MaxWait)
	}
	p.mu.Lock()
	waiting := ep.dequeue(client, w)
	p.mu.Unlock()
	if !waiting {
		// Handed a connection or a slot as the wait ended.
		p.passOn(ep, client, <-w)
	}
	return nil, false, err
}

// passOn gives c, or the slot (c nil), that ep handed to a waiter of
// client which no longer wants it, to the next.
func (p *Pool) passOn(ep *endpoint, client Client, c *Conn) {
	if c != nil {
		p.Put(c)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unhold(ep, client)
	p.free(ep)
}

// endpoint returns addr's endpoint, new if it has none; p.mu is held.
func (p *Pool) endpoint(addr netip.AddrPort) *endpoint {
	ep := p.eps[addr]
	if ep == nil {
		ep = &endpoint{addr: addr}
		p.eps[addr] = ep
	}
	return ep
}

// dial dials in a slot of ep held for client.
func (p *Pool) dial(ctx context.Context, ep *endpoint, client Client, dial func(context.Context) (net.Conn, error)) (*Conn, error) {
	nc, err := dial(ctx)
	if err != nil {
		p.passOn(ep, client, nil)
		return nil, err
	}
	c := &Conn{Conn: nc, ep: ep, client: client, held: true, lim: LimitReader{Err: ErrHeadTooLarge}, body: nc}
	if tc, ok := nc.(*tls.Conn); ok {
		if under := sockio.Of(tc.NetConn()); under != nil {
			c.body = tlsBody{tc, under}
		}
	}
	p.untrim(c)
	return p.handOut(c), nil
}

// trimAfter is how long a connection stays idle before it gives its
// buffers back, or, beyond MaxIdle, closes: a pool keeps up to MaxIdle
// connections per endpoint, each with 2×BufferSize (32 KiB) it needs only
// while in use, and connections reused within seconds should not pay to
// take them again.
const trimAfter = 10 * time.Second

// trim gives back the buffers of c, idle and empty (Put checked R; W was
// flushed by the last request).
func (p *Pool) trim(c *Conn) {
	c.R.Reset(nil)
	c.W.Reset(nil)
	p.readers.Put(c.R)
	p.writers.Put(c.W)
	c.R, c.W = nil, nil
}

// untrim gives c buffers again.
func (p *Pool) untrim(c *Conn) {
	c.R = p.readers.Get().(*bufio.Reader)
	c.R.Reset(&c.lim)
	c.W = p.writers.Get().(*bufio.Writer)
	c.W.Reset(c.Conn)
}

// handOut bounds the heads of c's next answer: MaxHeadBytes, plus what R
// may read ahead of the head's end.
func (p *Pool) handOut(c *Conn) *Conn {
	c.lim.R, c.lim.N = c.Conn, int64(p.cfg.MaxHeadBytes+p.cfg.BufferSize)
	return c
}

// drop closes c, which is not reusable, and says why.
func (p *Pool) drop(c *Conn, why DropReason) {
	p.Discard(c)
	if p.cfg.Dropped != nil {
		p.cfg.Dropped(why)
	}
}

// Put gives c back for reuse: the caller read its last response to the end,
// nothing is buffered in W, and neither side asked to close. A connection
// with bytes left in R is closed instead: the peer sent more than the
// response it was asked for (a legacy server's body after HEAD, 204 or
// 304, a stray CRLF), and the next caller would read them as its own
// response's start. Get checks what arrives later (see silent).
func (p *Pool) Put(c *Conn) {
	if c.R.Buffered() > 0 {
		p.drop(c, DropUnsolicited)
		return
	}
	c.uses++
	p.mu.Lock()
	ep := c.ep
	p.unhold(ep, c.client)
	if w, client, ok := p.next(ep); ok {
		c.client = client
		p.mu.Unlock()
		w <- c
		return
	}
	c.held = false
	if p.cfg.MaxIdle < 0 || p.closed {
		p.mu.Unlock()
		p.Discard(c)
		return
	}
	c.idleSince = time.Now()
	p.park(c)
	p.mu.Unlock()
}

// park adds c, idle since c.idleSince, to its endpoint's idle ones; p.mu
// is held.
func (p *Pool) park(c *Conn) {
	c.ep.idle = append(c.ep.idle, c)
	// Armed for later (every idle connection trimmed, waiting to expire),
	// the sweep comes sooner for this one's turn.
	if due := c.idleSince.Add(min(trimAfter, p.cfg.IdleTimeout)); p.sweepAt.IsZero() || due.Before(p.sweepAt) {
		p.sweepAt = due
		p.sweep.Reset(time.Until(due))
	}
}

// Discard closes c and frees its slot.
func (p *Pool) Discard(c *Conn) {
	c.Conn.Close()
	p.release(c)
}

// Detach frees c's slot and leaves c open and to the caller (an upgraded
// connection that will never carry HTTP again).
func (p *Pool) Detach(c *Conn) { p.release(c) }

// release frees c's slot, and its client's hold on it.
func (p *Pool) release(c *Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.held {
		c.held = false
		p.unhold(c.ep, c.client)
	}
	p.free(c.ep)
}

// free frees one slot of ep: a waiter may dial in its place; an endpoint
// with nothing left is forgotten. p.mu is held.
func (p *Pool) free(ep *endpoint) {
	if w, _, ok := p.next(ep); ok {
		w <- nil // the slot passes to the waiter
		return
	}
	ep.open--
	if ep.open == 0 && p.eps[ep.addr] == ep {
		delete(p.eps, ep.addr)
	}
}

// expire closes the connections idle for IdleTimeout or longer, and
// those idle for trimAfter beyond an endpoint's MaxIdle, trims the others
// idle for trimAfter, and arms the sweep again for the next one to reach
// either. Idle lists are oldest first, so the closed ones are a prefix of
// each (the least recently used), and the trimmed ones the prefix after.
func (p *Pool) expire() {
	now := time.Now()
	var expired []*Conn
	p.mu.Lock()
	var next time.Duration
	at := func(d time.Duration) {
		if next == 0 || d < next {
			next = d
		}
	}
	for _, ep := range p.eps {
		n := 0
		for n < len(ep.idle) && now.Sub(ep.idle[n].idleSince) >= p.cfg.IdleTimeout {
			n++
		}
		for n < len(ep.idle)-p.cfg.MaxIdle && now.Sub(ep.idle[n].idleSince) >= trimAfter {
			n++
		}
		expired = append(expired, ep.idle[:n]...)
		ep.idle = slices.Delete(ep.idle, 0, n)
		for _, c := range ep.idle {
			if idle := now.Sub(c.idleSince); idle < trimAfter {
				at(trimAfter - idle)
				break
			}
			if c.R != nil {
				p.trim(c)
			}
		}
		if len(ep.idle) > 0 {
			at(p.cfg.IdleTimeout - now.Sub(ep.idle[0].idleSince))
		}
	}
	p.sweepAt = time.Time{}
	if next > 0 {
		p.sweepAt = now.Add(next)
		p.sweep.Reset(next)
	}
	p.mu.Unlock()
	for _, c := range expired {
		p.Discard(c)
	}
}

// Close closes every idle connection, and each one in use as it is put
// back (the backend left the snapshot or its settings changed, or the
// proxy is shutting down): nothing takes them from this pool again, and
// kept, they stayed open until IdleTimeout. A request still under way on
// the old settings may Get and Put a connection as before; it is closed
// once put back. Idle connections the new settings keep (HandOver) were
// moved before.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	for _, c := range p.takeIdle() {
		p.Discard(c)
	}
}

// takeIdle takes every idle connection out of p.
func (p *Pool) takeIdle() []*Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	var idle []*Conn
	for _, ep := range p.eps {
		idle = append(idle, ep.idle...)
		clear(ep.idle)
		ep.idle = ep.idle[:0]
	}
	return idle
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
