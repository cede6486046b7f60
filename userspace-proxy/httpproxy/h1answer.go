package httpproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/relay"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// The fast path's answers to the client: framing, body streaming, upgrades,
// informational answers and the proxy's own error answers (a broken
// request body's 400 among them).

// framing is how an answer's body is delimited toward the client.
type framing uint8

const (
	framingNone    framing = iota // HEAD, 1xx, 204, 304: no body
	framingLength                 // Content-Length
	framingChunked                // unknown length to an HTTP/1.1 client
	framingClose                  // unknown length to an HTTP/1.0 client: the end is the close
)

func framingFor(req *http.Request, resp *http.Response) framing {
	switch {
	case req.Method == http.MethodHead || resp.StatusCode < http.StatusOK ||
		resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified:
		return framingNone
	case req.ProtoAtLeast(1, 1) && len(resp.Trailer) > 0:
		// Only chunks carry trailers, whatever length the answer
		// has (an HTTP/2 backend may send both).
		return framingChunked
	case resp.ContentLength >= 0:
		return framingLength
	case req.ProtoAtLeast(1, 1):
		return framingChunked
	}
	return framingClose
}

// answer writes resp to the client. closeAfter says the answer told the
// client the connection ends; ended that resp's body was read to its end,
// so the upstream connection is clean. On the pooled path (s.up) the
// upstream connection is released before the last write to the client.
// err is the first read or write failure: the client then got a truncated
// answer (never a clean short one), and its connection must close; or
// errClientGone, nothing written, when the app left before it began.
func (s *h1Conn) answer(req *http.Request, resp *http.Response, x *exchange, c *balance.Choice, src *bufio.Reader) (closeAfter, ended bool, err error) {
	if s.watch.gone.Load() {
		// The exchange's outcome is decided here, once (see clientWatch):
		// the app left before its answer began, though the answer came.
		return false, false, errClientGone
	}
	plain := resp == &s.plain.resp // its fields are in src's buffer (never a 426)
	var upgrade []string
	if !plain {
		upgrade = upgradeRequired(req, resp)
		removeHopByHop(resp.Header)
		if upgrade != nil {
			resp.Header["Upgrade"] = upgrade
		}
		x.decorate(resp.Header, req, c)
	}
	f := framingFor(req, resp)
	// An answer that starts before the client's body was read to its end
	// ends the connection (finish stops the body): say so, or the client
	// may send its next request on a connection about to close.
	closeAfter = s.closeAfter || f == framingClose || s.h.h1.draining.Load() || s.sent.unread()
	bw := s.startAnswer()
	dated := plain && s.plain.head.date
	switch {
	case plain:
		s.plain.writeHead(bw, src, x.be, c) // framingLength
	case f == framingNone:
		// HEAD and 304 keep the Content-Length the backend gave; a 204
		// has none (RFC 9110 §8.6), whatever the backend sent.
		skip := ""
		if resp.StatusCode == http.StatusNoContent {
			skip = "Content-Length"
		}
		writeStatusLine(bw, resp)
		writeHeader(bw, resp.Header, skip)
	default:
		writeStatusLine(bw, resp)
		writeHeader(bw, resp.Header, "Content-Length") // the framing's own follows
	}
	if !plain {
		_, dated = resp.Header["Date"] // nil when a rule removed it: none then
	}
	if !dated {
		writeDate(bw)
	}
	switch {
	case plain: // its head has its Content-Length
	case f == framingLength:
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), resp.ContentLength, 10))
		bw.WriteString("\r\n")
	case f == framingChunked:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
		if len(resp.Trailer) > 0 {
			bw.WriteString("Trailer: ")
			first := true
			for k := range resp.Trailer {
				if !first {
					bw.WriteString(", ")
				}
				bw.WriteString(k)
				first = false
			}
			bw.WriteString("\r\n")
		}
	}
	writeConnection(bw, closeAfter, !req.ProtoAtLeast(1, 1), upgrade != nil)
	bw.WriteString("\r\n")
	s.count(x, resp.StatusCode)
	ended = true
	if f != framingNone {
		ended, bw, err = s.copyBody(bw, resp, f, src)
	}
	if err == nil {
		if s.up.uc != nil {
			s.release(x, ended)
		}
		if closeAfter {
			// The last answer on the connection: held (TCP_CORK) until
			// the connection is closed, its tail and the FIN leave in one
			// segment, not two. With a connection per request that is
			// a segment, and a wakeup of the client, fewer per request, in
			// a cost the proxy pays (on loopback the sender's system call
			// runs the receiver's TCP input). Never on a connection that
			// stays open: a partial corked segment waits up to 200 ms.
			sockio.Cork(s.c)
		}
		if err = bw.Flush(); err != nil {
			err = fmt.Errorf("write answer: %w", err)
		}
	}
	// copyBody may have swapped bw. Not deferred: a panic in a waiting
	// stream's read (waitBody) finds bw given back already, and a second
	// Put would lend it to two connections at once.
	s.putWriter(bw)
	return closeAfter, ended, err
}

