package httpproxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// serveL7 runs the fixture's Handler behind net/http's server (HTTP/1.1
// and h2c), as the proxy does for HTTP/2 apps, and returns a client of
// it; h2c makes the client speak HTTP/2 with prior knowledge.
func (f *fixture) serveL7(h2c bool) *http.Client {
	f.t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.t.Fatal(err)
	}
	var h http.Handler = f.h
	if f.wrapL7 != nil {
		h = f.wrapL7(h)
	}
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols), DisableGeneralOptionsHandler: true, // as the proxy's
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return WithTarget(ctx, &Target{OrigDst: vip, Start: f.cur.Load(), Current: &f.cur,
				ClientAddr: c.RemoteAddr().(*net.TCPAddr).AddrPort()})
		}}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(l)
	f.t.Cleanup(func() { srv.Close() })
	f.l7 = l
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", l.Addr().String())
		},
		DisableCompression: true,
		Protocols:          new(http.Protocols),
	}
	if h2c {
		tr.Protocols.SetUnencryptedHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	f.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// extendedConnect opens an RFC 8441 WebSocket stream to path over c, a
// connection to net/http's h2c server (serveL7; TestMain has it take
// extended CONNECT), and returns its answer's :status. Go's HTTP/2 clients refuse to send :protocol
// (go.dev/issue/53208): it speaks frames through x/net/http2's Framer.
func extendedConnect(t *testing.T, c net.Conn, path string) string {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for opened := false; ; {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("read frame: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() || opened {
				continue
			}
			if v, ok := f.Value(http2.SettingEnableConnectProtocol); !ok || v != 1 {
				t.Fatal("the server does not take extended CONNECT")
			}
			var hb bytes.Buffer
			enc := hpack.NewEncoder(&hb)
			for _, kv := range [][2]string{{":method", "CONNECT"}, {":protocol", "websocket"}, {":scheme", "http"},
				{":path", path}, {":authority", "echo.b.svc"}, {"sec-websocket-version", "13"}} {
				enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
			}
			fr.WriteSettingsAck()
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
				t.Fatal(err)
			}
			opened = true
		case *http2.MetaHeadersFrame:
			return f.PseudoValue("status")
		case *http2.RSTStreamFrame:
			t.Fatalf("stream reset: %v", f.ErrCode)
		}
	}
}

// TestStreamByteNotHeld: a streamed answer's byte that came alone (a
// heartbeat, a line's end flushed on its own) reaches the app at once,
// not with the backend's next write.
func TestStreamByteNotHeld(t *testing.T) {
	for _, proto := range []snapshot.Protocol{snapshot.ProtocolH2C, snapshot.ProtocolHTTP11} {
		t.Run(string(proto), func(t *testing.T) {
			next := make(chan struct{})
			ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for _, b := range []string{"first event\n", "x", "last"} {
					io.WriteString(w, b)
					w.(http.Flusher).Flush()
					select {
					case <-next:
					case <-r.Context().Done():
						return
					}
				}
			}))
			f := newFixture(t, Config{}, snapshot.Backend{Protocol: proto, Endpoints: []snapshot.Endpoint{ep}})
			resp, err := f.serveL7(true).Get("http://echo.b.svc/stream")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			for _, want := range []string{"first event\n", "x"} {
				got := make([]byte, len(want))
				done := make(chan error, 1)
				go func() { _, err := io.ReadFull(resp.Body, got); done <- err }()
				select {
				case err := <-done:
					if err != nil || string(got) != want {
						t.Fatalf("read %q, %v; want %q", got, err, want)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%q did not arrive before the backend's next write", want)
				}
				next <- struct{}{}
			}
		})
	}
}

// TestStreamHeadNotHeld: a streamed answer's head reaches the app before
// its first event, which may come much later (server-sent events, an MCP
// stream). net/http's server sent it with the first body bytes.
func TestStreamHeadNotHeld(t *testing.T) {
	for _, proto := range []snapshot.Protocol{snapshot.ProtocolH2C, snapshot.ProtocolHTTP11} {
		t.Run(string(proto), func(t *testing.T) {
			first := make(chan struct{})
			ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.(http.Flusher).Flush()
				select {
				case <-first:
					io.WriteString(w, "data: first\n\n")
				case <-r.Context().Done():
				}
			}))
			f := newFixture(t, Config{}, snapshot.Backend{Protocol: proto, Endpoints: []snapshot.Endpoint{ep}})
			c := f.serveL7(true)
			head := make(chan *http.Response, 1)
			go func() {
				resp, err := c.Get("http://echo.b.svc/events")
				if err != nil {
					t.Error(err)
				}
				head <- resp
			}()
			var resp *http.Response
			select {
			case resp = <-head:
				close(first)
			case <-time.After(10 * time.Second):
				t.Error("the head did not arrive before the first event")
				close(first)
				resp = <-head
			}
			if resp == nil {
				return
			}
			defer resp.Body.Close()
			if b, err := io.ReadAll(resp.Body); string(b) != "data: first\n\n" || err != nil {
				t.Errorf("events %q, %v", b, err)
			}
		})
	}
}

// TestSizedHeadNotHeld: the head and first bytes of a sized answer reach
// an HTTP/2 app while the backend pauses mid-body. net/http's server held
// them in its 4 KiB buffer until the rest came.
func TestSizedHeadNotHeld(t *testing.T) {
	for _, proto := range []snapshot.Protocol{snapshot.ProtocolH2C, snapshot.ProtocolHTTP11} {
		t.Run(string(proto), func(t *testing.T) {
			rest := make(chan struct{})
			ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "200")
				io.WriteString(w, strings.Repeat("a", 100))
				w.(http.Flusher).Flush()
				select {
				case <-rest:
					io.WriteString(w, strings.Repeat("b", 100))
				case <-r.Context().Done():
				}
			}))
			f := newFixture(t, Config{}, snapshot.Backend{Protocol: proto, Endpoints: []snapshot.Endpoint{ep}})
			c := f.serveL7(true)
			first := make(chan string, 1)
			var resp *http.Response
			go func() {
				var err error
				if resp, err = c.Get("http://echo.b.svc/sized"); err != nil {
					t.Error(err)
					first <- ""
					return
				}
				b := make([]byte, 100)
				_, err = io.ReadFull(resp.Body, b)
				first <- fmt.Sprint(string(b), err)
			}()
			select {
			case got := <-first:
				close(rest)
				if want := strings.Repeat("a", 100) + "<nil>"; got != want {
					t.Errorf("first bytes %q, want %q", got, want)
				}
			case <-time.After(10 * time.Second):
				t.Error("the head and first bytes did not arrive before the rest of the body")
				close(rest)
				<-first
			}
			if resp == nil {
				return
			}
			defer resp.Body.Close()
			if b, err := io.ReadAll(resp.Body); string(b) != strings.Repeat("b", 100) || err != nil {
				t.Errorf("rest %q, %v", b, err)
			}
		})
	}
}

