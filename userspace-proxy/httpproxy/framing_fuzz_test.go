package httpproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// FuzzRequestFraming sends arbitrary bytes to the HTTP/1 fast path as an
// app's connection and checks that the backend reads no request but those
// net/http's parser reads from the same bytes, in the same order, with the
// same bodies: a proxy that frames a request differently than the server
// behind it lets one request carry another past it (request smuggling,
// RFC 9112 §11.2). The proxy may refuse more than the parser (and then
// closes the connection), so the backend's requests must be a prefix of
// the parser's. Whatever the proxy sends, the backend must be able to
// parse.
//
// `go test` runs the seeds below (classic smuggling attempts) and
// testdata/fuzz/FuzzRequestFraming; `go test -fuzz FuzzRequestFraming`
// looks for more.
func FuzzRequestFraming(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /cl HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /te HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
		// CL.TE and TE.CL.
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 13\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nSMUGGLED",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
		// Obfuscated Transfer-Encoding.
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		// Two lengths, a sign, obs-fold, bare LF, a chunk extension and a
		// trailer, HTTP/1.0 with Transfer-Encoding.
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n 3\r\n\r\nabc",
		"POST / HTTP/1.1\nHost: a\nContent-Length: 3\n\nabcGET /lf HTTP/1.1\nHost: a\n\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=\"x\"\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\nGET /after HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nGET /x HTTP/1.1\r\nHost: a\r\n\r\n",
		"HEAD / HTTP/1.1\r\nHost: a\r\n\r\nGET /get HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
		// Answered by the proxy (lastHop), which reads on.
		"TRACE / HTTP/1.1\r\nHost: a\r\nMax-Forwards: 0\r\n\r\nGET /after HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		want := parseRequests(in)
		rec := startRecorder(t)
		// The comparison runs after the fixture's cleanup, once the proxy
		// and then the recorder have ended every connection.
		t.Cleanup(func() {
			got, bad := rec.results()
			if bad != "" {
				t.Fatalf("the backend could not parse what the proxy sent: %s\ninput: %q", bad, in)
			}
			if len(got) > len(want) {
				t.Fatalf("backend read %d requests, net/http reads %d\nbackend: %q\nnet/http: %q\ninput: %q", len(got), len(want), got, want, in)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("request %d: backend read %q, net/http reads %q\ninput: %q", i, got[i], want[i], in)
				}
			}
		})
		fx := newFixture(t, Config{}, snapshot.Backend{Endpoints: []snapshot.Endpoint{rec.ep}})
		cl := fx.dial()
		if _, err := cl.c.Write(in); err != nil {
			return // the proxy already closed: nothing more to send
		}
		cl.c.(*net.TCPConn).CloseWrite()
		cl.c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, cl.c); isTimeout(err) {
			t.Fatalf("the proxy kept the connection open after the app's end\ninput: %q", in)
		}
	})
}

// framed is one request as a server reads it: what decides where the next
// one starts, and what reaches the app.
type framed struct {
	Method, Target, Body string
}

// parseRequests reads requests from in with net/http's parser until it
// fails; a request whose body is cut short does not count, nor does one
// the proxy answers as its final recipient (lastHop).
func parseRequests(in []byte) []framed {
	br := bufio.NewReader(bytes.NewReader(in))
	var out []framed
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return out
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return out
		}
		if !lastHop(req) {
			out = append(out, framed{req.Method, req.URL.RequestURI(), string(body)})
		}
	}
}

// recorder is a backend that reads requests strictly (readStrict),
// records them and answers each with a 200.
type recorder struct {
	ep   snapshot.Endpoint
	mu   sync.Mutex
	seen []framed
	bad  string // the first error other than the connection's end
}

func startRecorder(t *testing.T) *recorder {
	r := &recorder{}
	r.ep = serveRaw(t, r.serve)
	return r
}

func (r *recorder) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		req, err := readStrict(br)
		if err != nil {
			r.failed(err)
			return
		}
		r.mu.Lock()
		r.seen = append(r.seen, req)
		r.mu.Unlock()
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

