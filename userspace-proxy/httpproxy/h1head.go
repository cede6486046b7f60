package httpproxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// Plain heads. Most requests an app sends through the proxy are GETs
// without a body, and most answers a backend sends are HTTP/1.1 with a
// body whose length one Content-Length gives; their fields are ones
// net/http's parser would take as they are. When the proxy has nothing to
// read in those fields (no routes, no session persistence, an HTTP/1.1
// backend), such a head is checked where it lies in the connection's
// buffer and passed on as received, less its hop-by-hop lines: no
// http.Header is built and none written again. An MCP backend's heads
// are plain too: the one field the proxy rewrites, Mcp-Session-Id, is
// found among the lines (cutMCPSession, appendMCPKept). Against
// http.ReadResponse and writeHeader that was a sixth of the proxy's CPU
// per small answer (test/bench/proxy, keep-alive 100 B from nginx);
// against http.ReadRequest a tenth. A request's body one Content-Length gives is
// read by a sizedBody and written after the head as it came. Everything
// else — another version or method, a status without a body, a chunked
// body, Transfer-Encoding, Expect, a field net/http would rewrite or
// refuse, a head not yet whole in the buffer — goes through net/http's
// parser as before. FuzzPlainAnswer and FuzzPlainRequest check that a head
// taken as plain is read alike by net/http (a body too), and forwarded with
// the same fields.

// plainHead is a head scanPlainAnswer or scanPlainRequest took.
type plainHead struct {
	n      int    // its length, through the empty line that ends it
	drop   uint64 // lines not to forward (bit i: line i; 0 is the start line)
	close  bool   // Connection: close
	length int64  // the Content-Length; -1 for none
	// An answer's:
	status int
	date   bool // it has a Date field
	// A request's:
	method       string
	target, host []byte
	hasHost      bool
	mcp          bool // an Mcp-Session-Id field, for cutMCPSession
}

// maxPlainLines bounds the lines of a plain head: drop has a bit for each.
const maxPlainLines = 64

// scanPlainAnswer reports whether b starts with a plain answer head, and
// which. It takes only what it is sure net/http reads the same way:
// "HTTP/1.1", a 3-digit status from 200 to 599 but 204, 304 and 426, plain
// fields (scanFields) with one Content-Length of digits. The caller makes
// sure the request was not HEAD.
func scanPlainAnswer(b []byte) (h plainHead, ok bool) {
	line, rest, ok := cutLine(b)
	if !ok {
		return h, false
	}
	if h.status, ok = plainStatus(line); !ok {
		return h, false
	}
	h.length = -1
	return h, h.scanFields(b, rest, false) && h.length >= 0
}

// scanPlainRequest reports whether b starts with a plain request head,
// and which: a target in origin form (an absolute-form one names the
// authority, which Host may not override: RFC 9112 §3.2.2, as
// ReadRequest reads it — TestAbsoluteFormAuthority), "HTTP/1.1", plain fields
// (scanFields) with at most one Host and no Expect; "GET" or "HEAD" with
// no Content-Length, or another of plainMethods with one Content-Length
// of digits. The target is checked further by url.ParseRequestURI, as
// net/http does.
func scanPlainRequest(b []byte) (h plainHead, ok bool) {
	line, rest, ok := cutLine(b)
	if !ok || !h.requestLine(line) {
		return h, false
	}
	h.length = -1
	if !h.scanFields(b, rest, true) {
		return h, false
	}
	if h.method != http.MethodGet && h.method != http.MethodHead {
		return h, h.length >= 0
	}
	return h, true
}

// scanFields reads the field lines in rest, which follows b's start line,
// to the empty line, and sets h.n. Each line must end in CRLF and keep no
// CR or LF (the checks of its bytes see to it), so none ends where
// textproto, which also takes a bare LF, would end it; it must have a
// token name and value bytes textproto accepts, and no line may be folded.
// Connection may list close and keep-alive only: other options name
// fields to remove, which net/http's path does. requestField or
// answerField classes the others: a line to drop, or one that makes the
// head not plain.
func (h *plainHead) scanFields(b, rest []byte, request bool) bool {
	for i := 1; ; i++ {
		line, next, ok := cutLine(rest)
		if !ok || i == maxPlainLines {
			return false
		}
		rest = next
		if len(line) == 0 {
			h.n = len(b) - len(rest)
			return true
		}
		name, value, found := bytes.Cut(line, colon)
		if !found || !validFieldName(name) || !validFieldValue(value) {
			return false // also a folded line: it starts with a space
		}
		drop := true
		switch {
		case equalFold(name, connection):
			ok = plainConnection(value, &h.close)
		case oneOf(name, unplain):
			ok = false
		case request:
			drop, ok = requestField(h, name, value)
		default:
			drop, ok = answerField(h, name, value)
		}
		if !ok {
			return false
		}
		if drop {
			h.drop |= 1 << i
		}
	}
}

