package httpproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// An app that stops in the middle of an exchange — it sends part of a
// request body and no more, or stops reading a large answer — holds what
// the exchange holds for as long as it stays: a pooled HTTP/1.1 upstream
// connection, one of the endpoint's MaxConnsPerEndpoint shared by every
// pod on the node. A stallWatch ends such an exchange once a read of the
// app's body or a write of the answer to it has been under way for
// Config.StallTimeout with no byte through, as nginx's client_body_timeout
// and send_timeout do (the time between two successive reads or writes).
// Nothing under way is no stall: an answer stream whose backend is quiet
// (server-sent events, MCP, gRPC server streaming, long polls) waits on
// the backend, not on the app. A write under way moves as the kernel takes
// its bytes, not only when it returns: a write of 32 KiB to an app that
// reads a KiB now and then waits through many of its reads (writeProgress).
// It ticks every StallTimeout/stallTicks while its exchanges run, so a read
// or write pays two atomic additions and a load rather than a deadline
// update, and a stall is ended between a quarter and a half more than
// StallTimeout after its last byte (the tick after it finds it moved, and
// StallTimeout more must pass quiet: tick).

// errAppStalled is the failure of an exchange a stallWatch ended.
var errAppStalled = errors.New("app made no progress")

const stallTicks = 4

// stallOwner is what a stallWatch watches: an exchange on net/http's
// server, or a fast-path connection.
type stallOwner interface {
	// stallStop ends what is under way: the app's reads and writes fail
	// at once (deadlines in the past), and whatever the exchange waits
	// on upstream with them.
	stallStop()
	// exchanging reports whether an exchange runs: the watch ticks only
	// then.
	exchanging() bool
	// progress is a count that grows as the app's connection takes the
	// bytes of a write under way (writeProgress), or 0.
	progress() uint64
}

// writeProgress is a connection whose writes count the bytes the peer
// took while they wait for it (sockio.Conn.Progress).
type writeProgress interface{ Progress() uint64 }

// progressOf is the Progress of c, or of the connection under its wrappers
// (NetConn) that has one; 0 when none does.
func progressOf(c net.Conn) uint64 {
	for {
		if p, ok := c.(writeProgress); ok {
			return p.Progress()
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return 0
		}
		c = u.NetConn()
	}
}

// stallWatch watches the reads and writes of one app connection (the fast
// path) or request (net/http's server), once init readied it.
type stallWatch struct {
	timeout time.Duration
	of      stallOwner
	// panics reports a panic of tick, which runs in its timer's
	// goroutine: contained, it leaves the exchange unwatched.
	panics *contain.Reporter
	t      *time.Timer
	armed  atomic.Bool
	// mu orders stallStop against end: once end returned, none runs (on
	// net/http's server, the connection's next request would get the
	// deadlines).
	mu    sync.Mutex
	ended bool
	// moved counts the reads and writes that returned, pending those
	// under way (whose bytes the owner's progress counts meanwhile).
	moved   atomic.Uint64
	pending atomic.Int32
	stalled atomic.Bool
	// The tick's own: moved at the last tick, and the ticks since that
	// found something under way and nothing moved.
	seen  uint64
	quiet int
}

func (w *stallWatch) init(timeout time.Duration, of stallOwner, panics *contain.Reporter) {
	w.timeout, w.of, w.panics = timeout, of, panics
	w.t = time.AfterFunc(time.Hour, w.tick) // made before watch: tick reads it
	w.t.Stop()
}

// watch makes the watch tick, if it does not already.
func (w *stallWatch) watch() {
	if !w.armed.Swap(true) {
		w.t.Reset(w.timeout / stallTicks)
	}
}

// end stops the ticks for good.
func (w *stallWatch) end() {
	w.mu.Lock()
	w.ended = true
	w.mu.Unlock()
	w.t.Stop()
}

func (w *stallWatch) tick() {
	var err error
	defer w.panics.Recover("stall watch", &err, nil)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return
	}
	moved := w.moved.Load() + w.of.progress()
	if w.pending.Load() > 0 && moved == w.seen {
		w.quiet++
	} else {
		w.quiet = 0
	}
	w.seen = moved
	// More than stallTicks: what was under way at the first quiet tick
	// may have started just before it.
	if w.quiet > stallTicks && !w.stalled.Swap(true) {
		w.of.stallStop()
		return
	}
	w.armed.Store(false)
	if w.of.exchanging() {
		w.watch()
	}
}

// begin and done bracket a read or write of the app; done says whether
// bytes went through, and turns the failure of one the watch ended into
// errAppStalled (on HTTP/2 a reset stream's, not a deadline's).
func (w *stallWatch) begin() { w.pending.Add(1) }

func (w *stallWatch) done(n int, err error) error {
	w.pending.Add(-1)
	if n > 0 {
		w.moved.Add(1)
	}
	if err != nil && w.stalled.Load() {
		return fmt.Errorf("%w for %v: %w", errAppStalled, w.timeout, err)
	}
	return err
}

// stalledReader reads an app's request body under w, if set, and keeps
// why its first read that failed on the app's side did. The transports
// read the body in a goroutine of their own, and fail the request with an
// error of the connection they close in turn (the HTTP/1.1 pool's "read
// answer: use of closed network connection"): without it, a malformed
// chunk of the app's read as the backend's failure (upstream_error).
type stalledReader struct {
	io.ReadCloser
	w      *stallWatch
	failed atomic.Pointer[error]
	// closed is set once it is closed (its tries are over, or a
	// transport gave up on it): a read that fails then, as a read under
	// way of an HTTP/2 app's body does, failed nothing of the app's.
	closed atomic.Bool
	// h1 says it reads an HTTP/1.x app's body on net/http's server,
	// whose Close waits for a read under way (the body's lock): that
	// read's failure is the app's, closed or not, and only a read after
	// the close fails of it (http.ErrBodyReadAfterClose).
	h1 bool
	// reading is held through a read and the keeping of its failure
	// (settled).
	reading sync.Mutex
}

