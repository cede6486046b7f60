package httpproxy

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http/httpguts"

	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/relay"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// forward sends r to c over the backend's pool and streams the response back.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, x *exchange, c *balance.Choice) {
	be := x.be
	websocket := isWebSocketUpgrade(r)
	out := outgoing(r, be, c, websocket)
	// net/http's HTTP/1 server sends 100 Continue when the body is first
	// read, and leaves the Expect to the handler: it goes to the backend,
	// whose 100 has the transports read the body. (Its HTTP/2 server
	// removes the Expect before the handler runs, and a read is all that
	// tells it: an HTTP/2 app gets its 100 when the body goes, at once.)
	expects := r.ProtoMajor == 1 && r.ProtoMinor >= 1 && r.ContentLength != 0 &&
		httpguts.HeaderValuesContainsToken(r.Header["Expect"], "100-continue")
	if r.ProtoMajor == 1 && !expects {
		delete(out.Header, "Expect") // nothing to expect from HTTP/1.0, or without a body
	}
	if x.r != nil {
		if err := h.applyRoute(x, out, r.Host, expects, websocket); err != nil {
			be.Picker.Unused(c)
			leaveBody(w, r)
			h.bodyFailed(w, r, x, err)
			return
		}
	}
	if r.ProtoMajor == 1 && r.ContentLength != 0 {
		// A request body may still be on its way to the backend when the
		// response starts (bidirectional streaming, an early answer);
		// net/http's HTTP/1 server would then read the rest and drop it,
		// unless asked not to.
		http.NewResponseController(w).EnableFullDuplex()
	}
	stop := noop
	if r.ProtoAtLeast(1, 1) {
		var trace *httptrace.ClientTrace
		trace, stop = h.informational(r.Context(), w)
		out = out.WithContext(httptrace.WithClientTrace(out.Context(), trace))
	}
	wire := WireFor(be, r.ProtoMajor, websocket)
	aw := h.watchStalls(w, r, x, out, wire)
	defer x.stall.end()
	resp, c, done, err := h.roundTrip(x, wire, out, c)
	stop()
	if err != nil && x.stall.stalled.Load() {
		h.stalled(x, err)
		resetApp(w, r)
	}
	if err != nil && h.refuseBrokenBody(w, r, x, err) {
		return
	}
	if err != nil {
		h.fail(w, r, x, upstream.Classify(err), err)
		return
	}
	defer done()
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		h.switchProtocols(w, r, x, c, resp, websocket)
		return
	}
	hdr := w.Header()
	upgrade := upgradeRequired(r, resp)
	removeHopByHop(resp.Header)
	x.decorate(resp.Header, r, c)
	for k, vv := range resp.Header {
		hdr[k] = vv
	}
	if upgrade != nil {
		hdr["Upgrade"] = upgrade
		// net/http's server writes its own Connection: close over one
		// without that option when the connection ends after the
		// answer: the app's asking keeps it so. (Its own reasons, a
		// shutdown or an unread body, still send Upgrade without it.)
		hdr["Connection"] = connectionUpgrade
		if r.Close {
			hdr["Connection"] = connectionCloseUpgrade
		}
	}
	if _, ok := resp.Header["Content-Type"]; !ok {
		// As the backend sent it: net/http's server would otherwise sniff
		// the body and add one.
		hdr["Content-Type"] = nil
	}
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		hdr["Trailer"] = []string{strings.Join(keys, ", ")}
		if r.ProtoMajor == 1 && r.ProtoMinor == 1 {
			// Only chunks carry trailers to an HTTP/1.1 app, and
			// net/http's server chunks an answer only without a length
			// (an HTTP/2 backend may send both).
			delete(hdr, "Content-Length")
		}
	}
	w.WriteHeader(resp.StatusCode)
	h.m.request(x.fe, resp.StatusCode, protocolOf(be))
	if err := h.copyBody(aw, resp, be); err != nil {
		if errors.Is(err, errAppStalled) {
			h.stalled(x, err)
			resetApp(w, r)
		}
		h.log.Debug("response body copy failed", "service", x.fe.Service.String(), "err", err)
		if x.grpc != nil && errors.Is(err, errBackendBody) && r.Context().Err() == nil && isGRPCType(resp.Header) {
			// A gRPC call ends with a status saying what broke it (a lost
			// backend connection: UNAVAILABLE, as for a client of the
			// backend; a route timeout: what it gets before the answer).
			err = x.timedOut(err)
			code, why := x.grpc.failStatus(err, upstream.Classify(err))
			setGRPCTrailers(hdr, code, why)
			return
		}
		resetApp(w, r)
	}
	for k, vv := range resp.Trailer {
		if len(resp.Trailer) != announced {
			// gRPC servers do not announce their trailers (grpc-status);
			// net/http sends prefixed keys as trailers all the same.
			k = http.TrailerPrefix + k
		}
		hdr[k] = vv
	}
}

