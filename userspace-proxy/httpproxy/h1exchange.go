package httpproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/relay"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// One exchange on the fast path: serve routes a request and picks its
// backend; forward sends it over a pooled HTTP/1.1 connection (conn, send,
// writeRequest) and answers from what comes back (respond, release), and
// roundTrip through a backend's net/http Transport for another wire. A
// rule's retries are in h1retry.go, the request body's goroutine in
// h1body.go, the answers in h1answer.go.

// serve forwards one request and writes its answer; it reports whether the
// client connection may carry another request.
func (s *h1Conn) serve(req *http.Request) bool {
	switch {
	case !validRequest(req):
		s.refuse("400 Bad Request")
		return false
	case req.ProtoMajor != 1:
		s.refuse("505 HTTP Version Not Supported")
		return false
	case req.Method == http.MethodConnect:
		// A tunnel through a Service address is not a mesh request.
		s.refuse("405 Method Not Allowed")
		return false
	}
	s.t.nameService(req)
	s.closeAfter = req.Close
	s.sent.on = false
	x := &s.x
	*x = exchange{t: s.t, app: s.c, stalls: &s.stall}
	// A request that failed before its body was read (no endpoint took
	// its connect) left its mirrors waiting for the rest until
	// MirrorTimeout, each holding one of MaxMirrors.
	defer func() {
		x.tee.release()
		x.tee.cut()
	}()
	if s.v == nil {
		s.v, s.fe = s.t.view()
	}
	x.v, x.fe = s.v, s.fe
	if x.fe == nil {
		return s.fail(req, x, upstream.ReasonNoEndpoints, upstream.ErrNoEndpoints)
	}
	if lastHop(req) {
		a := s.h.finalAnswer(x, req)
		return s.writeLocal(req, a.status, a.header, "", a.body)
	}
	if s.plainReq {
		x.mcp = s.mcp // cut as it was read (readPlainRequest)
	} else {
		x.mcp = balance.CutMCPSession(req.Header)
	}
	ref := x.fe.Backend
	if x.fe.Routes != nil {
		var forward bool
		if s.rt == nil {
			s.rt = new(routed)
		}
		ref, forward = s.h.route(x, req, s.rt)
		if x.r != nil && x.r.d.ExternalAuth != nil {
			if x.r.d.ExternalAuth.MaxBody > 0 {
				if err := s.continueNow(req); err != nil {
					return s.fail(req, x, readFailed(err), err) // a write: the app left, or stalled
				}
			}
			switch a, ok, err := s.h.authorize(x, req, s.watchAuth); {
			case ok:
			case s.watch.gone.Load():
				return false // the app left (reported canceled)
			case err != nil:
				return s.bodyFailed(req, x, err)
			default:
				return s.writeLocal(req, a.status, a.header, "", a.body)
			}
		}
		if !forward {
			return s.answerLocally(req, x)
		}
	}
	if x.be = x.v.Backends.Get(ref); x.be == nil {
		return s.fail(req, x, upstream.ReasonNoEndpoints, upstream.ErrNoEndpoints)
	}
	if x.be.Err != nil {
		return s.fail(req, x, upstream.ReasonInvalidPolicy, x.be.Err)
	}
	if err := s.t.relayFailed(x.be); err != nil {
		return s.fail(req, x, upstream.Classify(err), err)
	}
	choice := x.pick(req)
	if choice == nil {
		return s.fail(req, x, upstream.ReasonNoEndpoints, upstream.ErrNoEndpoints)
	}
	websocket := isWebSocketUpgrade(req)
	host := req.Host
	s.prepare(req, x.be, websocket)
	if x.r != nil {
		if err := s.h.applyRoute(x, req, host, s.cont != nil, websocket); err != nil {
			x.be.Picker.Unused(choice)
			return s.bodyFailed(req, x, err)
		}
	}
	wire := fastWire(x.be, WireFor(x.be, req.ProtoMajor, websocket))
	if wire != upstream.WireH1 {
		return s.roundTrip(req, x, choice, wire)
	}
	if c := upstream.ConnectionTE(req.Header); c != nil {
		req.Header["Connection"] = c
	}
	return s.forward(req, x, choice, websocket)
}

