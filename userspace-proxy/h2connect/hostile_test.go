package h2connect

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestBreaches: a backend that breaks RFC 9113 or RFC 8441, before the
// answer or after it, ends the stream with ErrProtocol — Open's error or
// the stream's read once its buffered DATA are read — and gets a GOAWAY
// with the code the RFC names: nothing it sent past a breach is taken,
// DATA past the window the proxy gave included, and no window grows past
// 2^31-1.
func TestBreaches(t *testing.T) {
	answered := func(b *backend) { b.open(); b.headers(id, false, ":status", "200") }
	for _, tc := range []struct {
		name   string
		script func(b *backend)
		want   http2.ErrCode
		// ended: the stream ended (END_STREAM) before the breach, which
		// then ends only the connection.
		ended bool
	}{
		{"DATA before SETTINGS", func(b *backend) { b.preface(); b.write(b.fr.WriteData(id, false, []byte("x"))) }, http2.ErrCodeProtocol, false},
		{"HEADERS before SETTINGS", func(b *backend) { b.preface(); b.headers(id, false, ":status", "200") }, http2.ErrCodeProtocol, false},
		{"SETTINGS ACK before SETTINGS", func(b *backend) { b.preface(); b.write(b.fr.WriteSettingsAck()) }, http2.ErrCodeProtocol, false},
		{"PING before SETTINGS", func(b *backend) { b.preface(); b.write(b.fr.WritePing(false, [8]byte{})) }, http2.ErrCodeProtocol, false},
		{"INITIAL_WINDOW_SIZE past 2^31-1", func(b *backend) { b.preface(); b.settings(setting(http2.SettingInitialWindowSize, 1<<31)) }, http2.ErrCodeFlowControl, false},
		{"MAX_FRAME_SIZE below 16384", func(b *backend) { b.preface(); b.settings(setting(http2.SettingMaxFrameSize, 16383)) }, http2.ErrCodeProtocol, false},
		{"MAX_FRAME_SIZE past 2^24-1", func(b *backend) { b.preface(); b.settings(setting(http2.SettingMaxFrameSize, 1<<24)) }, http2.ErrCodeProtocol, false},
		{"ENABLE_CONNECT_PROTOCOL 2", func(b *backend) { b.preface(); b.settings(setting(http2.SettingEnableConnectProtocol, 2)) }, http2.ErrCodeProtocol, false},
		{"ENABLE_CONNECT_PROTOCOL taken back", func(b *backend) {
			answered(b)
			b.write(b.fr.WriteSettings(setting(http2.SettingEnableConnectProtocol, 0)))
		}, http2.ErrCodeProtocol, false},
		{"INITIAL_WINDOW_SIZE takes the stream's window past 2^31-1", func(b *backend) {
			answered(b)
			b.write(b.fr.WriteWindowUpdate(id, maxWindow-initialWindow))
			b.write(b.fr.WriteSettings(setting(http2.SettingInitialWindowSize, initialWindow+1)))
		}, http2.ErrCodeFlowControl, false},
		{"WINDOW_UPDATE past 2^31-1 on the connection", func(b *backend) { answered(b); b.write(b.fr.WriteWindowUpdate(0, maxWindow)) }, http2.ErrCodeFlowControl, false},
		{"WINDOW_UPDATE past 2^31-1 on the stream", func(b *backend) { answered(b); b.write(b.fr.WriteWindowUpdate(id, maxWindow)) }, http2.ErrCodeFlowControl, false},
		{"WINDOW_UPDATE of 0", func(b *backend) { answered(b); b.write(b.fr.WriteWindowUpdate(0, 0)) }, http2.ErrCodeProtocol, false},
		{"WINDOW_UPDATE on a stream never opened", func(b *backend) { answered(b); b.write(b.fr.WriteWindowUpdate(3, 1)) }, http2.ErrCodeProtocol, false},
		{"HEADERS on a stream never opened", func(b *backend) { b.open(); b.headers(3, false, ":status", "200") }, http2.ErrCodeProtocol, false},
		{"DATA on a stream never opened", func(b *backend) { answered(b); b.write(b.fr.WriteData(3, false, []byte("x"))) }, http2.ErrCodeProtocol, false},
		{"RST_STREAM on a stream never opened", func(b *backend) { answered(b); b.write(b.fr.WriteRSTStream(3, http2.ErrCodeCancel)) }, http2.ErrCodeProtocol, false},
		{"PUSH_PROMISE", func(b *backend) {
			b.open()
			b.write(b.fr.WritePushPromise(http2.PushPromiseParam{StreamID: id, PromiseID: 2, EndHeaders: true,
				BlockFragment: block(":method", "GET", ":scheme", "http", ":authority", "ws.example", ":path", "/")}))
		}, http2.ErrCodeProtocol, false},
		{"DATA before the answer", func(b *backend) { b.open(); b.write(b.fr.WriteData(id, false, []byte("x"))) }, http2.ErrCodeProtocol, false},
		{"DATA past the window", func(b *backend) {
			answered(b)
			for range window / maxFrame {
				b.write(b.fr.WriteData(id, false, make([]byte, maxFrame)))
			}
			b.write(b.fr.WriteData(id, false, []byte("x")))
		}, http2.ErrCodeFlowControl, false},
		{"padding past the window", func(b *backend) {
			answered(b)
			for range window / maxFrame {
				b.write(b.fr.WriteDataPadded(id, false, make([]byte, maxFrame-256), make([]byte, 255)))
			}
			b.write(b.fr.WriteData(id, false, []byte("x")))
		}, http2.ErrCodeFlowControl, false},
		{"a frame past 16384 bytes", func(b *backend) { answered(b); b.write(b.fr.WriteData(id, false, make([]byte, maxFrame+1))) }, http2.ErrCodeFrameSize, false},
		{"a 1xx with END_STREAM", func(b *backend) { b.open(); b.headers(id, true, ":status", "103") }, http2.ErrCodeProtocol, false},
		{"six 1xx answers", func(b *backend) {
			b.open()
			for range max1xx + 1 {
				b.headers(id, false, ":status", "103")
			}
		}, http2.ErrCodeProtocol, false},
		{"a head past 1 MiB in CONTINUATIONs", func(b *backend) {
			b.open()
			first := block(":status", "200")
			if b.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first}) != nil {
				return
			}
			// Until the proxy ends the connection: a flood, bounded by
			// the head's limit.
			pad := strings.Repeat("0123456789abcdef", maxFrame/32)
			for i := 0; b.fr.WriteContinuation(id, false, block("x-pad-"+strconv.Itoa(i), pad)) == nil; i++ {
			}
		}, http2.ErrCodeProtocol, false},
		{"1xx heads past 1 MiB together", func(b *backend) {
			b.open()
			for range 4 { // each of 300 kB, under the limit alone
				b.head(id, bigBlock(":status", "103", 300<<10))
			}
			b.headers(id, false, ":status", "200")
		}, http2.ErrCodeProtocol, false},
		{"trailers without END_STREAM", func(b *backend) { answered(b); b.headers(id, false, "x-trailer", "1") }, http2.ErrCodeProtocol, false},
		{"HEADERS after END_STREAM", func(b *backend) { b.open(); b.headers(id, true, ":status", "200"); b.headers(id, true, "x", "1") }, http2.ErrCodeStreamClosed, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, b := dialBackend(t)
			got := open(context.Background(), c, nil)
			tc.script(b)
			// What the proxy takes for a breach it sees before the end
			// of the backend's bytes, which would otherwise end the
			// stream with io.EOF.
			b.c.(*net.TCPConn).CloseWrite()
			o := <-got
			err := o.err
			if err == nil {
				// The app reads once the proxy took all the backend
				// sent: a read before would give window back.
				awaitEnd(o.resp.Body.(*Stream))
				_, err = io.Copy(io.Discard, o.resp.Body)
				o.resp.Body.Close()
			}
			code, sent := b.goAway()
			if tc.ended && err != nil || !tc.ended && !errors.Is(err, ErrProtocol) {
				t.Errorf("stream ended with %v, want ErrProtocol unless END_STREAM came first (%v)", err, tc.ended)
			}
			if !sent || code != tc.want {
				t.Errorf("GOAWAY %v (sent: %v), want %v", code, sent, tc.want)
			}
		})
	}
}

