package upstream

// A request's tries through net/http's HTTP/2 Transport: what it sends
// again at once where the Transport would back off, and the waits it
// bounds (a connection, a stream on it).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
)

// h2Transport is net/http's HTTP/2 Transport of a wire (transport).
type h2Transport struct {
	w    *wireState
	wire Wire
}

func (t h2Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.w.roundTrips.Add(1)
	defer t.w.roundTrips.Add(-1)
	if t.w.retired.Load() {
		// Sent on a wire no snapshot has (the request's View is older):
		// its connection closes once idle (Request.Close), as nothing
		// would take it again.
		req = req.WithContext(req.Context())
		req.Close = true
	}
	ctx, connected := t.w.traceConn(req)
	resp, err := connected.send(ctx, t.w.pool(t.wire).t, req)
	connected.settle(ctx.Err())
	if err != nil {
		if failed := checkFailed(connected.lastConn()); failed != nil {
			err = failed
		}
		if !connected.headersWritten() && !NoConnection(err) {
			err = notSent{err}
		}
	}
	if connected.c != nil && !connected.Load() {
		// Ended (its context, most often) before the Transport dialed
		// or took a connection: nothing settles a probe it holds. Should
		// the Transport dial for it all the same (it dials on after the
		// request has left, for later ones), that dial carries the same
		// Choice, and hands back nothing more (Health.handBack).
		t.w.p.health.Canceled(connected.c)
	}
	return resp, err
}

// MaxResends bounds the times a request goes again where net/http's
// HTTP/2 Transport would send it again: the backend refused its stream
// (REFUSED_STREAM, or past its GOAWAY), which it never processed (RFC
// 9113 §8.7), or the connection could not take it. The Transport would
// send it again the first time at once, then after 1, 2, 4… s, 7 times in
// all, which held a request to a backend refusing every stream about a
// minute, uncounted when it had no body; send sends it again at once each
// time, counted, and then the app gets 503 refused_stream, as Envoy
// answers a refused stream it does not retry. Bursts need more than a few: the Transport
// sends up to 100 streams on a new connection before the backend's
// SETTINGS say how many it takes, so a stream is refused about once per
// connection a burst opens — 150 at once to a backend taking 10, each
// answered in 100 ms, went again up to 9 times.
const MaxResends = 10

// ErrRefusedStream marks a request whose stream its HTTP/2 backend
// refused and that cannot go again: sent again MaxResends times, or its
// body is not at hand (ReasonRefusedStream).
var ErrRefusedStream = errors.New("stream refused by the backend")

// errResend ends a RoundTrip of the Transport where it would send the
// request again, before it does (resendNow, gotConn): send does, at once.
var errResend = errors.New("upstream: request to send again")

// resendNow is the GetBody the Transport asks before it sends a request
// with a body again.
func resendNow() (io.ReadCloser, error) { return nil, errResend }

// errNoStream ends a RoundTrip of the Transport whose request waited
// Config.ConnWait for a stream on the connection it was given (awaitStream).
var errNoStream = errors.New("upstream: no stream came free")

// connTry records whether a request to c got to a connection: the
// Transport took one (GotConn) or dialed c for it (dialFn).
type connTry struct {
	atomic.Bool
	c *balance.Choice // nil unless the request holds a probe
	// resent, unless nil, counts a stream sent again (Config.StreamResent).
	resent func()
	trace  httptrace.ClientTrace // its request's, allocated with it
	// got closes once the request's wait for a connection ends — the
	// Transport gave it one, or the request ended: a dial that waited on
	// another for it then ends (h2pool.dialOnce). A stream the backend
	// refused waits again (sent again over another connection): each
	// wait has its own, made when a dial asks for it (wait): a request
	// given a connection open makes none. endErr is the request's
	// context's error once it ended (settle).
	mu     sync.Mutex
	got    chan struct{}
	ended  bool
	endErr error
	conn   net.Conn // the last connection the Transport gave it
	// cancel ends the Transport's RoundTrip under way (send), sent counts
	// the connections it gave the request in it, and bodiless is set for
	// a request without a body, which a second sends again (gotConn).
	cancel   context.CancelCauseFunc
	sent     int
	bodiless bool
	// streamWait bounds the request's wait for a stream on each
	// connection the Transport gives it (awaitStream), which that
	// connection's streamWaits, waiting, lists while it lasts.
	streamWait time.Duration
	waiting    *streamWaits
	// listed, until and end are its entry in waiting's list, under
	// waiting.mu: end cancels the RoundTrip the wait is of at until.
	listed     bool
	until      time.Time
	end        context.CancelCauseFunc
	prev, next *connTry
	// wrote is set once HEADERS of the request were written, on any
	// connection (headersWritten).
	wrote bool
}