// watchAuth watches the client while its request's authorization server
// is asked (Handler.authorize): one that leaves cancels the ask. held says
// the request's body is unread, kept for the backend.
func (s *h1Conn) watchAuth(cancel context.CancelFunc, held bool) (stop func()) {
	if held {
		s.watch.hold() // before start, so that no read of the watch misses it
	}
	s.watch.start(nil, cancel)
	return s.watch.stop
}

// prepare turns the client's request into the one sent upstream, in place:
// hop-by-hop fields go (the WebSocket Upgrade is kept), the backend's own
// name replaces Host for an external hostname, the target stays the app's,
// and a body that waits for 100 Continue is held until the backend asks for
// it (continueReader).
func (s *h1Conn) prepare(req *http.Request, be *upstream.Backend, websocket bool) {
	upgrade := ""
	if websocket {
		upgrade = req.Header.Get("Upgrade")
	}
	expect := req.Header.Get("Expect")
	removeHopByHop(req.Header)
	if upgrade != "" {
		req.Header["Connection"] = connectionUpgrade
		req.Header["Upgrade"] = []string{upgrade}
	}
	s.cont = nil
	if expect != "" {
		if strings.EqualFold(expect, "100-continue") && req.Body != http.NoBody && req.ProtoAtLeast(1, 1) {
			// The backend decides (RFC 9110 §10.1.1): its 100 Continue
			// releases the body (continueReader).
			s.cont = &continueReader{s: s, r: req.Body, proceed: make(chan struct{}), stop: make(chan struct{})}
			req.Body = s.cont
		} else {
			delete(req.Header, "Expect") // nothing to expect from HTTP/1.0 or unknown expectations
		}
	}
	if req.Body != http.NoBody && !s.plainReq {
		keepUserAgent(req) // for Request.Write (writeRequest)
		keepTrailers(req)
	}
	if be.Authority != "" {
		req.Host = be.Authority
	}
	// As the app sent it also where net/http writes the target from the
	// URL (a request with a body, an HTTP/2 backend, a mirror).
	req.URL.Opaque = sentPath(req.RequestURI)
	// Connection: close from the client ends the client's connection
	// (closeAfter), not the pooled one.
	req.Close = false
}

// keepTrailers makes net/http's writers send the trailers of an HTTP/1.1
// app's chunked body that no Trailer field announced: its reader merges
// them into req.Trailer at the body's end, making the map when there is
// none — after Request.Write and the HTTP/2 Transport took req.Trailer,
// whose entries they write once the body ended. Without the map they
// dropped them.
func keepTrailers(req *http.Request) {
	if req.ProtoMajor == 1 && req.ContentLength < 0 && req.Trailer == nil {
		req.Trailer = make(http.Header)
	}
}

// keepUserAgent makes Request.Write and net/http's Transport send what the
// app sent: without it they would add Go's User-Agent.
func keepUserAgent(req *http.Request) {
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = noValue
	}
}

var noValue = []string{""}

// errStale marks a failure on a reused connection before any byte of an
// answer: the backend probably closed it while idle, and a replayable
// request may go again on another (as net/http's Transport does).
var errStale = errors.New("pooled connection closed by the backend")