// awaitEnd waits until s's reader ended: the backend's bytes did, or a
// breach in them.
func awaitEnd(s *Stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.err == nil {
		s.cond.Wait()
	}
}

func setting(id http2.SettingID, v uint32) http2.Setting { return http2.Setting{ID: id, Val: v} }

// TestAnswers: what a backend may send around its answer reaches the
// caller as HTTP/2 means it: 1xx answers are passed over; a refusal comes
// with its body; trailers end the stream; a GOAWAY that spares the stream
// leaves it be; a RST_STREAM ends it, after the DATA before it. No GOAWAY
// goes back for any of these.
func TestAnswers(t *testing.T) {
	for _, tc := range []struct {
		name       string
		script     func(b *backend)
		status     int
		header     http.Header
		body       string
		wantReadOK bool // the stream ends with io.EOF, not an error
	}{
		{"1xx then 200", func(b *backend) {
			b.headers(id, false, ":status", "100", "x-early", "1")
			b.headers(id, false, ":status", "103", "link", "</a>")
			b.headers(id, false, ":status", "200", "sec-websocket-protocol", "chat")
			b.write(b.fr.WriteData(id, true, []byte("hi")))
		}, 200, http.Header{"Sec-Websocket-Protocol": {"chat"}}, "hi", true},
		{"403 with a body", func(b *backend) {
			b.headers(id, false, ":status", "403", "content-length", "7")
			b.write(b.fr.WriteData(id, true, []byte("denied\n")))
		}, 403, http.Header{"Content-Length": {"7"}}, "denied\n", true},
		{"trailers", func(b *backend) {
			b.headers(id, false, ":status", "200")
			b.write(b.fr.WriteData(id, false, []byte("x")))
			b.headers(id, true, "x-trailer", "1")
		}, 200, http.Header{}, "x", true},
		{"GOAWAY sparing the stream", func(b *backend) {
			b.headers(id, false, ":status", "200")
			b.write(b.fr.WriteGoAway(id, http2.ErrCodeNo, nil))
			b.write(b.fr.WriteData(id, true, []byte("after")))
		}, 200, http.Header{}, "after", true},
		{"RST_STREAM after the answer", func(b *backend) {
			b.headers(id, false, ":status", "200")
			b.write(b.fr.WriteData(id, false, []byte("abc")))
			b.write(b.fr.WriteRSTStream(id, http2.ErrCodeCancel))
		}, 200, http.Header{}, "abc", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, b := dialBackend(t)
			got := open(context.Background(), c, nil)
			b.open()
			tc.script(b)
			o := <-got
			if o.err != nil {
				t.Fatalf("Open: %v", o.err)
			}
			defer o.resp.Body.Close()
			if o.resp.StatusCode != tc.status || !equalHeader(o.resp.Header, tc.header) {
				t.Errorf("answer %d %v, want %d %v", o.resp.StatusCode, o.resp.Header, tc.status, tc.header)
			}
			body, err := io.ReadAll(o.resp.Body)
			if string(body) != tc.body || (err == nil) != tc.wantReadOK {
				t.Errorf("body %q, %v; want %q, ending cleanly: %v", body, err, tc.body, tc.wantReadOK)
			}
			o.resp.Body.Close()
			if code, sent := b.goAway(); sent {
				t.Errorf("the proxy sent GOAWAY %v", code)
			}
		})
	}
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if strings.Join(v, "\x00") != strings.Join(b[k], "\x00") {
			return false
		}
	}
	return true
}