func (r *stalledReader) Read(p []byte) (int, error) {
	r.reading.Lock()
	defer r.reading.Unlock()
	if r.w == nil {
		return r.check(r.ReadCloser.Read(p))
	}
	r.w.begin()
	n, err := r.ReadCloser.Read(p)
	return r.check(n, r.w.done(n, err))
}

// check keeps err, of a read of n bytes, if it is the first to fail on
// the app's side.
func (r *stalledReader) check(n int, err error) (int, error) {
	if err != nil && err != io.EOF && r.appFailed(err) {
		failed := err // its own variable: allocated only here
		r.failed.CompareAndSwap(nil, &failed)
	}
	return n, err
}

// appFailed reports whether err, a read's failure, is the app's rather
// than the close's.
func (r *stalledReader) appFailed(err error) bool {
	if r.h1 {
		return !errors.Is(err, http.ErrBodyReadAfterClose)
	}
	return !r.closed.Load()
}

func (r *stalledReader) Close() error {
	r.closed.Store(true)
	return r.ReadCloser.Close()
}

// broken is why reading the app's body failed, or nil.
func (r *stalledReader) broken() error {
	if err := r.failed.Load(); err != nil {
		return *err
	}
	return nil
}

// settled is broken once a read under way has returned. Ask it only when
// no read can wait on the app: net/http's HTTP/1 server cancels a
// request's context as its read of the app's connection fails, inside the
// body's read that failed, and a transport that gives up on the request
// then may return before that read tells why.
func (r *stalledReader) settled() error {
	r.reading.Lock()
	defer r.reading.Unlock()
	return r.broken()
}

// stalledResponse is an answer on net/http's server written under w: its
// writes and flushes (HTTP/2's wait for the app's flow control).
type stalledResponse struct {
	http.ResponseWriter
	w *stallWatch
}

func (s *stalledResponse) Write(p []byte) (int, error) {
	s.w.begin()
	n, err := s.ResponseWriter.Write(p)
	return n, s.w.done(n, err)
}

func (s *stalledResponse) Flush() {
	s.w.begin()
	err := http.NewResponseController(s.ResponseWriter).Flush()
	s.w.done(1, err)
}

func (s *stalledResponse) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// watchApp readies x's stall watch over its exchange with its app on w,
// r's, unless it did already, until x.stall.end: the reads of bodies the
// proxy reads itself (readBody), and what watchStalls adds. The server's
// deadlines end it (per stream on HTTP/2: the body's reads fail, the
// stream is reset).
func (h *Handler) watchApp(w http.ResponseWriter, r *http.Request, x *exchange) {
	if x.stalls != nil {
		return
	}
	if r.ProtoMajor == 1 {
		x.conn = x.t.Conn
	}
	x.answer = stalledResponse{ResponseWriter: w, w: &x.stall}
	x.stall.init(h.cfg.StallTimeout, x, h.cfg.Panics)
	x.stall.watch()
	x.stalls = &x.stall
}

// watchStalls puts x's exchange with its app on w, r's, under x's stall
// watch (watchApp): also the answer's writes, and toward a backend that is
// not HTTP/2 the reads of out's body (see sentBody.track's callers), by
// every try: a body recorded for a rule's retries or mirrors (keepBody) is
// watched beneath its recording, whose later tries read the rest from the
// app there. Toward any backend, x.body then keeps why that body broke
// (refuseBrokenBody). It returns w as the answer is to be written.
func (h *Handler) watchStalls(w http.ResponseWriter, r *http.Request, x *exchange, out *http.Request, wire upstream.Wire) http.ResponseWriter {
	h.watchApp(w, r, x)
	if out.Body != nil && out.Body != http.NoBody {
		body := &out.Body
		if x.tee != nil {
			body = &x.tee.src
		}
		x.body = stalledReader{ReadCloser: *body, w: &x.stall, h1: r.ProtoMajor == 1}
		if wire == upstream.WireH2 {
			// A quiet request stream toward an HTTP/2 backend holds a
			// stream, not a pooled connection (gRPC's client-streaming
			// calls idle legitimately): only why it broke is kept.
			x.body.w = nil
		}
		*body = &x.body
	}
	return &x.answer
}

func (x *exchange) stallStop() {
	rc := http.NewResponseController(x.answer.ResponseWriter)
	rc.SetReadDeadline(aLongTimeAgo)
	rc.SetWriteDeadline(aLongTimeAgo)
}

// exchanging: the watch of an exchange ticks until its end.
func (x *exchange) exchanging() bool { return true }

// progress: the HTTP/1.x app's connection's, which net/http's server
// writes an answer's large writes to as they come. On HTTP/2 one
// connection's bytes are every stream's, and a stream waits on its flow
// control (Flush) rather than on a write: only a write's return moves.
func (x *exchange) progress() uint64 {
	if x.conn == nil {
		return 0
	}
	return progressOf(x.conn)
}

// stalledWriter writes an answer to an app under w.
type stalledWriter struct {
	dst io.Writer
	w   *stallWatch
}

func (s *stalledWriter) Write(p []byte) (int, error) {
	s.w.begin()
	n, err := s.dst.Write(p)
	return n, s.w.done(n, err)
}
