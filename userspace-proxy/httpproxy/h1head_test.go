package httpproxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
)

func TestScanPlainAnswer(t *testing.T) {
	for _, c := range []struct {
		head  string
		plain bool
		close bool
		out   string // the lines forwarded, when plain
	}{
		{head: "HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 02:12:42 GMT\r\nContent-Type: text/plain\r\nContent-Length: 100\r\nLast-Modified: Fri, 27 Nov 2026 02:00:00 GMT\r\nConnection: keep-alive\r\nETag: \"6745a3c0-64\"\r\nAccept-Ranges: bytes\r\n\r\n",
			plain: true, out: "HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 02:12:42 GMT\r\nContent-Type: text/plain\r\nContent-Length: 100\r\nLast-Modified: Fri, 27 Nov 2026 02:00:00 GMT\r\nETag: \"6745a3c0-64\"\r\nAccept-Ranges: bytes\r\n"},
		{head: "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nKeep-Alive: timeout=5\r\nConnection: Keep-Alive, close\r\n\r\n",
			plain: true, close: true, out: "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n"},
		{head: "HTTP/1.1 200\r\nContent-Length: 2\r\nUpgrade: h2c\r\n\r\n", plain: true, out: "HTTP/1.1 200\r\nContent-Length: 2\r\n"},
		{head: "HTTP/1.1 200 OK\r\ndate:x\r\nContent-Length: 2\r\n\r\n", plain: true, out: "HTTP/1.1 200 OK\r\ndate:x\r\nContent-Length: 2\r\n"},
		{head: "HTTP/1.1 200 OK\r\nX: \xff obs-text\tand tab\r\nContent-Length: 2\r\n\r\n", plain: true, out: "HTTP/1.1 200 OK\r\nX: \xff obs-text\tand tab\r\nContent-Length: 2\r\n"},
		// Not plain: net/http reads them, or refuses them.
		{head: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"},                                            // not whole yet
		{head: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n"},                                        // keep-alive differs
		{head: "HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\n"},                                // no body
		{head: "HTTP/1.1 103 Early Hints\r\nContent-Length: 2\r\n\r\n"},                               // informational
		{head: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"},                               // chunked
		{head: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"},          // ambiguous
		{head: "HTTP/1.1 200 OK\r\n\r\n"},                                                             // until the close
		{head: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n"},                   // duplicate
		{head: "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n"},                                       // not digits
		{head: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n X: folded\r\n\r\n"},                          // folded
		{head: "HTTP/1.1 200 OK\r\nContent-Length: 2\nX: y\r\n\r\n"},                                  // bare LF
		{head: "HTTP/1.1 200 OK\r\nBad Name: y\r\nContent-Length: 2\r\n\r\n"},                         // space in a name
		{head: "HTTP/1.1 200 OK\r\nX: a\x01b\r\nContent-Length: 2\r\n\r\n"},                           // control byte
		{head: "HTTP/1.1 200 OK\r\nConnection: X-Secret\r\nX-Secret: 1\r\nContent-Length: 2\r\n\r\n"}, // names a field
		{head: "HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 2\r\n\r\n"},                    // net/http adds Cache-Control
		{head: "HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\n"},                                       // status of 4 digits
		{head: "HTTP/1.1 426 Upgrade Required\r\nUpgrade: h2c\r\nContent-Length: 0\r\n\r\n"},          // keeps its Upgrade
	} {
		h, ok := scanPlainAnswer([]byte(c.head))
		if ok != c.plain {
			t.Errorf("%q: plain %v, want %v", c.head, ok, c.plain)
			continue
		}
		if !ok {
			continue
		}
		if h.n != len(c.head) || h.close != c.close || h.date != strings.Contains(strings.ToLower(c.head), "\ndate:") {
			t.Errorf("%q: length %d close %v date %v, want %d %v and a date if it has one", c.head, h.n, h.close, h.date, len(c.head), c.close)
		}
		if out := h.appendKept(nil, []byte(c.head), 0); string(out) != c.out {
			t.Errorf("%q: forwarded %q, want %q", c.head, out, c.out)
		}
	}
}

// FuzzPlainAnswer checks scanPlainAnswer against net/http: a head it
// takes, net/http reads with the same status, length, close and end, and
// the lines it forwards carry the fields net/http's path forwards, also
// for an MCP backend (appendMCPKept, Picker.MCPSession).
func FuzzPlainAnswer(f *testing.F) {
	p, c := mcpPicker()
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nmcp-session-id:  s1 \r\nContent-Length: 2\r\nMcp-Session-Id: s2\r\n\r\nok",
		"HTTP/1.1 404 Not Found\r\nMcp-Session-Id:\r\nContent-Length: 0\r\nMcp-Session-Id: s2\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: keep-alive, close\r\nKeep-Alive: timeout=5\r\n\r\nhello",
		"HTTP/1.1 503 \r\nX-A: 1\r\nX-A: 2\r\ncontent-length:3 \r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTrailer: X\r\nProxy-Connection: x\r\nUpgrade: y\r\n\r\nok",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, ok := scanPlainAnswer(raw)
		if !ok {
			return
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), &http.Request{Method: http.MethodGet})
		if err != nil {
			t.Fatalf("plain, but net/http reads no answer: %v\nhead: %q", err, raw)
		}
		_, dated := resp.Header["Date"]
		if resp.StatusCode != h.status || resp.ContentLength != h.length || resp.Close != h.close || dated != h.date {
			t.Fatalf("plain %+v, net/http reads status %d length %d close %v date %v\nhead: %q", h, resp.StatusCode, resp.ContentLength, resp.Close, dated, raw)
		}
		body, err := io.ReadAll(resp.Body)
		if want := raw[h.n:min(len(raw), h.n+int(h.length))]; !bytes.Equal(body, want) {
			t.Fatalf("net/http reads the body %q (%v), plain %q\nhead: %q", body, err, want, raw)
		}
		out := append(h.appendKept(nil, raw, 0), "\r\n"...)
		fwd, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), &http.Request{Method: http.MethodGet})
		if err != nil {
			t.Fatalf("the forwarded head %q does not parse: %v", out, err)
		}
		removeHopByHop(resp.Header)
		if !maps.EqualFunc(fwd.Header, resp.Header, slices.Equal) {
			t.Fatalf("forwarded fields %v, net/http's path forwards %v\nhead: %q", fwd.Header, resp.Header, raw)
		}
		out = append(h.appendMCPKept(nil, raw, c), "\r\n"...)
		if fwd, err = http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), &http.Request{Method: http.MethodGet}); err != nil {
			t.Fatalf("the forwarded MCP head %q does not parse: %v", out, err)
		}
		p.MCPSession(resp.Header, c)
		if !maps.EqualFunc(fwd.Header, resp.Header, slices.Equal) {
			t.Fatalf("forwarded MCP fields %v, net/http's path forwards %v\nhead: %q", fwd.Header, resp.Header, raw)
		}
	})
}