// TestBeforeTheStream: a RST_STREAM of the request, or a GOAWAY that says
// the stream was never processed, fails Open with what the backend said,
// without a GOAWAY of the proxy's: no breach.
func TestBeforeTheStream(t *testing.T) {
	t.Run("RST_STREAM", func(t *testing.T) {
		c, b := dialBackend(t)
		got := open(context.Background(), c, nil)
		b.open()
		b.write(b.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream))
		var se http2.StreamError
		if err := (<-got).err; !errors.As(err, &se) || se.Code != http2.ErrCodeRefusedStream || errors.Is(err, ErrProtocol) {
			t.Errorf("Open = %v, want the backend's REFUSED_STREAM", err)
		}
		if code, sent := b.goAway(); sent {
			t.Errorf("the proxy sent GOAWAY %v", code)
		}
	})
	t.Run("GOAWAY", func(t *testing.T) {
		c, b := dialBackend(t)
		got := open(context.Background(), c, nil)
		b.preface()
		b.settings()
		b.write(b.fr.WriteGoAway(0, http2.ErrCodeNo, nil))
		if err := (<-got).err; !errors.Is(err, errUnprocessed) {
			t.Errorf("Open = %v, want errUnprocessed", err)
		}
		if code, sent := b.goAway(); sent {
			t.Errorf("the proxy sent GOAWAY %v", code)
		}
	})
}

// TestNeverAnswers: a backend that takes the request and never answers
// holds Open until its context ends (the request's: the app leaving, a
// route's request or backendRequest timeout), whose error it returns.
func TestNeverAnswers(t *testing.T) {
	c, b := dialBackend(t)
	ctx, cancel := context.WithCancel(context.Background())
	got := open(ctx, c, nil)
	b.open()
	cancel()
	if err := (<-got).err; !errors.Is(err, context.Canceled) {
		t.Fatalf("Open = %v, want context.Canceled", err)
	}
}

