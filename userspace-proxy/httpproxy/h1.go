package httpproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http/httpguts"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/relay"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// The HTTP/1 fast path. Measured against net/http's Server, ReverseProxy
// style forwarding and Transport (test/bench/proxy, ../shared/BENCH.md),
// those cost two goroutine hand-offs and a request clone per request, and
// their HTTP/1.1 pool is per Transport. Here one goroutine per client
// connection reads a request with net/http's parser (http.ReadRequest),
// writes it with Request.Write on a pooled upstream connection (keep-alive,
// TLS resumed), reads the answer with http.ReadResponse and writes it back.
// Requests on one connection are served in order (pipelined ones wait in
// the read buffer); a request body is written upstream by a second
// goroutine only when it is not already buffered, so the answer can start
// before the body ends.

// ServeHTTP1 serves the HTTP/1.x requests of client connection c, whose
// original destination and client are t's, until the client or Drain ends
// it, an error makes it unusable, or it switches protocols (WebSocket). It
// takes ownership of c and closes it, and calls t.Ended then. A connection
// that waits Config.ParkAfter for its next request parks (h1Conn.park):
// ServeHTTP1 returns, and the connection lives on.
func (h *Handler) ServeHTTP1(c net.Conn, t *Target) {
	s := &h1Conn{h: h, c: c, t: t, wmu: make(writeTurn, 1)}
	s.watch.s = s
	s.stall.init(h.cfg.StallTimeout, s, h.cfg.Panics)
	s.out = stalledWriter{dst: c, w: &s.stall}
	if !h.h1.track(s) {
		s.close()
		t.ended()
		return
	}
	s.ahead = aheadReader{r: c, bufs: h.h1.heads}
	s.lim = pool.LimitReader{R: &s.ahead, N: math.MaxInt64, Err: errHeaderTooLarge}
	s.pooled = sockio.Pooled(c)
	s.run(false)
}

// run serves the connection's requests until it ends, parks, or becomes a
// WebSocket (relayTunnel); resumed says it parked, and waits for a request
// first.
func (s *h1Conn) run(resumed bool) {
	handedOff := false
	defer func() {
		if !handedOff {
			s.end()
		}
	}()
	if resumed {
		s.setDeadline(s.idleSince.Add(s.h.cfg.IdleTimeout), true)
		ok := s.waitRequest()
		s.idleDeadline = false // the next wait arms its own
		if !ok {
			return
		}
	}
	for {
		switch s.next() {
		case waitEnded:
			return
		case waitPark:
			handedOff = true
			go s.park()
			return
		}
		// Every write of the exchange to the app is watched, the
		// proxy's own answers and refusals too, and every read of its
		// body.
		s.stall.watch()
		req, err := s.readRequest()
		if err != nil {
			s.badRequest(err)
			return
		}
		if !s.serve(req) || !s.idle() {
			if s.tunnel != nil {
				handedOff = true
				go s.relayTunnel()
			}
			return
		}
	}
}

// park waits for the connection's next request in a goroutine of its own,
// and serves it there. The goroutine that served the requests before has
// a stack grown to 8 KiB on the way (crypto/tls's records, the parsers),
// which the GC cannot shrink while the connection waits 3 KiB deep in
// it; this one waits in 2 KiB. A node's proxy keeps every pod's idle
// keep-alive connections: parked, each holds 11 KiB where it held 17
// (test/bench/proxy -idle), for a goroutine start and a stack grown again
// per wait that outlasts ParkAfter.
func (s *h1Conn) park() {
	var err error
	defer s.h.cfg.Panics.Recover("connection", &err, func() { sockio.Reset(s.c) })
	s.run(true)
}

// end releases what the connection holds and closes it, once it ends.
func (s *h1Conn) end() {
	if s.up.uc != nil {
		// A panic unwound the exchange (the connection's recover contains
		// it): its pooled connection is closed and frees its place, once
		// the request body's goroutine, which reads br, has ended.
		s.release(&s.x, false)
	}
	s.h.h1.readers.put(s.br)
	s.ahead.release()
	s.h.h1.untrack(s)
	s.stall.end()
	s.close()
	s.t.ended()
}

// exchanging reports whether a request is being served (the stall watch
// ticks only then).
func (s *h1Conn) exchanging() bool { return s.state.Load() == stateActive }

