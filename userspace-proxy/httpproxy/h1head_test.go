package httpproxy

import (
	"bufio"
	"bytes"
	"io"
	"maps"
	"net/http"
	"slices"
	"testing"
)

func TestScanPlainHead(t *testing.T) {
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
	} {
		h, ok := scanPlainHead([]byte(c.head))
		if ok != c.plain {
			t.Errorf("%q: plain %v, want %v", c.head, ok, c.plain)
			continue
		}
		if !ok {
			continue
		}
		if h.n != len(c.head) || h.close != c.close {
			t.Errorf("%q: length %d close %v, want %d %v", c.head, h.n, h.close, len(c.head), c.close)
		}
		var out bytes.Buffer
		w := bufio.NewWriter(&out)
		h.write(w, []byte(c.head))
		w.Flush()
		if out.String() != c.out {
			t.Errorf("%q: forwarded %q, want %q", c.head, out.String(), c.out)
		}
	}
}

// FuzzPlainHead checks scanPlainHead against net/http: a head it takes,
// net/http reads with the same status, length, close and end, and the
// lines it forwards carry the fields net/http's path forwards.
func FuzzPlainHead(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: keep-alive, close\r\nKeep-Alive: timeout=5\r\n\r\nhello",
		"HTTP/1.1 503 \r\nX-A: 1\r\nX-A: 2\r\ncontent-length:3 \r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTrailer: X\r\nProxy-Connection: x\r\nUpgrade: y\r\n\r\nok",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, ok := scanPlainHead(raw)
		if !ok {
			return
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), &http.Request{Method: http.MethodGet})
		if err != nil {
			t.Fatalf("plain, but net/http reads no answer: %v\nhead: %q", err, raw)
		}
		if resp.StatusCode != h.status || resp.ContentLength != h.length || resp.Close != h.close {
			t.Fatalf("plain %+v, net/http reads status %d length %d close %v\nhead: %q", h, resp.StatusCode, resp.ContentLength, resp.Close, raw)
		}
		body, err := io.ReadAll(resp.Body)
		if want := raw[h.n:min(len(raw), h.n+int(h.length))]; !bytes.Equal(body, want) {
			t.Fatalf("net/http reads the body %q (%v), plain %q\nhead: %q", body, err, want, raw)
		}
		var out bytes.Buffer
		w := bufio.NewWriter(&out)
		h.write(w, raw)
		w.WriteString("\r\n")
		w.Flush()
		fwd, err := http.ReadResponse(bufio.NewReader(&out), &http.Request{Method: http.MethodGet})
		if err != nil {
			t.Fatalf("the forwarded head %q does not parse: %v", out.String(), err)
		}
		removeHopByHop(resp.Header)
		if !maps.EqualFunc(fwd.Header, resp.Header, slices.Equal) {
			t.Fatalf("forwarded fields %v, net/http's path forwards %v\nhead: %q", fwd.Header, resp.Header, raw)
		}
	})
}

// BenchmarkAnswerHead reads nginx's answer head as plain and, the
// baseline, with net/http's parser and the header's rewrite.
func BenchmarkAnswerHead(b *testing.B) {
	head := []byte("HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 02:12:42 GMT\r\nContent-Type: text/plain\r\nContent-Length: 100\r\nLast-Modified: Fri, 27 Nov 2026 02:00:00 GMT\r\nConnection: keep-alive\r\nETag: \"6745a3c0-64\"\r\nAccept-Ranges: bytes\r\n\r\n")
	w := bufio.NewWriter(io.Discard)
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			h, ok := scanPlainHead(head)
			if !ok {
				b.Fatal("not plain")
			}
			h.write(w, head)
		}
	})
	b.Run("nethttp", func(b *testing.B) {
		r := bufio.NewReader(nil)
		for b.Loop() {
			r.Reset(bytes.NewReader(head))
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
