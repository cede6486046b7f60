package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstreamtls"
)

// ErrNotHTTP2 is returned for a TLS backend that must speak HTTP/2 (its
// protocol says so) but did not negotiate h2 by ALPN, and wrapped for a
// backend that answered the HTTP/2 preface otherwise.
var ErrNotHTTP2 = errors.New("backend did not negotiate h2")

// errDeclinedH2: offered h2 and http/1.1, the endpoint chose http/1.1 (or
// no ALPN); negotiated sends the request over HTTP/1.1 instead.
var errDeclinedH2 = errors.New("backend declined h2")

// dialH2 opens a connection for net/http's HTTP/2 Transport of wire. A TLS
// connection that did not negotiate h2 is closed rather than handed over:
// the Transport would speak HTTP/1.1 on it, with the weakness h1Transport
// avoids.
func (w *wireState) dialH2(ctx context.Context, picked *balance.Choice, wire Wire) (*h2Checked, error) {
	c, err := w.dial(ctx, picked, wire.ALPN(), true)
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*tls.Conn)
	if !ok || tc.ConnectionState().NegotiatedProtocol == upstreamtls.ALPNH2 {
		return &h2Checked{Conn: c}, nil
	}
	c.Close()
	p := tc.ConnectionState().NegotiatedProtocol
	if wire == WireNegotiate {
		w.declinedH2.Store(time.Now().UnixNano())
		return nil, fmt.Errorf("tls to %s: %w (got %q)", picked.Endpoint.Addr, errDeclinedH2, p)
	}
	return nil, fmt.Errorf("tls to %s: %w (got %q)", picked.Endpoint.Addr, ErrNotHTTP2, p)
}

// AnsweredHTTP1 returns an error wrapping ErrNotHTTP2 when head, the first
// bytes a backend at addr sent over a connection for HTTP/2, begin an
// HTTP/1.x answer: it speaks HTTP/1.1 whatever its Service declares (h2c
// has no ALPN to tell), or whatever its TLS negotiated (a TLS terminator
// that offers h2 in front of an HTTP/1.1 server).
func AnsweredHTTP1(addr net.Addr, head []byte) error {
	if !bytes.HasPrefix(head, http1Answer) {
		return nil
	}
	return fmt.Errorf("http/2 to %s: %w: it answered HTTP/1.x to the HTTP/2 preface", addr, ErrNotHTTP2)
}

// http1Answer is how an HTTP/1.x answer begins.
var http1Answer = []byte("HTTP/1.")

// h2Checked is a connection of net/http's HTTP/2 Transport, cleartext or
// TLS, whose first read is checked (AnsweredHTTP1): its requests then fail
// as protocol, not with net/http's frame "too large" (upstream_error).
// That read, or a write that fails first, settles a TLS handshake the
// backend judges after it (Settle), so that a refusal fails its requests
// as tls_handshake, not as a broken pipe or as net/http's "could not be
// established".
type h2Checked struct {
	net.Conn
	read bool // the Transport's reader alone reads
	// failed is the check's error once it failed, or the handshake's once
	// it was refused: a request that took the connection after the
	// reader closed it fails with net/http's "could not be established"
	// and is told this instead (h2Transport).
	failed atomic.Pointer[error]
}

func (c *h2Checked) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.read {
		return n, err
	}
	if n == 0 {
		return 0, c.settle(err)
	}
	Settle(c.Conn, nil) // the backend's first bytes: it took the handshake
	// The answer's first bytes may come apart from the rest: read on
	// while they may begin an HTTP/1.x one (a SETTINGS frame does not).
	for err == nil && n < min(len(http1Answer), len(p)) && bytes.HasPrefix(http1Answer, p[:n]) {
		var m int
		m, err = c.Conn.Read(p[n:])
		n += m
	}
	c.read = true
	if err := AnsweredHTTP1(c.RemoteAddr(), p[:n]); err != nil {
		c.failed.Store(&err)
		return 0, err
	}
	return n, err
}

