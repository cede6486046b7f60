package upstream

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// FuzzH1TransportAnswer has a TLS backend answer a request with arbitrary
// bytes through RoundTripper(WireH1), then asks it again: whatever the
// first answer was — short, long, ambiguous, followed by more — the second
// request gets its own answer, never bytes of the first. The answer
// itself is net/http's ReadResponse's reading (FuzzAnswerFraming in
// package httpproxy checks what reaches the app).
//
// `go test` runs the seeds; `go test -fuzz FuzzH1TransportAnswer` looks
// for more.
func FuzzH1TransportAnswer(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: t\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\nuntil the close",
		"HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\nevil",
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
		"HTTP/1.1 304 Not Modified\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
		"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
		"HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
		"not http at all",
	} {
		f.Add([]byte(s))
	}
	w := newWorld(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		addr := serveRawTLS(t, w, true, func(c net.Conn) {
			br := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				answer := []byte("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
				if req.URL.Path == "/fuzz" {
					answer = raw
				}
				if _, err := c.Write(answer); err != nil {
					return
				}
				// A connection the proxy does not reuse ends.
				c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			}
		})
		be := backendAt(t, w.pools, addr, w.policy())
		rt := be.RoundTripper(WireH1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if resp, err := rt.RoundTrip(request(t, ctx, be, http.MethodGet, "/fuzz", nil)); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		resp, err := rt.RoundTrip(request(t, ctx, be, http.MethodGet, "/second", nil))
		if err != nil {
			t.Fatalf("second request: %v\nfirst answer: %q", err, raw)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(body) != "second" {
			t.Fatalf("second request got %s %q (%v)\nfirst answer: %q", resp.Status, body, err, raw)
		}
	})
}