// writeHeader writes h's fields but skip as Header.Write does (names
// that are not tokens left out, CR and LF in values made spaces, values
// trimmed), without sorting them: the order of fields of different names
// carries no meaning (RFC 9110 §5.3), and sorting cost a pooled sorter
// and a slice per message. Errors stay in w (bufio's are sticky) for its
// Flush to report.
func writeHeader(w *bufio.Writer, h http.Header, skip string) {
	for k, vv := range h {
		if k == skip || !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range vv {
			if strings.ContainsAny(v, "\r\n") {
				v = headerNewlineToSpace.Replace(v)
			}
			w.WriteString(k)
			w.WriteString(": ")
			w.WriteString(textproto.TrimString(v))
			w.WriteString("\r\n")
		}
	}
}

var headerNewlineToSpace = strings.NewReplacer("\n", " ", "\r", " ")

// writeConnection writes an answer's Connection field: close when the
// connection ends after it, keep-alive when an HTTP/1.0 client's stays
// open, and upgrade for an answer that keeps its Upgrade field
// (upgradeRequired), as RFC 9110 §7.8 asks of its sender.
func writeConnection(w *bufio.Writer, closeAfter, http10, upgrade bool) {
	var options string
	switch {
	case closeAfter && upgrade:
		options = "close, upgrade"
	case closeAfter:
		options = "close"
	case upgrade:
		options = "upgrade"
	case http10:
		options = "keep-alive"
	default:
		return
	}
	w.WriteString("Connection: ")
	w.WriteString(options)
	w.WriteString("\r\n")
}

// writeDate writes a Date field of the time now. RFC 9110 §6.6.1: a
// recipient with a clock MUST add one to an answer it forwards without;
// net/http's server dates every answer it writes alike, the fast path's
// own too.
func writeDate(w *bufio.Writer) {
	w.WriteString("Date: ")
	w.Write(time.Now().UTC().AppendFormat(w.AvailableBuffer(), http.TimeFormat))
	w.WriteString("\r\n")
}

func writeStatusLine(bw *bufio.Writer, resp *http.Response) {
	bw.WriteString("HTTP/1.1 ")
	if resp.Status != "" {
		bw.WriteString(resp.Status) // "200 OK", as parsed
	} else {
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(resp.StatusCode), 10))
		bw.WriteString(" ")
		bw.WriteString(http.StatusText(resp.StatusCode))
	}
	bw.WriteString("\r\n")
}

