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
// allows either code); nghttp2's ends the whole connection then. Only one
// stream can be so caught: the client writes one new stream's HEADERS at
// a time, and the stream that took its slot before the SETTINGS was
// applied is the next to open one.
//
// So the ACK waits for the next header block that opens a stream and goes
// right after it, and frames the settings cannot govern may pass it
// meanwhile, as the other streams' work goes on: header blocks, trailers
// too; WINDOW_UPDATE, RST_STREAM, PING, PRIORITY and GOAWAY; and DATA
// while the connection's first ACK waits and its DATA, counted from its
// start, stays within 65,535 bytes, each stream's and the connection's
// initial window. A server may apply its settings only once acknowledged
// (nghttp2 does): what passes the ACK keeps to their initial values, and
// the Transport, which applied them before it wrote its ACK, keeps to them
// as well. Any other frame sends the ACK first: DATA past that, a frame
// larger than the initial 16,384-byte maximum, another SETTINGS, one it
// cannot see whole. So does ackHold passing: at once between frames, or
// at the end of the frame it passed in. A header block depends on no
// setting but the header table's size, which Go's encoder never raises
// past the initial 4,096 bytes, and a smaller size is within the old
// limit and the new.

// ackHold bounds how long an ACK waits with nothing written after it.
var ackHold = 10 * time.Millisecond // a var for tests

// clientPrefaceLen is the length of the client's connection preface, the
// bytes before its first frame (RFC 9113 §3.4).
const clientPrefaceLen = 24

// initialMaxFrameSize is SETTINGS_MAX_FRAME_SIZE's initial value: a larger
// frame needs the backend's settings applied.
const initialMaxFrameSize = 1 << 14

// initialWindowSize is the flow-control windows' initial size: DATA past
// it may need the backend's settings applied.
const initialWindowSize = 1<<16 - 1

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
	data           int    // DATA bytes written, until the first ACK goes
	acked          bool   // an ACK went
	held           bool   // an ACK is held back
	due            bool   // ackHold passed inside a frame: the ACK goes at its end
	timer          *time.Timer
}

// release notes that the held ACK goes.
func (o *outFrames) release() {
	o.held, o.due, o.acked = false, false, true
	o.timer.Stop()
}

// mayPass reports whether the frame whose header was just read may go
// ahead of a held ACK.
func (o *outFrames) mayPass(typ byte) bool {
	if o.left > initialMaxFrameSize {
		return false
	}
	switch typ {
	case frameData:
		return !o.acked && o.data <= initialWindowSize
	case frameHeaders, frameWindowUpdate, frameRSTStream, framePing, framePriority, frameGoAway:
		return true
	}
	return false
}

// edit returns p with a SETTINGS ACK that comes whole in it (net/http
// writes and flushes its ACK alone) taken out and held, and a held ACK put
// back in where the ACK's rules say; edited is false, and out nil, when it
// changes nothing. release is what the hold's timer calls.
func (o *outFrames) edit(p []byte, release func()) (out []byte, edited bool) {
	from := 0 // p[from:] is not in out yet
	putBack := func(at int) {
		out, from, edited = append(append(out, p[from:at]...), settingsAck...), at, true
		o.release()
	}
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
			at, begins, inBlock := i, o.hn == 0, o.inBlock
			n := copy(o.hdr[o.hn:], p[i:])
			o.hn += n
			i += n
			if o.hn < frameHeaderLen {
				if o.held && begins && !inBlock {
					putBack(at) // a frame it cannot see whole yet
				}
				continue
			}
			o.hn = 0
			o.left = int(o.hdr[0])<<16 | int(o.hdr[1])<<8 | int(o.hdr[2])
			typ, flags := o.hdr[3], o.hdr[4]
			switch typ {
			case frameSettings:
				if flags&flagAck != 0 && o.left == 0 && begins {
					if o.held { // the one before goes first
						putBack(at)
					}
					out, from, edited = append(out, p[from:at]...), i, true
					o.held = true
					o.timer = time.AfterFunc(ackHold, release)
					continue
				}
				o.acked = o.acked || flags&flagAck != 0
			case frameData:
				o.data += o.left
			case frameHeaders:
				id := binary.BigEndian.Uint32(o.hdr[5:]) &^ (1 << 31)
				o.opens = id > o.lastID
				o.lastID = max(o.lastID, id)
				o.inBlock = flags&flagEndHeaders == 0
			case frameContinuation:
				o.inBlock = flags&flagEndHeaders == 0
			}
			if o.held && begins && !inBlock && (o.due || !o.mayPass(typ)) {
				putBack(at)
			}
		}
		if o.left == 0 && o.hn == 0 && !o.inBlock {
			if o.held && (o.opens || o.due) {
				putBack(i)
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

// Write writes the Transport's bytes to the backend, with its SETTINGS
// ACK held back as outFrames says, and notes its first stream's opening
// (streamOpened).
func (c *Upstream) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	opened := c.sent.lastID != 0
	out, edited := c.sent.edit(p, c.ackHoldEnded)
	n, err := len(p), error(nil)
	if !edited {
		n, err = c.Conn.Write(p)
	} else if _, err = c.Conn.Write(out); err != nil {
		n = 0
	}
	if !opened && c.sent.lastID != 0 {
		c.streamOpened()
	}
	return n, err
}

// ackHoldEnded sends a held ACK once ackHold has passed: at once between
// frames, else at the end of the frame (edit).
func (c *Upstream) ackHoldEnded() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	switch {
	case !c.sent.held:
	case !c.sent.between():
		c.sent.due = true
	default:
		c.sent.release()
		c.Conn.Write(settingsAck) // a failed write fails the Transport's next
	}
}