// answerField classes an answer's field for scanFields, and notes a Date
// (answer adds one to an answer without).
func answerField(h *plainHead, name, value []byte) (drop, ok bool) {
	switch {
	case equalFold(name, contentLength):
		if h.length >= 0 {
			return false, false
		}
		h.length, ok = plainLength(value)
		return false, ok
	case equalFold(name, date):
		h.date = true
		return false, true
	}
	return oneOf(name, dropped), true
}

// requestField classes a request's field for scanFields. Host is dropped:
// writeHead writes it. Content-Length is kept, and read into h.length.
// An MCP session ID is noted, so that only requests with one are searched
// for it.
func requestField(h *plainHead, name, value []byte) (drop, ok bool) {
	switch {
	case equalFold(name, mcpSessionID):
		h.mcp = true
		return false, true
	case equalFold(name, host):
		if h.hasHost {
			return false, false
		}
		h.hasHost, h.host = true, bytes.Trim(value, " \t")
		return true, true
	case equalFold(name, contentLength):
		if h.length >= 0 || h.method == http.MethodGet || h.method == http.MethodHead {
			return false, false
		}
		h.length, ok = plainLength(value)
		return false, ok
	case equalFold(name, expect):
		return false, false
	}
	return oneOf(name, dropped), true
}

// requestLine reads a plain request line into h.
func (h *plainHead) requestLine(line []byte) bool {
	method, rest, ok1 := bytes.Cut(line, sp)
	target, proto, ok2 := bytes.Cut(rest, sp)
	if !ok1 || !ok2 || string(proto) != "HTTP/1.1" || len(target) == 0 || target[0] != '/' || !validFieldValue(target) {
		return false
	}
	for _, m := range plainMethods {
		if string(method) == m {
			h.method, h.target = m, target
			return true
		}
	}
	return false
}