// forward sends req over a pooled HTTP/1.1 connection and answers. A
// request that failed on a reused connection before any answer came is
// sent again when it is replayable (errStale); a routed request is also
// retried as its rule's policy says (policy.go).
func (s *h1Conn) forward(req *http.Request, x *exchange, choice *balance.Choice, websocket bool) bool {
	be := x.be
	stale := 0
	replayable := req.Body == http.NoBody && upstream.Idempotent(req)
	// inline: the body is at hand (kept, or buffered from the client), so
	// it is written with the head, not by a goroutine.
	inline := req.Body == http.NoBody || x.r != nil && x.r.kept ||
		s.cont == nil && req.ContentLength > 0 && req.ContentLength <= int64(s.br.Buffered())
	countRequest(x)
	defer s.watch.stop()
	for retry := 0; ; {
		uc, c, err := s.conn(x, choice, req.Body == http.NoBody || x.r != nil && x.r.kept)
		if err != nil {
			if s.watch.gone.Load() {
				return s.fail(req, x, upstream.ReasonCanceled, errClientGone)
			}
			if retry == 0 && stale == 0 && errors.Is(err, upstream.ErrDeclinedHTTP11) && fastWire(be, WireFor(be, 1, websocket)) != upstream.WireH1 {
				// A backend negotiated with elsewhere (WireFor) refused
				// http/1.1 alone: it speaks h2 alone. Nothing of the
				// request went out, nor was its body read: the
				// negotiation sends it, and the next ones (fastWire, now
				// that the dial remembered it).
				return s.roundTrip(req, x, c, upstream.WireNegotiate)
			}
			// Nothing went out: a connect that failed, or an attempt
			// whose backendRequest timeout passed while it waited for a
			// connection, may go again (as on net/http's path).
			why := "connect"
			if errors.Is(err, errBackendTimeout) {
				why = "backend_timeout"
			}
			if why == "connect" && !connectFailed(err) || !s.mayRetry(x, retry, "connect", req) {
				return s.fail(req, x, upstream.Classify(err), err)
			}
			if ok, keep := s.again(x, &retry, why, req, err, nil, timeoutError(true, err)); !ok {
				return keep
			}
			choice = x.repick(c) // the last endpoint conn tried
			continue
		}
		choice = c
		s.up = upstreamConn{uc: uc} // for end, should a panic unwind the exchange
		cd := armConn(x, uc, s.h.cfg.Panics)
		resp, body, err := s.send(uc, req, replayable, inline, x.r == nil && !x.setSession)
		if err == nil && x.r != nil && x.r.pol.retryStatus(resp.StatusCode) && s.mayRetry(x, retry, "status", req) {
			s.watch.stop()
			switch sent, late := s.halt(body, uc, cd); {
			case late:
				// The app held the rest of its body back past the
				// rule's timeout: the request can go no further.
				cd.stop()
				be.DiscardH1(uc)
				s.up = upstreamConn{}
				return s.fail(req, x, upstream.ReasonTimeout, timeoutError(cd.request, errors.New("wait for the request body")))
			case sent || !x.tee.broken():
				// The try's goroutine is over: nothing reads the app's
				// body until the retry's, and the watch may look at the
				// app (past the body's rest: backoff).
				s.sent.on = false
				s.discardAnswer(be, uc, resp, cd, sent)
				s.up = upstreamConn{}
				if s.watch.gone.Load() {
					return s.fail(req, x, upstream.ReasonCanceled, errClientGone)
				}
				if ok, keep := s.again(x, &retry, "status", req, nil, resp, timeoutError(true, errRetryBackoff)); !ok {
					return keep
				}
				choice = x.repick(choice)
				continue
			}
			// The body broke off (the app left in the middle of it, or
			// sent a bad chunk) while halt let the try's read of it end:
			// no try can send it whole. The answer goes out, as an early
			// answer to a body that breaks off does; uc, its request cut,
			// carries no other.
			body, resp.Close = nil, true
		}
		if err == nil {
			x.cd = cd
			x.tee.settle()
			return s.respond(req, resp, x, choice, websocket, uc, body)
		}
		s.watch.stop()
		s.release(x, false)
		if s.watch.gone.Load() {
			return s.fail(req, x, upstream.ReasonCanceled, errClientGone)
		}
		if s.stall.stalled.Load() {
			// Its body's read, or the 100 Continue it waited for.
			return s.stalledOut(x, fmt.Errorf("%w for %v", errAppStalled, s.stall.timeout))
		}
		if s.refuseBrokenBody(req, x, err) {
			return false
		}
		if cd.stop() {
			if cd.request {
				return s.fail(req, x, upstream.ReasonTimeout, timeoutError(true, err))
			}
			if !s.mayRetry(x, retry, "backend_timeout", req) {
				return s.fail(req, x, upstream.ReasonTimeout, timeoutError(false, err))
			}
			if ok, keep := s.again(x, &retry, "backend_timeout", req, err, nil, timeoutError(true, err)); !ok {
				return keep
			}
			choice = x.repick(choice)
			continue
		}
		if stale++; !errors.Is(err, errStale) || stale == 3 {
			return s.fail(req, x, upstream.Classify(err), err)
		}
	}
}

