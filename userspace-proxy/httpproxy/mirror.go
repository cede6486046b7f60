package httpproxy

import (
	"context"
	"io"
	"net/http"

	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// RequestMirror filters: a copy of the request, as the rule changed it, goes
// to each mirror backend the decision drew; the answers are read and
// dropped. A mirror never delays the request it copies: the copy is made
// (headers cloned, the kept body shared) and handed to a goroutine before
// the request is sent, at most RoutingConfig.MaxMirrors run at once and
// one more is dropped rather than queued, and each ends after
// MirrorTimeout or when the Handler drains.

// mirror sends copies of r to x's mirror backends. body is r's body when
// it was kept; a request whose body was streamed is not mirrored (the
// bytes cannot be sent twice), and neither is a WebSocket upgrade.
func (h *Handler) mirror(x *exchange, r *http.Request, websocket bool) {
	refs := x.r.d.Mirrors
	if len(refs) == 0 {
		return
	}
	switch {
	case websocket:
		h.m.mirrors.WithLabelValues("dropped_upgrade").Add(float64(len(refs)))
		return
	case !x.replayable(r):
		h.m.mirrors.WithLabelValues("dropped_body").Add(float64(len(refs)))
		return
	}
	for _, ref := range refs {
		be := x.v.Backends.Get(ref)
		if be == nil || be.Err != nil {
			h.m.mirrors.WithLabelValues("failed").Inc()
			continue
		}
		c := be.Picker.Pick()
		if c == nil {
			h.m.mirrors.WithLabelValues("failed").Inc()
			continue
		}
		select {
		case h.mirrorSlots <- struct{}{}:
		default:
			h.m.mirrors.WithLabelValues("dropped_busy").Inc()
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
		if x.r.kept {
			m.Body, m.ContentLength = replayBody(x.r.body), int64(len(x.r.body))
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
