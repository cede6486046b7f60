package sniff

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// Kind is what the first bytes of a connection look like.
type Kind uint8

const (
	// Opaque: not recognised, or the client sent nothing in time (a
	// server-first protocol).
	Opaque Kind = iota
	// TLS: a TLS handshake record carrying a ClientHello.
	TLS
	// HTTP1: an HTTP/1.x request line (a method of RFC 9110 §9's, or a
	// whole line).
	HTTP1
	// HTTP2: the HTTP/2 prior-knowledge preface (RFC 9113 §3.4).
	HTTP2
)

func (k Kind) String() string {
	switch k {
	case TLS:
		return "tls"
	case HTTP1:
		return "http1"
	case HTTP2:
		return "http2"
	}
	return "opaque"
}

// HTTP2Preface is the magic that begins the client connection preface of
// RFC 9113 §3.4 (a SETTINGS frame follows).
const HTTP2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// methods are the request methods of RFC 9110 §9 plus PATCH (RFC 5789), each
// with the space that ends the token: known at once. Other methods (WebDAV's
// PROPFIND, QUERY) are judged by their whole request line (requestLine).
var methods = [...]string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "CONNECT ", "OPTIONS ", "TRACE ", "PATCH "}

// readSize is the most Sniff reads at once: an API client's request head
// fits (nginx's client_header_buffer_size is the same 1 KiB). It bounds
// how much Classify reads before deciding: the longest pattern is the
// request line of a method it does not know.
const readSize = 1 << 10

// readers hold what Sniff read until a Conn replayed it.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readSize) }}

// Classify decides what bytes b (the start of a stream) are, or reports more
// = true when b is a prefix of a pattern and more bytes would decide.
func Classify(b []byte) (k Kind, more bool) {
	if len(b) == 0 {
		return Opaque, true
	}
	// TLS record: content type 22 (handshake), version major 3, then after
	// the 5-byte record header the handshake type 1 (ClientHello); RFC 8446
	// §5.1 and §4.
	if b[0] == 0x16 {
		switch {
		case len(b) < 6:
			if len(b) >= 2 && b[1] != 0x03 {
				return Opaque, false
			}
			return Opaque, true
		case b[1] == 0x03 && b[5] == 0x01:
			return TLS, false
		}
		return Opaque, false
	}
	if isPrefixEither(b, HTTP2Preface) {
		if len(b) >= len(HTTP2Preface) {
			return HTTP2, false
		}
		return Opaque, true
	}
	for _, m := range methods {
		if isPrefixEither(b, m) {
			if len(b) >= len(m) {
				return HTTP1, false
			}
			more = true
		}
	}
	if more {
		return Opaque, true
	}
	return requestLine(b)
}

// requestLine classifies b as an HTTP/1.x request by its first line,
// "method SP target SP HTTP/1.x" (RFC 9112 §3), for a method that is not
// one of methods: HTTP allows others, and such a request taken for opaque
// bytes was relayed past everything the L7 paths apply (routes, session
// persistence, a translation to h2c). Its method is taken as the IANA
// registry spells them all (WebDAV's PROPFIND, QUERY), in capitals and
// dashes, at most maxMethod long, so that the short lowercase greetings
// of other protocols are judged at once, not when the line or the
// timeout comes. A line yet to end is judged as far as it goes: bytes no
// request line holds there (Redis' "SET k v", a control byte) decide at
// once, and only a prefix of a request line waits for more.
func requestLine(b []byte) (Kind, bool) {
	// Sniff reads no more: a longer line is judged by its first readSize
	// bytes, whole or in pieces alike.
	b = b[:min(len(b), readSize)]
	i := 0
	for i < len(b) && i <= maxMethod && ('A' <= b[i] && b[i] <= 'Z' || b[i] == '-') {
		i++
	}
	switch {
	case i == 0, i > maxMethod, i < len(b) && b[i] != ' ':
		return Opaque, false
	case i == len(b):
		return Opaque, true
	}
	line := b[i+1:]
	end := bytes.IndexByte(line, '\n')
	if end >= 0 {
		line = bytes.TrimSuffix(line[:end], []byte("\r"))
	}
	target, proto, spaced := bytes.Cut(line, []byte(" "))
	for _, c := range target {
		if c <= ' ' || c == 0x7f {
			return Opaque, false
		}
	}
	if end >= 0 {
		if len(target) == 0 || (string(proto) != "HTTP/1.1" && string(proto) != "HTTP/1.0") {
			return Opaque, false
		}
		return HTTP1, false
	}
	if spaced && (len(target) == 0 || !isPrefixOf(proto, "HTTP/1.1\r") && !isPrefixOf(proto, "HTTP/1.0\r")) {
		return Opaque, false
	}
	return Opaque, len(b) < readSize
}

// isPrefixOf reports whether b is a prefix of p.
func isPrefixOf(b []byte, p string) bool {
	return len(b) <= len(p) && string(b) == p[:len(b)]
}

// maxMethod bounds the method requestLine takes: the longest registered,
// UPDATEREDIRECTREF, has 17 bytes.
const maxMethod = 20