// TestStreamedBodyAfterRefusedConnect: a request whose body streams (an
// HTTP/2 upload, a gRPC call: no Content-Length) goes to another endpoint
// when its endpoint refuses the connection, as one with a sized body
// does: none of its body was read.
func TestStreamedBodyAfterRefusedConnect(t *testing.T) {
	for _, proto := range []snapshot.Protocol{snapshot.ProtocolH2C, snapshot.ProtocolHTTP11} {
		t.Run(string(proto), func(t *testing.T) {
			ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				w.Write(b)
			}))
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			refused := snapshot.Endpoint{Addr: l.Addr().(*net.TCPAddr).AddrPort(), Ready: true, Serving: true}
			l.Close()
			f := newFixture(t, Config{}, snapshot.Backend{Protocol: proto, Endpoints: []snapshot.Endpoint{refused, ep}})
			c := f.serveL7(true)
			// Endpoints take turns: one of the two requests is sent to
			// the refusing one first.
			for i := range 2 {
				pr, pw := io.Pipe()
				go func() {
					io.WriteString(pw, "streamed body")
					pw.Close()
				}()
				resp, err := c.Post("http://echo.b.svc/upload", "text/plain", pr)
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(b) != "streamed body" || err != nil {
					t.Fatalf("request %d: %d %q %v, want 200 with the body", i, resp.StatusCode, b, err)
				}
			}
		})
	}
}

// TestInformationalAfterEnd: a 1xx the backend sends as the app's request
// ends (here the app leaves on the first of a stream of 103s) is dropped.
// net/http's HTTP/2 transport may deliver it from its read loop after the
// round trip returned, and passing it on to the finished request panicked
// there, where nothing recovers: the proxy ended.
func TestInformationalAfterEnd(t *testing.T) {
	ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		for r.Context().Err() == nil {
			w.WriteHeader(http.StatusEarlyHints)
		}
	}))
	f := newFixture(t, Config{}, snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: []snapshot.Endpoint{ep}})
	c := f.serveL7(true)
	for range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got1xxResponse: func(int, textproto.MIMEHeader) error {
			cancel()
			return nil
		}})
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://echo.b.svc/hints", nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
		}
		cancel()
	}
}

// TestUploadAnsweredWhileSent: an HTTP/1.1 app's request body of known
// length goes on to the backend after the backend's answer started (a
// streaming echo, progress reported during an upload), each piece as it
// comes. net/http's HTTP/1 server reads and drops what is left of a
// request body when the answer starts, unless the handler is full duplex,
// and the HTTP/1.1 transport held such a body's pieces in its writer until
// the end: the backend never got the rest, and an app waiting for the
// answer to send more waited forever.
func TestUploadAnsweredWhileSent(t *testing.T) {
	for _, proto := range []snapshot.Protocol{snapshot.ProtocolH2C, snapshot.ProtocolHTTP11} {
		t.Run(string(proto), func(t *testing.T) {
			ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.NewResponseController(w).EnableFullDuplex()
				buf := make([]byte, 1024)
				for {
					n, err := r.Body.Read(buf)
					if n > 0 {
						w.Write(buf[:n])
						w.(http.Flusher).Flush()
					}
					if err != nil {
						return
					}
				}
			}))
			f := newFixture(t, Config{}, snapshot.Backend{Protocol: proto, Endpoints: []snapshot.Endpoint{ep}})
			f.serveL7(false)
			c, err := net.Dial("tcp", f.l7.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			piece := strings.Repeat("a", 1024)
			// Each piece after the first is sent once the one before came back.
			io.WriteString(c, "POST /echo HTTP/1.1\r\nHost: echo.b.svc\r\nContent-Length: 4096\r\n\r\n"+piece)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("answer head: %v", err)
			}
			buf := make([]byte, len(piece))
			for i := range 4 {
				if _, err := io.ReadFull(resp.Body, buf); err != nil {
					t.Fatalf("echo of piece %d: %v", i, err)
				}
				if i < 3 {
					io.WriteString(c, piece)
				}
			}
		})
	}
}

// TestRequestTargetKept: the backend gets the request target as the app
// sent it — an empty query ("/p?"), escapes and characters net/http's URL
// would spell otherwise ({, |, ^, UTF-8) — from HTTP/1.1 apps on the fast
// path and net/http's, and h2c apps, to HTTP/1.1 and h2c backends, with
// and without a body.
func TestRequestTargetKept(t *testing.T) {
	targets := []string{"/p?", "/p?x=%2F&y=a;b", "/a%2Fb;c=d/%2f", "/p{x}|y^z", "/caf\xc3\xa9?q=\xc3\xa9"}
	for _, proto := range []snapshot.Protocol{snapshot.ProtocolHTTP11, snapshot.ProtocolH2C} {
		t.Run(string(proto), func(t *testing.T) {
			ep := startBackend(t, http.HandlerFunc(echoHeaders))
			f := newFixture(t, Config{}, snapshot.Backend{Protocol: proto, Endpoints: []snapshot.Endpoint{ep}})
			h2c := f.serveL7(true)
			for _, target := range targets {
				for _, method := range []string{http.MethodGet, http.MethodPost} {
					want := method + " " + target
					for front, c := range map[string]*client{"fast": f.dial(), "nethttp": f.dialL7()} {
						c.send(method + " " + target + " HTTP/1.1\r\nHost: echo.b.svc\r\nContent-Length: 1\r\n\r\nx")
						if _, body := c.read(method); !strings.HasPrefix(field(body, "line"), want+" ") {
							t.Errorf("%s: %s reached the backend as %q", front, want, field(body, "line"))
						}
					}
					path, query, _ := strings.Cut(target, "?")
					u := &url.URL{Scheme: "http", Host: "echo.b.svc", Opaque: path, RawQuery: query, ForceQuery: strings.HasSuffix(target, "?")}
					resp, err := h2c.Do(&http.Request{Method: method, URL: u, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("x")), ContentLength: 1})
					if err != nil {
						t.Fatalf("h2c %s: %v", want, err)
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if got := field(string(body), "line"); !strings.HasPrefix(got, want+" ") {
						t.Errorf("h2c: %s reached the backend as %q", want, got)
					}
				}
			}
		})
	}
}