// conn takes a connection to choice's endpoint. A failed connect sent no
// byte, so, as on the L4 path, other endpoints the request has not tried
// are tried (three in all; failover), also when the request's session
// named the first; it returns the endpoint connected to, which the
// session then names.
//
// A route's timeouts bound the wait for a connection too, and past the
// request timeout none is taken, not even an idle one (pool.Get): nothing
// goes out then, and the error says which timeout passed (timeoutError).
// The app's leaving
// ends the wait too, when every connection the endpoint may have is busy:
// read is set when nothing of the request is left to read from the app,
// and the watch goes on through send; else the request's body comes next,
// unread, and the watch waits past it for the app's hangup (held) while
// conn waits.
func (s *h1Conn) conn(x *exchange, choice *balance.Choice, read bool) (*pool.Conn, *balance.Choice, error) {
	be := x.be
	ctx := s.leaveCtx()
	if !read {
		s.watch.hold()
		defer s.watch.stop()
	}
	s.watch.start(nil, s.leave)
	if x.r != nil && x.r.pol.active {
		if d, _, ok := x.r.pol.limit(time.Now()); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
	}
	client := s.poolClient()
	uc, err := be.GetH1(ctx, choice, client)
	// A failover follows a connect tried: the first Get tells.
	s.h.settleRetry(x, !errors.Is(err, pool.ErrNotHandedOut))
	tries := be.Picker.Tries(choice)
	for i := 1; err != nil && i < tries && upstream.NoConnection(err); i++ {
		choice = x.failover(choice)
		uc, err = be.GetH1(ctx, choice, client)
	}
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// Only a route's timeouts set a deadline on ctx.
		err = timeoutError(x.r.pol.expired(time.Now()), err)
	}
	return uc, choice, err
}

// leaveCtx is s.ctx, made anew when the app's leaving ended the last one.
func (s *h1Conn) leaveCtx() context.Context {
	if s.ctx == nil || s.ctx.Err() != nil {
		s.ctx, s.leave = context.WithCancel(context.Background())
	}
	return s.ctx
}

// clientCtx is the context the connection's requests through a backend's
// RoundTripper start from: it names their client (upstream.WithClient).
func (s *h1Conn) clientCtx() context.Context {
	if s.base == nil {
		s.base = upstream.WithClient(context.Background(), s.poolClient())
	}
	return s.base
}

// poolClient is the connection's client as the upstream pools tell
// clients apart (Target.poolClient), looked up once.
func (s *h1Conn) poolClient() pool.Client {
	if !s.clientSet {
		s.client, s.clientSet = s.t.poolClient(), true
	}
	return s.client
}

// send writes req on uc and reads the answer's head, passing informational
// answers on. A body that is not at hand (inline) is written by another
// goroutine, which reports on the returned channel, so the answer can
// start before the body ends (full duplex); the caller must finish it.
// plain says the answer's fields need not be read (readAnswer).
func (s *h1Conn) send(uc *pool.Conn, req *http.Request, replayable, inline, plain bool) (*http.Response, chan error, error) {
	var body chan error
	fields := s.plainFields()
	if inline {
		if err := writeRequest(uc, req, fields, true); err != nil {
			return nil, nil, staleIf(upstream.Settle(uc.Conn, err), replayable && uc.Reused())
		}
	} else {
		s.sent.track(&req.Body, &s.stall)
		body = make(chan error, 1)
		s.up.body = body
		go func() {
			var err error
			defer func() { body <- err }()
			// Closing uc ends the answer's read, which waits on this.
			defer s.h.cfg.Panics.Recover("request body", &err, func() { uc.Conn.Close() })
			err = writeRequest(uc, req, fields, false)
		}()
	}
	s.watch.start(uc, nil) // until forward returns, or uc is released
	_, err := uc.R.Peek(1)
	if err = upstream.Settle(uc.Conn, err); err != nil { // a handshake judged after it: settled by the first read
		return nil, body, staleIf(fmt.Errorf("read answer: %w", err), replayable && uc.Reused() && body == nil)
	}
	for {
		// The final answer may be coming: the watch lets it come even if
		// the body breaks (sentBody.stranded).
		s.sent.heard.Store(body != nil)
		resp, err := s.readAnswer(uc.R, req, plain)
		if err != nil {
			return nil, body, fmt.Errorf("read answer: %w", uc.HeadErr(err))
		}
		if resp.StatusCode >= http.StatusOK || resp.StatusCode == http.StatusSwitchingProtocols {
			uc.EndHead()
			return resp, body, nil
		}
		s.sent.heard.Store(false)
		if resp.StatusCode == http.StatusContinue && s.cont != nil {
			s.cont.release()
		}
		s.informational(req, resp)
		if _, err := uc.R.Peek(1); err != nil {
			return nil, body, fmt.Errorf("read answer: %w", err)
		}
	}
}