// progress: the connection's, which counts the bytes of a write under way
// as the kernel takes them, through its wrappers (sockio.Conn; looked up
// per tick, which no request pays for).
func (s *h1Conn) progress() uint64 { return progressOf(s.c) }

// stallStop ends the exchange of an app that stopped moving: its reads
// and writes fail at once, and so does the wait on the backend.
func (s *h1Conn) stallStop() {
	s.c.SetReadDeadline(aLongTimeAgo)
	s.c.SetWriteDeadline(aLongTimeAgo)
	s.watch.mu.Lock()
	s.watch.end()
	s.watch.mu.Unlock()
}

// Drain stops the fast path's keep-alive: connections waiting for a request
// are closed now, the others after their current answer (which says
// Connection: close), parked ones too, and mirrored requests in flight are
// cancelled. The proxy calls it on shutdown and waits for each
// connection's Target.Ended (ServeHTTP1 may have returned before: parked).
func (h *Handler) Drain() {
	h.stopMirrors()
	h.h1.draining.Store(true)
	h.h1.mu.Lock()
	defer h.h1.mu.Unlock()
	for s := range h.h1.conns {
		if s.state.CompareAndSwap(stateIdle, stateClosed) {
			s.c.Close()
		}
	}
}

// h1State is the Handler's fast-path bookkeeping.
type h1State struct {
	draining atomic.Bool
	mu       sync.Mutex
	conns    map[*h1Conn]struct{}
	// readers hold a client connection's unread bytes from the moment
	// its next request starts to arrive, writers while an answer is
	// written: a connection waiting for a request holds neither
	// (waitRequest), where it held 4 KiB, once 36.
	readers readerPool
	writers sync.Pool
	// heads lend waitRequest a reader's worth of buffer for the bytes
	// that end a wait.
	heads *relay.Pool
}

// readerSize sizes the readers of client connections (net/http's too).
const readerSize = 4 << 10

// readerPool lends the readers of client connections, counting those out.
type readerPool struct {
	p     sync.Pool
	inUse atomic.Int64
}

// get returns a reader of readerSize bytes reading r.
func (p *readerPool) get(r io.Reader) *bufio.Reader {
	p.inUse.Add(1)
	br, _ := p.p.Get().(*bufio.Reader)
	if br == nil {
		return bufio.NewReaderSize(r, readerSize)
	}
	br.Reset(r)
	return br
}

// put gives br back, if there is one.
func (p *readerPool) put(br *bufio.Reader) {
	if br == nil {
		return
	}
	p.inUse.Add(-1)
	br.Reset(nil)
	p.p.Put(br)
}

const answerBufferSize = 32 << 10 // two full TLS records of a large body per write

func (s *h1State) init() {
	s.conns = make(map[*h1Conn]struct{})
	s.heads = relay.NewPoolSize(readerSize)
	s.writers.New = func() any { return bufio.NewWriterSize(nil, answerBufferSize) }
}