// refuseBrokenBody answers a request that failed, err, after the app's
// body broke (x.body) as the fast path does (h1Conn.refuseBrokenBody;
// refuseBody), and reports whether it did. The transport's own error then
// says only that it gave up (a closed connection), not that the backend
// failed. An app that left (appLeft) gets no answer (canceled).
func (h *Handler) refuseBrokenBody(w http.ResponseWriter, r *http.Request, x *exchange, err error) bool {
	broken := x.body.broken()
	if broken == nil && r.ProtoMajor == 1 && r.Context().Err() != nil {
		// net/http's HTTP/1 server ended the request as the app's
		// connection ended or failed: the transport may have given up
		// before the body's read under way told why.
		broken = x.body.settled()
	}
	if broken == nil {
		return false
	}
	if appLeft(r, broken) {
		h.fail(w, r, x, upstream.ReasonCanceled, broken) // aborts the request
		return true
	}
	h.refuseBody(w, r, x, broken, "upstream_err", err)
	return true
}

// bodyFailed fails r, whose body the proxy read itself before the request
// went (readBody: kept for its rule's retries or mirrors, or for its
// ExternalAuth server) and could not, as the fast path's bodyFailed does
// (bodyReadFailed decides for both).
func (h *Handler) bodyFailed(w http.ResponseWriter, r *http.Request, x *exchange, err error) {
	if reason, refuse := bodyReadFailed(r, err); !refuse {
		h.fail(w, r, x, reason, err)
		return
	}
	h.refuseBody(w, r, x, err)
}

// refuseBody answers r, whose body broke off or proved malformed (err),
// as the fast path does (h1Conn.refuseBody): 400, its rule's headers (a
// page's script sees a CORS error rather than the 400 without them), the
// connection closed, counted as answered; attrs add to the log line. A
// gRPC call gets a trailers-only INTERNAL instead, counted as it goes out
// (200), as the proxy's other answers to gRPC: a bare 400 reaches gRPC
// clients as INTERNAL with "unexpected HTTP status code", the reason
// lost. INTERNAL is both gRPC's reading of a 400 (PROTOCOL-HTTP2.md) and
// what its libraries give a request they cannot parse or a protocol
// violation (doc/statuscodes.md); not INVALID_ARGUMENT, which they never
// generate and which says the call's arguments, not its framing, were
// wrong.
func (h *Handler) refuseBody(w http.ResponseWriter, r *http.Request, x *exchange, err error, attrs ...any) {
	h.log.Debug("request body broken", append(attrs, "service", x.fe.Service.String(), "client", x.t.client(), "err", err)...)
	hdr := w.Header()
	if x.r != nil {
		x.r.d.ApplyResponse(hdr)
	}
	if x.grpc != nil {
		maps.Copy(hdr, grpcHeader(grpcInternal, "bad_request_body"))
		w.WriteHeader(http.StatusOK)
		h.m.request(x.fe, http.StatusOK, protocolOf(x.be))
		return
	}
	plainText(hdr)
	leaveBody(w, r)
	w.WriteHeader(http.StatusBadRequest)
	w.Write(badRequest)
	h.m.request(x.fe, http.StatusBadRequest, protocolOf(x.be))
}

