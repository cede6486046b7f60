package h2drain

import (
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// Upstream is net/http's side of an HTTP/2 connection the proxy dialed to
// a backend for its Transport: the Transport reads the backend's frames
// from it, and GoAway slips a GOAWAY in between two of them, which the
// Transport takes for the backend's. It then sends no new request over
// the connection, lets those under way finish, and closes it once the
// last ends (at once if none is): net/http has no other way to set one
// connection of its pool aside. Write lets the Transport's next opening
// HEADERS pass its SETTINGS ACK (settingsack.go).
type Upstream struct {
	net.Conn
	mu sync.Mutex
	fr frames
	// pending is the GOAWAY asked for and not yet read (nil: none).
	pending []byte
	asked   bool
	// out is what the Transport reads before more of the backend's
	// bytes: the GOAWAY, and those read past the place it went in.
	out []byte
	// woke is set while the read deadline GoAway set interrupts a read
	// that waits on a backend between frames.
	woke bool
	// wmu orders the Transport's writes and a held SETTINGS ACK's (sent).
	wmu  sync.Mutex
	sent outFrames
}

// NewUpstream wraps c, a connection to a backend that speaks HTTP/2.
func NewUpstream(c net.Conn) *Upstream { return &Upstream{Conn: c} }

// Read reads the backend's bytes, and slips a GOAWAY asked for in at the
// first read where a frame may go.
func (c *Upstream) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.out) > 0 {
		n := copy(p, c.out)
		c.out = c.out[n:]
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.woke {
		c.woke = false
		c.Conn.SetReadDeadline(time.Time{})
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = nil // GoAway's deadline: the Transport sets none
		}
	}
	at := -1
	if c.pending != nil && c.fr.between() {
		at = 0
	}
	if safe := c.fr.feed(p[:n]); at < 0 {
		at = safe
	}
	if c.fr.goAway {
		c.pending = nil // the backend's own came: the Transport moves anyway
	}
	if c.pending == nil || at < 0 {
		return n, err
	}
	c.out = append(c.pending, p[at:n]...)
	c.pending = nil
	m := copy(p[at:], c.out)
	c.out = c.out[m:]
	return at + m, err
}

// streamOpened lets a GOAWAY go in before the backend has begun an
// answer, once the Transport has opened a stream: one read before that
// fails the connection's first request (net/http's "client conn could not
// be established"), one read after sends its next requests elsewhere, and
// a connection whose first answers are slow to begin (a watch, a long
// poll) is set aside at once rather than when one begins. c.wmu is held.
func (c *Upstream) streamOpened() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fr.answered = true
	if c.pending != nil && c.fr.between() {
		c.woke = c.Conn.SetReadDeadline(time.Unix(1, 0)) == nil
	}
}

// GoAway asks the Transport to send its next requests over another
// connection, and reports whether it did: false when asked before, or
// when the backend sent its own GOAWAY. The frame goes in at once when
// the backend is between frames and has begun an answer (a read waiting
// on it is woken by a read deadline in the past), else where the next
// frame ends, outside a header block, once one has begun.
func (c *Upstream) GoAway(why Reason) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.asked || c.fr.goAway {
		return false
	}
	c.asked = true
	c.pending = goAwayFrame(why)
	if c.fr.between() {
		c.woke = c.Conn.SetReadDeadline(time.Unix(1, 0)) == nil
	}
	return true
}
