package h2drain

import (
	"encoding/binary"
	"net"
	"sync"

	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// Reason is why a connection is asked to go away; it is the metric label
// and, in the frame's debug data, what a client's log shows.
type Reason string

const (
	// ReasonEndpointGone: the connection's endpoint is no longer handed
	// out (not ready, or gone from the EndpointSlice).
	ReasonEndpointGone Reason = "endpoint_gone"
	// ReasonRebalance: the backend gained endpoints, and this one holds
	// more than its share of the node's connections.
	ReasonRebalance Reason = "rebalance"
	// ReasonPreferredBack: the connection's endpoint is a fallback one
	// (another zone's or node's, snapshot.Endpoint.Fallback), and one the
	// backend prefers to it (its node's or zone's) takes connections again.
	ReasonPreferredBack Reason = "preferred_back"
	// ReasonPolicyChanged: the backend's protocol or TLS settings changed
	// and do not keep the connection's TLS (upstreamtls.Keeper.Keep),
	// or it now fails closed: the next connection gets the new ones.
	ReasonPolicyChanged Reason = "policy_changed"
	// ReasonExpired: the certificate chain the connection's TLS handshake
	// verified expired, so a new handshake would fail.
	ReasonExpired Reason = "expired"
	// ReasonShutdown: the proxy is shutting down.
	ReasonShutdown Reason = "shutdown"
)

// frame type and flag values of RFC 9113 §6.
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	framePriority     = 0x2
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePushPromise  = 0x5
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9
	flagAck           = 0x1
	flagEndHeaders    = 0x4
	frameHeaderLen    = 9
)

// goAwayFrame is a GOAWAY with the highest stream identifier, NO_ERROR
// and "sockmesh: <reason>" as debug data.
func goAwayFrame(why Reason) []byte {
	debug := "sockmesh: " + string(why)
	f := make([]byte, frameHeaderLen+8+len(debug))
	n := 8 + len(debug)
	f[0], f[1], f[2] = byte(n>>16), byte(n>>8), byte(n)
	f[3] = frameGoAway
	binary.BigEndian.PutUint32(f[9:], 1<<31-1) // last stream: any the client opened
	copy(f[17:], debug)                        // error code 0 (NO_ERROR) between
	return f
}

// frames follows the frames of a byte stream written in pieces.
type frames struct {
	hdr [frameHeaderLen]byte
	hn  int // bytes of hdr held
	// left is what remains of the current frame's payload.
	left int
	// inBlock is set while a header block waits for its CONTINUATION.
	inBlock bool
	// goAway is set once the backend's own GOAWAY went by.
	goAway bool
	// answered is set once a HEADERS frame went by: the app has opened a
	// stream. A GOAWAY before that, right after the backend's SETTINGS,
	// can reach a client that has not sent its first request yet, and
	// Go's fails it ("http2: client conn could not be established")
	// rather than sending it again on a new connection. Toward the
	// proxy's own client it is also set once that client opened a stream
	// (Upstream.streamOpened).
	answered bool
	// began is set once the backend's first frame began: a GOAWAY must
	// not come before its SETTINGS.
	began bool
}

// feed takes p, the next bytes of the stream, and returns the offset in p
// just after the last frame that ended outside a header block once the
// first HEADERS had gone by (-1 if none), where a GOAWAY may go: an end of
// frame before the first HEADERS in the same p is no such place.
func (f *frames) feed(p []byte) int {
	safe := -1
	for i := 0; i < len(p); {
		if f.left > 0 {
			n := min(f.left, len(p)-i)
			f.left -= n
			i += n
		} else {
			n := copy(f.hdr[f.hn:], p[i:])
			f.hn += n
			i += n
			if f.hn < frameHeaderLen {
				break
			}
			f.hn = 0
			f.began = true
			f.left = int(f.hdr[0])<<16 | int(f.hdr[1])<<8 | int(f.hdr[2])
			switch typ, flags := f.hdr[3], f.hdr[4]; typ {
			case frameHeaders, framePushPromise, frameContinuation:
				f.inBlock = flags&flagEndHeaders == 0
				f.answered = f.answered || typ == frameHeaders
			case frameGoAway:
				f.goAway = true
			}
		}
		if f.left == 0 && !f.inBlock && f.answered {
			safe = i
		}
	}
	return safe
}

// between reports whether a GOAWAY may go in now.
func (f *frames) between() bool {
	return f.hn == 0 && f.left == 0 && f.answered && f.began && !f.inBlock
}

// Conn is the app's side of a relayed HTTP/2 connection: the relay
// writes the backend's frames to it, and GoAway slips a GOAWAY in
// between two of them. Reads, closes and half-closes go to the connection
// underneath.
type Conn struct {
	net.Conn
	mu sync.Mutex
	fr frames
	// pending is the GOAWAY asked for and not yet written (nil: none),
	// and sent GoAway's, told once it is.
	pending []byte
	sent    func()
	asked   bool
}

// NewConn wraps c, an app's connection whose first bytes were an HTTP/2
// client preface.
func NewConn(c net.Conn) *Conn { return &Conn{Conn: c} }

// Write writes the backend's bytes p to the app, with a GOAWAY asked for
// at the last point in p where a frame may go.
func (c *Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.fr.feed(p)
		return c.Conn.Write(p)
	}
	// Asked for while a frame was coming (GoAway sends at once between
	// frames): it goes in at the last place p has for it.
	at := c.fr.feed(p)
	if c.fr.goAway {
		c.pending, c.sent = nil, nil // the backend's own comes: the client moves anyway
	}
	if at < 0 || c.pending == nil {
		return c.Conn.Write(p)
	}
	// Once per connection: one write of p with the frame inside.
	f, sent := c.pending, c.sent
	c.pending, c.sent = nil, nil
	b := make([]byte, 0, len(p)+len(f))
	b = append(append(append(b, p[:at]...), f...), p[at:]...)
	n, err := c.Conn.Write(b)
	if n >= at+len(f) && sent != nil {
		sent()
	}
	if n > at {
		n = max(at, n-len(f)) // of p's bytes
	}
	return n, err
}

// GoAway asks the app to open its next streams on a new connection, and
// reports whether it did: false when asked before, or when the backend
// sent its own GOAWAY. The frame goes out at once when the backend is
// between frames and has begun an answer, else in the next write where a
// frame ends (outside a header block) once one has begun. It may block
// while the app is not reading (as the relay's writes do), until the
// relay ends. sent, unless nil, is called (and must not block) once the
// frame is written whole to the app: never when the connection ended
// first — the relay closed it, or it closed before the backend's frame
// the GOAWAY waited for ended — nor when the backend's own GOAWAY came.
func (c *Conn) GoAway(why Reason, sent func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.asked || c.fr.goAway {
		return false
	}
	c.asked = true
	if !c.fr.between() {
		c.pending, c.sent = goAwayFrame(why), sent
		return true
	}
	// A failed write is the relay's to see.
	if _, err := c.Conn.Write(goAwayFrame(why)); err == nil && sent != nil {
		sent()
	}
	return true
}

// NetConn returns the connection underneath (half-close, reset).
func (c *Conn) NetConn() net.Conn { return c.Conn }

// ReadPooled is Read for a relay (sockio.Pooled), when the connection
// underneath is a sockio.PooledReader.
func (c *Conn) ReadPooled(bufs sockio.Buffers) (*[]byte, int, error) {
	return c.Conn.(sockio.PooledReader).ReadPooled(bufs)
}