// plainMethods are the methods a plain request may have: GET and HEAD
// without a body, the others with one Content-Length. Not OPTIONS, whose
// Max-Forwards the proxy reads (lastHop), nor TRACE.
var plainMethods = [...]string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete}

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
	sp            = []byte(" ")
	connection    = []byte("Connection")
	contentLength = []byte("Content-Length")
	host          = []byte("Host")
	date          = []byte("Date")
	mcpSessionID  = []byte("Mcp-Session-Id")
	expect        = []byte("Expect")
	// unplain are the fields that make any head not plain: Pragma, as
	// net/http adds a Cache-Control for it; Close, as Connection: close
	// would remove it. dropped are the hop-by-hop ones removeHopByHop
	// removes, but Connection.
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
// empty or missing) whose status has a body, but 426.
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
	if code < http.StatusOK || code > 599 || code == http.StatusNoContent || code == http.StatusNotModified ||
		code == http.StatusUpgradeRequired { // keeps its Upgrade (upgradeRequired), which plain heads drop
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

// validFieldName reports a non-empty token (RFC 9110 §5.1): what
// httpguts.ValidHeaderFieldName checks, on bytes, without converting each
// name to a string (an allocation per field).
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

// validFieldValue reports bytes textproto accepts in a field value (as
// httpguts.ValidHeaderFieldValue, on bytes):
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

// appendKept appends the head's lines from line first on but those it
// drops, each with its CRLF, and not the empty line that ends it.
func (h *plainHead) appendKept(dst, head []byte, first int) []byte {
	head = head[:h.n-2]
	for i := 0; len(head) > 0; i++ {
		line := head[:bytes.IndexByte(head, '\n')+1]
		head = head[len(line):]
		if i >= first && h.drop&(1<<i) == 0 {
			dst = append(dst, line...)
		}
	}
	return dst
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
// (the proxy reads none of its fields but an MCP session ID) and it is,
// else with http.ReadResponse. A plain answer's resp is &s.plain.resp.
func (s *h1Conn) readAnswer(r *bufio.Reader, req *http.Request, plain bool) (*http.Response, error) {
	if plain && req.Method != http.MethodHead {
		b, _ := r.Peek(r.Buffered())
		if h, ok := scanPlainAnswer(b); ok {
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
// empty line that ends it, and drops it from r, where it still lies; an
// MCP backend's with its session ID prefixed for c's endpoint
// (appendMCPKept).
func (p *plainAnswer) writeHead(w *bufio.Writer, r *bufio.Reader, be *upstream.Backend, c *balance.Choice) {
	head, _ := r.Peek(p.head.n)
	if be.Spec.Protocol == snapshot.ProtocolMCP {
		w.Write(p.head.appendMCPKept(w.AvailableBuffer(), head, c))
	} else {
		w.Write(p.head.appendKept(w.AvailableBuffer(), head, 0))
	}
	r.Discard(p.head.n)
}

// appendMCPKept is appendKept(dst, head, 0) for an answer of an MCP
// backend from c's endpoint: its session ID goes prefixed, as
// Picker.MCPSession has it, the first field, when not empty, in the place
// of all.
func (h *plainHead) appendMCPKept(dst, head []byte, c *balance.Choice) []byte {
	mask, _, _, id := mcpField(head[:h.n-2], 1)
	if len(id) == 0 {
		return h.appendKept(dst, head, 0)
	}
	kept := *h
	kept.drop |= mask
	dst = kept.appendKept(dst, head, 0)
	dst = append(dst, "Mcp-Session-Id: "...)
	dst = append(dst, balance.MCPSessionID(string(id), c)...)
	return append(dst, "\r\n"...)
}

// mcpField finds the Mcp-Session-Id fields in lines, a plain head's lines
// from line first on, each ending in CRLF (as scanFields checked them):
// mask has the bit of each (as plainHead.drop numbers lines), n counts
// them, and value is the first one's, trimmed as textproto trims it, at
// offset at in lines.
func mcpField(lines []byte, first int) (mask uint64, n, at int, value []byte) {
	for i, off := 0, 0; off < len(lines); i++ {
		line := lines[off : off+bytes.IndexByte(lines[off:], '\n')-1]
		if name, v, _ := bytes.Cut(line, colon); i >= first && equalFold(name, mcpSessionID) {
			if mask |= 1 << i; n == 0 {
				value = bytes.TrimLeft(v, " \t")
				at = off + len(line) - len(value)
				value = bytes.TrimRight(value, " \t")
			}
			n++
		}
		off += len(line) + 2
	}
	return mask, n, at, value
}

// sizedBody reads the n bytes of a plain answer's or request's body; an
// end before them is io.ErrUnexpectedEOF, and io.EOF comes with the last
// of them, as from net/http's body.
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

// readPlainRequest reads the next request as plain when nothing the proxy
// does with it reads its fields (plainFor) and it is: the fields to
// forward go to s.fields, for writeHead. nil when it is not.
func (s *h1Conn) readPlainRequest() *http.Request {
	s.plainReq = false
	if s.head == nil {
		return nil
	}
	s.v, s.fe = s.t.view()
	if !plainFor(s.v, s.fe) {
		return nil
	}
	h, ok := scanPlainRequest(s.head)
	if !ok {
		return nil
	}
	target := string(h.target)
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil // net/http refuses it too, with its own error
	}
	s.fields = h.appendKept(s.fields[:0], s.head, 1)
	s.mcp = ""
	if h.mcp {
		if s.fields, s.mcp, ok = cutMCPSession(s.fields); !ok {
			return nil
		}
	}
	s.br.Discard(h.n)
	s.head, s.plainReq = nil, true
	req := &http.Request{
		Method: h.method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: http.NoBody, Host: string(h.host), RequestURI: target, Close: h.close,
	}
	if h.length > 0 {
		s.body = sizedBody{r: s.br, n: h.length}
		req.Body, req.ContentLength = &s.body, h.length
	}
	return req
}

// unplain gives req, the current request read plain, the fields kept for
// writeHead as its Header, for a wire that writes them from there: the
// fast path learnt, after it read req, that its backend takes h2 alone
// (fastWire). They passed scanPlainRequest's checks, as net/http's parser
// would have.
func (s *h1Conn) unplain(req *http.Request) error {
	r := textproto.NewReader(bufio.NewReader(io.MultiReader(bytes.NewReader(s.fields), bytes.NewReader(crlf))))
	h, err := r.ReadMIMEHeader()
	if err != nil {
		return fmt.Errorf("read the fields of a plain request: %w", err)
	}
	req.Header, s.plainReq = http.Header(h), false
	return nil
}

var crlf = []byte("\r\n")

// cutMCPSession cuts the prefix Picker.MCPSession added off the MCP
// session ID in fields, a plain request's kept lines, in place, and
// returns them and the token of the endpoint it names
// (balance.CutMCPSession). It cuts it whatever the backend, as net/http's
// path does: the prefix is sockmesh's, never a backend's, and a backend
// no longer MCP (a Service whose backend changed) gets the ID its MCP
// predecessor issued. A request with more than one such field is not
// taken as plain (ok false): net/http's path makes them one.
func cutMCPSession(fields []byte) (_ []byte, tok string, ok bool) {
	_, n, at, value := mcpField(fields, 0)
	if n != 1 {
		return fields, "", n == 0
	}
	id, tok := balance.CutMCPSessionID(string(value))
	if tok != "" {
		fields = append(fields[:at], fields[at+len(value)-len(id):]...)
	}
	return fields, tok, true
}

// maxKeptFields is the most of a plain request's fields an idle
// connection keeps room for.
const maxKeptFields = 1 << 10

// plainFor reports whether requests to fe, on view v, may be read plain:
// no routes, no session persistence, and the backend takes HTTP/1.1 — or
// the request is answered by the proxy itself.
func plainFor(v *View, fe *snapshot.Frontend) bool {
	if fe == nil {
		return true
	}
	if fe.Routes != nil {
		return false
	}
	be := v.Backends.Get(fe.Backend)
	if be == nil || be.Err != nil {
		return true
	}
	return be.Spec.SessionPersistence == nil && fastWire(be, WireFor(be, 1, false)) == upstream.WireH1
}