// copyBody streams resp's body to the client and reports whether it was
// read to its end. A sized body is read straight into bw's buffer and goes
// out in full buffers, or, on the pooled path, when the backend has
// nothing more at hand and bw holds postponeBelow (readAtHand); a body of
// unknown length (chunked, server-sent events, MCP, streamed gRPC-Web) is
// flushed whenever the backend has nothing more buffered, so nothing waits
// in the proxy. It returns the answer's writer, bw or, when a stream that
// waited gave bw back (see waitBody), the one it took again.
func (s *h1Conn) copyBody(bw *bufio.Writer, resp *http.Response, f framing, src *bufio.Reader) (bool, *bufio.Writer, error) {
	b := bodyCopy{s: s, bw: bw, chunked: f == framingChunked}
	b.take()
	defer b.drop()
	stream := f != framingLength
	var under *sockio.Conn // the upstream socket, for a sized body's reads (readAtHand)
	if !stream && src != nil && s.up.uc != nil {
		under = sockio.Of(s.up.uc.Conn)
	}
	last := 0
	for {
		var p []byte
		var n int
		var rerr error
		full := false
		if stream && last < streamWaitBelow && (src == nil || src.Buffered() == 0) {
			var err error
			if p, n, full, rerr, err = b.waitBody(resp.Body); err != nil {
				return false, b.bw, fmt.Errorf("write answer: %w", err)
			}
		} else {
			var err error
			if p, err = b.target(); err != nil {
				return false, b.bw, fmt.Errorf("write answer: %w", err)
			}
			if under != nil && b.bw.Buffered() >= postponeBelow && src.Buffered() == 0 {
				if p, n, rerr, err = b.readAtHand(resp.Body, p, under); err != nil {
					return false, b.bw, fmt.Errorf("write answer: %w", err)
				}
			} else {
				n, rerr = resp.Body.Read(p)
			}
		}
		last = n
		if full {
			last = streamWaitBelow // more may be at hand: read on with the buffer
		}
		if n > 0 {
			if err := b.commit(p[:n]); err != nil {
				return false, b.bw, fmt.Errorf("write answer: %w", err)
			}
		}
		if stream && n > 0 && (src == nil || src.Buffered() == 0) {
			if err := b.bw.Flush(); err != nil {
				return false, b.bw, fmt.Errorf("write answer: %w", err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return false, b.bw, fmt.Errorf("read answer body: %w", rerr)
		}
	}
	if b.cw != nil {
		b.cw.Close() // the last chunk; its trailer section follows
		if err := resp.Trailer.Write(b.bw); err != nil {
			return true, b.bw, fmt.Errorf("write answer: %w", err)
		}
		b.bw.WriteString("\r\n")
	}
	return true, b.bw, nil
}

// postponeBelow is how much of a sized answer may wait in the proxy while
// the backend pauses: as nginx's postpone_output, a segment's worth.
const postponeBelow = 1460

// readAtHand reads a sized body into p as Read would, but when nothing of
// it is at hand it first writes out what the answer's writer holds (at
// least postponeBelow: the head, the body so far), then waits: bytes the
// backend sent do not wait in the proxy for the rest of a 32 KiB write.
// It returns the buffer the bytes are in (the writer's, taken again after
// the write), and werr when that write failed.
func (b *bodyCopy) readAtHand(body io.Reader, p []byte, under *sockio.Conn) (_ []byte, n int, err, werr error) {
	under.NoWait(true)
	n, err = body.Read(p)
	under.NoWait(false)
	switch {
	case !errors.Is(err, sockio.ErrWouldBlock):
		return p, n, err, nil
	case n > 0:
		return p, n, nil, nil
	}
	if werr = b.bw.Flush(); werr != nil {
		return nil, 0, nil, werr
	}
	if p, werr = b.target(); werr != nil {
		return nil, 0, nil, werr
	}
	n, err = body.Read(p)
	return p, n, err, nil
}

// streamWaitBelow: a streamed answer whose last read brought less than
// this, with nothing more from the backend buffered, probably waits for
// its next event — server-sent events and MCP streams may idle for
// minutes — and waits without buffers (waitBody). Bulk bodies read in
// larger pieces and go on without the detour.
const streamWaitBelow = 4 << 10

// bodyCopy is copyBody's buffers: the answer's writer and, for a chunked
// answer, a copy buffer and the chunked writer over bw.
type bodyCopy struct {
	s       *h1Conn
	bw      *bufio.Writer
	chunked bool
	bp      *[]byte
	cw      io.WriteCloser
}

// take gets the copy buffer and chunked writer a chunked answer needs.
func (b *bodyCopy) take() {
	if b.chunked {
		b.bp = b.s.h.bufs.Get()
		b.cw = httputil.NewChunkedWriter(b.bw)
	}
}

func (b *bodyCopy) drop() {
	if b.bp != nil {
		b.s.h.bufs.Put(b.bp)
		b.bp = nil
	}
}

// target is where the next read of the body goes: the copy buffer, or
// the writer's own free space (flushed first when little is left; an
// error there, the client gone, ends the copy).
func (b *bodyCopy) target() ([]byte, error) {
	if b.chunked {
		return *b.bp, nil
	}
	if b.bw.Available() < 2<<10 {
		if err := b.bw.Flush(); err != nil {
			return nil, err
		}
	}
	p := b.bw.AvailableBuffer()
	return p[:cap(p)], nil
}

// commit writes p, read into target, to the client.
func (b *bodyCopy) commit(p []byte) error {
	if b.chunked {
		_, err := b.cw.Write(p)
		return err
	}
	_, err := b.bw.Write(p)
	return err
}

// waitBody waits for the body's next bytes holding neither the answer's
// writer nor a copy buffer (32 and 64 KiB, for as long as an event stream
// idles): it flushes and gives them back, reads into the connection's
// probe (the rest of what arrives waits in the upstream connection's own
// buffer) and takes them again. One read: a second, for what came with
// the first bytes, waited for the backend's next write when they had come
// alone (a one-byte chunk, a heartbeat), and held them from the app until
// then. full says the probe came back full: more may be at hand; werr
// that a write to the app failed.
func (b *bodyCopy) waitBody(body io.Reader) (p []byte, n int, full bool, err, werr error) {
	if werr = b.bw.Flush(); werr != nil {
		return nil, 0, false, nil, werr
	}
	b.drop()
	b.s.putWriter(b.bw)
	if b.s.probe == nil {
		b.s.probe = new([probeSize]byte)
	}
	n, err = body.Read(b.s.probe[:])
	b.bw = b.s.writer()
	b.take()
	if n == 0 {
		return nil, 0, false, err, nil
	}
	if p, werr = b.target(); werr != nil {
		return nil, 0, false, nil, werr
	}
	copy(p, b.s.probe[:n]) // target has room for a probe: 2 KiB or more
	return p, n, n == probeSize, err, nil
}

// upgrade completes a WebSocket upgrade the backend accepted: the 101 goes
// to the client, decorated as every answer (x.decorate), then bytes flow
// both ways between the app and up, the backend's upgraded connection or
// extended CONNECT stream, until either side ends. A 101 the app did not
// take ends both, the app's connection with a reset, as any answer that
// broke off (answerFailed; one that stalled counted so).
func (s *h1Conn) upgrade(req *http.Request, resp *http.Response, x *exchange, c *balance.Choice, up io.ReadWriteCloser) {
	x.decorate(resp.Header, req, c)
	bw := s.startAnswer()
	writeStatusLine(bw, resp)
	resp.Header.Write(bw) // Connection, Upgrade and Sec-WebSocket-* as the backend sent them
	bw.WriteString("\r\n")
	err := bw.Flush()
	s.putWriter(bw)
	s.count(x, resp.StatusCode)
	if err != nil {
		up.Close()
		s.answerFailed(x, fmt.Errorf("write switching protocols: %w", err))
		return
	}
	if !s.deadline.IsZero() {
		s.setDeadline(time.Time{}, false) // a WebSocket may idle
	}
	s.tunnel = up // relayed once the exchange has unwound (run)
}

// relayTunnel relays the WebSocket of an accepted upgrade in a goroutine
// of its own, where it waits with a small stack (as a parked connection),
// then ends the connection.
func (s *h1Conn) relayTunnel() {
	defer s.end()
	var err error
	defer s.h.cfg.Panics.Recover("websocket relay", &err, func() { sockio.Reset(s.c); s.tunnel.Close() })
	res := relay.Relay(&relay.BufferedConn{Conn: s.c, R: s.br}, s.tunnel, s.h.bufs, s.h.cfg.Panics)
	s.h.m.upgradedBytes.Add(float64(res.AToB + res.BToA))
}

// informational passes a 1xx answer (103 Early Hints, 102) to an HTTP/1.1
// client; 100 Continue is the proxy's own to send. It waits for wmu only to
// write: a request body's goroutine may hold it for long, writing the
// proxy's 100 to an app slow to read it, and the answer that follows a
// backend's 100 must not wait behind that.
func (s *h1Conn) informational(req *http.Request, resp *http.Response) {
	if resp.StatusCode == http.StatusContinue || !req.ProtoAtLeast(1, 1) {
		return
	}
	s.wmu.take()
	defer s.wmu.give()
	bw := s.writer()
	defer s.putWriter(bw)
	writeStatusLine(bw, resp)
	resp.Header.Write(bw)
	bw.WriteString("\r\n")
	bw.Flush()
}

// informationalTrace passes the 1xx answers of a round trip through
// net/http's Transport (to an h2 or h2c backend) as informational does,
// until stop (passHints): written after it, one would land in the answer,
// or in the next request's.
func (s *h1Conn) informationalTrace(req *http.Request) (trace *httptrace.ClientTrace, stop func()) {
	return s.h.passHints(func(code int, fields textproto.MIMEHeader) bool {
		s.informational(req, &http.Response{StatusCode: code, Header: http.Header(fields)})
		return true
	})
}

// fail answers a request the proxy could not forward, with the status,
// body and rule's headers of the net/http path; the app of one whose body
// it stalled in (readBody) gets a reset.
func (s *h1Conn) fail(req *http.Request, x *exchange, reason upstream.Reason, err error) bool {
	if reason == upstream.ReasonAppStalled {
		return s.stalledOut(x, err)
	}
	code := s.h.report(context.Background(), x, reason, err)
	if reason == upstream.ReasonCanceled {
		return false
	}
	return s.writePlain(req, x, code, reasonBodies[reason])
}

// writePlain writes the fast path's own text answer to x: with its rule's
// response header changes and CORS headers, then the body's own fields,
// which win over the rule's as on the net/http path (written beside them,
// a field the rule sets too went out twice).
func (s *h1Conn) writePlain(req *http.Request, x *exchange, code int, body []byte) bool {
	if x.r == nil {
		return s.writeLocal(req, code, nil, "Content-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\n", body)
	}
	h := http.Header{}
	x.r.d.ApplyResponse(h)
	plainText(h)
	return s.writeLocal(req, code, h, "", body)
}

// refuseBrokenBody answers 400 and ends the connection when the exchange
// failed after the request's body broke off or proved malformed (the
// backend could not answer it: the watch ends the wait, clientWatch.fire;
// net/http's Transport resets the stream), and reports whether it did. As
// the proxy's other answers to a rule's request, it carries the rule's
// headers: without its CORS headers, a page's script would see a CORS
// error rather than the 400. An app that reset its connection in the
// middle of its body left (appLeft): it gets nothing, counted canceled,
// as on net/http's path.
func (s *h1Conn) refuseBrokenBody(req *http.Request, x *exchange, err error) bool {
	if !s.sent.failed() {
		return false
	}
	if appLeft(req, s.sent.err) {
		s.fail(req, x, upstream.ReasonCanceled, s.sent.err)
		return true
	}
	s.refuseBody(req, x, s.sent.err, "upstream_err", err)
	return true
}

// bodyFailed fails req, whose body the proxy read itself before the
// request went (readBody: kept for its rule's retries or mirrors, or for
// its ExternalAuth server) and could not, as net/http's path does
// (bodyReadFailed decides for both): a body that broke off or is
// malformed gets the 400 a forwarded one gets (refuseBrokenBody), not
// silence.
func (s *h1Conn) bodyFailed(req *http.Request, x *exchange, err error) bool {
	if reason, refuse := bodyReadFailed(req, err); !refuse {
		return s.fail(req, x, reason, err)
	}
	s.refuseBody(req, x, err)
	return false
}

// refuseBody answers 400 to req, whose body broke off or proved malformed
// (err), counts it, and the connection ends; attrs add to the log line.
func (s *h1Conn) refuseBody(req *http.Request, x *exchange, err error, attrs ...any) {
	s.h.log.Debug("request body broken", append(attrs, "service", x.fe.Service.String(), "client", s.t.client(), "err", err)...)
	s.writePlain(req, x, http.StatusBadRequest, badRequest)
	s.count(x, http.StatusBadRequest)
}

var badRequest = []byte("400 Bad Request")

// answerLocally writes a route's own answer (a redirect, a CORS preflight's, 404, 500).
func (s *h1Conn) answerLocally(req *http.Request, x *exchange) bool {
	a := answerFor(&x.r.d, req)
	// Counted before it is written: an app that reads the answer finds it
	// counted, as the proxy's other answers are.
	s.h.countLocal(context.Background(), x, a.status)
	return s.writeLocal(req, a.status, a.header, "", a.body)
}

// writeLocal writes an answer of the proxy's own to the current exchange
// (s.x): status code, the fields of header and the preformatted lines
// fixed, body (not for HEAD). The connection stays open only when the
// request had no body: nothing of it is left unread; it is reset when the
// app left the answer unread (stallWatch).
func (s *h1Conn) writeLocal(req *http.Request, code int, header http.Header, fixed string, body []byte) bool {
	keep := req.Body == http.NoBody && !s.closeAfter && !s.h.h1.draining.Load()
	s.unread = req.Body != http.NoBody
	bw := s.startAnswer()
	defer s.putWriter(bw)
	bw.WriteString("HTTP/1.1 ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(code), 10))
	bw.WriteString(" ")
	bw.WriteString(http.StatusText(code))
	bw.WriteString("\r\n")
	bw.WriteString(fixed)
	if err := header.Write(bw); err != nil {
		return false
	}
	if _, ok := header["Date"]; !ok {
		writeDate(bw)
	}
	bw.WriteString("Content-Length: ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(body)), 10))
	if !keep {
		bw.WriteString("\r\nConnection: close")
	} else if !req.ProtoAtLeast(1, 1) {
		bw.WriteString("\r\nConnection: keep-alive") // as answer says it
	}
	bw.WriteString("\r\n\r\n")
	if req.Method != http.MethodHead {
		bw.Write(body)
	}
	if err := bw.Flush(); err != nil {
		if errors.Is(err, errAppStalled) {
			s.stalledOut(&s.x, fmt.Errorf("write answer: %w", err))
		}
		return false
	}
	return keep
}

// startAnswer marks the final answer as begun (no 100 Continue after it)
// and lends a writer for it. A 100 Continue under way is written whole
// first: the answer must not land in the middle of it. That wait is as
// long as the app takes to read the 100, bounded by the stall watch,
// which ends the write, as it would the answer's own to an app that
// reads nothing (writeTurn).
func (s *h1Conn) startAnswer() *bufio.Writer {
	s.wmu.take()
	s.answered = true
	s.wmu.give()
	return s.writer()
}

// writeTurn is the turn to write to the app of a fast-path connection,
// taken by the proxy's own 100 Continue (written from the request body's
// goroutine) and its other informational answers, and by the final
// answer as it starts. A channel, not a sync.Mutex: a wait for a turn
// that an app slow to read holds must let the stall watch's clock run,
// and in a synctest bubble a wait on a mutex does not (it is not durably
// blocked), so the watch that ends the write under way never came: a
// final answer that came while the 100 was written to an app that reads
// nothing waited for good (TestUnreadAnswersCut/continue-then-answer).
type writeTurn chan struct{}

func (w writeTurn) take() { w <- struct{}{} }

func (w writeTurn) give() { <-w }

func (s *h1Conn) writer() *bufio.Writer {
	bw := s.h.h1.writers.Get().(*bufio.Writer)
	bw.Reset(&s.out)
	return bw
}

func (s *h1Conn) putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	s.h.h1.writers.Put(bw)
}