// mcpPicker is the picker of an MCP backend of one endpoint, and its
// choice of it.
func mcpPicker() (*balance.Picker, *balance.Choice) {
	p := balance.New(&snapshot.Backend{Protocol: snapshot.ProtocolMCP,
		Endpoints: []snapshot.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Ready: true, Serving: true}}}, nil, nil)
	return p, p.Pick()
}

// BenchmarkHeads reads a curl request's head and nginx's answer head as
// plain and, the baseline, with net/http's parser and the rewrite of the
// header.
func BenchmarkHeads(b *testing.B) {
	request := []byte("GET /a?b=c HTTP/1.1\r\nHost: svc.ns:8080\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n")
	answer := []byte("HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 02:12:42 GMT\r\nContent-Type: text/plain\r\nContent-Length: 100\r\nLast-Modified: Fri, 27 Nov 2026 02:00:00 GMT\r\nConnection: keep-alive\r\nETag: \"6745a3c0-64\"\r\nAccept-Ranges: bytes\r\n\r\n")
	w := bufio.NewWriter(io.Discard)
	r := bufio.NewReader(nil)
	b.Run("request/plain", func(b *testing.B) {
		var fields []byte
		for b.Loop() {
			h, ok := scanPlainRequest(request)
			if !ok {
				b.Fatal("not plain")
			}
			u, err := url.ParseRequestURI(string(h.target))
			if err != nil {
				b.Fatal(err)
			}
			fields = h.appendKept(fields[:0], request, 1)
			req := &http.Request{Method: h.method, URL: u, Header: http.Header{}, Host: string(h.host), RequestURI: u.Path}
			writeHead(w, req, &fields)
		}
	})
	b.Run("request/nethttp", func(b *testing.B) {
		for b.Loop() {
			r.Reset(bytes.NewReader(request))
			req, err := http.ReadRequest(r)
			if err != nil {
				b.Fatal(err)
			}
			removeHopByHop(req.Header)
			writeHead(w, req, nil)
		}
	})
	b.Run("answer/plain", func(b *testing.B) {
		for b.Loop() {
			h, ok := scanPlainAnswer(answer)
			if !ok {
				b.Fatal("not plain")
			}
			w.Reset(io.Discard) // a fresh writer per answer, as answer's
			w.Write(h.appendKept(w.AvailableBuffer(), answer, 0))
		}
	})
	b.Run("answer/nethttp", func(b *testing.B) {
		for b.Loop() {
			r.Reset(bytes.NewReader(answer))
			resp, err := http.ReadResponse(r, &http.Request{Method: http.MethodGet})
			if err != nil {
				b.Fatal(err)
			}
			removeHopByHop(resp.Header)
			writeStatusLine(w, resp)
			writeHeader(w, resp.Header, "Content-Length")
		}
	})
}