func (s *h1State) track(c *h1Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining.Load() {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *h1State) untrack(c *h1Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

// A connection's state: Drain closes it only while it waits for a request.
const (
	stateIdle int32 = iota
	stateActive
	stateClosed
)

// h1Conn is one client connection on the fast path.
type h1Conn struct {
	h   *Handler
	c   net.Conn
	t   *Target
	lim pool.LimitReader
	// br reads lim, which reads ahead, then c; nil while the connection
	// waits for a request (waitRequest).
	br    *bufio.Reader
	ahead aheadReader
	// pooled is c as a sockio.PooledReader; nil when a layer of c cannot
	// read that way, and then br stays for the connection's life.
	pooled sockio.PooledReader
	state  atomic.Int32
	x      exchange // the current request's, reused
	// rt is the current request's route decision, allocated by the
	// first routed request and reused: connections to frontends without
	// routes do not carry it.
	rt *routed
	// up is the pooled upstream connection of the answer being written.
	up upstreamConn
	// sent wraps a request body that a goroutine writes upstream, to tell
	// when the client's side of it was read whole (finish).
	sent sentBody
	// v and fe are the snapshot view and frontend the current request is
	// served on, looked up before it is read when its head is at hand
	// (plainFor), else by serve.
	v  *View
	fe *snapshot.Frontend
	// plainReq says the current request was read plain (h1head.go); fields
	// are its header lines to forward, body reads its sized body.
	plainReq bool
	fields   []byte
	body     sizedBody
	// mcp is the token a plain request's MCP session ID named
	// (cutMCPSession); "" without one.
	mcp string
	// plain is the current answer when its head was plain.
	plain plainAnswer
	// tunnel is the upstream side of a WebSocket upgrade the backend
	// accepted (its connection, or its extended CONNECT stream), relayed
	// by relayTunnel.
	tunnel io.ReadWriteCloser
	// watch ends an exchange whose client left (h1watch.go).
	watch clientWatch
	// stall ends an exchange whose client stopped moving (stall.go); out
	// is c as the answers' writers write it, under stall.
	stall stallWatch
	out   stalledWriter
	// probe is where a streamed answer waiting for its next event reads
	// it (bodyCopy.waitBody); taken the first time one waits.
	probe *[probeSize]byte
	// ctx bounds waits for an upstream connection and a retry's backoff;
	// the watch ends it (leave) when the client leaves. Made by the first
	// request that waits (leaveCtx).
	ctx   context.Context
	leave context.CancelFunc
	// client is t's as the upstream pools tell clients apart, looked up
	// by the first request that needs it (poolClient); base names it to a
	// backend's RoundTripper (clientCtx).
	client    pool.Client
	clientSet bool
	base      context.Context
	// wmu orders the fast path's writes to c against a 100 Continue sent
	// from the request body's goroutine; answered is set under it once the
	// final answer starts.
	wmu      writeTurn
	answered bool
	// closeAfter is set when the current request asked to close.
	closeAfter bool
	// cont is the current request's body when it expects 100 Continue.
	cont *continueReader
	// unread is set when the connection ends before the client's request
	// was read whole (close lingers).
	unread bool
	// broken is set when an answer broke off: the connection ends with a
	// reset.
	broken bool
	// head is the next request's head buffered whole by next (nil: larger
	// than the reader), for readPlainRequest and checkHead.
	head []byte
	// deadline is c's read deadline (zero: none); idleDeadline says it is
	// the idle one.
	deadline     time.Time
	idleDeadline bool
	// idleSince is when the connection last started to wait for a
	// request; waitErr is why waitRequest's read of the connection ended
	// a wait.
	idleSince time.Time
	waitErr   error
	// counted caches the requests counter of the last answer's labels:
	// a connection's requests mostly share service, backend and status.
	counted struct {
		fe   *snapshot.Frontend
		be   *upstream.Backend
		code int
		c    prometheus.Counter
	}
}

// What next found.
const (
	waitReady = iota // a request starts
	waitEnded        // the client is gone, Drain closed it, or it idled out
	waitPark         // it waited ParkAfter: park it
)

// next waits for the start of the next request (at most ParkAfter, or
// IdleTimeout when it does not park) and marks the connection busy.
//
// Deadlines are timer updates, three per request done naively; a
// keep-alive connection instead re-arms its idle deadline when it has
// drifted by more than deadlineSlack (so the idle timeout, or the park,
// may come up to that much early), and sets the header deadline only when
// the request head is not already buffered (then no read can stall).
func (s *h1Conn) next() int {
	// As net/http: the header block plus what bufio may read ahead.
	s.lim.N = int64(s.h.cfg.MaxHeaderBytes) + 4096
	if s.br == nil || s.br.Buffered() == 0 {
		now := time.Now()
		s.idleSince = now
		wait, parks := s.h.cfg.IdleTimeout, s.parks()
		if parks {
			wait = s.h.cfg.ParkAfter
		}
		if want := now.Add(wait); !s.idleDeadline || want.Sub(s.deadline) > deadlineSlack {
			s.setDeadline(want, true)
		}
		if !s.waitRequest() {
			if parks && errors.Is(s.waitErr, os.ErrDeadlineExceeded) && time.Since(now) < s.h.cfg.IdleTimeout {
				return waitPark
			}
			return waitEnded
		}
	}
	s.head = nil
	b, _ := s.br.Peek(s.br.Buffered())
	if !headComplete(b) {
		// From the head's first bytes, as net/http's server does, not from
		// the start of the wait for them, which may have lasted longer.
		s.setDeadline(time.Now().Add(s.h.cfg.ReadHeaderTimeout), false)
		b = s.readHead(b)
	}
	if headComplete(b) {
		s.head = b
	}
	if !s.state.CompareAndSwap(stateIdle, stateActive) {
		return waitEnded
	}
	return waitReady
}

// parks says whether the connection parks when it idles: it waits holding
// no reader (waitRequest), and ParkAfter comes before IdleTimeout.
func (s *h1Conn) parks() bool {
	return s.pooled != nil && s.h.cfg.ParkAfter > 0 && s.h.cfg.ParkAfter < s.h.cfg.IdleTimeout
}

const deadlineSlack = time.Second

// waitRequest waits for the client's next bytes, holding no reader while
// it waits: a node's proxy keeps every pod's idle keep-alive connections,
// and a reader was a fifth of the memory each kept (test/bench/proxy
// -idle). The read that ends the wait takes a buffer from heads only once
// bytes are there (sockio's ReadPooled: one read, as before), and a reader
// takes them in through ahead. False when the client is gone or the idle
// deadline passed.
func (s *h1Conn) waitRequest() bool {
	if s.pooled == nil {
		if s.br == nil {
			s.br = s.h.h1.readers.get(&s.lim)
		}
		_, err := s.br.Peek(1)
		return err == nil
	}
	s.h.h1.readers.put(s.br)
	s.br = nil
	bp, n, err := s.pooled.ReadPooled(s.h.h1.heads)
	if err != nil {
		s.waitErr = err
		return false
	}
	s.ahead.b, s.ahead.bp = (*bp)[:n], bp
	s.br = s.h.h1.readers.get(&s.lim)
	// An empty reader's first read takes all of ahead (a head buffer is
	// no larger than a reader): whoever reads the connection past br
	// (a WebSocket's relay) misses nothing.
	_, err = s.br.Peek(1)
	return err == nil
}

// aheadReader serves the bytes that ended waitRequest's wait, then reads r.
type aheadReader struct {
	r    io.Reader
	bufs sockio.Buffers
	b    []byte
	bp   *[]byte // b's buffer, from bufs; nil when b is served
}

func (a *aheadReader) Read(p []byte) (int, error) {
	if a.bp == nil {
		return a.r.Read(p)
	}
	n := copy(p, a.b)
	if a.b = a.b[n:]; len(a.b) == 0 {
		a.release()
	}
	return n, nil
}

// release gives the buffer back.
func (a *aheadReader) release() {
	if a.bp != nil {
		a.bufs.Put(a.bp)
		a.bp, a.b = nil, nil
	}
}

// setDeadline sets c's read deadline; idle says it is the idle deadline,
// which may stay armed while a bodiless request is forwarded (nothing reads
// c then).
func (s *h1Conn) setDeadline(t time.Time, idle bool) {
	s.deadline, s.idleDeadline = t, idle
	s.c.SetReadDeadline(t)
}

// readHead reads on until b, the start of a head buffered in s.br, holds
// the head whole or fills the reader, and returns what it buffered: a
// head that came in several reads is then checked as one that came in
// one (checkHead). Errors are left for ReadRequest to meet again.
func (s *h1Conn) readHead(b []byte) []byte {
	for !headComplete(b) && len(b) < s.br.Size() {
		var err error
		if b, err = s.br.Peek(len(b) + 1); err != nil {
			return b
		}
	}
	return b
}

// headComplete reports whether b holds a whole request head (up to its
// empty line, CRLF or bare LF as textproto accepts).
func headComplete(b []byte) bool {
	return bytes.Contains(b, crlfcrlf) || bytes.Contains(b, lflf)
}

var crlfcrlf, lflf = []byte("\n\r\n"), []byte("\n\n")

// idle marks the connection as waiting for a request; false when draining.
// It keeps nothing of the last request's body: kept for a retry or a
// mirror, or teed to mirrors, that is up to ReplayBytes, which a parked
// connection held until its next request or its end.
func (s *h1Conn) idle() bool {
	if cap(s.fields) > maxKeptFields {
		s.fields = nil
	}
	s.x.tee, s.sent.ReadCloser = nil, nil
	if s.rt != nil {
		s.rt.body, s.rt.kept = nil, false
	}
	s.state.Store(stateIdle)
	return !s.h.h1.draining.Load()
}

var errHeaderTooLarge = errors.New("request header too large")

// readRequest parses the next request (plain, or with net/http's parser)
// within the MaxHeaderBytes and ReadHeaderTimeout next set; its body is
// read later, without either limit, as net/http's server does.
func (s *h1Conn) readRequest() (*http.Request, error) {
	s.v, s.fe = nil, nil
	var err error
	req := s.readPlainRequest()
	if req == nil {
		req, err = http.ReadRequest(s.br)
	}
	s.lim.N = math.MaxInt64
	if err == nil && !s.plainReq {
		err = s.checkHead(req)
	}
	if err != nil {
		return nil, err
	}
	if !s.deadline.IsZero() && (!s.idleDeadline || req.Body != http.NoBody) {
		// A body is read without a deadline, as by net/http's server.
		s.setDeadline(time.Time{}, false)
	}
	s.answered, s.cont = false, nil
	return req, nil
}

var (
	errAmbiguousFraming = errors.New("request framing is ambiguous")
	errNoHost           = errors.New("missing required Host header")
)

// checkHead refuses what net/http's parser settles silently, looking the
// fields up in the head as received. A request whose body length its
// sender and the proxy may read differently, which is how requests are
// smuggled past a component in front of the app (RFC 9112 §11.2):
// Content-Length with Transfer-Encoding (§6.3; nginx refuses it too), or
// Transfer-Encoding in HTTP/1.0 (§6.1); the parser settles both — chunked
// wins, Content-Length is dropped; HTTP/1.0's Transfer-Encoding is
// dropped. And an HTTP/1.1 request without Host (§3.2: a server MUST
// answer 400), which the parser hides when the target is in absolute
// form: it takes the target's authority for req.Host and drops the field
// (one in origin form gets an empty Host, which validRequest refuses).
// The head is read again with net/textproto: it is still in s.br's
// buffer, since ReadRequest reads nothing more when it is whole (s.head,
// read whole by next when it fits the reader). Only chunked, HTTP/1.0 and
// absolute-form requests pay for it. One whose head is larger than the
// reader (4 KiB) cannot be checked: its connection ends after the answer,
// so nothing after its body is taken for a request (and an absolute-form
// one goes on with the target's authority, the one a proxy would send in
// any case: §3.2.2).
func (s *h1Conn) checkHead(req *http.Request) error {
	chunked := req.TransferEncoding != nil
	http11 := req.ProtoAtLeast(1, 1)
	absolute := http11 && req.URL.Scheme != "" // a CONNECT's authority-form has none
	if !chunked && !absolute && http11 {
		return nil
	}
	head := s.head
	s.head = nil
	if head == nil {
		req.Close = true
		return nil
	}
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(head)))
	if _, err := tp.ReadLine(); err != nil {
		return fmt.Errorf("read request line again: %w", err)
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil {
		return fmt.Errorf("read request head again: %w", err)
	}
	_, cl := h["Content-Length"]
	_, te := h["Transfer-Encoding"]
	_, host := h["Host"]
	switch {
	case chunked && cl || !http11 && te:
		return errAmbiguousFraming
	case absolute && !host:
		return errNoHost
	}
	return nil
}

// answerFailed ends a connection whose answer broke off after it started
// (the backend's failure or the client's): with a reset, as the client
// must not take what it got for the whole answer. An app that stopped
// reading it is counted (stallWatch); one the client watch saw leave
// before the answer began (errClientGone: answer) got none of it, and is
// counted canceled.
func (s *h1Conn) answerFailed(x *exchange, err error) {
	s.broken = true
	switch {
	case errors.Is(err, errAppStalled):
		s.h.stalled(x, err)
	case errors.Is(err, errClientGone):
		s.h.report(context.Background(), x, upstream.ReasonCanceled, err) // nothing of the answer went out
	default:
		s.h.log.Debug("answer failed", "service", x.fe.Service.String(), "client", s.t.client(), "err", err)
	}
}

// stalledOut ends an exchange whose app stopped moving before its answer
// began (stallWatch): err counted, and the connection reset.
func (s *h1Conn) stalledOut(x *exchange, err error) bool {
	s.broken = true
	s.h.stalled(x, err)
	return false
}

// close closes the client connection. When the client may still be
// sending (an answer went out before its request was read whole), the
// write side is shut first and what arrives is read and dropped until the
// client stops or lingerTime passes, so the client reads the answer before
// a reset would throw it away (net/http's server waits likewise; nginx
// calls it lingering close). Bounded by time alone: at a byte bound
// (net/http's 256 KiB, read in a millisecond on loopback) the reset came
// while an app uploading 4 MiB was still sending, and took the answer it
// had not read yet (TestInteropNative's early answers, 1 run in 4). After
// a broken answer it resets instead (answerFailed).
func (s *h1Conn) close() {
	if s.leave != nil {
		s.leave()
	}
	if s.broken {
		sockio.Reset(s.c)
		return
	}
	if s.unread {
		closeWrite(s.c)
		s.c.SetReadDeadline(time.Now().Add(lingerTime))
		io.Copy(io.Discard, s.c)
	}
	s.c.Close()
}

const lingerTime = 500 * time.Millisecond // net/http's rstAvoidanceDelay

// closeWrite shuts c's write half, through wrappers that expose the
// connection underneath as NetConn (crypto/tls's convention).
func closeWrite(c net.Conn) {
	for {
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
			return
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return
		}
		c = u.NetConn()
	}
}

