package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/relay"
)

// h1Transport is the RoundTripper of WireH1: net/http's request writer
// and response parser over the HTTP/1.1 pool of the fast path (GetH1), so
// that a connection is handed to a request only after the pool saw it
// silent since its last answer (pool.Conn.silent). net/http's Transport
// keeps a read pending on idle connections and, when bytes arrive just as
// one is handed to the next request, takes them for that request's
// answer: an answer a backend sent unasked reached another app
// (docs/design.md).
//
// As the Transport configured here does: the body goes concurrently with
// reading the answer (full duplex), at once or, when the request expects
// 100 Continue, once the backend's 100 arrives or ExpectContinueTimeout
// passes (a final answer first: never; continueGate);
// 1xx answers go to the request's httptrace.ClientTrace; a 101 answer's
// body is the upgraded connection; a request without body that is
// idempotent is sent again when its reused connection failed before
// answering (the backend closed it while idle); the request's context
// ends the exchange, body included.
type h1Transport struct{ b *Backend }

// ExpectContinueTimeout is how long a request that expects 100 Continue
// waits for the backend's before its body goes anyway (curl waits as
// long), on every wire: a backend that ignores the Expect must still get
// the body.
const ExpectContinueTimeout = time.Second

// staleTries bounds the tries of a request whose reused connections keep
// failing before an answer.
const staleTries = 3

func (t h1Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.roundTrip(req, false)
}

// roundTrip is RoundTrip; reached says a step of the request before went
// toward the endpoint (a connection dialed for it), so that its error is
// never ErrNotSent.
func (t h1Transport) roundTrip(req *http.Request, reached bool) (*http.Response, error) {
	if c := ConnectionTE(req.Header); c != nil {
		// On a copy: req may go again over h2 (negotiated, a retry).
		out := *req
		out.Header = req.Header.Clone()
		out.Header["Connection"] = c
		req = &out
	}
	ctx := req.Context()
	c, err := endpointFor(ctx, req.URL.Host)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	bodiless := req.Body == nil || req.Body == http.NoBody
	for try := 1; ; try++ {
		uc, err := t.b.GetH1(ctx, c, clientOf(ctx))
		if err != nil {
			closeBody(req)
			if !reached && try == 1 && errors.Is(err, pool.ErrNotHandedOut) {
				// Past the first, the request went out on a connection
				// the backend had closed: it was sent.
				err = notSent{err}
			}
			return nil, err
		}
		// A body is the exchange's to close: Request.Write closes it
		// once it ends, which may be after the answer (full duplex).
		resp, err := t.exchange(ctx, uc, req, bodiless)
		if err == nil || !errors.Is(err, errStaleConn) || !Idempotent(req) || try == staleTries {
			return resp, err
		}
	}
}

// ConnectionTE is the Connection field of a request with header h sent
// over HTTP/1.1 when h has a TE field Connection does not list: its
// options and "TE", as a sender of TE must (RFC 9110 §10.1.4); nil
// otherwise. HTTP/2 has no Connection field, and net/http's HTTP/2
// Transport refuses one: only HTTP/1.1's writers (h1Transport, the fast
// path) add it.
func ConnectionTE(h http.Header) []string {
	if _, ok := h["Te"]; !ok || httpguts.HeaderValuesContainsToken(h["Connection"], "te") {
		return nil
	}
	return append(slices.Clip(h["Connection"]), "TE")
}

// errStaleConn marks a failure on a reused connection before any byte of
// an answer: the backend probably closed it while it was idle.
var errStaleConn = errors.New("pooled connection closed by the backend")

