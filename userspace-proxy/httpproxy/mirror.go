package httpproxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// RequestMirror filters: a copy of the request, as the rule changed it, goes
// to each mirror backend the decision drew; the answers are read and
// dropped. A mirror never delays the request it copies: the copy is made
// (headers cloned, the kept body shared, a streamed one teed) and handed
// to a goroutine before the request is sent, at most
// RoutingConfig.MaxMirrors run at once and one more is dropped rather
// than queued, and each ends after MirrorTimeout or when the Handler
// drains.

// mirror sends copies of r to x's mirror backends. A kept body is shared;
// a body of unknown length (every gRPC call, a chunked upload) is teed
// (keepBody): the mirrors get its bytes as r's own send reads them. A body of known
// length too large to keep is not mirrored, nor is a WebSocket upgrade.
func (h *Handler) mirror(x *exchange, r *http.Request, websocket bool) {
	refs := x.r.d.Mirrors
	if len(refs) == 0 {
		return
	}
	tee := x.tee
	switch {
	case websocket:
		h.m.mirrors.WithLabelValues("dropped_upgrade").Add(float64(len(refs)))
		return
	case x.replayable(r), tee != nil:
	default:
		h.m.mirrors.WithLabelValues("dropped_body").Add(float64(len(refs)))
		return
	}
	// Each copy counts as r's client's in the upstream pools: copies of one
	// pod's requests wait their turn as its requests do.
	client := x.t.poolClient()
	for _, ref := range refs {
		be := x.v.Backends.Get(ref)
		if be == nil || be.Err != nil {
			h.m.mirrors.WithLabelValues("failed").Inc()
			continue
		}
		// A slot first: a pick may take an endpoint's probe (balance.Health),
		// which a mirror dropped would hold out for 15 s.
		select {
		case h.mirrorSlots <- struct{}{}:
		default:
			h.m.mirrors.WithLabelValues("dropped_busy").Inc()
			continue
		}
		c := be.Picker.Pick()
		if c == nil {
			h.m.mirrors.WithLabelValues("failed").Inc()
			<-h.mirrorSlots
			continue
		}
		ctx, cancel := context.WithTimeout(h.mirrorCtx, h.cfg.Routing.MirrorTimeout)
		m := r.Clone(upstream.WithEndpoint(upstream.WithClient(ctx, client), c))
		m.URL = upstreamURL(r.URL, be.Scheme(), c.Host)
		m.RequestURI, m.Close = "", false
		removeHopByHop(m.Header)
		keepUserAgent(m) // the fast path's bodiless requests have no placeholder
		externalAuthority(m, be, &x.r.d)
		m.Body, m.ContentLength = nil, 0
		switch {
		case x.r.kept:
			body := x.r.body
			m.Body, m.ContentLength = replayBody(body), int64(len(body))
			// A stream its HTTP/2 backend refuses, which it did not
			// process, goes again (upstream asks GetBody).
			m.GetBody = func() (io.ReadCloser, error) { return replayBody(body), nil }
		case tee != nil:
			tee.mu.Lock()
			tee.teed = true
			tee.mu.Unlock()
			// GetBody gives the request's own next try (resend).
			m.Body, m.ContentLength, m.GetBody = newTeeReader(tee, ctx.Done()), -1, nil
		}
		rt := be.RoundTripper(WireFor(be, r.ProtoMajor, false))
		go func() {
			var err error
			defer func() {
				cancel()
				h.mirrorEnded(be.Spec.Ref.String(), err)
			}()
			defer h.cfg.Panics.Recover("mirror", &err, nil)
			err = sendMirror(rt, m)
		}()
	}
}

// mirrorEnded counts the result of a mirror to backend, failed if err is
// not nil, then frees its slot. In this order the in-flight gauge (the
// slots held) reads 0 only once every copy's result is in mirrors, which
// is how a scrape knows the count is whole (e2e gamma-mirror relies on
// it); a scrape in between sees the copy in both for a moment. The other
// way round, it could see a copy in neither.
func (h *Handler) mirrorEnded(backend string, err error) {
	result := "sent"
	if err != nil {
		result = "failed"
		h.log.Debug("mirror failed", "backend", backend, "err", err)
	}
	h.m.mirrors.WithLabelValues(result).Inc()
	<-h.mirrorSlots
}

