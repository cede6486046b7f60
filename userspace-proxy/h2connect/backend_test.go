package h2connect

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sockmesh/sockmesh/internal/leakcheck"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
)

// backend is the server's end of a real TCP connection to Open: a test
// writes it frames through x/net's Framer, as a hostile backend may
// (AllowIllegalWrites), and reads what the proxy sent.
type backend struct {
	t  *testing.T
	c  net.Conn
	fr *http2.Framer
	// dec decodes the proxy's HEADERS; the test sets its table size as
	// its SETTINGS_HEADER_TABLE_SIZE says.
	dec *hpack.Decoder
}

// dialBackend returns the proxy's end of a loopback TCP connection and
// the backend's. Both close in cleanup, after which none of the
// package's goroutines may be left (leakcheck).
func dialBackend(t *testing.T) (net.Conn, *backend) {
	t.Helper()
	leakcheck.Register(t, "/userspace-proxy/h2connect/")
	c, sc := tcpserve.Pair(t)
	b := &backend{t: t, c: sc, fr: http2.NewFramer(sc, sc), dec: hpack.NewDecoder(defaultHeaderTable, nil)}
	b.fr.AllowIllegalWrites = true
	return c, b
}

// opened is what Open returned.
type opened struct {
	resp *http.Response
	err  error
}

// open runs Open on c for a WebSocket to /ws, its context ctx.
func open(ctx context.Context, c net.Conn, h http.Header) <-chan opened {
	return openWith(ctx, c, h, Config{})
}

// openWith is open under cfg.
func openWith(ctx context.Context, c net.Conn, h http.Header, cfg Config) <-chan opened {
	out := make(chan opened, 1)
	go func() {
		resp, err := Open(ctx, c, &Request{Protocol: "websocket", Scheme: "http", Authority: "ws.example", Path: "/ws", Header: h}, cfg)
		out <- opened{resp, err}
	}()
	return out
}

// openAnswered opens a stream that the backend answers 200, and returns
// the backend and the answer, whose body is closed in cleanup.
func openAnswered(t *testing.T) (*backend, *http.Response) {
	t.Helper()
	return openAnsweredWith(t, Config{})
}

// openAnsweredWith is openAnswered under cfg.
func openAnsweredWith(t *testing.T, cfg Config) (*backend, *http.Response) {
	t.Helper()
	c, b := dialBackend(t)
	got := openWith(context.Background(), c, nil, cfg)
	b.open()
	b.headers(id, false, ":status", "200")
	o := <-got
	if o.err != nil {
		t.Fatal(o.err)
	}
	t.Cleanup(func() { o.resp.Body.Close() })
	return b, o.resp
}

// preface reads the proxy's connection preface and the frames it sends
// with it: its SETTINGS and the connection's WINDOW_UPDATE.
func (b *backend) preface() {
	b.t.Helper()
	p := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(b.c, p); err != nil || string(p) != http2.ClientPreface {
		b.t.Fatalf("preface %q, %v", p, err)
	}
	for _, want := range []http2.FrameType{http2.FrameSettings, http2.FrameWindowUpdate} {
		if f, err := b.fr.ReadFrame(); err != nil || f.Header().Type != want {
			b.t.Fatalf("after the preface: %v, %v; want %v", f, err, want)
		}
	}
}

// settings sends SETTINGS enabling extended CONNECT, then extra.
func (b *backend) settings(extra ...http2.Setting) {
	b.t.Helper()
	b.write(b.fr.WriteSettings(append([]http2.Setting{{ID: http2.SettingEnableConnectProtocol, Val: 1}}, extra...)...))
}

// request reads the proxy's frames up to its request's HEADERS and
// returns the request's fields.
func (b *backend) request() []hpack.HeaderField {
	b.t.Helper()
	for {
		f, err := b.fr.ReadFrame()
		if err != nil {
			b.t.Fatalf("waiting for the request: %v", err)
		}
		if h, ok := f.(*http2.HeadersFrame); ok {
			if !h.HeadersEnded() {
				b.t.Fatal("the request came in more than one frame")
			}
			fields, err := b.dec.DecodeFull(h.HeaderBlockFragment())
			if err != nil {
				b.t.Fatalf("decode the request's HEADERS: %v", err)
			}
			return fields
		}
	}
}

// open reads the preface, sends SETTINGS enabling extended CONNECT and
// waits for the request: the stream is open.
func (b *backend) open() {
	b.t.Helper()
	b.preface()
	b.settings()
	b.request()
}

// headers sends a HEADERS on stream sid with the fields in pairs.
func (b *backend) headers(sid uint32, end bool, pairs ...string) {
	b.t.Helper()
	b.write(b.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: block(pairs...), EndStream: end, EndHeaders: true}))
}

// head sends a header block as a HEADERS and the CONTINUATIONs it needs,
// ending the block, not the stream.
func (b *backend) head(sid uint32, blk []byte) {
	b.t.Helper()
	first := blk[:min(len(blk), maxFrame)]
	blk = blk[len(first):]
	b.write(b.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: first, EndHeaders: len(blk) == 0}))
	for len(blk) > 0 {
		next := blk[:min(len(blk), maxFrame)]
		blk = blk[len(next):]
		b.write(b.fr.WriteContinuation(sid, len(blk) == 0, next))
	}
}

// bigBlock HPACK-encodes the pseudo-field name: value and fields of 8 kB
// that add up to size.
func bigBlock(name, value string, size int) []byte {
	pairs := []string{name, value}
	pad := strings.Repeat("0123456789abcdef", 512)
	for i := 0; len(pairs)/2*len(pad) < size; i++ {
		pairs = append(pairs, "x-pad-"+strconv.Itoa(i), pad)
	}
	return block(pairs...)
}

// block HPACK-encodes fields given in pairs.
func block(pairs ...string) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for i := 0; i < len(pairs); i += 2 {
		enc.WriteField(hpack.HeaderField{Name: pairs[i], Value: pairs[i+1]})
	}
	return buf.Bytes()
}

func (b *backend) write(err error) {
	b.t.Helper()
	if err != nil {
		b.t.Fatalf("backend's write: %v", err)
	}
}

// goAway reads what the proxy sends until its GOAWAY, whose code it
// returns, or until the connection ends (ok false).
func (b *backend) goAway() (code http2.ErrCode, ok bool) {
	for {
		f, err := b.fr.ReadFrame()
		if err != nil {
			return 0, false
		}
		if g, isGoAway := f.(*http2.GoAwayFrame); isGoAway {
			return g.ErrCode, true
		}
	}
}