// Idempotent is net/http's rule for requests it may send twice.
func Idempotent(req *http.Request) bool {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// exchange sends req on uc and reads the head of its final answer.
func (t h1Transport) exchange(ctx context.Context, uc *pool.Conn, req *http.Request, bodiless bool) (*http.Response, error) {
	x := &h1Exchange{b: t.b, uc: uc, ctx: ctx, close: req.Close}
	// Closing the connection ends a read or write in progress, whichever
	// side of the exchange is waiting when the context ends.
	x.stop = context.AfterFunc(ctx, func() { uc.Conn.Close() })
	if bodiless {
		if err := writeRequest(uc, req); err != nil {
			return nil, x.fail(Settle(uc.Conn, err), uc.Reused())
		}
	} else {
		x.wrote = make(chan error, 1)
		src := &sourceBody{ReadCloser: req.Body}
		if httpguts.HeaderValuesContainsToken(req.Header["Expect"], "100-continue") {
			x.cont = &continueGate{r: req.Body, proceed: make(chan struct{}), stop: make(chan struct{})}
			src.ReadCloser = x.cont
		}
		out := *req
		out.Body = src
		go func() {
			var err error
			defer func() { x.wrote <- err }()
			defer t.b.w.p.cfg.Panics.Recover("request body", &err, func() { abort(uc.Conn) })
			err = writeRequest(uc, &out)
			if err != nil && src.err != nil && !errors.Is(src.err, errNoContinue) {
				// The app's body failed: the backend would wait for the
				// rest forever. A failed write to the backend leaves the
				// connection to the read side, where an early answer may
				// still be waiting.
				abort(uc.Conn)
			}
		}()
	}
	_, err := uc.R.Peek(1)
	if err = Settle(uc.Conn, err); err != nil { // a handshake judged after it: settled by the first read
		return nil, x.fail(fmt.Errorf("read answer: %w", err), bodiless && uc.Reused())
	}
	trace := httptrace.ContextClientTrace(ctx)
	for {
		resp, err := http.ReadResponse(uc.R, req)
		if err != nil {
			return nil, x.fail(fmt.Errorf("read answer: %w", uc.HeadErr(err)), false)
		}
		if resp.StatusCode >= http.StatusOK || resp.StatusCode == http.StatusSwitchingProtocols {
			uc.EndHead()
			x.cont.halt() // the body it held back is not sent: the connection closes after the answer
		} else if resp.StatusCode == http.StatusContinue {
			x.cont.release()
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return x.upgraded(resp)
		case resp.StatusCode < http.StatusOK:
			if trace != nil && trace.Got1xxResponse != nil {
				if err := trace.Got1xxResponse(resp.StatusCode, textproto.MIMEHeader(resp.Header)); err != nil {
					return nil, x.fail(err, false)
				}
			}
			continue
		}
		x.close = x.close || resp.Close
		if resp.Body == http.NoBody {
			x.finish(true) // HEAD, 204, 304, an empty body
		} else {
			resp.Body = &h1Body{r: resp.Body, x: x}
		}
		return resp, nil
	}
}

// abort closes c under its TLS, without a close_notify: a backend told
// that the connection ended cleanly may end its answer cleanly in the
// moment before the socket closes, and the app would take a request whose
// body broke off for answered.
func abort(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		tc.NetConn().Close()
	}
	c.Close()
}

// writeRequest writes req with Request.Write (its framing: Content-Length
// or chunks and trailers, flushed chunk by chunk for chunked bodies; a
// body of known length goes out as it is read: sizedWriter).
func writeRequest(uc *pool.Conn, req *http.Request) error {
	var w io.Writer = uc.W
	if req.ContentLength > 0 {
		w = sizedWriter{uc.W}
	}
	err := req.Write(w)
	if err == nil {
		err = uc.W.Flush()
	}
	if err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	return nil
}

// sizedWriter is the connection's writer for a request body of known
// length, which Request.Write flushes only at its end: its bytes go out
// as they are read, as a chunked body's do, or a backend answering as it
// reads (a streaming echo) waits for pieces held here, and the app for
// their answers. The writer's buffer is the copy buffer.
type sizedWriter struct{ *bufio.Writer }