// badRequest answers a request that could not be parsed, as net/http's
// server does, and the connection ends. A client that went silent or away
// gets nothing.
func (s *h1Conn) badRequest(err error) {
	var status string
	switch {
	case !s.idleDeadline && !s.deadline.IsZero() && !time.Now().Before(s.deadline):
		// Too slow with its head (textproto reports the cut line as
		// malformed, hiding the timeout): nothing to answer. Not the idle
		// deadline, kept for a head next found whole, which nothing read
		// under: it may have passed while the request before was served.
		return
	case errors.Is(err, errHeaderTooLarge):
		status = "431 Request Header Fields Too Large"
	case strings.HasPrefix(err.Error(), "unsupported transfer encoding"):
		// RFC 9112 §6.1, as net/http's server answers it (ReadRequest's
		// error type is unexported).
		status = "501 Not Implemented"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, net.ErrClosed):
		return
	default:
		status = "400 Bad Request"
	}
	s.h.log.Debug("bad request", "client", s.t.client(), "orig_dst", s.t.OrigDst.String(), "err", err)
	s.refuse(status)
}

// refuse answers a request the fast path does not serve, and the
// connection ends; reset, when the app left the answer unread (stallWatch).
// Dated, unlike net/http's server's refusals: RFC 9110 §6.6.1 asks a
// server with a clock for a Date on its 4xx answers.
func (s *h1Conn) refuse(status string) {
	s.unread = true
	_, err := io.WriteString(&s.out, "HTTP/1.1 "+status+"\r\nDate: "+time.Now().UTC().Format(http.TimeFormat)+
		"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"+status)
	if errors.Is(err, errAppStalled) {
		s.stalledOut(&exchange{t: s.t}, fmt.Errorf("write refusal: %w", err)) // routed nowhere yet
	}
}