// TestSpaceInTargetRefused: an HTTP/2 app's :path with a space, which
// net/http's server takes and no HTTP/1.1 request line can carry, is
// refused (400), as the fast path refuses such a request line; it reached
// the backend as "GET /a HTTP/1.1 HTTP/1.1".
func TestSpaceInTargetRefused(t *testing.T) {
	f := newFixture(t, Config{}, snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: []snapshot.Endpoint{serveRaw(t, echoHead)}})
	u := &url.URL{Scheme: "http", Host: "echo.b.svc", Opaque: "/a HTTP/1.1"}
	resp, err := f.serveL7(true).Do(&http.Request{Method: http.MethodGet, URL: u, Header: http.Header{}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("%s %q, want 400", resp.Status, body)
	}
}

// TestTETrailersKept: an app that accepts trailers says so to the backend
// as "TE: trailers" (gRPC needs it), also when an HTTP/1.1 app lists TE in
// Connection, as it must; other transfer codings stay on the app's hop.
// An HTTP/1.1 backend gets TE listed in Connection too (RFC 9110
// §10.1.4), from each path (it got none); an HTTP/2 one has no
// Connection field.
func TestTETrailersKept(t *testing.T) {
	for _, proto := range []snapshot.Protocol{snapshot.ProtocolHTTP11, snapshot.ProtocolH2C} {
		t.Run(string(proto), func(t *testing.T) {
			ep := startBackend(t, http.HandlerFunc(echoHeaders))
			f := newFixture(t, Config{}, snapshot.Backend{Protocol: proto, Endpoints: []snapshot.Endpoint{ep}})
			h2 := f.serveL7(true)
			check := func(front, fields, body, want string) {
				t.Helper()
				connection := ""
				if proto == snapshot.ProtocolHTTP11 && want != "" {
					connection = "TE"
				}
				if te, c := field(body, "Te"), field(body, "Connection"); te != want || c != connection {
					t.Errorf("%s: %q reached the backend with TE %q, Connection %q; want %q, %q", front, fields, te, c, want, connection)
				}
			}
			for _, tc := range []struct{ fields, want string }{
				{"TE: trailers\r\nConnection: TE\r\n", "trailers"},
				{"TE: deflate, trailers\r\nConnection: keep-alive, te\r\n", "trailers"},
				{"TE: trailers\r\n", "trailers"},
				{"TE: deflate\r\nConnection: TE\r\n", ""},
			} {
				for front, c := range map[string]*client{"fast": f.dial(), "nethttp": f.dialL7()} {
					c.send("GET /p HTTP/1.1\r\nHost: echo.b.svc\r\n" + tc.fields + "\r\n")
					_, body := c.read(http.MethodGet)
					check(front, tc.fields, body, tc.want)
				}
			}
			req, err := http.NewRequest(http.MethodGet, "http://echo.b.svc/p", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("TE", "trailers")
			resp, err := h2.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			check("h2c", "te: trailers", string(body), "trailers")
		})
	}
}

// TestUnannouncedTrailersKept: the trailers of an HTTP/1.1 app's chunked
// body reach an HTTP/1.1 backend, from the fast path and from net/http's,
// also when no Trailer field announced them (RFC 9112 §7.1.2 lets a
// sender leave them unannounced); net/http's request writer dropped such
// trailers.
func TestUnannouncedTrailersKept(t *testing.T) {
	ep := startBackend(t, http.HandlerFunc(echoHeaders))
	f := newFixture(t, Config{}, snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: []snapshot.Endpoint{ep}})
	f.serveL7(false)
	for front, c := range map[string]*client{"fast": f.dial(), "nethttp": f.dialL7()} {
		for _, announce := range []string{"", "Trailer: X-Sum\r\n"} {
			c.send("POST / HTTP/1.1\r\nHost: echo.b.svc\r\nTransfer-Encoding: chunked\r\n" + announce + "\r\n" +
				"3\r\nabc\r\n0\r\nX-Sum: 1\r\nX-Other: 2\r\n\r\n")
			_, body := c.read(http.MethodPost)
			if field(body, "body") != "3" || field(body, "trailer X-Sum") != "1" || field(body, "trailer X-Other") != "2" {
				t.Errorf("%s, announced %q: the backend saw\n%s\nwant the body and both trailers", front, announce, body)
			}
		}
	}
}

// TestAnnouncedTrailersWithLength: trailers an HTTP/2 backend announced
// reach an HTTP/1.1 app, also when the answer has a length too (Go's
// HTTP/2 server sends one for a short body): it goes chunked, the framing
// that carries trailers, as the backend's own HTTP/1.1 answer would.
func TestAnnouncedTrailersWithLength(t *testing.T) {
	ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Checksum")
		io.WriteString(w, "abc")
		w.Header().Set("X-Checksum", "900150983cd24fb0")
	}))
	f := newFixture(t, Config{}, snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: []snapshot.Endpoint{ep}})
	f.serveL7(false)
	for front, c := range map[string]*client{"fast": f.dial(), "nethttp": f.dialL7()} {
		c.send("GET / HTTP/1.1\r\nHost: echo.b.svc\r\nTE: trailers\r\n\r\n")
		if resp, body := c.read(http.MethodGet); body != "abc" || resp.Trailer.Get("X-Checksum") != "900150983cd24fb0" {
			t.Errorf("%s: body %q, trailers %v; want abc and X-Checksum", front, body, resp.Trailer)
		}
	}
}