// TestPingFlood: every PING is answered with its data, in order, as it
// comes: the answers are written on the reading goroutine, so a backend
// that stops reading them stops its own flood, and nothing queues.
func TestPingFlood(t *testing.T) {
	b, _ := openAnswered(t)
	const n = 1000
	go func() {
		for i := range n {
			if b.fr.WritePing(false, [8]byte{byte(i >> 8), byte(i)}) != nil {
				return
			}
		}
	}()
	for i := 0; i < n; {
		f, err := b.fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %d answers: %v", i, err)
		}
		if p, ok := f.(*http2.PingFrame); ok {
			if want := [8]byte{byte(i >> 8), byte(i)}; !p.IsAck() || p.Data != want {
				t.Fatalf("answer %d: %v ack=%v, want an ack of %v", i, p.Data, p.IsAck(), want)
			}
			i++
		}
	}
}

// TestPaddingGivenBack: padding is never read, so its share of the
// windows goes back as it comes (as Go's HTTP/2 client does): a backend
// that padded a window's worth of DATA may send more before the app
// reads anything. Held until a read, it stalled the stream, and the next
// DATA was a flow-control error.
func TestPaddingGivenBack(t *testing.T) {
	c, b := dialBackend(t)
	got := open(context.Background(), c, nil)
	b.open()
	b.headers(id, false, ":status", "200")
	for range window / 256 {
		b.write(b.fr.WriteDataPadded(id, false, nil, make([]byte, 255)))
	}
	b.write(b.fr.WriteData(id, true, []byte("hello")))
	o := <-got
	if o.err != nil {
		t.Fatal(o.err)
	}
	defer o.resp.Body.Close()
	if body, err := io.ReadAll(o.resp.Body); err != nil || string(body) != "hello" {
		t.Errorf("body %q, %v; want hello", body, err)
	}
}

// TestWithheldWindow: a backend that gives no WINDOW_UPDATE gets no byte
// past its window while the app keeps writing: the app's write waits,
// the stream's read side goes on working, and Close ends the write.
func TestWithheldWindow(t *testing.T) {
	b, resp := openAnswered(t)
	st := resp.Body.(*Stream)
	type wrote struct {
		n   int
		err error
	}
	w := make(chan wrote, 1)
	go func() {
		n, err := st.Write(make([]byte, 4*initialWindow))
		w <- wrote{n, err}
	}()
	received := 0
	for received < initialWindow {
		f, err := b.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := f.(*http2.DataFrame); ok {
			received += len(d.Data())
		}
	}
	b.write(b.fr.WriteData(id, false, []byte("still reading")))
	p := make([]byte, 64)
	if n, err := st.Read(p); err != nil || string(p[:n]) != "still reading" {
		t.Fatalf("read while the write waits: %q, %v", p[:n], err)
	}
	st.Close()
	if r := <-w; r.n != initialWindow || r.err == nil {
		t.Errorf("Write = %d, %v; want the %d bytes of the window and an error", r.n, r.err, initialWindow)
	}
	for {
		f, err := b.fr.ReadFrame()
		if err != nil {
			break
		}
		if d, ok := f.(*http2.DataFrame); ok {
			received += len(d.Data())
		}
	}
	if received != initialWindow {
		t.Errorf("backend received %d bytes of DATA, want its window's %d", received, initialWindow)
	}
}

// TestHeaderTableSize: the request's HEADERS use no more of the
// backend's HPACK table than its SETTINGS_HEADER_TABLE_SIZE, 0 here:
// its decoder, which holds no table, decodes a field whose name repeats
// (which an encoder with a table sends as a reference to it).
func TestHeaderTableSize(t *testing.T) {
	c, b := dialBackend(t)
	got := open(context.Background(), c, http.Header{"X-A": {"1", "2"}})
	b.preface()
	b.settings(setting(http2.SettingHeaderTableSize, 0))
	b.dec = hpack.NewDecoder(0, nil)
	fields := b.request()
	var vals []string
	for _, f := range fields {
		if f.Name == "x-a" {
			vals = append(vals, f.Value)
		}
	}
	if strings.Join(vals, ",") != "1,2" {
		t.Errorf("request's x-a fields %q, want 1 and 2", vals)
	}
	b.headers(id, true, ":status", "200")
	if o := <-got; o.err == nil {
		o.resp.Body.Close()
	}
}