// resetApp ends an answer that cannot complete, whose headers may be gone:
// the client must see a truncated answer, never a clean short one. HTTP/2
// gets its stream reset; an HTTP/1.x connection a TCP reset, as net/http's
// abort would end it cleanly (which completes a close-delimited HTTP/1.0
// body). It does not return.
func resetApp(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 {
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			sockio.Reset(c)
		}
	}
	panic(http.ErrAbortHandler)
}

// informational passes the backend's 1xx answers (103 Early Hints, 102)
// to the client, as the fast path does (passHints); 100 Continue is the
// server's own to send. A 1xx sent as the app's stream ends leaves w's
// header as it is, and is the last: net/http's HTTP/2 server may still be
// writing it out.
func (h *Handler) informational(ctx context.Context, w http.ResponseWriter) (trace *httptrace.ClientTrace, stop func()) {
	return h.passHints(func(code int, fields textproto.MIMEHeader) bool {
		hdr := w.Header()
		for k, vv := range fields {
			hdr[k] = vv
		}
		w.WriteHeader(code)
		if ctx.Err() != nil {
			return false
		}
		for k := range fields {
			delete(hdr, k)
		}
		return true
	})
}

// passHints passes the 1xx answers of a round trip through net/http's
// Transport to the app with write, in order, until stop; write reports
// whether more may follow. The Transports call Got1xxResponse before they
// return the final answer, but HTTP/2's calls it from its connection's
// read loop: a write there that waits for an app that does not read held
// every stream of the upstream connection. So the answers wait in a queue
// (bounded: hintsBudget) that a goroutine writes, started by the first to
// come. The read loop may also deliver a 1xx after the round trip ended
// (the client left, a timeout passed): stop, called before the handler
// writes anything else, takes no more, and returns once those that came
// before are written, ahead of the final answer; past it, net/http panics
// on a write to a finished w.
func (h *Handler) passHints(write func(code int, fields textproto.MIMEHeader) bool) (trace *httptrace.ClientTrace, stop func()) {
	q := &hintQueue{write: write, panics: h.cfg.Panics, budget: hintsBudget(http.DefaultMaxHeaderBytes)}
	return &httptrace.ClientTrace{Got1xxResponse: q.got}, q.stop
}

// hintQueue is passHints' queue.
type hintQueue struct {
	write   func(code int, fields textproto.MIMEHeader) bool
	panics  *contain.Reporter
	mu      sync.Mutex
	waiting []hint
	budget  hintsBudget
	stopped bool
	// writer is closed when the goroutine writing the queue ends; nil
	// while none runs.
	writer chan struct{}
}

type hint struct {
	code   int
	fields textproto.MIMEHeader
}

