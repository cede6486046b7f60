package httpproxy

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
)

// Plain answer heads. Most answers a backend sends are HTTP/1.1 with a
// body whose length one Content-Length gives, and fields that net/http's
// parser would take as they are. When the proxy has nothing to read in
// those fields (no route filters, no session to set), such a head is
// checked where it lies in the upstream connection's buffer and passed to
// the client as received, less its hop-by-hop lines: no http.Header is
// built and none written again. Against http.ReadResponse and writeHeader
// that is a sixth of the proxy's CPU per small answer (test/bench/proxy,
// keep-alive 100 B from nginx). Everything else — another version, a
// status without a body, Transfer-Encoding, a field net/http would
// rewrite or refuse, a head not yet whole in the buffer — goes through
// http.ReadResponse as before. FuzzPlainHead checks that a head
// scanPlainHead takes is read alike by net/http, and forwarded with the
// same fields.

// plainHead is an answer head scanPlainHead took.
type plainHead struct {
	n      int    // its length, through the empty line that ends it
	drop   uint64 // lines not to forward (bit i: line i; 0 is the status line)
	status int
	length int64 // the Content-Length
	close  bool  // Connection: close
}

// maxPlainLines bounds the lines of a plain head: drop has a bit for each.
const maxPlainLines = 64

// scanPlainHead reports whether b starts with a plain answer head, and
// which. It takes only what it is sure net/http reads the same way:
// "HTTP/1.1", a 3-digit status from 200 to 599 but 204 and 304, lines
// ending in CRLF with token names and value bytes textproto accepts, one
// Content-Length of digits, Connection with close and keep-alive only; no
// Transfer-Encoding, TE, Pragma (net/http adds a Cache-Control for it) or
// a field named Close (which Connection: close would remove), no line
// folded. The caller makes sure the request was not HEAD.
func scanPlainHead(b []byte) (h plainHead, ok bool) {
	// Line by line to the empty one. A line must end in CRLF and keep no
	// CR or LF (the checks of its bytes see to it), so none ends where
	// textproto, which also takes a bare LF, would end it.
	line, rest, ok := cutLine(b)
	if !ok {
		return h, false
	}
	if h.status, ok = plainStatus(line); !ok {
		return h, false
	}
	h.length = -1
	for i := 1; ; i++ {
		if line, rest, ok = cutLine(rest); !ok || i == maxPlainLines {
			return h, false
		}
		if len(line) == 0 {
			h.n = len(b) - len(rest)
			return h, h.length >= 0
		}
		name, value, found := bytes.Cut(line, colon)
		if !found || !validFieldName(name) || !validFieldValue(value) {
			return h, false // also a folded line: it starts with a space
		}
		switch {
		case equalFold(name, contentLength):
			if h.length >= 0 {
				return h, false
			}
			if h.length, ok = plainLength(value); !ok {
				return h, false
			}
		case equalFold(name, connection):
			if !plainConnection(value, &h.close) {
				return h, false
			}
			h.drop |= 1 << i
		case oneOf(name, unplain):
			return h, false
		case oneOf(name, dropped):
			h.drop |= 1 << i
		}
	}
}

// cutLine cuts b's first line, which must end in CRLF, off the rest.
func cutLine(b []byte) (line, rest []byte, ok bool) {
	i := bytes.IndexByte(b, '\n')
	if i < 1 || b[i-1] != '\r' {
		return nil, nil, false
	}
	return b[:i-1], b[i+1:], true
}

// equalFold is bytes.EqualFold that first compares the lengths.
func equalFold(a, b []byte) bool { return len(a) == len(b) && bytes.EqualFold(a, b) }

var (
	colon         = []byte(":")
	connection    = []byte("Connection")
	contentLength = []byte("Content-Length")
	// unplain are the fields that make a head not plain; dropped the
	// hop-by-hop ones removeHopByHop removes but Connection.
	unplain = [][]byte{[]byte("Transfer-Encoding"), []byte("TE"), []byte("Pragma"), []byte("Close")}
	dropped = [][]byte{[]byte("Proxy-Connection"), []byte("Keep-Alive"), []byte("Upgrade"), []byte("Trailer")}
)

func oneOf(name []byte, names [][]byte) bool {
	for _, k := range names {
		if equalFold(name, k) {
			return true
		}
	}
	return false
}

