package proxy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sockmesh/sockmesh/userspace-proxy/h2drain"
)

// TestStreamOverLimitAtSettingsAck makes the race h2drain's held SETTINGS
// ACK is for, frame by frame, against Go's HTTP/2 server and nghttpd, each
// allowing 10 streams: 10 streams open and wait for their bodies, the
// backend's SETTINGS come, and then, in one write, the ACK, DATA of an open
// stream's body and an 11th stream's HEADERS — the order net/http's
// Transport writes them in when that stream took its slot before it
// applied the SETTINGS and another request's body went meanwhile. Through
// h2drain.Upstream, as the proxy's connections to HTTP/2 backends go, the
// 11th stream is refused (REFUSED_STREAM, which the proxy sends again) and
// the connection carries on; written as they come (the control), Go's
// server resets that stream with PROTOCOL_ERROR, which no client may send
// again, and nghttpd ends the connection.
func TestStreamOverLimitAtSettingsAck(t *testing.T) {
	const limit = 10
	backends := map[string]func(t *testing.T) netip.AddrPort{
		"go": func(t *testing.T) netip.AddrPort {
			srv := &http.Server{Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{MaxConcurrentStreams: limit},
				Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(w, r.Body) })}
			srv.Protocols.SetUnencryptedHTTP2(true)
			return serveLocal(t, srv)
		},
		"nghttpd": func(t *testing.T) netip.AddrPort {
			return startNghttpd(t, newEnv(t, envOptions{}), t.TempDir(), false, "-m", fmt.Sprint(limit))
		},
	}
	for _, tc := range []struct {
		backend string
		held    bool
		want    string
	}{
		{"go", true, "RST_STREAM REFUSED_STREAM, PING answered"},
		{"go", false, "RST_STREAM PROTOCOL_ERROR, PING answered"},
		{"nghttpd", true, "RST_STREAM REFUSED_STREAM, PING answered"},
		{"nghttpd", false, "GOAWAY PROTOCOL_ERROR"},
	} {
		t.Run(fmt.Sprintf("%s/held=%v", tc.backend, tc.held), func(t *testing.T) {
			if got := streamOverLimitAtAck(t, backends[tc.backend](t), limit, tc.held); got != tc.want {
				t.Errorf("the stream over the limit met %q, want %q", got, tc.want)
			}
		})
	}
}

// streamOverLimitAtAck opens limit streams to addr and one more right
// behind the ACK of the backend's SETTINGS, through an h2drain.Upstream
// when held is set, and tells what the backend did with the last: its
// RST_STREAM or GOAWAY, and whether a PING was answered after.
func streamOverLimitAtAck(t *testing.T, addr netip.AddrPort, limit int, held bool) string {
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(hangGuard))
	var w io.Writer = c
	if held {
		w = h2drain.NewUpstream(c)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/"}, {":authority", "backend"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	open := func(fr *http2.Framer, id uint32) error {
		return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true})
	}
	fr := http2.NewFramer(w, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := io.WriteString(w, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for i := range limit {
		if err := open(fr, uint32(2*i+1)); err != nil {
			t.Fatal(err)
		}
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("before the backend's SETTINGS: %v", err)
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			break
		}
	}
	// One write, as the hold's timer would send the ACK if the Transport's
	// writes lagged.
	var burst bytes.Buffer
	bfr := http2.NewFramer(&burst, nil)
	over := uint32(2*limit + 1)
	if err := errors.Join(bfr.WriteSettingsAck(), bfr.WriteData(1, false, []byte("body")), open(bfr, over)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(burst.Bytes()); err != nil {
		t.Fatal(err)
	}
	var met string
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("after the stream over the limit: %v", err)
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			if met == "" {
				return "GOAWAY " + f.ErrCode.String()
			}
			return met + ", GOAWAY " + f.ErrCode.String()
		case *http2.RSTStreamFrame:
			if f.StreamID == over {
				met = "RST_STREAM " + f.ErrCode.String()
				if err := fr.WritePing(false, [8]byte{1}); err != nil {
					return met + ", PING not sent"
				}
			}
		case *http2.PingFrame:
			if f.IsAck() && met != "" {
				return met + ", PING answered"
			}
		}
	}
}