// readStrict reads a request strictly (strictHead) and its body.
func readStrict(br *bufio.Reader) (framed, error) {
	head, chunked, err := strictHead(br)
	if err != nil {
		return framed{}, err
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		return framed{}, fmt.Errorf("head %q: %w", head, err)
	}
	body, err := readBody(br, chunked, req.ContentLength)
	return framed{req.Method, req.URL.RequestURI(), body}, err
}

// strictHead reads a message head that leaves no room to frame the message
// in two ways (RFC 9112): every line ends in CRLF, no field is folded or has
// space before its colon, and the body's length is given once — by one
// Content-Length or by Transfer-Encoding: chunked, never both.
func strictHead(br *bufio.Reader) (head []byte, chunked bool, err error) {
	var lengths, codings []string
	for n := 0; ; n++ {
		line, err := br.ReadBytes('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && (n > 0 || len(line) > 0) {
				err = io.ErrUnexpectedEOF
			}
			return nil, false, err
		}
		head = append(head, line...)
		if !bytes.HasSuffix(line, []byte("\r\n")) {
			return nil, false, fmt.Errorf("line %q does not end in CRLF", line)
		}
		line = line[:len(line)-2]
		if len(line) == 0 {
			break
		}
		if n == 0 {
			continue // the start line: net/http's parser checks it
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || !httpguts.ValidHeaderFieldName(string(name)) {
			return nil, false, fmt.Errorf("field line %q", line)
		}
		switch v := string(bytes.TrimSpace(value)); http.CanonicalHeaderKey(string(name)) {
		case "Content-Length":
			lengths = append(lengths, v)
		case "Transfer-Encoding":
			codings = append(codings, v)
		}
	}
	switch {
	case len(lengths) > 1, len(codings) > 1, len(lengths) == 1 && len(codings) == 1:
		return nil, false, fmt.Errorf("length given as Content-Length %q and Transfer-Encoding %q", lengths, codings)
	case len(codings) == 1 && codings[0] != "chunked":
		return nil, false, fmt.Errorf("Transfer-Encoding %q", codings[0])
	}
	return head, len(codings) == 1, nil
}

// readBody reads a body of length n (-1: until the connection's end), or a
// chunked one and its trailer section.
func readBody(br *bufio.Reader, chunked bool, n int64) (string, error) {
	var r io.Reader = br
	switch {
	case chunked:
		r = httputil.NewChunkedReader(br)
	case n >= 0:
		r = io.LimitReader(br, n)
	}
	b, err := io.ReadAll(r)
	if err == nil && chunked {
		err = skipTrailers(br)
	}
	if err == nil && int64(len(b)) < n {
		err = io.ErrUnexpectedEOF
	}
	return string(b), err
}

// skipTrailers reads the trailer section after a chunked body's last chunk.
func skipTrailers(br *bufio.Reader) error {
	for {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
		if string(line) == "\r\n" {
			return nil
		}
	}
}

// failed records err unless it is the connection's end (the proxy closing
// it, also in the middle of a body the app cut short).
func (r *recorder) failed(err error) {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "connection reset") {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bad == "" {
		r.bad = err.Error()
	}
}

func (r *recorder) results() ([]framed, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen, r.bad
}