// plainStatus reads a status line "HTTP/1.1 200 OK" (the reason may be
// empty or missing) whose status has a body.
func plainStatus(line []byte) (int, bool) {
	const prefix = "HTTP/1.1 "
	if len(line) < len(prefix)+3 || string(line[:len(prefix)]) != prefix || !validFieldValue(line) {
		return 0, false
	}
	code := 0
	for _, c := range line[len(prefix) : len(prefix)+3] {
		if c < '0' || c > '9' {
			return 0, false
		}
		code = code*10 + int(c-'0')
	}
	if len(line) > len(prefix)+3 && line[len(prefix)+3] != ' ' {
		return 0, false
	}
	if code < http.StatusOK || code > 599 || code == http.StatusNoContent || code == http.StatusNotModified {
		return 0, false
	}
	return code, true
}

// plainLength reads a Content-Length: digits between optional spaces and
// tabs, few enough not to overflow.
func plainLength(v []byte) (int64, bool) {
	v = bytes.Trim(v, " \t")
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// plainConnection reads a Connection value that lists only close and
// keep-alive, and sets *close when it lists close. Other options name
// fields to remove, which net/http's path does.
func plainConnection(v []byte, close *bool) bool {
	for len(v) > 0 {
		var opt []byte
		opt, v, _ = bytes.Cut(v, []byte(","))
		switch opt = bytes.Trim(opt, " \t"); {
		case len(opt) == 0, bytes.EqualFold(opt, []byte("keep-alive")):
		case bytes.EqualFold(opt, []byte("close")):
			*close = true
		default:
			return false
		}
	}
	return true
}

// validFieldName reports a non-empty token (RFC 9110 §5.1).
func validFieldName(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tokenByte[c] {
			return false
		}
	}
	return true
}

// validFieldValue reports bytes textproto accepts in a field value:
// visible ASCII, space, tab and obs-text; no other control, so no CR or LF.
func validFieldValue(b []byte) bool {
	for _, c := range b {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// tokenByte marks the bytes of a token (RFC 9110 §5.6.2).
var tokenByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// write writes the head's lines but those it drops, each with its CRLF,
// and not the empty line that ends it.
func (h *plainHead) write(w *bufio.Writer, head []byte) {
	head = head[:h.n-2]
	for i := 0; len(head) > 0; i++ {
		line := head[:bytes.IndexByte(head, '\n')+1]
		head = head[len(line):]
		if h.drop&(1<<i) == 0 {
			w.Write(line)
		}
	}
}

// plainAnswer is the answer of a plain head, an h1Conn's, reused: resp
// has no Header (the fields stay in the upstream connection's buffer until
// writeHead), and body reads the sized body after the head.
type plainAnswer struct {
	head plainHead
	resp http.Response
	body sizedBody
}

// readAnswer reads an answer's head: as a plain one when plain allows
// (the proxy reads none of its fields) and it is, else with
// http.ReadResponse. A plain answer's resp is &s.plain.resp.
func (s *h1Conn) readAnswer(r *bufio.Reader, req *http.Request, plain bool) (*http.Response, error) {
	if plain && req.Method != http.MethodHead {
		b, _ := r.Peek(r.Buffered())
		if h, ok := scanPlainHead(b); ok {
			p := &s.plain
			p.head = h
			p.body = sizedBody{r: r, n: h.length}
			p.resp = http.Response{
				Status: "", StatusCode: h.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				ContentLength: h.length, Close: h.close, Body: &p.body, Request: req,
			}
			return &p.resp, nil
		}
	}
	return http.ReadResponse(r, req)
}

// writeHead writes the head to w, without its hop-by-hop lines and the
// empty line that ends it, and drops it from r, where it still lies.
func (p *plainAnswer) writeHead(w *bufio.Writer, r *bufio.Reader) {
	head, _ := r.Peek(p.head.n)
	p.head.write(w, head)
	r.Discard(p.head.n)
}

// sizedBody reads the n bytes of a plain answer's body; an end before
// them is io.ErrUnexpectedEOF, and io.EOF comes with the last of them, as
// from net/http's body.
type sizedBody struct {
	r *bufio.Reader
	n int64
}

func (b *sizedBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	switch {
	case err == io.EOF:
		err = io.ErrUnexpectedEOF
	case err == nil && b.n == 0:
		err = io.EOF
	}
	return n, err
}

func (b *sizedBody) Close() error { return nil }