func (w sizedWriter) ReadFrom(r io.Reader) (int64, error) {
	var n int64
	for {
		if err := w.Flush(); err != nil {
			return n, err
		}
		p := w.AvailableBuffer()
		m, err := r.Read(p[:cap(p)])
		w.Write(p[:m]) // into its own free space: cannot fail
		n += int64(m)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// sourceBody remembers that reading the app's body failed.
type sourceBody struct {
	io.ReadCloser
	err error
}

func (s *sourceBody) Read(p []byte) (int, error) {
	n, err := s.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// h1Exchange is one request's use of a pooled connection.
type h1Exchange struct {
	b   *Backend
	uc  *pool.Conn
	ctx context.Context
	// stop unhooks the context; false when it already ended and closed
	// the connection.
	stop func() bool
	// wrote reports the end of the body's goroutine (nil: none).
	wrote chan error
	// close says either side asked to close the connection.
	close bool
	done  sync.Once
	// cont holds back a body that waits for 100 Continue; nil for others.
	cont *continueGate
}

// fail ends an exchange that produced no answer. The connection is closed;
// stale says it failed as an idle connection the backend closed would.
func (x *h1Exchange) fail(err error, stale bool) error {
	x.stop()
	x.cont.halt()
	x.b.DiscardH1(x.uc)
	if x.wrote != nil {
		// The body's goroutine may wait for the app's next bytes; it ends
		// when the app's body does (the server closes it).
		select {
		case werr := <-x.wrote:
			if werr != nil && errors.Is(err, io.EOF) {
				err = werr // the write's failure says more than the read's end
			}
		default:
		}
	}
	if cerr := x.ctx.Err(); cerr != nil {
		return fmt.Errorf("%w: %w", cerr, err)
	}
	if stale {
		return fmt.Errorf("%w: %w", errStaleConn, err)
	}
	return err
}

// finish ends the exchange once its answer's body was read to its end
// (clean) or given up: the connection goes back to the pool when the
// request went out whole, the context did not end, and neither side asked
// to close; else it is closed.
func (x *h1Exchange) finish(clean bool) {
	x.done.Do(func() {
		reuse := x.stop() && clean && !x.close
		if x.wrote != nil && reuse {
			// A backend may answer before it read the whole body; the
			// rest must still go out before the connection can serve
			// another request.
			t := time.NewTimer(bodyTailWait)
			select {
			case err := <-x.wrote:
				reuse = err == nil
			case <-t.C:
				reuse = false
			}
			t.Stop()
		}
		if reuse {
			x.b.PutH1(x.uc)
		} else {
			x.b.DiscardH1(x.uc)
		}
	})
}

// bodyTailWait bounds how long a finished answer waits for the end of its
// request's body to be written before the connection is given up.
const bodyTailWait = 50 * time.Millisecond

// upgraded hands over the connection of a 101 answer as its body. The
// exchange is over: the context no longer bounds the connection (a
// WebSocket may idle), and the pool forgets it.
func (x *h1Exchange) upgraded(resp *http.Response) (*http.Response, error) {
	if x.wrote != nil || !x.stop() {
		// A request with a body is no upgrade; a context that ended
		// closed the connection.
		return nil, x.fail(errors.New("backend switched protocols"), false)
	}
	x.b.DetachH1(x.uc)
	resp.Body = &relay.BufferedConn{Conn: x.uc.Conn, R: x.uc.R}
	return resp, nil
}

// h1Body is an answer's body; reading it to its end or closing it ends
// the exchange. Closing it early closes the connection rather than
// reading the rest (as net/http's response bodies would).
type h1Body struct {
	r      io.ReadCloser
	x      *h1Exchange
	closed atomic.Bool
}

var errBodyClosed = errors.New("read on a closed response body")

func (b *h1Body) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errBodyClosed
	}
	n, err := b.r.Read(p)
	switch {
	case err == io.EOF:
		b.x.finish(true)
	case err != nil:
		b.x.finish(false)
		if cerr := b.x.ctx.Err(); cerr != nil {
			err = fmt.Errorf("%w: %w", cerr, err)
		}
	}
	return n, err
}

// AtHand reports whether the body of resp, an answer read from uc, has
// arrived whole: its declared length lies in uc's buffer, so reading it
// waits for nothing. One of unknown length (chunked, or until the
// connection closes) is not known to have.
func AtHand(uc *pool.Conn, resp *http.Response) bool {
	return resp.ContentLength >= 0 && int64(uc.R.Buffered()) >= resp.ContentLength
}

// BodyAtHand is AtHand for an answer a Backend's RoundTripper returned,
// its body unread; never for one over HTTP/2, whose body's end may be a
// read away (closing it costs only its stream).
func BodyAtHand(resp *http.Response) bool {
	b, ok := resp.Body.(*h1Body)
	return ok && AtHand(b.x.uc, resp)
}

func (b *h1Body) Close() error {
	b.closed.Store(true)
	b.x.finish(false)
	return nil
}

// continueGate holds back a request body that expects 100 Continue: its
// first read waits until the backend sends its 100 (release) or
// ExpectContinueTimeout passes; a final answer first (halt) ends it with
// errNoContinue, and the body is never read (RFC 9110 §10.1.1: the app,
// which gets its 100 only when the body is read, then sends none). Its
// methods are no-ops on a nil gate.
type continueGate struct {
	r             io.ReadCloser
	proceed, stop chan struct{}
	released      sync.Once
	halted        sync.Once
	started       bool
}

// errNoContinue ends a held-back body whose answer came first.
var errNoContinue = errors.New("final answer before 100 Continue: request body not sent")

func (g *continueGate) release() {
	if g != nil {
		g.released.Do(func() { close(g.proceed) })
	}
}

func (g *continueGate) halt() {
	if g != nil {
		g.halted.Do(func() { close(g.stop) })
	}
}

func (g *continueGate) Read(p []byte) (int, error) {
	if !g.started {
		g.started = true
		t := time.NewTimer(ExpectContinueTimeout)
		defer t.Stop()
		select {
		case <-g.proceed:
		case <-t.C:
		case <-g.stop:
			return 0, errNoContinue
		}
	}
	return g.r.Read(p)
}

func (g *continueGate) Close() error { return g.r.Close() }