// send sends req through rt with ctx, and again where rt would, at once,
// up to MaxResends times, counted; req's GetBody gives its body again. It
// sends with a context that gotConn cancels for a request without a body,
// as the Transport asks nothing before sending it again, and that a wait
// for a stream past streamWait cancels (awaitStream): the request fails
// as pool.ErrBusy.
func (t *connTry) send(ctx context.Context, rt http.RoundTripper, req *http.Request) (*http.Response, error) {
	body := req.Body
	for n := 0; ; n++ {
		actx, cancel := context.WithCancelCause(ctx)
		t.mu.Lock()
		t.streamed() // a wait of the try before: not this one's
		t.sent, t.cancel, t.bodiless = 0, cancel, body == nil || body == http.NoBody
		t.mu.Unlock()
		out := req.WithContext(actx)
		if out.Body = body; req.GetBody != nil {
			out.GetBody = resendNow
		}
		resp, err := rt.RoundTrip(out)
		if err == nil {
			return resp, nil // actx ends with ctx, after the answer's body
		}
		cancel(nil)
		switch {
		case errors.Is(context.Cause(actx), errNoStream):
			return nil, fmt.Errorf("%w: the HTTP/2 connection it was given had no stream free for %v", pool.ErrBusy, t.streamWait)
		case !errors.Is(err, errResend) && !errors.Is(context.Cause(actx), errResend):
			return nil, err
		case n == MaxResends:
			return nil, fmt.Errorf("%w: sent again %d times", ErrRefusedStream, n)
		case req.GetBody != nil:
			if body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
		if t.resent != nil {
			t.resent()
		}
	}
}

// wait returns the channel that closes when the request's current wait
// for a connection ends.
func (t *connTry) wait() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.got == nil {
		t.got = make(chan struct{})
		if t.ended {
			close(t.got)
		}
	}
	return t.got
}

// gotConn ends the request's current wait: it has c. A request without
// a body given a second in the same RoundTrip is sent again, which the
// Transport would do backing off: it is canceled before its stream goes
// out, and send sends it again (one with a body asks GetBody first).
func (t *connTry) gotConn(c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.conn = c
	if t.got != nil && !t.ended {
		close(t.got)
		t.got = nil // the next wait's is made when asked for
	}
	if t.sent++; t.sent > 1 && t.bodiless {
		t.cancel(errResend)
		return
	}
	t.awaitStream(c)
}

// awaitStream bounds the wait for a stream on c, the connection the
// request was just given, until its HEADERS are written (streamed), by
// streamWait. The Transport reserves a stream on a new connection for
// each request as if the backend took 100 at once, until its SETTINGS
// say: a request whose stream they leave over the limit waits for one of
// the connection's streams to end — as long as they last, a gRPC stream's
// or a watch's, where a request coming later is given a new connection.
// It fails as one waiting for an HTTP/1.1 connection does. A bound that
// passes as the stream starts is not told from one that passes before:
// net/http's client decides to write a stream's HEADERS at one look at
// the request's context (encodeAndWriteHeaders, under the connection's
// write lock) and calls no hook between that look and the write — the
// first after it, WroteHeaderField, comes while the HEADERS are encoded
// (a slice allocated per field) — so those HEADERS may go out and the
// stream be reset at once, never sent again. t.mu is held.
func (t *connTry) awaitStream(c net.Conn) {
	t.streamed()
	if t.waiting = waitsOf(c); t.waiting != nil {
		t.waiting.add(t, time.Now().Add(t.streamWait))
	}
}

// streamed ends the wait awaitStream bounds: the request's HEADERS were
// written, or it ended. t.mu is held.
func (t *connTry) streamed() {
	if t.waiting != nil {
		t.waiting.remove(t)
		t.waiting = nil
	}
}

// headersWritten reports whether the request's HEADERS were written on a
// connection: what tells a request that got a stream from one that never
// did (ErrNotSent) — no connect tried for it (a dial it made, or one it
// waited for, that failed: NoConnection), no stream, as it waited for one
// (awaitStream) or for a connection. A request whose RoundTrip ended
// before net/http's client called the hook (it writes the HEADERS on a
// goroutine of its own, and RoundTrip returns as the request's context
// ends) is taken as one that got none: only HEADERS under way as the
// context ends — the client looks at it once, then encodes and writes
// them (awaitStream) — go out so, and their stream is reset at once.
func (t *connTry) headersWritten() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.wrote
}

func (t *connTry) lastConn() net.Conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.conn
}

// settle ends every wait of the request: it ended, its context with err
// (nil when it ended otherwise: answered, or failed).
func (t *connTry) settle(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.streamed()
	if !t.ended {
		t.ended, t.endErr = true, err
		if t.got != nil {
			close(t.got)
		}
	}
}

// endedWith returns the error the request's context ended with if its
// wait got, ended, ended so (settle); nil when it got a connection.
func (t *connTry) endedWith(got <-chan struct{}) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended && t.got != nil && (<-chan struct{})(t.got) == got {
		return t.endErr
	}
	return nil
}

type connTryKey struct{}

// traceConn returns req's context with a trace that tells when the
// Transport gives it a connection, and the connTry its RoundTrip fills
// in: a dial the Transport makes for it while another to the endpoint is
// under way waits until then (h2pool.dialOnce); the Health learns that a
// request holding a probe went on a connection already open (Reused), and
// a probe which connects nothing is handed back; the wait for a stream on
// that connection is bounded (awaitStream). It costs every request a few
// allocations, against a connection per request of a cold burst (send's
// context a few more, against a minute held; the wait's bound none, its
// connection's streamWaits, against a wait as long as another stream).
func (w *wireState) traceConn(req *http.Request) (context.Context, *connTry) {
	c, ok := req.Context().Value(endpointKey{}).(*balance.Choice)
	if !ok || !c.Probing() {
		c = nil
	}
	h := w.p.health
	try := &connTry{c: c, resent: w.p.cfg.StreamResent, streamWait: w.p.cfg.ConnWait}
	try.trace.GotConn = func(info httptrace.GotConnInfo) {
		try.Store(true)
		try.gotConn(info.Conn)
		if info.Reused && c != nil {
			h.Reused(c)
		}
	}
	try.trace.WroteHeaders = func() {
		try.mu.Lock()
		defer try.mu.Unlock()
		try.streamed()
		try.wrote = true
	}
	return context.WithValue(httptrace.WithClientTrace(req.Context(), &try.trace), connTryKey{}, try), try
}