// TestHostlessRequestNamesTheService: an HTTP/1.0 request without Host
// reaches HTTP/1.1 and h2c backends with the Service's address, the one
// the app connected to (RFC 9112 §3.3), from the fast path and net/http's
// alike.
func TestHostlessRequestNamesTheService(t *testing.T) {
	for _, proto := range []snapshot.Protocol{snapshot.ProtocolHTTP11, snapshot.ProtocolH2C} {
		t.Run(string(proto), func(t *testing.T) {
			ep := startBackend(t, http.HandlerFunc(echoHeaders))
			f := newFixture(t, Config{}, snapshot.Backend{Protocol: proto, Endpoints: []snapshot.Endpoint{ep}})
			f.serveL7(false)
			for _, req := range []string{"GET / HTTP/1.0\r\n\r\n", "POST / HTTP/1.0\r\nContent-Length: 1\r\n\r\nx"} {
				// HTTP/1.0: one request per connection.
				for front, c := range map[string]*client{"fast": f.dial(), "nethttp": f.dialL7()} {
					c.send(req)
					if _, body := c.read(""); field(body, "host") != vip.String() {
						t.Errorf("%s: %q reached the backend with Host %q, want %s", front, req, field(body, "host"), vip)
					}
				}
			}
		})
	}
}

// TestUpgradeIgnoredInHTTP10: an HTTP/1.0 request's Upgrade is ignored
// (RFC 9110 §7.8: a server MUST), on the fast path and net/http's alike:
// the backend gets an ordinary request, not a WebSocket upgrade.
func TestUpgradeIgnoredInHTTP10(t *testing.T) {
	ep := startBackend(t, http.HandlerFunc(echoHeaders))
	f := newFixture(t, Config{}, snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: []snapshot.Endpoint{ep}})
	f.serveL7(false)
	for front, c := range map[string]*client{"fast": f.dial(), "nethttp": f.dialL7()} {
		c.send("GET / HTTP/1.0\r\nHost: echo.b.svc\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
		resp, body := c.read(http.MethodGet)
		if resp.StatusCode != http.StatusOK || field(body, "Upgrade") != "" || field(body, "Connection") != "" {
			t.Errorf("%s: %s; the backend got Upgrade %q, Connection %q; want 200 and neither",
				front, resp.Status, field(body, "Upgrade"), field(body, "Connection"))
		}
	}
}

// echoHead is a raw HTTP/1.1 backend that answers each request with its
// head as it arrived (the request must have no body).
func echoHead(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		var head strings.Builder
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if line == "\r\n" {
				break
			}
			head.WriteString(line)
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", head.Len(), head.String())
	}
}

// TestEmptyBodyLength: a bodiless request whose app sent Content-Length: 0
// reaches an HTTP/1.1 backend with it (RFC 9110 §8.6; a server may answer
// 411 without), from the fast path and net/http's. (Go's HTTP/2 client
// sends content-length 0 only for POST, PUT and PATCH, which Request.Write
// sends it for too.)
func TestEmptyBodyLength(t *testing.T) {
	f := newFixture(t, Config{}, snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: []snapshot.Endpoint{serveRaw(t, echoHead)}})
	f.serveL7(false)
	for _, method := range []string{http.MethodPost, http.MethodDelete} {
		for front, c := range map[string]*client{"fast": f.dial(), "nethttp": f.dialL7()} {
			c.send(method + " / HTTP/1.1\r\nHost: echo.b.svc\r\nContent-Length: 0\r\n\r\n")
			if _, head := c.read(method); !strings.Contains(head, "\r\nContent-Length: 0\r\n") {
				t.Errorf("%s: %s with Content-Length: 0 reached the backend as\n%s", front, method, head)
			}
		}
	}
}

// TestExpectContinueAwaitsBackend: an HTTP/1.1 app's request that expects
// 100 Continue gets it only when the backend asks for the body, on
// net/http's path as on the fast path, to HTTP/1.1 and h2c backends: a
// backend that refuses the upload (401) answers before the app sends it,
// and one that reads it gets it after its 100.
func TestExpectContinueAwaitsBackend(t *testing.T) {
	for _, proto := range []snapshot.Protocol{snapshot.ProtocolHTTP11, snapshot.ProtocolH2C} {
		t.Run(string(proto), func(t *testing.T) {
			ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/refuse" {
					w.WriteHeader(http.StatusUnauthorized)
					return
				}
				echoHeaders(w, r)
			}))
			f := newFixture(t, Config{}, snapshot.Backend{Protocol: proto, Endpoints: []snapshot.Endpoint{ep}})
			f.serveL7(false)
			for front, dial := range map[string]func() *client{"fast": f.dial, "nethttp": f.dialL7} {
				c := dial()
				c.send("POST /refuse HTTP/1.1\r\nHost: echo.b.svc\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
				if resp, _ := c.read(http.MethodPost); resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("%s: refused upload answered %s first, want 401", front, resp.Status)
				}
				c = dial()
				c.send("POST /echo HTTP/1.1\r\nHost: echo.b.svc\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
				if resp, _ := c.read(http.MethodPost); resp.StatusCode != http.StatusContinue {
					t.Fatalf("%s: upload answered %s first, want 100", front, resp.Status)
				}
				c.send("hello")
				if resp, body := c.read(http.MethodPost); resp.StatusCode != http.StatusOK || field(body, "body") != "5" {
					t.Errorf("%s: upload after 100 answered %s with %q, want 200 and the body", front, resp.Status, body)
				}
			}
		})
	}
}