func TestScanPlainRequest(t *testing.T) {
	for _, c := range []struct {
		head   string
		plain  bool
		close  bool
		host   string
		fields string // the lines forwarded, when plain
		length int64  // the body's, which follows head
	}{
		{head: "GET /a?b=c HTTP/1.1\r\nHost: svc.ns:8080\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n",
			plain: true, host: "svc.ns:8080", fields: "User-Agent: curl/7.88.1\r\nAccept: */*\r\n"},
		{head: "HEAD / HTTP/1.1\r\nhost:  a \r\nConnection: close\r\nKeep-Alive: 5\r\nX: y\r\n\r\n",
			plain: true, close: true, host: "a", fields: "X: y\r\n"},
		{head: "GET / HTTP/1.1\r\n\r\n", plain: true}, // no Host: validRequest refuses it, as on net/http's path
		{head: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n",
			plain: true, host: "a", fields: "Content-Length: 2\r\n", length: 2},
		{head: "PATCH /x HTTP/1.1\r\ncontent-length:  017 \r\nHost: a\r\n\r\n",
			plain: true, host: "a", fields: "content-length:  017 \r\n", length: 17},
		{head: "DELETE / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", plain: true, fields: "Content-Length: 0\r\n"},
		// Not plain.
		{head: "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"},
		{head: "POST / HTTP/1.1\r\nHost: a\r\n\r\n"},
		{head: "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n"},
		{head: "POST / HTTP/1.1\r\nContent-Length: 5,5\r\n\r\n"},
		{head: "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"},
		{head: "POST / HTTP/1.1\r\nContent-Length: 9999999999999999999\r\n\r\n"},
		{head: "POST / HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"},
		{head: "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{head: "CONNECT / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"},
		{head: "OPTIONS / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"}, // its Max-Forwards is read
		{head: "GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{head: "GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n"},
		{head: "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"},
		{head: "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"},
		{head: "GET / HTTP/1.0\r\nHost: a\r\n\r\n"},
		{head: "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n"},
		{head: "GET  / HTTP/1.1\r\nHost: a\r\n\r\n"},
		{head: "get / HTTP/1.1\r\nHost: a\r\n\r\n"},
		{head: "GET / HTTP/1.1\r\nHost: a\r\n"},
		{head: "GET / HTTP/1.1\nHost: a\n\n"},
	} {
		h, ok := scanPlainRequest([]byte(c.head))
		if ok != c.plain {
			t.Errorf("%q: plain %v, want %v", c.head, ok, c.plain)
			continue
		}
		if !ok {
			continue
		}
		if h.n != len(c.head) || h.close != c.close || string(h.host) != c.host || max(h.length, 0) != c.length {
			t.Errorf("%q: length %d close %v host %q body %d, want %d %v %q %d", c.head, h.n, h.close, h.host, h.length,
				len(c.head), c.close, c.host, c.length)
		}
		if out := h.appendKept(nil, []byte(c.head), 1); string(out) != c.fields {
			t.Errorf("%q: forwarded %q, want %q", c.head, out, c.fields)
		}
	}
}

// FuzzPlainRequest checks scanPlainRequest against net/http: a head it
// takes (and url.ParseRequestURI, as readPlainRequest asks), net/http
// reads as the same request, with the same Content-Length, body (also one
// cut short) and end, and the lines it
// forwards carry the fields net/http's path forwards, also for an MCP
// backend, which cuts the same session ID (cutMCPSession,
// balance.CutMCPSession) or takes the request as not plain.
func FuzzPlainRequest(f *testing.F) {
	_, c := mcpPicker()
	session := balance.MCPSessionID("s1", c)
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\nmcp-session-id:  " + session + " \r\nX-A: 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nMcp-Session-Id: " + session + "\r\nMcp-Session-Id: s2\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /p?q HTTP/1.1\r\nHost: a:80\r\nConnection: keep-alive\r\nUser-Agent: x\r\nX-A: 1\r\nX-A: 2\r\n\r\nGET / HTTP/1.1\r\n",
		"HEAD /%41 HTTP/1.1\r\nConnection: close, close\r\nProxy-Connection: x\r\nTrailer: y\r\nHost: b\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"PUT / HTTP/1.1\r\nHost: a\r\nContent-Length:  05 \r\n\r\nhello",
		"PATCH / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
		"DELETE / HTTP/1.1\r\ncontent-length: 3\r\n\r\nab",
		"OPTIONS / HTTP/1.1\r\nContent-Length:\t2\t\r\n\r\nab",
		"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nContent-Length: 5,5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
		"POST / HTTP/1.1\r\nContent-Length: 999999999999999999\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\nx",
		"GET / HTTP/1.1\r\nContent-Length: 1\r\n\r\nx",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, ok := scanPlainRequest(raw)
		if !ok {
			return
		}
		if _, err := url.ParseRequestURI(string(h.target)); err != nil {
			return
		}
		br := bufio.NewReader(bytes.NewReader(raw))
		req, err := http.ReadRequest(br)
		if err != nil {
			t.Fatalf("plain, but net/http reads no request: %v\nhead: %q", err, raw)
		}
		length := max(h.length, 0)
		if req.Method != h.method || req.RequestURI != string(h.target) || req.Host != string(h.host) || req.Close != h.close ||
			(req.Body == http.NoBody) != (length == 0) || req.ContentLength != length || req.ProtoMinor != 1 {
			t.Fatalf("plain %+v, net/http reads %s %q host %q close %v body %v length %d\nhead: %q",
				h, req.Method, req.RequestURI, req.Host, req.Close, req.Body, req.ContentLength, raw)
		}
		// The body as net/http reads it, then what follows it, against
		// sizedBody's reading of the same bytes.
		body, err := io.ReadAll(req.Body)
		plainBody, plainErr := io.ReadAll(&sizedBody{r: bufio.NewReader(bytes.NewReader(raw[h.n:])), n: length})
		if !bytes.Equal(body, plainBody) || err != plainErr {
			t.Fatalf("net/http reads the body %q (%v), plain %q (%v)\nhead: %q", body, err, plainBody, plainErr, raw)
		}
		if rest, _ := io.ReadAll(br); !bytes.Equal(rest, raw[h.n+len(body):]) {
			t.Fatalf("net/http leaves %q after the body, plain %q\nhead: %q", rest, raw[h.n+len(body):], raw)
		}
		out := append([]byte("GET / HTTP/1.1\r\n"), h.appendKept(nil, raw, 1)...)
		fwd, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(append(out, "\r\n"...))))
		if err != nil {
			t.Fatalf("the forwarded fields %q do not parse: %v", out, err)
		}
		removeHopByHop(req.Header)
		if !maps.EqualFunc(fwd.Header, req.Header, slices.Equal) {
			t.Fatalf("forwarded fields %v, net/http's path forwards %v\nhead: %q", fwd.Header, req.Header, raw)
		}
		fields, tok, ok := cutMCPSession(h.appendKept(nil, raw, 1))
		if !ok {
			if n := len(req.Header.Values("Mcp-Session-Id")); n < 2 {
				t.Fatalf("not plain for MCP with %d session IDs\nhead: %q", n, raw)
			}
			return
		}
		out = append([]byte("GET / HTTP/1.1\r\n"), fields...)
		if fwd, err = http.ReadRequest(bufio.NewReader(bytes.NewReader(append(out, "\r\n"...)))); err != nil {
			t.Fatalf("the forwarded MCP fields %q do not parse: %v", out, err)
		}
		if want := balance.CutMCPSession(req.Header); tok != want || !maps.EqualFunc(fwd.Header, req.Header, slices.Equal) {
			t.Fatalf("forwarded MCP fields %v (token %q), net/http's path forwards %v (token %q)\nhead: %q", fwd.Header, tok, req.Header, want, raw)
		}
	})
}