// writeRequest writes req on uc: a request with a body with Request.Write
// (its framing, chunks and trailers), a bodiless one as its head alone; a
// request read plain as its head with its header lines fields, whose
// Content-Length line among them its sized body follows. A body not
// atHand follows a flushed head, as Request.Write's does: the backend sees
// the request while its body comes.
func writeRequest(uc *pool.Conn, req *http.Request, fields *[]byte, atHand bool) error {
	var err error
	switch {
	case req.Body == http.NoBody:
		err = writeHead(uc.W, req, fields)
	case fields != nil:
		if err = writeHead(uc.W, req, fields); err == nil && !atHand {
			err = uc.W.Flush()
		}
		if err == nil {
			// Its sizedBody (or the sentBody over it) ends after
			// ContentLength bytes, or fails before.
			_, err = uc.W.ReadFrom(req.Body)
		}
	default:
		err = req.Write(uc.W)
	}
	if err == nil {
		err = uc.W.Flush()
	}
	if err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	return nil
}

// writeHead writes a bodiless request's head: what Request.Write would,
// without its formatting and allocations (measured: 40 % cheaper), and with
// the app's own request-target. The parts are as ReadRequest validated
// them: no control characters, no spaces in the target; the header fields
// go through writeHeader, or are the lines fields of a plain request.
func writeHead(w *bufio.Writer, req *http.Request, fields *[]byte) error {
	target := req.RequestURI
	if !strings.HasPrefix(target, "/") {
		target = req.URL.RequestURI() // absolute-form or "*": origin-form for the backend
	}
	w.WriteString(req.Method)
	w.WriteString(" ")
	w.WriteString(target)
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(req.Host)
	w.WriteString("\r\n")
	if fields != nil {
		w.Write(*fields)
	}
	writeHeader(w, req.Header, "") // a plain request's is empty
	_, err := w.WriteString("\r\n")
	return err
}

// plainFields is the current request's header lines when it was read
// plain, for writeRequest.
func (s *h1Conn) plainFields() *[]byte {
	if !s.plainReq {
		return nil
	}
	return &s.fields
}

func staleIf(err error, stale bool) error {
	if stale {
		return fmt.Errorf("%w: %w", errStale, err)
	}
	return err
}

// respond answers the client from resp, read on uc, and gives uc back
// (release) when both messages ended cleanly and neither side asked to
// close.
func (s *h1Conn) respond(req *http.Request, resp *http.Response, x *exchange, c *balance.Choice, websocket bool, uc *pool.Conn, body chan error) bool {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The exchange is complete; the relay that follows has no route
		// timeout (a WebSocket may idle).
		fired := x.cd.stop()
		s.watch.stop() // the relay reads the client
		// The body's goroutine ends first, also when the switch fails: it
		// reads the client's reader, which the connection's end gives back.
		consumed := s.finish(body, uc)
		s.up.body = nil
		switch {
		case s.watch.gone.Load():
			// The app left before the 101 went out, as answer decides
			// for other answers; the watch closed uc.
			s.release(x, false)
			s.fail(req, x, upstream.ReasonCanceled, errClientGone)
			return false
		case fired:
			// The route's timeout passed as the 101 came, and cut uc: the
			// timeout ended the exchange, as any other it passes in.
			s.release(x, false)
			s.fail(req, x, upstream.ReasonTimeout, timeoutError(x.cd.request, errors.New("switching protocols")))
			return false
		case !websocket || !consumed:
			s.release(x, false)
			s.fail(req, x, upstream.ReasonProtocol, errors.New("backend switched protocols without a websocket upgrade"))
			return false
		}
		x.be.DetachH1(uc)
		s.up.uc = nil
		s.upgrade(req, resp, x, c, &relay.BufferedConn{Conn: uc.Conn, R: uc.R})
		return false
	}
	s.up = upstreamConn{uc: uc, body: body, close: resp.Close}
	closeAfter, ended, err := s.answer(req, resp, x, c, uc.R)
	consumed := s.release(x, ended) // when answer failed before it did
	if err != nil {
		s.answerFailed(x, err)
		return false
	}
	return !closeAfter && consumed
}