// TestDateAdded: an answer the backend sent without Date reaches an
// HTTP/1.1 app with one (RFC 9110 §6.6.1: a recipient with a clock that
// forwards it MUST append one), from the fast path (plain heads and
// others, HTTP/1.1 and h2c backends) as from net/http's server, which adds
// it; one the backend dated keeps its own, alone; the proxy's own answers
// are dated too. The fast path forwarded them undated.
func TestDateAdded(t *testing.T) {
	const backendDate = "Sun, 06 Nov 1994 08:49:37 GMT"
	answers := map[string]string{
		"/plain":   "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"/chunked": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"/dated":   "HTTP/1.1 200 OK\r\nDate: " + backendDate + "\r\nContent-Length: 2\r\n\r\nok",
		"/dated-chunked": "HTTP/1.1 200 OK\r\nDate: " + backendDate + "\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"2\r\nok\r\n0\r\n\r\n",
	}
	h1 := serveRaw(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.WriteString(c, answers[req.URL.Path])
		}
	})
	h2c := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/dated" {
			w.Header()["Date"] = nil // net/http's server adds none then
		} else {
			w.Header().Set("Date", backendDate)
		}
		io.WriteString(w, "ok")
	}))
	start := time.Now().Truncate(time.Second)
	for _, c := range []struct {
		name  string
		be    snapshot.Backend
		paths []string
	}{
		{"http11", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: []snapshot.Endpoint{h1}},
			[]string{"/plain", "/chunked", "/dated", "/dated-chunked"}},
		{"h2c", snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: []snapshot.Endpoint{h2c}}, []string{"/plain", "/dated"}},
		{"proxy's own answer", snapshot.Backend{}, []string{"/"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, Config{}, c.be)
			f.serveL7(false)
			for front, cl := range map[string]*client{"fast": f.dial(), "nethttp": f.dialL7()} {
				for _, p := range c.paths {
					cl.send("GET " + p + " HTTP/1.1\r\nHost: echo.b.svc\r\n\r\n")
					resp, _ := cl.read(http.MethodGet)
					dates := resp.Header["Date"]
					if len(dates) != 1 {
						t.Errorf("%s %s: %s with Date %q, want one", front, p, resp.Status, dates)
						continue
					}
					d, err := http.ParseTime(dates[0])
					switch {
					case strings.HasPrefix(p, "/dated"):
						if dates[0] != backendDate {
							t.Errorf("%s %s: Date %q, want the backend's %q", front, p, dates[0], backendDate)
						}
					case err != nil || d.Before(start) || !strings.HasSuffix(dates[0], " GMT"):
						t.Errorf("%s %s: Date %q (%v), want the time it was forwarded, in GMT", front, p, dates[0], err)
					}
				}
			}
		})
	}
}

// TestUpgradeRequiredKeepsUpgrade: a backend's 426 reaches an HTTP/1.1
// app with its Upgrade field and the "upgrade" connection option (RFC
// 9110 §15.5.22: a 426 MUST carry Upgrade; §7.8: with that option), from
// the fast path and net/http's, also when the backend listed no option
// and when the app asked to close; an HTTP/1.0 app, which ignores Upgrade
// (§7.8), gets neither, as for any other answer. The proxy removed both
// as hop-by-hop.
func TestUpgradeRequiredKeepsUpgrade(t *testing.T) {
	ep := serveRaw(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			connection := "Connection: Upgrade\r\n"
			if req.URL.Path == "/no-option" {
				connection = ""
			}
			io.WriteString(c, "HTTP/1.1 426 Upgrade Required\r\nUpgrade: websocket\r\n"+connection+"Content-Length: 0\r\n\r\n")
		}
	})
	f := newFixture(t, Config{}, snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: []snapshot.Endpoint{ep}})
	f.serveL7(false)
	for _, c := range []struct {
		name, req string
		upgrade   bool
	}{
		{"option", "GET / HTTP/1.1\r\nHost: echo.b.svc\r\n\r\n", true},
		{"no option", "GET /no-option HTTP/1.1\r\nHost: echo.b.svc\r\n\r\n", true},
		{"close", "GET / HTTP/1.1\r\nHost: echo.b.svc\r\nConnection: close\r\n\r\n", true},
		{"http/1.0", "GET / HTTP/1.0\r\nHost: echo.b.svc\r\n\r\n", false},
	} {
		for front, cl := range map[string]*client{"fast": f.dial(), "nethttp": f.dialL7()} {
			cl.send(c.req)
			// Read as sent: net/http's parser drops a Connection that says close.
			tp := textproto.NewReader(cl.r)
			status, err := tp.ReadLine()
			if err != nil {
				t.Fatalf("%s, %s: %v", c.name, front, err)
			}
			h, err := tp.ReadMIMEHeader()
			if err != nil {
				t.Fatalf("%s, %s: %v", c.name, front, err)
			}
			upgrade, option := h.Get("Upgrade"), httpguts.HeaderValuesContainsToken(h["Connection"], "upgrade")
			switch {
			case !strings.Contains(status, " 426 "):
				t.Errorf("%s, %s: %s, want 426", c.name, front, status)
			case c.upgrade && (upgrade != "websocket" || !option):
				t.Errorf("%s, %s: Upgrade %q, Connection %q; want websocket and upgrade", c.name, front, upgrade, h["Connection"])
			case !c.upgrade && (upgrade != "" || option):
				t.Errorf("%s, %s: Upgrade %q, Connection %q; want neither", c.name, front, upgrade, h["Connection"])
			case c.name == "close" && !httpguts.HeaderValuesContainsToken(h["Connection"], "close"):
				t.Errorf("%s, %s: Connection %q, want close too", c.name, front, h["Connection"])
			}
		}
	}
}

