package httpproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

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
	s.closeAfter = req.Close
	x := &s.x
	*x = exchange{t: s.t}
	x.v, x.fe = s.t.view()
	if x.fe == nil {
		return s.fail(req, x, upstream.ReasonNoEndpoints, upstream.ErrNoEndpoints)
	}
	if x.be = x.v.Backends.Get(s.h.route(x.fe, req)); x.be == nil {
		return s.fail(req, x, upstream.ReasonNoEndpoints, upstream.ErrNoEndpoints)
	}
	if x.be.Err != nil {
		return s.fail(req, x, upstream.ReasonInvalidPolicy, x.be.Err)
	}
	if x.be.Spec.SessionPersistence != nil {
		x.now = time.Now() // sessions time out; other requests need no clock
	}
	choice, setSession := x.be.Picker.PickRequest(req, x.now)
	if choice == nil {
		return s.fail(req, x, upstream.ReasonNoEndpoints, upstream.ErrNoEndpoints)
	}
	websocket := isWebSocketUpgrade(req)
	s.prepare(req, x.be, websocket)
	wire := wireFor(x.be, req, websocket)
	if wire == upstream.WireNegotiate {
		// XBackend HTTP offers both; for HTTP/1.1 apps an HTTP/1.1 pool
		// beat h2 upstreams on every proxy measured (../shared/BENCH.md).
		wire = upstream.WireH1
	}
	if wire != upstream.WireH1 {
		return s.roundTrip(req, x, choice, wire, setSession)
	}
	return s.forward(req, x, choice, setSession, websocket)
}

// prepare turns the client's request into the one sent upstream, in place:
// hop-by-hop fields go (the WebSocket Upgrade is kept), the backend's own
// name replaces Host for an external hostname, and a body that waits for
// 100 Continue is held until the backend asks for it (continueReader).
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
	if req.Body != http.NoBody {
		keepUserAgent(req) // for Request.Write (writeRequest)
	}
	if be.Spec.Hostname != "" {
		// An ExternalHostname backend's own name is the authority it serves.
		req.Host = be.Spec.Hostname
	}
	// Connection: close from the client ends the client's connection
	// (closeAfter), not the pooled one.
	req.Close = false
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

// forward sends req over a pooled HTTP/1.1 connection and answers.
func (s *h1Conn) forward(req *http.Request, x *exchange, choice *balance.Choice, setSession, websocket bool) bool {
	be := x.be
	replayable := req.Body == http.NoBody && isIdempotent(req)
	for attempt := 1; ; attempt++ {
		uc, c, err := s.conn(be, choice)
		if err != nil {
			return s.fail(req, x, upstream.Classify(err), err)
		}
		choice = c
		resp, body, err := s.send(uc, req, replayable)
		if err == nil {
			return s.respond(req, resp, x, choice, setSession, websocket, uc, body)
		}
		s.finish(body, uc)
		be.DiscardH1(uc)
		if !errors.Is(err, errStale) || attempt == 3 {
			return s.fail(req, x, upstream.Classify(err), err)
		}
	}
}

// conn takes a connection to choice's endpoint. A failed connect sent no
// byte, so, as on the L4 path, other endpoints are tried (three in all)
// unless a session pins the endpoint.
func (s *h1Conn) conn(be *upstream.Backend, choice *balance.Choice) (*pool.Conn, *balance.Choice, error) {
	uc, err := be.GetH1(context.Background(), &choice.Endpoint)
	for i := 1; err != nil && be.Spec.SessionPersistence == nil && i < min(be.Picker.Len(), 3); i++ {
		if r := upstream.Classify(err); r != upstream.ReasonRefused && r != upstream.ReasonDialFailed {
			break
		}
		choice = be.Picker.Pick()
		uc, err = be.GetH1(context.Background(), &choice.Endpoint)
	}
	return uc, choice, err
}

// send writes req on uc and reads the answer's head, passing informational
// answers on. A body that is not already buffered is written by another
// goroutine, which reports on the returned channel, so the answer can
// start before the body ends (full duplex); the caller must finish it.
func (s *h1Conn) send(uc *pool.Conn, req *http.Request, replayable bool) (*http.Response, chan error, error) {
	var body chan error
	if req.Body == http.NoBody || s.cont == nil && req.ContentLength > 0 && req.ContentLength <= int64(s.br.Buffered()) {
		if err := writeRequest(uc, req); err != nil {
			return nil, nil, staleIf(err, replayable && uc.Reused())
		}
	} else {
		body = make(chan error, 1)
		go func() { body <- writeRequest(uc, req) }()
	}
	if _, err := uc.R.Peek(1); err != nil {
		return nil, body, staleIf(fmt.Errorf("read answer: %w", err), replayable && uc.Reused() && body == nil)
	}
	for {
		resp, err := http.ReadResponse(uc.R, req)
		if err != nil {
			return nil, body, fmt.Errorf("read answer: %w", err)
		}
		if resp.StatusCode >= http.StatusOK || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, body, nil
		}
		if resp.StatusCode == http.StatusContinue && s.cont != nil {
			s.cont.release()
		}
		s.informational(req, resp)
	}
}