// TestPlainHeads: a request and an answer whose fields the proxy does not
// read go through as they came, less their hop-by-hop lines (names in
// their case, values with their spaces); with session persistence, whose
// header the proxy reads and sets, net/http's parser reads them and the
// fields arrive as it writes them. An MCP backend's go through as they
// came too, but for the session ID: the request's loses the prefix the
// proxy added (an ID without one stays as it is), the answer's gains it.
// Before, an MCP backend's heads went through net/http's parser.
func TestPlainHeads(t *testing.T) {
	const date = "Sun, 06 Nov 1994 08:49:37 GMT" // the backend's own: no Date of the proxy's
	heads := make(chan string, 1)
	ep := serveRaw(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			var head strings.Builder
			for !strings.HasSuffix(head.String(), "\r\n\r\n") {
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				head.WriteString(line)
			}
			heads <- head.String()
			io.WriteString(c, "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-odd:  v  \r\nmcp-session-id:  s1 \r\nKeep-Alive: timeout=5\r\nConnection: keep-alive\r\n"+
				"date: "+date+"\r\n\r\nok")
		}
	})
	const request = "GET /p?q=1 HTTP/1.1\r\nHost: svc\r\nx-lower:  v \r\nConnection: keep-alive\r\n"
	session := balance.MCPSessionID("s1", balance.New(&snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}}, nil, nil).Pick())
	for _, c := range []struct {
		name     string
		sp       *snapshot.SessionPersistence
		protocol snapshot.Protocol
		fields   string // the request's, after request's
		sent     string
		answered []string // the answer head's lines, in any order after the first
	}{
		{"plain", nil, "", "",
			"GET /p?q=1 HTTP/1.1\r\nHost: svc\r\nx-lower:  v \r\n\r\n",
			[]string{"HTTP/1.1 200 OK", "content-length: 2", "x-odd:  v  ", "mcp-session-id:  s1 ", "date: " + date}},
		{"session persistence", &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "x-session"}, "", "",
			"GET /p?q=1 HTTP/1.1\r\nHost: svc\r\nX-Lower: v\r\n\r\n",
			[]string{"HTTP/1.1 200 OK", "Content-Length: 2", "X-Odd: v", "Mcp-Session-Id: s1", "X-Session: ", "Date: " + date}},
		{"MCP session", nil, snapshot.ProtocolMCP, "mcp-session-id: " + session + " \r\n",
			"GET /p?q=1 HTTP/1.1\r\nHost: svc\r\nx-lower:  v \r\nmcp-session-id: s1 \r\n\r\n",
			[]string{"HTTP/1.1 200 OK", "content-length: 2", "x-odd:  v  ", "Mcp-Session-Id: " + session, "date: " + date}},
		{"MCP, no session", nil, snapshot.ProtocolMCP, "",
			"GET /p?q=1 HTTP/1.1\r\nHost: svc\r\nx-lower:  v \r\n\r\n",
			[]string{"HTTP/1.1 200 OK", "content-length: 2", "x-odd:  v  ", "Mcp-Session-Id: " + session, "date: " + date}},
		{"MCP, the app's own ID", nil, snapshot.ProtocolMCP, "mcp-session-id: 0123456789abcdef.s1\r\n",
			"GET /p?q=1 HTTP/1.1\r\nHost: svc\r\nx-lower:  v \r\nmcp-session-id: 0123456789abcdef.s1\r\n\r\n",
			[]string{"HTTP/1.1 200 OK", "content-length: 2", "x-odd:  v  ", "Mcp-Session-Id: " + session, "date: " + date}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fx := newFixture(t, Config{}, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}, SessionPersistence: c.sp, Protocol: c.protocol})
			cl := fx.dial()
			cl.c.SetDeadline(time.Now().Add(10 * time.Second))
			for range 2 { // the second on the pooled connection
				cl.send(request + c.fields + "\r\n")
				if got := <-heads; got != c.sent {
					t.Errorf("the backend got %q, want %q", got, c.sent)
				}
				var head strings.Builder
				for !strings.HasSuffix(head.String(), "\r\n\r\n") {
					line, err := cl.r.ReadString('\n')
					if err != nil {
						t.Fatalf("read answer: %v", err)
					}
					head.WriteString(line)
				}
				body := make([]byte, 2)
				if _, err := io.ReadFull(cl.r, body); err != nil || string(body) != "ok" {
					t.Fatalf("body %q: %v", body, err)
				}
				lines := strings.Split(strings.TrimSuffix(head.String(), "\r\n\r\n"), "\r\n")
				slices.Sort(lines[1:])
				for i, l := range lines {
					if strings.HasPrefix(l, "X-Session: ") {
						lines[i] = "X-Session: " // the session's token
					}
				}
				want := slices.Clone(c.answered)
				slices.Sort(want[1:])
				if !slices.Equal(lines, want) {
					t.Errorf("the app got %q, want the lines %q", head.String(), c.answered)
				}
			}
		})
	}
}