// TestMaxForwards: a TRACE or OPTIONS request whose Max-Forwards is 0 is
// answered by the proxy as its final recipient, on the fast path and
// net/http's (HTTP/1.1 and HTTP/2 apps), never reaching the backend: an
// OPTIONS (also "OPTIONS *") with a 200 without content, a TRACE with its
// head, less the fields that may carry credentials (RFC 9110 §7.6.2,
// §9.3.8). A larger one reaches the backend one less; one that is no
// number, or another method's, as it came. The proxy forwarded them all
// as they came.
func TestMaxForwards(t *testing.T) {
	var reached atomic.Int32
	ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		echoHeaders(w, r)
	}))
	f := newFixture(t, Config{}, snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: []snapshot.Endpoint{ep}})
	h2c := f.serveL7(true)
	const secrets = "Authorization: Basic c2VjcmV0\r\nProxy-Authorization: Basic c2VjcmV0\r\nCookie: id=secret\r\n"
	answered := 0 // by the proxy, counted as no backend's
	for _, c := range []struct {
		name, method, target, fields, body string
		forwarded                          string // the Max-Forwards the backend sees; "" for none: answered
	}{
		{"trace", http.MethodTrace, "/t", "Max-Forwards: 0\r\nX-Keep: 1\r\n" + secrets, "", ""},
		{"options", http.MethodOptions, "/o", "Max-Forwards: 0\r\n", "", ""},
		{"options *", http.MethodOptions, "*", "Max-Forwards: 0\r\n", "", ""},
		{"trace, one more hop", http.MethodTrace, "/t", "Max-Forwards: 1\r\n", "", "0"},
		{"options, more hops", http.MethodOptions, "/o", "Max-Forwards: 10\r\n", "", "9"},
		{"options with a body", http.MethodOptions, "/o", "Max-Forwards: 3\r\nContent-Length: 2\r\n", "hi", "2"},
		{"not a number", http.MethodTrace, "/t", "Max-Forwards: -1\r\n", "", "-1"},
		{"another method", http.MethodGet, "/g", "Max-Forwards: 0\r\n", "", "0"},
	} {
		for front, cl := range map[string]*client{"fast": f.dial(), "nethttp": f.dialL7()} {
			before := reached.Load()
			cl.send(c.method + " " + c.target + " HTTP/1.1\r\nHost: echo.b.svc\r\n" + c.fields + "\r\n" + c.body)
			resp, got := cl.read(c.method)
			checkMaxForwards(t, c.name+", "+front, resp, got, c.forwarded, reached.Load() > before)
		}
		if c.forwarded == "" {
			answered += 2
		}
		if c.target == "*" {
			continue // Go's HTTP/2 client sends no "*"
		}
		req, err := http.NewRequest(c.method, "http://echo.b.svc"+c.target, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		h, err := textproto.NewReader(bufio.NewReader(strings.NewReader(c.fields + "\r\n"))).ReadMIMEHeader()
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(req.Header, http.Header(h))
		delete(req.Header, "Content-Length") // the client's own
		before := reached.Load()
		resp, err := h2c.Do(req)
		if err != nil {
			t.Fatalf("%s, h2c: %v", c.name, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		checkMaxForwards(t, c.name+", h2c", resp, string(got), c.forwarded, reached.Load() > before)
		if c.forwarded == "" {
			answered++
		}
	}
	if n := f.counter("sockmesh_proxy_requests_total", map[string]string{"protocol": "none", "code": "200"}); n != float64(answered) {
		t.Errorf("%v answers counted with protocol none, want %d", n, answered)
	}
}

// checkMaxForwards checks a TestMaxForwards answer: from the backend
// (reached) with the Max-Forwards forwarded, or, forwarded empty, the
// proxy's own.
func checkMaxForwards(t *testing.T, name string, resp *http.Response, body, forwarded string, reached bool) {
	t.Helper()
	switch {
	case forwarded != "":
		if !reached || resp.StatusCode != http.StatusOK || field(body, "Max-Forwards") != forwarded {
			t.Errorf("%s: %s, the backend saw\n%s\nwant Max-Forwards %s", name, resp.Status, body, forwarded)
		}
	case reached || resp.StatusCode != http.StatusOK:
		t.Errorf("%s: %s, reached the backend %v; want 200 from the proxy", name, resp.Status, reached)
	case resp.Request.Method == http.MethodOptions:
		if resp.ContentLength != 0 || body != "" {
			t.Errorf("%s: Content-Length %d, body %q; want 0", name, resp.ContentLength, body)
		}
	default:
		line := "TRACE /t " + resp.Proto // as the app sent it
		if resp.Header.Get("Content-Type") != "message/http" || !strings.HasPrefix(body, line+"\r\nHost: echo.b.svc\r\n") ||
			!strings.Contains(body, "\r\nX-Keep: 1\r\n") || strings.Contains(body, "secret") || !strings.HasSuffix(body, "\r\n\r\n") {
			t.Errorf("%s: Content-Type %q, body\n%s\nwant message/http, the head without the credentials", name, resp.Header.Get("Content-Type"), body)
		}
	}
}

// TestBrokenBodyNoFalseAnswer: a request whose body breaks off or is
// malformed (brokenBodies), forwarded as it streams, kept for a rule's
// retries or read for its ExternalAuth server, gets 400 on both L7 paths —
// never an answer that says the backend or the authorization server took
// it, or failed it. The fast path ended a body it read itself (kept, or
// for the authorization server) with no answer, where its forward answers
// 400. net/http's HTTP/1 server cancels a request at the app's half-close:
// the canceled request got the clean, empty 200 the server sends for a
// handler that wrote nothing, then no answer at all, where the fast path
// answers 400; and a body read for the authorization server that broke
// off failed as ext_auth_error (503), the server never asked. A malformed
// one forwarded from net/http's HTTP/1 server got 502 upstream_error: the
// transport gave up on the backend as the body broke, and said only that.
func TestBrokenBodyNoFalseAnswer(t *testing.T) {
	for _, l7 := range []bool{false, true} {
		for _, kind := range brokenBodyKinds {
			for _, b := range brokenBodies {
				for _, proto := range []snapshot.Protocol{snapshot.ProtocolHTTP11, snapshot.ProtocolH2C} {
					t.Run(fmt.Sprintf("l7=%v/%s/%s/%s", l7, kind, b.name, proto), func(t *testing.T) {
						fx := newFixture(t, Config{}, snapshot.Backend{})
						asked := brokenBodyRoute(fx, kind, proto)
						cl := fx.dial()
						if l7 {
							fx.serveL7(false)
							cl = fx.dialL7()
						}
						cl.c.SetDeadline(time.Now().Add(10 * time.Second))
						cl.send(b.send)
						if b.halfClose {
							cl.c.(*net.TCPConn).CloseWrite()
						}
						resp, err := http.ReadResponse(cl.r, &http.Request{Method: http.MethodPost})
						for err == nil && resp.StatusCode == http.StatusContinue {
							resp, err = http.ReadResponse(cl.r, &http.Request{Method: http.MethodPost})
						}
						if err != nil {
							t.Fatalf("no answer (%v); want 400", err)
						}
						io.Copy(io.Discard, resp.Body)
						if resp.StatusCode != http.StatusBadRequest {
							t.Errorf("answer %s; want 400", resp.Status)
						}
						if !cl.closed() {
							t.Error("connection left open")
						}
						checkNoneBlamed(fx, asked)
						if got := fx.counter("sockmesh_proxy_requests_total", map[string]string{"code": "400"}); got != 1 {
							t.Errorf("requests_total{code=400} = %v, want 1", got)
						}
						if got := fx.counter("sockmesh_proxy_request_failures_total", nil); got != 0 {
							t.Errorf("counted %v failures; want none: the app got its answer", got)
						}
					})
				}
			}
		}
	}
}

// TestBrokenBodyToldLate: net/http's HTTP/1 server cancels a request's
// context inside the read of its body that meets the app's half-close;
// net/http's HTTP/2 Transport then gives up on the request and closes its
// body, and the read tells why the body broke only after. The app still
// gets its 400. It got no answer (canceled): forward looked before the
// read told, and the read's failure, told after the close, was dropped as
// one the close caused (TestBrokenBodyNoFalseAnswer's net/http
// half-close cases failed so now and then under -race). lateFailure
// holds the failed read until the close, as the server's body's Close
// waits for a read under way. (The HTTP/1.1 pool's transport leaves the
// body to the server, which closes it when the handler returns: the same
// hold would never end there.)
func TestBrokenBodyToldLate(t *testing.T) {
	fx := newFixture(t, Config{}, snapshot.Backend{})
	asked := brokenBodyRoute(fx, "plain", snapshot.ProtocolH2C)
	fx.wrapL7 = func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Body = &lateFailure{ReadCloser: r.Body, closed: make(chan struct{})}
			next.ServeHTTP(w, r)
		})
	}
	fx.serveL7(false)
	cl := fx.dialL7()
	cl.c.SetDeadline(time.Now().Add(10 * time.Second))
	cl.send("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nhel")
	cl.c.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(cl.r, &http.Request{Method: http.MethodPost})
	if err != nil {
		t.Fatalf("no answer (%v); want 400", err)
	}
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("answer %s; want 400", resp.Status)
	}
	checkNoneBlamed(fx, asked)
	if got := fx.counter("sockmesh_proxy_request_failures_total", nil); got != 0 {
		t.Errorf("counted %v failures; want none: the app got its answer", got)
	}
}

