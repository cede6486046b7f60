package h2connect

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"

	"github.com/sockmesh/sockmesh/internal/leakcheck"
	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
)

// FuzzH2Connect: whatever bytes a backend sends after the proxy's
// preface — its first frame at once, the rest once the request's HEADERS
// came (so that a stream's frames find it open), then its end — Open and
// the stream end without a panic, within the guard's time (each input
// ends in well under a millisecond; the guard tells a hang), and no
// goroutine of the package's is left.
func FuzzH2Connect(f *testing.F) {
	for _, seed := range [][]byte{
		frames(func(fr *http2.Framer) {
			fr.WriteSettings(setting(http2.SettingEnableConnectProtocol, 1))
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block(":status", "200"), EndHeaders: true})
			fr.WriteData(id, false, []byte("hello"))
			fr.WriteDataPadded(id, false, []byte("padded"), make([]byte, 7))
			fr.WriteWindowUpdate(0, 1000)
			fr.WritePing(false, [8]byte{1})
			fr.WriteData(id, true, nil)
		}),
		frames(func(fr *http2.Framer) { fr.WriteSettings() }),
		frames(func(fr *http2.Framer) {
			fr.WriteSettings(setting(http2.SettingEnableConnectProtocol, 1), setting(http2.SettingInitialWindowSize, 0))
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block(":status", "103"), EndHeaders: true})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block(":status", "403"), EndHeaders: false})
			fr.WriteContinuation(id, true, block("x", "y"))
			fr.WriteData(id, false, []byte("denied"))
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block("x-t", "1"), EndStream: true, EndHeaders: true})
			fr.WriteGoAway(id, http2.ErrCodeNo, nil)
		}),
		frames(func(fr *http2.Framer) {
			fr.WriteSettings(setting(http2.SettingEnableConnectProtocol, 1))
			fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
		}),
	} {
		f.Add(seed)
	}
	leakcheck.Register(f, "/userspace-proxy/h2connect/")
	panics, err := contain.New(slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { l.Close() })
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sc, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		backendDone := serveBytes(sc.(*net.TCPConn), in)
		// A guard, not a measure: it tells a hang from an end.
		c.SetDeadline(time.Now().Add(5 * time.Second))
		resp, err := Open(context.Background(), c, &Request{Protocol: "websocket", Scheme: "http", Authority: "a", Path: "/"}, Config{Panics: panics})
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		var p *contain.Panic
		switch {
		case errors.As(err, &p):
			t.Fatalf("panic: %v\n%s", p.Value, p.Stack)
		case errors.Is(err, os.ErrDeadlineExceeded):
			t.Fatalf("the stream did not end with the backend's bytes: %v", err)
		}
		c.Close()
		<-backendDone
	})
}

// serveBytes plays a backend that sends in, then its end: when in begins
// with a whole SETTINGS frame, that first, then the rest once the proxy's
// HEADERS came (or the proxy closed); at once otherwise (any other start
// is a breach, or waits for bytes to come). It reads all the proxy sends until the
// proxy closes; the channel is closed then.
func serveBytes(sc *net.TCPConn, in []byte) <-chan struct{} {
	requested := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			select {
			case <-requested:
			default:
				close(requested)
			}
		}()
		if _, err := io.ReadFull(sc, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		fr := http2.NewFramer(io.Discard, sc)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if f.Header().Type == http2.FrameHeaders {
				close(requested)
				io.Copy(io.Discard, sc)
				return
			}
		}
	}()
	go func() {
		if first := firstSettings(in); first > 0 {
			if _, err := sc.Write(in[:first]); err != nil {
				return
			}
			in = in[first:]
			<-requested
		}
		sc.Write(in)
		sc.CloseWrite()
	}()
	return done
}

// firstSettings is the length of the whole SETTINGS frame in begins with;
// 0 without one.
func firstSettings(in []byte) int {
	if len(in) < 9 || http2.FrameType(in[3]) != http2.FrameSettings {
		return 0
	}
	n := 9 + (int(in[0])<<16 | int(in[1])<<8 | int(in[2]))
	if n > len(in) {
		return 0
	}
	return n
}

// frames returns the bytes write writes with a Framer.
func frames(write func(fr *http2.Framer)) []byte {
	var buf bytes.Buffer
	write(http2.NewFramer(&buf, nil))
	return buf.Bytes()
}