// upstreamConn is the pooled connection an answer is read from, until
// release gives it back.
type upstreamConn struct {
	uc *pool.Conn
	// body reports the end of the request body's goroutine (nil: none).
	body chan error
	// close says the backend asked to close the connection.
	close bool
	// consumed is set by release: the request body went out whole.
	consumed bool
}

// release ends the current exchange's use of its pooled connection, once
// the answer's body was read to its end (ended) or failed: the connection
// goes back to the pool when both messages ended cleanly and neither side
// asked to close, else it is closed. answer calls it before its last
// write to the client, so the connection is free again while that write
// is under way (a client's next request, or another client, finds it idle
// rather than dialing a second one). It reports whether the request body
// went out whole; later calls only repeat that.
func (s *h1Conn) release(x *exchange, ended bool) bool {
	u := &s.up
	if u.uc == nil {
		return u.consumed
	}
	u.consumed = s.finish(u.body, u.uc)
	if x.cd.stop() {
		ended = false // the deadline cut the connection, maybe after the end
	}
	s.watch.detach()
	if ended && u.consumed && !u.close {
		x.be.PutH1(u.uc)
	} else {
		x.be.DiscardH1(u.uc)
	}
	u.uc, u.body = nil, nil
	return u.consumed
}

// roundTrip forwards a request whose backend needs another wire than
// HTTP/1.1 (h2, h2c) through the backend's net/http Transport, and answers
// as the pooled path does.
func (s *h1Conn) roundTrip(req *http.Request, x *exchange, c *balance.Choice, wire upstream.Wire) bool {
	be := x.be
	if s.plainReq {
		// Read plain while the backend took HTTP/1.1 (fastWire): the
		// Transport writes the fields from req.Header.
		if err := s.unplain(req); err != nil {
			return s.fail(req, x, upstream.ReasonProtocol, err)
		}
	}
	ctx, cancel := context.WithCancel(s.clientCtx())
	defer cancel()
	trace, stop := s.informationalTrace(req)
	out := req.WithContext(upstream.WithEndpoint(httptrace.WithClientTrace(ctx, trace), c))
	out.URL = upstreamURL(req.URL, be.Scheme(), c.Host)
	out.RequestURI = ""
	keepUserAgent(req)
	if s.cont != nil {
		// net/http's Transport reads the body once the backend's 100
		// arrives (upstream.ExpectContinueTimeout): the client gets its
		// 100 then, on the first read.
		s.cont.release()
	}
	var body chan error
	switch {
	case req.Body == http.NoBody:
		out.Body = nil // the Transport may then retry
	case x.r != nil && x.r.kept:
		// The Transport reads a kept body at once; roundTrip replays it.
	default:
		// Beneath a recording (keepBody), which each try reads through:
		// the client's body is what the tracker reports on.
		under := &out.Body
		if x.tee != nil {
			under = &x.tee.src
		}
		// Not under the stall watch: a quiet request stream toward an
		// HTTP/2 backend holds a stream, not a pooled connection, and
		// gRPC's client-streaming calls idle legitimately.
		s.sent.track(under, nil)
		body = make(chan error, 1)
		*under = &bodyTracker{r: *under, panics: s.h.cfg.Panics, done: body}
	}
	s.watch.start(nil, cancel)
	defer s.watch.stop()
	resp, c, done, err := s.h.roundTrip(x, wire, out, c)
	stop()
	if err != nil {
		s.finish(body, nil)
		if s.watch.gone.Load() {
			return s.fail(req, x, upstream.ReasonCanceled, errClientGone)
		}
		if s.stall.stalled.Load() {
			// The 100 Continue its body waited for (the body itself is
			// not watched toward HTTP/2).
			return s.stalledOut(x, fmt.Errorf("%w for %v", errAppStalled, s.stall.timeout))
		}
		if s.refuseBrokenBody(req, x, err) {
			return false
		}
		return s.fail(req, x, upstream.Classify(err), err)
	}
	if up, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		// A WebSocket's extended CONNECT to an HTTP/2 backend, answered
		// (upstream.Backend.WebSocketH2): the relay reads the client.
		s.watch.stop()
		done()
		s.upgrade(req, resp, x, c, up)
		return false
	}
	closeAfter, _, err := s.answer(req, resp, x, c, nil)
	resp.Body.Close()
	done()
	consumed := s.finish(body, nil)
	if err != nil {
		s.answerFailed(x, err)
		return false
	}
	return !closeAfter && consumed
}
