package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// An RFC 8441 client at the frame level. Go 1.27's HTTP/2 clients (net/http,
// and golang.org/x/net/http2, which now wraps it) refuse the :protocol
// pseudo-header (go.dev/issue/53208), so the test speaks frames through
// x/net/http2's Framer and hpack: a real HTTP/2 connection, checked by the
// proxy's net/http server.
type h2Stream struct {
	c    net.Conn
	fr   *http2.Framer
	buf  bytes.Buffer // DATA received and not yet consumed
	id   uint32
	last []byte
}

// openExtendedConnect sends the preface and SETTINGS, waits for the server's
// SETTINGS_ENABLE_CONNECT_PROTOCOL, opens a CONNECT :protocol=websocket
// stream and checks the 200.
func openExtendedConnect(t *testing.T, c net.Conn, authority, path string) *h2Stream {
	t.Helper()
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	s := &h2Stream{c: c, fr: http2.NewFramer(c, c), id: 1}
	if err := s.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	enabled := false
	for !enabled {
		f, err := s.fr.ReadFrame()
		if err != nil {
			t.Fatalf("read server settings: %v", err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			continue
		}
		v, ok := sf.Value(http2.SettingEnableConnectProtocol)
		if !ok || v != 1 {
			t.Fatalf("server does not enable extended CONNECT (is GODEBUG=http2xconnect=1 set?)")
		}
		enabled = true
		s.fr.WriteSettingsAck()
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "CONNECT"}, {":protocol", "websocket"}, {":scheme", "http"},
		{":path", path}, {":authority", authority}, {"sec-websocket-version", "13"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	dec := hpack.NewDecoder(4096, nil)
	for {
		f, err := s.fr.ReadFrame()
		if err != nil {
			t.Fatalf("read response headers: %v", err)
		}
		hf, ok := f.(*http2.HeadersFrame)
		if !ok {
			continue
		}
		fields, err := dec.DecodeFull(hf.HeaderBlockFragment())
		if err != nil {
			t.Fatal(err)
		}
		if fields[0].Name != ":status" || fields[0].Value != "200" {
			t.Fatalf("extended CONNECT answered %v", fields)
		}
		return s
	}
}

// writeWS sends one masked WebSocket text frame (RFC 6455 §5.2) as DATA.
func (s *h2Stream) writeWS(payload []byte) error {
	key := [4]byte{1, 2, 3, 4}
	f := []byte{0x81, 0x80 | byte(len(payload))}
	f = append(f, key[:]...)
	for i, b := range payload {
		f = append(f, b^key[i%4])
	}
	return s.fr.WriteData(s.id, false, f)
}

// readWS returns the payload of the next unmasked server frame (< 64 KiB).
func (s *h2Stream) readWS() ([]byte, error) {
	need := func(n int) error {
		for s.buf.Len() < n {
			f, err := s.fr.ReadFrame()
			if err != nil {
				return err
			}
			switch f := f.(type) {
			case *http2.DataFrame:
				s.buf.Write(f.Data())
				if len(f.Data()) > 0 {
					s.fr.WriteWindowUpdate(0, uint32(len(f.Data())))
					s.fr.WriteWindowUpdate(s.id, uint32(len(f.Data())))
				}
			case *http2.RSTStreamFrame:
				return fmt.Errorf("stream reset: %v", f.ErrCode)
			case *http2.GoAwayFrame:
				return fmt.Errorf("goaway: %v", f.ErrCode)
			}
		}
		return nil
	}
	if err := need(2); err != nil {
		return nil, err
	}
	h := s.buf.Bytes()
	n, hdr := int(h[1]&0x7f), 2
	if n == 126 {
		if err := need(4); err != nil {
			return nil, err
		}
		h = s.buf.Bytes()
		n, hdr = int(h[2])<<8|int(h[3]), 4
	}
	if err := need(hdr + n); err != nil {
		return nil, err
	}
	s.buf.Next(hdr)
	return bytes.Clone(s.buf.Next(n)), nil
}