// TestPlainRequestBodies: requests with a Content-Length body, pipelined
// in one write, reach a backend that reads no fields as they came (names
// in their case, values with their spaces) with their bodies, a small one
// written with its head and a large one streamed, and their answers come
// back in order. Before, such a request went through net/http's parser
// and arrived with its fields as net/http writes them.
func TestPlainRequestBodies(t *testing.T) {
	got := make(chan string, 3)
	ep := serveRaw(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			var head strings.Builder
			length := 0
			for !strings.HasSuffix(head.String(), "\r\n\r\n") {
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				if name, v, _ := strings.Cut(line, ":"); strings.EqualFold(name, "Content-Length") {
					length, _ = strconv.Atoi(strings.TrimSpace(v))
				}
				head.WriteString(line)
			}
			body := make([]byte, length)
			if _, err := io.ReadFull(br, body); err != nil {
				return
			}
			got <- head.String() + string(body)
			line, _, _ := strings.Cut(head.String(), "\r\n")
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(line), line)
		}
	})
	fx := newFixture(t, Config{}, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}})
	large := strings.Repeat("0123456789abcdef", 8<<10) // more than the proxy buffers
	sent := []string{
		"POST /a HTTP/1.1\r\nHost: svc\r\ncontent-length:  5 \r\nx-lower:  v \r\n\r\nhello",
		"GET /b HTTP/1.1\r\nHost: svc\r\n\r\n",
		"PUT /c HTTP/1.1\r\nHost: svc\r\nContent-Length: " + strconv.Itoa(len(large)) + "\r\nx-lower: w\r\n\r\n" + large,
	}
	cl := fx.dial()
	cl.c.SetDeadline(time.Now().Add(10 * time.Second))
	go io.WriteString(cl.c, strings.Join(sent, "")) // the large body fills the socket's buffers
	for _, want := range sent {
		line, _, _ := strings.Cut(want, "\r\n")
		if resp, body := cl.read(strings.Fields(line)[0]); resp.StatusCode != http.StatusOK || body != line {
			t.Errorf("answer %s %q, want 200 %q", resp.Status, body, line)
		}
		if b := <-got; b != want {
			t.Errorf("the backend got %.200q (%d bytes), want %.200q (%d bytes)", b, len(b), want, len(want))
		}
	}
}