// sendMirror sends m and drops its answer.
func sendMirror(rt http.RoundTripper, m *http.Request) error {
	resp, err := rt.RoundTrip(m)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, mirrorReadLimit))
	resp.Body.Close()
	return nil
}

// mirrorReadLimit is how much of a mirror's answer is read (so that its
// connection may be reused) before it is closed.
const mirrorReadLimit = 64 << 10

// errMirrorCut ends a mirror's teed body that will not be whole: the
// request's own send stopped before the end, or the body outgrew
// RoutingConfig.ReplayBytes. The mirror's request then fails rather than
// look complete.
var errMirrorCut = errors.New("mirrored body cut short")

// teeBody is a request body sent as it streams (not kept) whose bytes, as
// the request's tries read them, are recorded up to limit: the mirrors'
// teeReaders copy them, and a retry sends them again (again) before the
// rest of the body. A body that outgrew limit is sent on by the try that
// read past it, its recording dropped (memory is bounded per request) and
// its mirrors cut; it goes to no other try. It never waits for a mirror:
// a mirror reads only what the request has sent.
//
// The transports may still read a try's body after their RoundTrip
// failed (net/http's HTTP/2 Transport writes it on a goroutine of its
// own): reads of the app's body are one at a time (reading), and a try
// made stale by the next one reads no more of it once its read in
// progress returns, whose bytes the recording keeps for the next try
// (past limit too: by at most that one read).
type teeBody struct {
	src   io.ReadCloser
	limit int

	reading sync.Mutex // held by the try reading src

	mu    sync.Mutex
	buf   []byte        // the body's first bytes, all read while it stays within limit
	read  int           // bytes read from src
	over  bool          // read passed limit: no other try, mirrors cut
	end   error         // src's io.EOF or error, or errMirrorCut once the request is over
	grew  chan struct{} // a mirror waits on it (nil: none); closed when buf grows or end is set
	cur   *tryBody      // the try under way
	first tryBody       // most requests have but one try
	held  bool          // tries may follow: Close waits for release
	teed  bool          // mirrors read buf: settle keeps it
	ended bool          // close was done
}

// record makes r's streamed body x's teeBody, keeping up to limit bytes
// of it, unless it is one already; r's body is then its first try.
func (x *exchange) record(r *http.Request, limit int) {
	if x.tee != nil {
		return
	}
	x.tee = &teeBody{src: r.Body, limit: limit, held: true}
	r.Body = x.tee.again()
}

// handOver reports whether another try may start: nothing read of the
// body outgrew the recording, nor failed. If so, the try under way is
// stale from now on, so that it cannot read past limit (and drop the
// recording) before the next starts: what its read in progress gets goes
// to the next. A nil t cannot.
func (t *teeBody) handOver() bool {
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.over || t.failed() {
		return false
	}
	t.cur.stale = true
	return true
}

// broken reports whether reading the body failed (the app left in the
// middle of it, or sent a malformed one), or it was cut: no try can send
// it whole. A nil t has not.
func (t *teeBody) broken() bool {
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed()
}

// failed is broken with t.mu held.
func (t *teeBody) failed() bool { return t.end != nil && t.end != io.EOF }

// again is a new try of t's body, from its start; the one before is
// stale.
func (t *teeBody) again() *tryBody {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cur == nil {
		t.first.t = t
		t.cur = &t.first
		return t.cur
	}
	t.cur.stale = true
	t.cur = &tryBody{t: t}
	return t.cur
}

// settle tells t that no try follows the one under way: its answer's
// head goes to the app. The recording, which a long stream (a gRPC call)
// would hold for as long as it lives, is dropped once that try has read
// it, unless mirrors read it (they may be behind; MirrorTimeout ends
// them). A nil t does nothing.
func (t *teeBody) settle() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.teed {
		return
	}
	t.over = true // no other try: its reads drop the recording
	if t.cur != nil && t.cur.off == t.read {
		t.buf = nil
	}
}

// release ends t's tries: a Close of the last passes through from now on,
// and one already made is done.
func (t *teeBody) release() {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.held = false
	closed := t.cur != nil && t.cur.closed
	t.mu.Unlock()
	if closed {
		t.close()
	}
}

// close ends the body, once: the mirrors' copies are cut unless it
// ended, and src is closed.
func (t *teeBody) close() {
	t.mu.Lock()
	ended := t.ended
	t.ended = true
	t.mu.Unlock()
	if !ended {
		t.cut()
		t.src.Close()
	}
}