// FuzzAnswerFraming has the backend answer a request with arbitrary bytes
// and checks what the app gets: an answer framed without ambiguity
// (strictHead) with the status and body net/http's parser reads from those
// bytes, or the proxy's own error, or a broken connection — never another
// answer. The backend then answers a second request, on the same
// connection if the proxy sends it there: bytes past the first answer must
// not become the app's next answer (response queue poisoning).
func FuzzAnswerFraming(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: t\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\nuntil the close",
		"HTTP/1.0 200 OK\r\n\r\nold",
		"HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\nevil",
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		// A second answer nobody asked for, after the first.
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
		"HTTP/1.1 304 Not Modified\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
		// Ambiguous framing.
		"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 4\r\n\r\nokok",
		"HTTP/1.1 200 OK\r\nContent-Length:\r\n 2\r\n\r\nok",
		"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
		"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n",
		"not http at all",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		want, wantErr := parseAnswer(raw)
		be := startScriptedBackend(t, raw)
		fx := newFixture(t, Config{}, snapshot.Backend{Endpoints: []snapshot.Endpoint{be}})
		cl := fx.dial()
		cl.c.SetDeadline(time.Now().Add(20 * time.Second))
		cl.send("GET /fuzz HTTP/1.1\r\nHost: a\r\n\r\n")
		got, closed, err := readStrictAnswer(cl.r)
		switch {
		case isTimeout(err):
			t.Fatalf("no answer\nbackend: %q", raw)
		case err != nil && !brokenConn(err):
			t.Fatalf("the app could not parse what the proxy sent: %v\nbackend: %q", err, raw)
		case err != nil, got.status == http.StatusSwitchingProtocols || want.status == http.StatusSwitchingProtocols:
			return // a broken answer; or a tunnel, whose bytes are the backend's
		case proxyError(got):
			// The proxy may refuse what net/http's parser takes.
		case wantErr != nil:
			t.Fatalf("the app got %+v, net/http reads no answer (%v)\nbackend: %q", got, wantErr, raw)
		case got != want:
			t.Fatalf("the app got %+v, net/http reads %+v\nbackend: %q", got, want, raw)
		}
		if closed {
			return
		}
		cl.send("GET /second HTTP/1.1\r\nHost: a\r\n\r\n")
		got, _, err = readStrictAnswer(cl.r)
		if err != nil && !brokenConn(err) {
			t.Fatalf("second answer: %v\nbackend: %q", err, raw)
		}
		if err == nil && !proxyError(got) && got != (answer{status: 200, body: "second"}) {
			t.Fatalf("the second request got %+v\nbackend: %q", got, raw)
		}
	})
}

// answer is what an app makes of an answer.
type answer struct {
	status int
	body   string
}

// proxyError reports whether a is one of the proxy's own error answers.
func proxyError(a answer) bool {
	return a.status >= 500 && strings.HasPrefix(a.body, "sockmesh: ")
}

// brokenConn reports whether err is the connection breaking off (a reset
// or an early end), as the proxy ends an answer it cannot complete.
func brokenConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(err.Error(), "connection reset")
}

// parseAnswer is net/http's reading of raw as the answer to a GET, past
// any 1xx (but 101), the body up to raw's end when nothing delimits it.
func parseAnswer(raw []byte) (answer, error) {
	br := bufio.NewReader(bytes.NewReader(raw))
	for {
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
		if err != nil {
			return answer{}, err
		}
		if resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		body, err := io.ReadAll(resp.Body)
		return answer{resp.StatusCode, string(body)}, err
	}
}

// readStrictAnswer reads the answer to a GET, past any 1xx (but 101),
// strictly (strictHead); closed says the connection ends after it.
func readStrictAnswer(br *bufio.Reader) (a answer, closed bool, err error) {
	for {
		head, chunked, err := strictHead(br)
		if err != nil {
			return answer{}, false, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(head)), &http.Request{Method: http.MethodGet})
		if err != nil {
			return answer{}, false, fmt.Errorf("head %q: %w", head, err)
		}
		a.status = resp.StatusCode
		switch {
		case a.status == http.StatusSwitchingProtocols:
			return a, true, nil
		case a.status < 200:
			continue
		case a.status == http.StatusNoContent || a.status == http.StatusNotModified:
			return a, resp.Close, nil
		}
		n := int64(-1)
		if resp.Header.Get("Content-Length") != "" {
			n = resp.ContentLength
		}
		a.body, err = readBody(br, chunked, n)
		return a, resp.Close || n < 0 && !chunked, err
	}
}

// startScriptedBackend answers /fuzz with raw, then reads on for the next
// request a short while (the proxy may send one on the same connection)
// before it closes, which ends an answer delimited by the close; it
// answers any other request with "second".
func startScriptedBackend(t *testing.T, raw []byte) snapshot.Endpoint {
	return serveRaw(t, func(c net.Conn) {
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
			c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		}
	})
}