// lateFailure is a request body whose failed read returns once it is
// closed.
type lateFailure struct {
	io.ReadCloser
	closed chan struct{}
	once   sync.Once
}

func (b *lateFailure) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		<-b.closed
	}
	return n, err
}

func (b *lateFailure) Close() error {
	b.once.Do(func() { close(b.closed) })
	return b.ReadCloser.Close()
}

// TestBrokenBodyAppGone: an app that leaves in the middle of its body —
// an HTTP/1 app resets its connection (on the fast path, or on net/http's
// server), an HTTP/2 app its stream — is counted canceled, not answered,
// whether its body was forwarded, kept for a rule's retries (an HTTP/1
// body that waits for 100 Continue is forwarded instead) or read for the
// authorization server: unlike one whose body a half-close broke off
// (TestBrokenBodyNoFalseAnswer), whose connection can still carry the
// 400. The app waits for the 100 Continue, which the backend (the fast
// path, and a rule's retries forward it the Expect) or net/http's servers
// (at the proxy's first read of the body) send, so that it leaves during
// that read. The fast path counted its 400 as answered.
func TestBrokenBodyAppGone(t *testing.T) {
	for _, app := range []string{"fast", "http1", "http2"} {
		for _, kind := range brokenBodyKinds {
			for _, proto := range []snapshot.Protocol{snapshot.ProtocolHTTP11, snapshot.ProtocolH2C} {
				t.Run(app+"/"+kind+"/"+string(proto), func(t *testing.T) {
					fx := newFixture(t, Config{}, snapshot.Backend{})
					asked := brokenBodyRoute(fx, kind, proto)
					switch app {
					case "fast":
						resetInBody(fx, fx.dial())
					case "http1":
						fx.serveL7(false)
						resetInBody(fx, fx.dialL7())
					default:
						cancelInBody(fx)
					}
					var answered, canceled float64
					for deadline := time.Now().Add(10 * time.Second); answered+canceled == 0; time.Sleep(10 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatal("the request was neither answered nor canceled")
						}
						answered = fx.counter("sockmesh_proxy_requests_total", nil)
						canceled = fx.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": string(upstream.ReasonCanceled)})
					}
					if answered != 0 || canceled != 1 {
						t.Errorf("requests_total = %v, failures{reason=canceled} = %v; want 0, 1", answered, canceled)
					}
					checkNoneBlamed(fx, asked)
				})
			}
		}
	}
}

// resetInBody sends an HTTP/1.1 request on cl and resets its connection
// after part of its body.
func resetInBody(fx *fixture, cl *client) {
	fx.t.Helper()
	cl.c.SetDeadline(time.Now().Add(10 * time.Second))
	cl.send("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n")
	if resp, err := http.ReadResponse(cl.r, &http.Request{Method: http.MethodPost}); err != nil || resp.StatusCode != http.StatusContinue {
		fx.t.Fatalf("answer %v, %v; want 100 Continue", resp, err)
	}
	cl.send("hel")
	cl.c.(*net.TCPConn).SetLinger(0)
	cl.c.Close() // a reset
}

// cancelInBody sends an HTTP/2 request to net/http's server (serveL7) and
// resets its stream (net/http's Transport sends RST_STREAM when a
// request's context ends) after part of its body.
func cancelInBody(fx *fixture) {
	fx.t.Helper()
	c := fx.serveL7(true)
	c.Transport.(*http.Transport).ExpectContinueTimeout = time.Minute // the body waits for the 100
	body, bodyW := io.Pipe()
	defer bodyW.Close()
	continued := make(chan struct{})
	ctx, cancel := context.WithCancel(httptrace.WithClientTrace(context.Background(),
		&httptrace.ClientTrace{Got100Continue: func() { close(continued) }}))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://echo.b.svc/", body)
	if err != nil {
		fx.t.Fatal(err)
	}
	req.ContentLength = 10
	req.Header.Set("Expect", "100-continue")
	done := make(chan error, 1)
	go func() {
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-continued:
	case err := <-done:
		fx.t.Fatalf("answer before 100 Continue (%v); want 100 Continue", err)
	}
	if _, err := io.WriteString(bodyW, "hel"); err != nil {
		fx.t.Fatal(err)
	}
	cancel()
	if err := <-done; err == nil {
		fx.t.Fatal("a request whose stream was reset got its answer")
	}
}