// writeRequest writes req on uc: a request with a body with Request.Write
// (its framing, chunks and trailers), a bodiless one as its head alone.
func writeRequest(uc *pool.Conn, req *http.Request) error {
	var err error
	if req.Body == http.NoBody {
		err = writeHead(uc.W, req)
	} else {
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
// go through Header.Write.
func writeHead(w *bufio.Writer, req *http.Request) error {
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
	if err := req.Header.Write(w); err != nil {
		return err
	}
	_, err := w.WriteString("\r\n")
	return err
}

func staleIf(err error, stale bool) error {
	if stale {
		return fmt.Errorf("%w: %w", errStale, err)
	}
	return err
}

// isIdempotent is net/http's rule for requests it may send twice.
func isIdempotent(req *http.Request) bool {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

// respond answers the client from resp, read on uc, then gives uc back
// when both messages ended cleanly and neither side asked to close.
func (s *h1Conn) respond(req *http.Request, resp *http.Response, x *exchange, c *balance.Choice, setSession, websocket bool, uc *pool.Conn, body chan error) bool {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if !websocket || !s.finish(body, uc) {
			x.be.DiscardH1(uc)
			s.fail(req, x, upstream.ReasonProtocol, errors.New("backend switched protocols without a websocket upgrade"))
			return false
		}
		s.upgrade(resp, x, uc)
		return false
	}
	closeAfter, ended, err := s.answer(req, resp, x, c, setSession, uc.R)
	consumed := s.finish(body, uc)
	if ended && consumed && !resp.Close {
		x.be.PutH1(uc)
	} else {
		x.be.DiscardH1(uc)
	}
	if err != nil {
		s.h.log.Debug("answer failed", "service", x.fe.Service.String(), "client", s.t.client(), "err", err)
		return false
	}
	return !closeAfter && consumed
}

// roundTrip forwards a request whose backend needs another wire than
// HTTP/1.1 (h2, h2c) through the backend's net/http Transport, and answers
// as the pooled path does.
func (s *h1Conn) roundTrip(req *http.Request, x *exchange, c *balance.Choice, wire upstream.Wire, setSession bool) bool {
	be := x.be
	out := req.WithContext(upstream.WithEndpoint(context.Background(), &c.Endpoint))
	out.URL = &url.URL{Scheme: be.Scheme(), Host: c.Host, Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	out.RequestURI = ""
	keepUserAgent(req)
	if s.cont != nil {
		// net/http's Transport sends the body at once (no
		// ExpectContinueTimeout): the client gets its 100 on the first read.
		delete(req.Header, "Expect")
		s.cont.release()
	}
	var body chan error
	if req.Body == http.NoBody {
		out.Body = nil // the Transport may then retry
	} else {
		body = make(chan error, 1)
		out.Body = &bodyTracker{r: req.Body, done: body}
	}
	resp, err := be.RoundTripper(wire).RoundTrip(out)
	if err != nil {
		s.finish(body, nil)
		return s.fail(req, x, upstream.Classify(err), err)
	}
	closeAfter, _, err := s.answer(req, resp, x, c, setSession, nil)
	resp.Body.Close()
	consumed := s.finish(body, nil)
	if err != nil {
		s.h.log.Debug("answer failed", "service", x.fe.Service.String(), "client", s.t.client(), "err", err)
		return false
	}
	return !closeAfter && consumed
}

// finish waits for the goroutine sending the request body, if any, and
// reports whether the body went out whole. One still running when the
// answer is over means the backend answered before the body ended: it is
// stopped (the client read and the upstream write time out at once), and
// neither connection can carry another request.
func (s *h1Conn) finish(body chan error, uc *pool.Conn) bool {
	if body == nil {
		return true
	}
	select {
	case err := <-body:
		return err == nil
	default:
	}
	if s.cont != nil {
		s.cont.halt()
	}
	s.unread = true
	s.setDeadline(aLongTimeAgo, false)
	if uc != nil {
		uc.SetWriteDeadline(aLongTimeAgo)
	}
	<-body
	return false
}

var aLongTimeAgo = time.Unix(1, 0)
