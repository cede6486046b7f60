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
// a body of unknown length (every gRPC call, a chunked upload) is teed:
// the mirrors get its bytes as r's own send reads them. A body of known
// length too large to keep is not mirrored, nor is a WebSocket upgrade.
func (h *Handler) mirror(x *exchange, r *http.Request, websocket bool) {
	refs := x.r.d.Mirrors
	if len(refs) == 0 {
		return
	}
	var tee *teeBody
	switch {
	case websocket:
		h.m.mirrors.WithLabelValues("dropped_upgrade").Add(float64(len(refs)))
		return
	case x.replayable(r):
	case r.ContentLength < 0:
		tee = &teeBody{ReadCloser: r.Body, limit: h.cfg.Routing.ReplayBytes, grew: make(chan struct{})}
		r.Body, x.tee = tee, tee
	default:
		h.m.mirrors.WithLabelValues("dropped_body").Add(float64(len(refs)))
		return
	}
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
			<-h.mirrorSlots
			h.m.mirrors.WithLabelValues("failed").Inc()
			continue
		}
		ctx, cancel := context.WithTimeout(h.mirrorCtx, h.cfg.Routing.MirrorTimeout)
		m := r.Clone(upstream.WithEndpoint(ctx, &c.Endpoint))
		m.URL = upstreamURL(r.URL, be.Scheme(), c.Host)
		m.RequestURI, m.Close = "", false
		removeHopByHop(m.Header)
		if be.Spec.Hostname != "" {
			m.Host = be.Spec.Hostname
		}
		m.Body, m.ContentLength = nil, 0
		switch {
		case x.r.kept:
			m.Body, m.ContentLength = replayBody(x.r.body), int64(len(x.r.body))
		case tee != nil:
			m.Body, m.ContentLength = io.NopCloser(&teeReader{t: tee, done: ctx.Done()}), -1
		}
		rt := be.RoundTripper(WireFor(be, r.ProtoMajor, false))
		go func() {
			var err error
			defer func() {
				cancel()
				<-h.mirrorSlots
				result := "sent"
				if err != nil {
					result = "failed"
					h.log.Debug("mirror failed", "backend", be.Spec.Ref.String(), "err", err)
				}
				h.m.mirrors.WithLabelValues(result).Inc()
			}()
			defer h.cfg.Panics.Recover("mirror", &err, nil)
			err = sendMirror(rt, m)
		}()
	}
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

// teeBody is a request body of unknown length whose bytes, as its own
// send reads them, are kept for the mirrors' teeReaders, up to limit. It
// never waits for a mirror: a mirror reads only what the request has sent.
type teeBody struct {
	io.ReadCloser
	limit int

	mu   sync.Mutex
	buf  []byte
	end  error         // io.EOF, errMirrorCut, or nil while the body goes on
	grew chan struct{} // closed, and replaced, when buf grows or end is set
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.end != nil {
		return n, err
	}
	switch {
	case len(t.buf)+n > t.limit:
		t.buf, t.end = nil, errMirrorCut
	case err == io.EOF:
		t.buf, t.end = append(t.buf, p[:n]...), io.EOF
	case err != nil:
		t.end = errMirrorCut
	case n == 0:
		return n, err
	default:
		t.buf = append(t.buf, p[:n]...)
	}
	close(t.grew)
	t.grew = make(chan struct{})
	return n, err
}

func (t *teeBody) Close() error {
	t.cut()
	return t.ReadCloser.Close()
}

// cut ends t's copies short unless its body ended: its request is over
// (or closed it) before reading the rest, which nothing will read now. A
// nil t does nothing.
func (t *teeBody) cut() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.end == nil {
		t.end = errMirrorCut
		close(t.grew)
	}
}

// teeReader is one mirror's copy of a teeBody. It waits for the
// request's next bytes until done: the mirror ended (its timeout, or its
// answer read), whether or not its transport still reads the body.
type teeReader struct {
	t    *teeBody
	off  int
	done <-chan struct{}
}

func (r *teeReader) Read(p []byte) (int, error) {
	for {
		r.t.mu.Lock()
		buf, end, grew := r.t.buf, r.t.end, r.t.grew
		r.t.mu.Unlock()
		switch {
		case end == errMirrorCut:
			return 0, end
		case r.off < len(buf):
			n := copy(p, buf[r.off:])
			r.off += n
			return n, nil
		case end != nil:
			return 0, end
		}
		select {
		case <-grew:
		case <-r.done:
			return 0, errMirrorCut
		}
	}
}