func (c *h2Checked) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		// net/http's Transport writes its preface before it reads.
		err = c.settle(err)
	}
	return n, err
}

// settle returns err, the error of c's first read or of a write, or the
// handshake's when the backend refused it, which it keeps (failed).
func (c *h2Checked) settle(err error) error {
	if err = Settle(c.Conn, err); refused(err) {
		c.failed.Store(&err)
	}
	return err
}

// closeNotifyWait bounds the close_notify a TLS h2Checked's Close sends:
// tls.Conn gives its write 5 s, which a backend that stopped reading (a
// full send buffer) takes whole — net/http closes a connection whose ping
// went unanswered that way.
const closeNotifyWait = 500 * time.Millisecond

func (c *h2Checked) Close() error {
	tc, ok := c.Conn.(*tls.Conn)
	if !ok {
		return c.Conn.Close()
	}
	// tls.Conn sets its own write deadline for the alert: closing the
	// socket underneath is what ends the write.
	t := time.AfterFunc(closeNotifyWait, func() { tc.NetConn().Close() })
	defer t.Stop()
	return tc.Close()
}

// checkFailed returns the error c, a connection of an h2pool's
// Transport, failed its check with, or its refused handshake's; nil
// otherwise.
func checkFailed(c net.Conn) error {
	var hc *h2Conn
	switch c := c.(type) {
	case *h2Conn:
		hc = c
	case h2TLSConn:
		hc = c.h2Conn
	default:
		return nil
	}
	if err := hc.checked().failed.Load(); err != nil {
		return *err
	}
	return nil
}

// negotiated is the RoundTripper of WireNegotiate to a TLS backend: h2
// when the endpoint picks it by ALPN, else HTTP/1.1 through h1Transport.
// A backend that declined h2 gets HTTP/1.1 directly for a while
// (SpeaksH1Only); the request that learns it is sent again over HTTP/1.1,
// which is safe, as nothing of it went out.
type negotiated struct{ b *Backend }

func (n negotiated) RoundTrip(req *http.Request) (*http.Response, error) {
	if n.b.SpeaksH1Only(time.Now()) {
		return h1Transport(n).RoundTrip(req)
	}
	out, held := req, (*heldBody)(nil)
	if req.Body != nil && req.Body != http.NoBody {
		// The Transport closes the body of a request it fails; one that
		// goes again over HTTP/1.1 must stay open.
		held = holdBody(req.Body)
		out = new(http.Request)
		*out = *req
		out.Body = held
	}
	resp, err := h2Transport{n.b.w, WireNegotiate}.RoundTrip(out)
	if errors.Is(err, errDeclinedH2) && held.Untouched() {
		// The endpoint was connected to for the request: not unsent.
		return h1Transport(n).roundTrip(req, true)
	}
	held.Release()
	return resp, err
}

// heldBody is a request body whose Close waits for Release, and which
// tells whether it was read: a request that failed before any of its body
// went out (h2 was declined) may go again with it, though the transport
// closed it.
type heldBody struct {
	r       io.ReadCloser
	mu      sync.Mutex
	read    bool
	holding bool // Close waits for Release
	closed  bool // Close was called while holding
}

// holdBody returns r held until Release.
func holdBody(r io.ReadCloser) *heldBody { return &heldBody{r: r, holding: true} }

func (h *heldBody) Read(p []byte) (int, error) {
	h.mu.Lock()
	h.read = true
	h.mu.Unlock()
	return h.r.Read(p)
}

func (h *heldBody) Close() error {
	h.mu.Lock()
	if h.holding {
		h.closed = true
		h.mu.Unlock()
		return nil
	}
	h.mu.Unlock()
	return h.r.Close()
}

// Untouched reports whether nothing read h; a nil h (no body) is untouched.
func (h *heldBody) Untouched() bool {
	if h == nil {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.read
}

// Release passes Close through from now on, and performs one that came
// while holding. A nil h does nothing.
func (h *heldBody) Release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.holding = false
	closed := h.closed
	h.mu.Unlock()
	if closed {
		h.r.Close()
	}
}
