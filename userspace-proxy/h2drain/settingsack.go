package h2drain

import (
	"encoding/binary"
	"time"
)

// The Transport's SETTINGS ACK, held back. net/http's HTTP/2 client takes
// a new stream's slot under the connection's stream limit, then writes
// its HEADERS; a backend's SETTINGS that lowers the limit (below the 100
// the client assumes until the first SETTINGS comes) can be applied and
// acknowledged in between. Go's server then counts that stream over its
// limit after its SETTINGS were acknowledged and resets it with
// PROTOCOL_ERROR, which no client may send again (the request could have
// been processed, for all the code says), where before the ACK it resets
// it with REFUSED_STREAM, which the proxy sends again (RFC 9113 §5.1.2
// allows either code). Only one stream can be so caught: the client
// writes one new stream's HEADERS at a time, and the stream that took its
// slot before the SETTINGS was applied is the next to open one. So an ACK
// goes after the next header block that opens a stream, or, when none
// does, once ackHold has passed, at the next place between two frames:
// the backend learns of its settings' acknowledgement microseconds later
// when a stream was caught, ackHold later at most when none was.

// ackHold bounds how long an ACK waits for the next stream to open.
var ackHold = 10 * time.Millisecond // a var for tests

// clientPrefaceLen is the length of the client's connection preface, the
// bytes before its first frame (RFC 9113 §3.4).
const clientPrefaceLen = 24

// settingsAck is a SETTINGS frame with the ACK flag.
var settingsAck = []byte{3: frameSettings, 4: flagAck, 8: 0}

// outFrames follows the Transport's frames to the backend for Write and
// holds a SETTINGS ACK back.
type outFrames struct {
	passed int // bytes of the client preface passed
	hdr    [frameHeaderLen]byte
	hn     int // bytes of hdr held
	left   int // what remains of the current frame's payload
	// inBlock is set while a header block waits for its CONTINUATION,
	// opens when that block opens a stream.
	inBlock, opens bool
	lastID         uint32 // the highest stream identifier opened
	// held is set while an ACK is held back, due once ackHold passed.
	held, due bool
	timer     *time.Timer
}

// edit returns p with a SETTINGS ACK that comes whole in it (net/http
// writes and flushes its ACK alone) taken out and held, and a held ACK put back in after the header block that opens the
// next stream, or where a frame may go once the hold ran out; edited is
// false, and out nil, when it changes nothing. release is what the hold's
// timer calls.
func (o *outFrames) edit(p []byte, release func()) (out []byte, edited bool) {
	from := 0 // p[from:] is not in out yet
	for i := 0; i < len(p); {
		switch {
		case o.passed < clientPrefaceLen:
			n := min(clientPrefaceLen-o.passed, len(p)-i)
			o.passed += n
			i += n
			continue
		case o.left > 0:
			n := min(o.left, len(p)-i)
			o.left -= n
			i += n
		default:
			at := i
			n := copy(o.hdr[o.hn:], p[i:])
			whole := o.hn == 0 && n == frameHeaderLen
			o.hn += n
			i += n
			if o.hn < frameHeaderLen {
				continue
			}
			o.hn = 0
			o.left = int(o.hdr[0])<<16 | int(o.hdr[1])<<8 | int(o.hdr[2])
			switch typ, flags := o.hdr[3], o.hdr[4]; typ {
			case frameSettings:
				if flags&flagAck != 0 && o.left == 0 && whole && !o.held {
					out, from, edited = append(out, p[from:at]...), i, true
					o.held = true
					o.timer = time.AfterFunc(ackHold, release)
					continue
				}
			case frameHeaders:
				id := binary.BigEndian.Uint32(o.hdr[5:]) &^ (1 << 31)
				o.opens = id > o.lastID
				o.lastID = max(o.lastID, id)
				o.inBlock = flags&flagEndHeaders == 0
			case frameContinuation:
				o.inBlock = flags&flagEndHeaders == 0
			}
		}
		if o.left == 0 && o.hn == 0 && !o.inBlock {
			if o.held && (o.opens || o.due) {
				out, from, edited = append(append(out, p[from:i]...), settingsAck...), i, true
				o.putBack()
			}
			o.opens = false
		}
	}
	if !edited {
		return nil, false
	}
	return append(out, p[from:]...), true
}

// between reports whether a frame may go in now.
func (o *outFrames) between() bool {
	return o.passed == clientPrefaceLen && o.hn == 0 && o.left == 0 && !o.inBlock
}

// putBack marks the held ACK sent.
func (o *outFrames) putBack() {
	o.held, o.due = false, false
	o.timer.Stop()
}

// Write writes the Transport's bytes to the backend, with its SETTINGS
// ACK held back as outFrames says.
func (c *Upstream) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	out, edited := c.sent.edit(p, c.ackHoldEnded)
	if !edited {
		return c.Conn.Write(p)
	}
	if _, err := c.Conn.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// ackHoldEnded sends a held ACK when no stream opened within ackHold: now
// if the Transport is between frames, else with its next write.
func (c *Upstream) ackHoldEnded() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.sent.held {
		return
	}
	if !c.sent.between() {
		c.sent.due = true
		return
	}
	c.sent.putBack()
	c.Conn.Write(settingsAck) // a failed write fails the Transport's next
}