// isPrefixEither reports whether one of b and p is a prefix of the other.
func isPrefixEither(b []byte, p string) bool {
	n := min(len(b), len(p))
	return string(b[:n]) == p[:n]
}

// Conn is a connection whose peeked bytes are replayed by Read.
type Conn struct {
	net.Conn
	r *bufio.Reader
}

// NetConn returns the connection underneath, as crypto/tls's Conn does.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// ReadPooled is Read for a connection underneath that is a
// sockio.PooledReader: the replay first, then its ReadPooled.
func (c *Conn) ReadPooled(bufs sockio.Buffers) (*[]byte, int, error) {
	if c.r == nil {
		return c.Conn.(sockio.PooledReader).ReadPooled(bufs)
	}
	bp, n, err := sockio.ReadInto(c.r, bufs)
	c.dropDrained()
	return bp, n, err
}

// Read reads the peeked bytes first, then from the connection.
func (c *Conn) Read(p []byte) (int, error) {
	if c.r == nil {
		return c.Conn.Read(p)
	}
	n, err := c.r.Read(p)
	c.dropDrained()
	return n, err
}

// Peek returns the next n bytes (at most 1 KiB) without consuming them:
// Read replays them. It reads from the connection as needed, under its
// read deadline.
func (c *Conn) Peek(n int) ([]byte, error) {
	if c.r == nil {
		c.r = readers.Get().(*bufio.Reader)
		c.r.Reset(c.Conn)
	}
	b, err := c.r.Peek(n)
	if err != nil {
		c.dropDrained()
	}
	return b, err
}

// dropDrained gives the replay's reader back once it is drained: later
// reads go straight to the socket without a copy, and a connection that
// reads nothing more (one request) still returns it.
func (c *Conn) dropDrained() {
	if c.r.Buffered() == 0 {
		c.r.Reset(nil)
		readers.Put(c.r)
		c.r = nil
	}
}

// Now is the timeout of a Sniff that never waits: for a caller that relays
// the bytes the same whatever they are, and only labels them.
const Now time.Duration = -1

// Sniff reads from c until Classify decides or timeout passes without a
// decision, and returns the kind with a Conn replaying the bytes read. A
// timeout, or end of stream, yields Opaque (an end before any byte may be
// a half-close: an app that waits for its server to speak, or only listens
// to it); a reset is an error. timeout 0 means no limit; timeout Now
// judges only the bytes that already arrived, undecided ones as Opaque.
//
// Most clients have sent their first bytes by the time the proxy takes
// their connection. On a sockio.Conn, reads first take what is there
// without waiting, and the deadline, two timer updates, is set only when
// one would wait.
func Sniff(c net.Conn, timeout time.Duration) (Kind, *Conn, error) {
	var now *sockio.Conn // reads do not wait while set
	armed := false       // the deadline is set
	arm := func() error {
		if now != nil {
			now.NoWait(false)
			now = nil
		}
		armed = true
		if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			return fmt.Errorf("sniff: set deadline: %w", err)
		}
		return nil
	}
	if timeout != 0 {
		if now = sockio.Of(c); now != nil {
			now.NoWait(true)
			defer func() {
				if now != nil {
					now.NoWait(false)
				}
			}()
		} else if timeout == Now {
			return Opaque, &Conn{Conn: c}, nil // cannot read without waiting
		} else if err := arm(); err != nil {
			return Opaque, nil, err
		}
	}
	// The first read takes whatever the client sent, up to readSize: a
	// typical request in one system call instead of two.
	r := readers.Get().(*bufio.Reader)
	r.Reset(c)
	var kind Kind
	for {
		// Wait for at least one more byte, then judge all that arrived.
		_, err := r.Peek(r.Buffered() + 1)
		if now != nil && errors.Is(err, sockio.ErrWouldBlock) {
			if timeout == Now {
				kind = Opaque
				break
			}
			if err := arm(); err != nil {
				return Opaque, nil, err
			}
			continue
		}
		b, _ := r.Peek(r.Buffered())
		k, more := Classify(b)
		if !more || len(b) >= readSize {
			kind = k
			break
		}
		if err != nil {
			// Nothing decisive in time (a server-first protocol, a slow
			// client) or a short stream, maybe empty: opaque bytes. Any
			// other error (a reset) is the connection's: the socket
			// reports it once and ends cleanly after, so the bytes would
			// be relayed with a clean end, as if complete.
			if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, io.EOF) {
				return Opaque, nil, fmt.Errorf("sniff: %w", err)
			}
			kind = Opaque
			break
		}
	}
	if armed {
		if err := c.SetReadDeadline(time.Time{}); err != nil {
			return Opaque, nil, fmt.Errorf("sniff: clear deadline: %w", err)
		}
	}
	sc := &Conn{Conn: c, r: r}
	// A silent client's reader replays nothing: given back now, so that
	// its reads are the socket's own (a relay's ReadPooled holds no buffer
	// while the client stays silent).
	sc.dropDrained()
	return kind, sc, nil
}