// validRequest applies the checks net/http's server adds to ReadRequest's:
// header field names are tokens, and the Host is a valid authority, given
// in HTTP/1.1 (RFC 9112 §3.2: the proxy would otherwise send the backend
// an empty one). A backend could read anything else differently than the
// proxy does.
func validRequest(req *http.Request) bool {
	for k := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
	}
	if req.Host == "" && req.ProtoAtLeast(1, 1) {
		return false
	}
	return validTarget(req.RequestURI) && httpguts.ValidHostHeader(req.Host)
}

// validTarget reports whether a request target has no fragment. RFC 9112
// §3.2 has none in any form, yet net/http's parsers take "/admin#x" and
// routes match the path escaped ("/admin%23x"), which misses a "/admin"
// rule, while the target goes on as sent and backends read "/admin": a
// rule's ExternalAuth or backend would be skipped. nginx and Envoy refuse
// or strip it too.
func validTarget(target string) bool {
	return strings.IndexByte(target, '#') < 0
}

// count adds one answered request to the requests metric.
func (s *h1Conn) count(x *exchange, code int) {
	k := &s.counted
	if k.c == nil || k.fe != x.fe || k.be != x.be || k.code != code {
		k.fe, k.be, k.code = x.fe, x.be, code
		k.c = s.h.m.counter(x.fe, code, protocolOf(x.be))
	}
	k.c.Inc()
}