func (q *hintQueue) got(code int, fields textproto.MIMEHeader) error {
	if code == http.StatusContinue {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stopped {
		return nil
	}
	if err := q.budget.spend(fields); err != nil {
		return err
	}
	q.waiting = append(q.waiting, hint{code, fields})
	if q.writer == nil {
		q.writer = make(chan struct{})
		go q.run()
	}
	return nil
}

func (q *hintQueue) run() {
	var err error
	defer q.panics.Recover("1xx answers", &err, func() { q.next(false) })
	more := true
	for next, ok := q.next(more); ok; next, ok = q.next(more) {
		more = q.write(next.code, next.fields)
	}
}

// next takes the next answer to write; when none waits, or no more may
// follow (!more, stop), it ends the writer.
func (q *hintQueue) next(more bool) (hint, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !more {
		q.stopped = true
		q.waiting = nil
	}
	if len(q.waiting) == 0 {
		close(q.writer)
		q.writer = nil
		return hint{}, false
	}
	next := q.waiting[0]
	q.waiting = q.waiting[1:]
	return next, true
}

func (q *hintQueue) stop() {
	q.mu.Lock()
	q.stopped = true
	writer := q.writer
	q.mu.Unlock()
	if writer != nil {
		<-writer
	}
}

// hintsBudget is what is left of the bound on the heads of the 1xx
// answers a round trip through net/http's Transport passes on: its HTTP/2
// Transport bounds them only when nobody reads them, and a trace does; the
// HTTP/1.1 pool bounds an answer's heads, 1xx included
// (pool.Config.MaxHeadBytes). A backend would otherwise hold a request
// open with 1xx answers without end.
type hintsBudget int

// spend takes h, a 1xx answer's fields, from b, and fails past its end.
// Its :status counts too, as net/http's HTTP/2 Transport counts it when
// nobody reads the 1xx: answers without fields would cost nothing.
func (b *hintsBudget) spend(h textproto.MIMEHeader) error {
	*b -= hintsBudget(len(":status") + len("103") + 32)
	for k, vv := range h {
		for _, v := range vv {
			*b -= hintsBudget(len(k) + len(v) + 32) // a field's size in HPACK (RFC 7541 §4.1)
		}
	}
	if *b < 0 {
		return fmt.Errorf("1xx answers: %w", pool.ErrHeadTooLarge)
	}
	return nil
}

// errBackendBody marks copyBody's failures on the backend's side.
var errBackendBody = errors.New("read response body")

// copyBody streams the response body. Responses of unknown length (SSE, MCP,
// gRPC streams, chunked) are flushed after every read so nothing waits in a
// buffer; sized ones go through net/http's buffered writer, flushed when a
// read came short of both its buffer and what the backend still owes: the
// transport's buffer is then drained (HTTP/2's stream pipe and the HTTP/1.1
// pool's bufio.Reader return what they hold), and the next read may wait
// on a backend that paused mid-body (the fast path's readAtHand). A body
// that came whole adds no flush: its last read owes nothing. A stream that
// probably waits for its next event (its last read was small:
// streamWaitBelow) waits in a read into a small probe, without a copy
// buffer, and passes on what it brought before it reads again: a read
// that waits for more must not hold back bytes the app is owed (a
// heartbeat, a line's end flushed alone). A probe that came back full
// may have left more at hand, read next with a copy buffer; the rest of
// what arrives waits in the transport's own buffers.
func (h *Handler) copyBody(w http.ResponseWriter, resp *http.Response, be *upstream.Backend) error {
	flush := resp.ContentLength < 0 || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	flusher, _ := w.(http.Flusher)
	var probe *[probeSize]byte // streams only: it escapes, an allocation
	if flush && flusher != nil {
		probe = new([probeSize]byte)
	}
	owed := resp.ContentLength // sized answers: what the backend has yet to send
	if probe != nil {
		// The head goes now, as on the fast path: net/http's server sends
		// it with the first write, and a stream may wait long for its
		// first event while its app waits for the head (an EventSource
		// opens on it). A gRPC call's too, at the cost of a write: a
		// backend that sends its head before any message (grpc-go's
		// SendHeader, a subscription acknowledging its stream) has a
		// client waiting in Header() for it, as Envoy passes it on. A
		// trailers-only answer, the backend's END_STREAM on its head,
		// has a length of 0 and no probe: it stays one HEADERS frame.
		flusher.Flush()
	}
	last := 0
	for {
		var bp *[]byte
		var p []byte
		if probe != nil && last < streamWaitBelow {
			p = probe[:]
		} else {
			bp = h.bufs.Get()
			p = *bp
		}
		n, rerr := resp.Body.Read(p)
		last = n
		if bp == nil && n == len(p) {
			last = streamWaitBelow
		}
		owed -= int64(n)
		var werr error
		if n > 0 {
			_, werr = w.Write(p[:n])
			if werr == nil && flusher != nil && (probe != nil || n < len(p) && owed > 0) {
				flusher.Flush()
			}
		}
		if bp != nil {
			h.bufs.Put(bp)
		}
		if werr != nil {
			return fmt.Errorf("write response body: %w", werr)
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("%w from %s: %w", errBackendBody, be.Spec.Ref, rerr)
		}
	}
}

// probeSize is the read a waiting stream waits in: most events and
// messages fit, so they go out in one write.
const probeSize = 512

// switchProtocols completes an HTTP/1.1 Upgrade the backend accepted: the
// 101 goes to the client, decorated as every answer (x.decorate), then
// bytes flow both ways until either side ends.
func (h *Handler) switchProtocols(w http.ResponseWriter, r *http.Request, x *exchange, c *balance.Choice, resp *http.Response, websocket bool) {
	be := x.be
	up, ok := resp.Body.(io.ReadWriteCloser)
	if !websocket || !ok {
		err := errors.New("backend switched protocols without a websocket upgrade")
		h.fail(w, r, x, upstream.ReasonProtocol, err)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		h.fail(w, r, x, upstream.ReasonProtocol, fmt.Errorf("hijack client connection: %w", err))
		return
	}
	h.m.request(x.fe, resp.StatusCode, protocolOf(be))
	resp.Body = nil // the relay owns it now
	x.decorate(resp.Header, r, c)
	if err := writeSwitch(brw.Writer, resp); err != nil {
		conn.Close()
		up.Close()
		return
	}
	client := &relay.BufferedConn{Conn: conn, R: brw.Reader}
	res := relay.Relay(client, up, h.bufs, h.cfg.Panics)
	h.m.upgradedBytes.Add(float64(res.AToB + res.BToA))
}

func writeSwitch(bw *bufio.Writer, resp *http.Response) error {
	if _, err := fmt.Fprintf(bw, "HTTP/1.1 101 %s\r\n", http.StatusText(http.StatusSwitchingProtocols)); err != nil {
		return err
	}
	if err := resp.Header.Write(bw); err != nil {
		return err
	}
	if _, err := bw.WriteString("\r\n"); err != nil {
		return err
	}
	return bw.Flush()
}

// bridgeWebSocket serves an RFC 8441 extended CONNECT from an HTTP/2 client
// by opening an HTTP/1.1 WebSocket Upgrade to the backend (RFC 6455 §4.1: a
// fresh Sec-WebSocket-Key, whose Accept it checks), answering 200 on the
// stream, and relaying the stream's DATA to and from the upgraded connection.
// To a backend that declared HTTP/2 (WireFor) that Upgrade goes out as an
// extended CONNECT again (upstream.Backend.WebSocketH2), whose 200 comes
// back as the 101. Its answer is decorated as forward's is (x.decorate).
func (h *Handler) bridgeWebSocket(w http.ResponseWriter, r *http.Request, x *exchange, c *balance.Choice) {
	be := x.be
	key := make([]byte, 16)
	rand.Read(key)
	wsKey := base64.StdEncoding.EncodeToString(key)
	up := outgoing(r, be, c, false)
	up.Method = http.MethodGet
	up.Proto, up.ProtoMajor, up.ProtoMinor = "HTTP/1.1", 1, 1
	up.Header = r.Header.Clone()
	delete(up.Header, ":protocol")
	up.Header.Set("Connection", "Upgrade")
	up.Header.Set("Upgrade", "websocket")
	up.Header.Set("Sec-WebSocket-Key", wsKey)
	up.Body, up.ContentLength = nil, 0
	if x.r != nil {
		h.applyRoute(x, up, r.Host, false, true) // no body to keep: cannot fail
	}
	// Under the rule's timeouts and retries, as an HTTP/1 app's upgrade: a
	// 101 that comes as a timeout passes finds its connection cut
	// (upstream's h1Transport), and fails as the timeout (504). One that
	// came before is the WebSocket's, which no route timeout bounds.
	resp, c, done, err := h.roundTrip(x, WireFor(be, 1, true), up, c)
	if err != nil {
		h.fail(w, r, x, upstream.Classify(err), err)
		return
	}
	defer done()
	defer func() {
		if resp.Body != nil {
			resp.Body.Close()
		}
	}()
	if resp.StatusCode >= http.StatusOK && resp.StatusCode < http.StatusMultipleChoices {
		// A 2xx is RFC 8441's success: the app would take the answer
		// for an open WebSocket.
		h.fail(w, r, x, upstream.ReasonProtocol, fmt.Errorf("backend answered a websocket upgrade with %d", resp.StatusCode))
		return
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		// Not upgraded: relay the backend's answer as is (e.g. 403, 404).
		hdr := w.Header()
		removeHopByHop(resp.Header)
		x.decorate(resp.Header, r, c)
		for k, vv := range resp.Header {
			hdr[k] = vv
		}
		w.WriteHeader(resp.StatusCode)
		h.m.request(x.fe, resp.StatusCode, protocolOf(be))
		if err := h.copyBody(w, resp, be); err != nil {
			// As forward's: a stream reset, never a clean short answer.
			h.log.Debug("response body copy failed", "service", x.fe.Service.String(), "err", err)
			panic(http.ErrAbortHandler)
		}
		return
	}
	upConn, ok := resp.Body.(io.ReadWriteCloser)
	if !ok || resp.Header.Get("Sec-WebSocket-Accept") != upstream.WebSocketAccept(wsKey) {
		h.fail(w, r, x, upstream.ReasonProtocol, errors.New("backend websocket handshake: bad Sec-WebSocket-Accept"))
		return
	}
	resp.Body = nil
	// The 200 carries the 101's fields (the subprotocol and extensions
	// chosen, cookies the backend set) but the HTTP/1.1 handshake's own
	// and a length, which would end the stream.
	removeHopByHop(resp.Header)
	delete(resp.Header, "Sec-Websocket-Accept")
	delete(resp.Header, "Content-Length")
	x.decorate(resp.Header, r, c)
	hdr := w.Header()
	for k, vv := range resp.Header {
		hdr[k] = vv
	}
	w.WriteHeader(http.StatusOK)
	h.m.request(x.fe, http.StatusOK, protocolOf(be))
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		upConn.Close()
		return
	}
	res := relay.Relay(&h2Stream{r: r.Body, w: w, rc: rc}, upConn, h.bufs, h.cfg.Panics)
	h.m.upgradedBytes.Add(float64(res.AToB + res.BToA))
	if res.Err != nil {
		// RFC 8441 §5: a connection error (the backend's reset) is a
		// stream reset, never the END_STREAM of an orderly close.
		panic(http.ErrAbortHandler)
	}
}

// h2Stream is an extended-CONNECT stream as a byte stream: reads are the
// request body, writes go out as response DATA, flushed at once.
type h2Stream struct {
	r  io.ReadCloser
	w  io.Writer
	rc *http.ResponseController
	// ended is set by CloseWrite, whose closing of r is an orderly end.
	ended atomic.Bool
}

func (s *h2Stream) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && s.ended.Load() {
		err = io.EOF
	}
	return n, err
}

func (s *h2Stream) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if err == nil {
		err = s.rc.Flush()
	}
	return n, err
}

func (s *h2Stream) Close() error { return s.r.Close() }

// CloseWrite is the relay's half-close after the backend's connection
// ended: the app must see END_STREAM (RFC 8441 §5: an orderly TCP close is
// END_STREAM), or a client waiting for the server to close after the
// close handshake (RFC 6455 §7.1.1) waits forever, and the stream with it.
// net/http ends a stream only when the handler returns, which the relay
// lets it do once the app's direction ends too: closing the request body
// ends it. Nothing the app still sends is owed to the backend: a WebSocket
// server closes its connection fully, not half.
func (s *h2Stream) CloseWrite() error {
	s.ended.Store(true)
	return s.r.Close()
}