// cut ends t's copies short unless its body ended: its request is over
// before reading the rest, which nothing will read now. A nil t does
// nothing.
func (t *teeBody) cut() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.end == nil {
		t.end = errMirrorCut
		t.grown()
	}
}

// grown wakes the mirrors; t.mu is held.
func (t *teeBody) grown() {
	if t.grew != nil {
		close(t.grew)
		t.grew = nil
	}
}

// tryBody is one try's copy of a teeBody: the recorded bytes, then the
// rest of the body as it reads it.
type tryBody struct {
	t   *teeBody
	off int
	// stale (a later try started) and closed (its transport is done)
	// are t.mu's.
	stale, closed bool
}

func (r *tryBody) Read(p []byte) (int, error) {
	t := r.t
	locked := false
	defer func() {
		if locked {
			t.reading.Unlock()
		}
	}()
	for {
		t.mu.Lock()
		switch {
		case r.stale, r.off < t.read && len(t.buf) != t.read:
			// A later try started, or the body outgrew limit before this.
			t.mu.Unlock()
			return 0, errBodyAbandoned
		case r.off < t.read:
			n := copy(p, t.buf[r.off:])
			r.off += n
			if t.over && r.off == t.read {
				t.buf = nil // settled: no try will want it again
			}
			t.mu.Unlock()
			return n, nil
		case t.end != nil && t.end != errMirrorCut:
			end := t.end
			t.mu.Unlock()
			return 0, end
		}
		t.mu.Unlock()
		if locked {
			return r.readOn(p)
		}
		// Another try may be reading src: wait for it, then look again.
		t.reading.Lock()
		locked = true
	}
}

// readOn reads the body on from src, where r is, with t.reading held, and
// records what it read.
func (r *tryBody) readOn(p []byte) (int, error) {
	t := r.t
	n, err := t.src.Read(p)
	t.mu.Lock()
	defer t.mu.Unlock()
	recorded, wasOver := len(t.buf) == t.read, t.over
	t.read += n
	t.over = wasOver || t.read > t.limit
	switch {
	case !r.stale && t.over:
		t.buf = nil // no try will want it again
	case recorded:
		// Also what a stale try read: the next try sends it.
		t.buf = append(t.buf, p[:n]...)
	}
	if err != nil && t.end == nil {
		t.end = err
	}
	if !wasOver {
		t.grown() // once over, the mirrors were cut
	}
	if r.stale {
		return 0, errBodyAbandoned
	}
	r.off += n
	return n, err
}

// Close ends r's try; the body is closed once the request's tries are
// over (release).
func (r *tryBody) Close() error {
	t := r.t
	t.mu.Lock()
	r.closed = true
	last := !t.held && t.cur == r
	t.mu.Unlock()
	if last {
		t.close()
	}
	return nil
}

// teeReader is one mirror's copy of a teeBody. It waits for the
// request's next bytes until done (the mirror ended: its timeout, or its
// answer read) or until its transport closes it: net/http's HTTP/2
// Transport waits for its body's read in progress before a RoundTrip whose
// stream the backend refused or reset returns, which would otherwise hold
// the mirror's slot until MirrorTimeout.
type teeReader struct {
	t      *teeBody
	off    int
	done   <-chan struct{}
	closed chan struct{}
	once   sync.Once
}

func newTeeReader(t *teeBody, done <-chan struct{}) *teeReader {
	return &teeReader{t: t, done: done, closed: make(chan struct{})}
}

// Close ends r's reads, the one waiting included.
func (r *teeReader) Close() error {
	r.once.Do(func() { close(r.closed) })
	return nil
}

func (r *teeReader) Read(p []byte) (int, error) {
	t := r.t
	for {
		t.mu.Lock()
		switch {
		case t.end == errMirrorCut || t.over:
			t.mu.Unlock()
			return 0, errMirrorCut
		case r.off < len(t.buf):
			n := copy(p, t.buf[r.off:])
			t.mu.Unlock()
			r.off += n
			return n, nil
		case t.end != nil:
			end := t.end
			t.mu.Unlock()
			return 0, end
		}
		if t.grew == nil {
			t.grew = make(chan struct{})
		}
		grew := t.grew
		t.mu.Unlock()
		select {
		case <-grew:
		case <-r.done:
			return 0, errMirrorCut
		case <-r.closed:
			return 0, errMirrorCut
		}
	}
}