// TestBrokenBodyHTTP2: an HTTP/2 app's request body that breaks while its
// stream stays open (it ends short of the Content-Length it declared, as
// net/http's HTTP/2 Transport sends a body shorter than its ContentLength)
// gets 400, and a gRPC call a trailers-only INTERNAL that names the
// reason, whether the body was forwarded, kept for a rule's retries or
// read for its ExternalAuth server. A gRPC call got a bare 400 (its
// client reads INTERNAL with "unexpected HTTP status code"); a body the
// proxy read itself got no answer at all, its stream reset and the
// request counted canceled, as if the app had left.
func TestBrokenBodyHTTP2(t *testing.T) {
	for _, kind := range brokenBodyKinds {
		for _, grpc := range []bool{false, true} {
			for _, proto := range []snapshot.Protocol{snapshot.ProtocolHTTP11, snapshot.ProtocolH2C} {
				t.Run(fmt.Sprintf("%s/grpc=%v/%s", kind, grpc, proto), func(t *testing.T) {
					fx := newFixture(t, Config{}, snapshot.Backend{})
					asked := brokenBodyRoute(fx, kind, proto)
					req, err := http.NewRequest(http.MethodPost, "http://echo.b.svc/echo.Echo/Unary", strings.NewReader("hello"))
					if err != nil {
						t.Fatal(err)
					}
					req.ContentLength = 10
					want, code := http.StatusBadRequest, "400"
					if grpc {
						req.Header.Set("Content-Type", "application/grpc")
						req.Header.Set("Te", "trailers")
						want, code = http.StatusOK, "200" // trailers-only, counted as it goes out
					}
					resp, err := fx.serveL7(true).Do(req)
					if err != nil {
						t.Fatalf("no answer (%v); want %d", err, want)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != want {
						t.Errorf("answer %s; want %d", resp.Status, want)
					}
					if st, msg := resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message"); grpc && (st != "13" || msg != "sockmesh: bad_request_body") {
						t.Errorf("grpc-status %q, grpc-message %q; want 13 (INTERNAL), sockmesh: bad_request_body", st, msg)
					}
					checkNoneBlamed(fx, asked)
					if got := fx.counter("sockmesh_proxy_requests_total", map[string]string{"code": code}); got != 1 {
						t.Errorf("requests_total{code=%s} = %v, want 1", code, got)
					}
					if got := fx.counter("sockmesh_proxy_request_failures_total", nil); got != 0 {
						t.Errorf("counted %v failures; want none: the app got its answer", got)
					}
				})
			}
		}
	}
}

// brokenBodyKinds are the ways a request's body reaches the backend that
// brokenBodyRoute sets up.
var brokenBodyKinds = []string{"plain", "retry", "auth"}

// brokenBodyRoute has fx's Service lead to a backend of proto that reads
// its requests' bodies whole: plainly ("plain"), or under a rule whose
// retries have a body of known length kept ("retry"), or whose
// ExternalAuth server gets the body ("auth"); asked tells whether that
// server was asked.
func brokenBodyRoute(fx *fixture, kind string, proto snapshot.Protocol) (asked *atomic.Bool) {
	fx.t.Helper()
	authRef := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: "auth", Port: 80}
	ep := startBackend(fx.t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
	asked = new(atomic.Bool)
	aep := startBackend(fx.t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { asked.Store(true) }))
	be := snapshot.Backend{Protocol: proto, Endpoints: []snapshot.Endpoint{ep}}
	rule := snapshot.RouteRule{Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: backendRef}}}
	switch kind {
	case "plain":
		fx.update(2, be)
		return asked
	case "retry":
		rule.Retry = &snapshot.Retry{Attempts: 1}
	case "auth":
		rule.Filters.ExternalAuth = &snapshot.ExternalAuth{Backend: authRef, MaxBody: 100}
	}
	fx.updateRoutes(2, be, &snapshot.RouteTable{Producer: &snapshot.RouteSet{
		Kind:    snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{{Path: snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/"}}},
		Rules:   []snapshot.RouteRule{rule},
	}}, snapshot.Backend{Ref: authRef, Endpoints: []snapshot.Endpoint{aep}})
	return asked
}

// checkNoneBlamed fails fx's test if a broken body's request was counted
// as the backend's failure or the authorization server's, or that server
// was asked (brokenBodyRoute's asked): the transport gave up on the
// backend as the body broke, and the server never got it.
func checkNoneBlamed(fx *fixture, asked *atomic.Bool) {
	fx.t.Helper()
	if got := fx.counter("sockmesh_proxy_route_answers_total", map[string]string{"reason": "ext_auth_error"}); got != 0 {
		fx.t.Errorf("counted ext_auth_error %v times", got)
	}
	if asked.Load() {
		fx.t.Error("the authorization server was asked about a broken body")
	}
	if got := fx.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": string(upstream.ReasonUpstream)}); got != 0 {
		fx.t.Errorf("counted upstream_error %v times", got)
	}
}

// TestExternalAuthPathEncoded: an HTTP ExternalAuth server gets the
// request's path as the app encoded it, after the filter's prefix — the
// path routes matched and the backend gets. It got the path decoded:
// "/a%2Fb" as "/a/b", another resource than the one it was asked about.
func TestExternalAuthPathEncoded(t *testing.T) {
	authRef := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: "auth", Port: 80}
	for _, l7 := range []bool{false, true} {
		t.Run(fmt.Sprintf("l7=%v", l7), func(t *testing.T) {
			fx := newFixture(t, Config{}, snapshot.Backend{})
			ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			asked := make(chan string, 1)
			aep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { asked <- r.RequestURI }))
			fx.updateRoutes(2, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}}, &snapshot.RouteTable{Producer: &snapshot.RouteSet{
				Kind:    snapshot.KindHTTPRoute,
				Matches: []snapshot.RouteMatch{{Path: snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/"}}},
				Rules: []snapshot.RouteRule{{Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: backendRef}},
					Filters: snapshot.Filters{ExternalAuth: &snapshot.ExternalAuth{Backend: authRef, PathPrefix: "/check"}}}},
			}}, snapshot.Backend{Ref: authRef, Endpoints: []snapshot.Endpoint{aep}})
			cl := fx.dial()
			if l7 {
				fx.serveL7(false)
				cl = fx.dialL7()
			}
			cl.send("GET /a%2Fb/c?x=%2F HTTP/1.1\r\nHost: a\r\n\r\n")
			if resp, _ := cl.read(http.MethodGet); resp.StatusCode != http.StatusOK {
				t.Errorf("l7=%v: answer %s, want 200", l7, resp.Status)
			}
			if got, want := <-asked, "/check/a%2Fb/c?x=%2F"; got != want {
				t.Errorf("l7=%v: the authorization server was asked about %s, want %s", l7, got, want)
			}
		})
	}
}
