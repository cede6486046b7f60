package proxy_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// An RFC 8441 client at the frame level. Go 1.27's HTTP/2 clients (net/http,
// and golang.org/x/net/http2, which now wraps it) refuse the :protocol
// pseudo-header (go.dev/issue/53208), so the tests speak frames through
// x/net/http2's Framer and hpack: a real HTTP/2 connection, checked by the
// proxy's net/http server.

// h2WS is one extended CONNECT stream, with flow control both ways so
// that messages larger than a window can cross.
type h2WS struct {
	fr       *http2.Framer
	id       uint32
	in       bytes.Buffer // DATA received, not yet read
	ended    bool         // the server's END_STREAM arrived
	err      error        // RST_STREAM or GOAWAY
	xconnect bool
	// send windows: the connection's, the stream's, and the initial one
	// the server's SETTINGS declared.
	connWin, streamWin, initWin int64
	status                      string
	header                      http.Header // the answer's fields
}

// openH2WS sends the preface and SETTINGS, waits for the server's
// SETTINGS_ENABLE_CONNECT_PROTOCOL, opens a CONNECT :protocol=websocket
// stream and checks the 200.
func openH2WS(t *testing.T, c net.Conn, authority, path string) *h2WS {
	t.Helper()
	s, err := startH2WS(c, authority, path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startH2WS is openH2WS returning its error, for goroutines of a test.
func startH2WS(c net.Conn, authority, path string) (*h2WS, error) {
	s, err := startH2(c, wsConnect("websocket", authority, path), false)
	if err == nil && s.status != "200" {
		err = fmt.Errorf("extended CONNECT answered %s", s.status)
	}
	return s, err
}

// connectH2WS is openH2WS, for :protocol protocol, up to the answer's
// status, whatever it is.
func connectH2WS(t *testing.T, c net.Conn, protocol, authority, path string) *h2WS {
	t.Helper()
	return requestH2(t, c, wsConnect(protocol, authority, path), false)
}

// wsConnect is the header fields of an extended CONNECT for protocol.
func wsConnect(protocol, authority, path string) [][2]string {
	return [][2]string{{":method", "CONNECT"}, {":protocol", protocol}, {":scheme", "http"},
		{":path", path}, {":authority", authority}, {"sec-websocket-version", "13"}}
}

// requestH2 opens a stream with the header fields given, which may be any
// (Go's clients refuse to send some), ending it at once when end is set,
// and reads up to the answer's status.
func requestH2(t *testing.T, c net.Conn, fields [][2]string, end bool) *h2WS {
	t.Helper()
	s, err := startH2(c, fields, end)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startH2 is requestH2 returning its error.
func startH2(c net.Conn, fields [][2]string, end bool) (*h2WS, error) {
	s, err := sendH2(c, fields, end)
	if err != nil {
		return nil, err
	}
	for s.status == "" {
		if err := s.step(); err != nil {
			return nil, fmt.Errorf("read response headers: %w", err)
		}
		if s.err != nil {
			return nil, s.err
		}
	}
	return s, nil
}

// sendH2 is startH2 up to the request's HEADERS, sent once the server's
// SETTINGS came.
func sendH2(c net.Conn, fields [][2]string, end bool) (*h2WS, error) {
	c.SetDeadline(time.Now().Add(hangGuard))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return nil, err
	}
	s := &h2WS{fr: http2.NewFramer(c, c), id: 1, connWin: 65535, streamWin: 65535, initWin: 65535}
	s.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := s.fr.WriteSettings(); err != nil {
		return nil, err
	}
	for !s.xconnect {
		if err := s.step(); err != nil {
			return nil, fmt.Errorf("read server settings: %w", err)
		}
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range fields {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: end}); err != nil {
		return nil, err
	}
	return s, nil
}

// step reads and handles one frame.
func (s *h2WS) step() error {
	f, err := s.fr.ReadFrame()
	if err != nil {
		return err
	}
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			break
		}
		if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
			s.streamWin += int64(v) - s.initWin
			s.initWin = int64(v)
		}
		if v, ok := f.Value(http2.SettingEnableConnectProtocol); ok && v == 1 {
			s.xconnect = true
		}
		return s.fr.WriteSettingsAck()
	case *http2.WindowUpdateFrame:
		switch f.StreamID {
		case 0:
			s.connWin += int64(f.Increment)
		case s.id:
			s.streamWin += int64(f.Increment)
		}
	case *http2.MetaHeadersFrame:
		if f.StreamID == s.id && s.status == "" {
			s.status = f.PseudoValue("status")
			s.header = http.Header{}
			for _, hf := range f.RegularFields() {
				s.header.Add(hf.Name, hf.Value)
			}
		}
		s.ended = s.ended || f.StreamEnded()
	case *http2.DataFrame:
		if f.StreamID != s.id {
			break
		}
		s.in.Write(f.Data())
		if n := uint32(len(f.Data())); n > 0 {
			s.fr.WriteWindowUpdate(0, n)
			if !f.StreamEnded() {
				s.fr.WriteWindowUpdate(s.id, n)
			}
		}
		s.ended = s.ended || f.StreamEnded()
	case *http2.RSTStreamFrame:
		s.err = fmt.Errorf("stream reset: %v", f.ErrCode)
	case *http2.GoAwayFrame:
		s.err = fmt.Errorf("goaway: %v", f.ErrCode)
	case *http2.PingFrame:
		if !f.IsAck() {
			return s.fr.WritePing(true, f.Data)
		}
	}
	return nil
}

// Read returns DATA of the stream; io.EOF after the server's END_STREAM.
func (s *h2WS) Read(p []byte) (int, error) {
	for s.in.Len() == 0 {
		switch {
		case s.ended:
			return 0, io.EOF
		case s.err != nil:
			return 0, s.err
		}
		if err := s.step(); err != nil {
			return 0, err
		}
	}
	return s.in.Read(p)
}

// Write sends p as DATA within the peer's flow-control windows.
func (s *h2WS) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		for s.connWin <= 0 || s.streamWin <= 0 {
			if s.err != nil {
				return n, s.err
			}
			if err := s.step(); err != nil {
				return n, err
			}
		}
		k := int(min(int64(len(p)), 16384, s.connWin, s.streamWin))
		if err := s.fr.WriteData(s.id, false, p[:k]); err != nil {
			return n, err
		}
		s.connWin -= int64(k)
		s.streamWin -= int64(k)
		n += k
		p = p[k:]
	}
	return n, nil
}

// WebSocket opcodes (RFC 6455 §5.2).
const (
	wsText   = 0x1
	wsBinary = 0x2
	wsClose  = 0x8
	wsPing   = 0x9
	wsPong   = 0xa
)

// writeWSFrame sends one masked client frame.
func writeWSFrame(w io.Writer, op byte, payload []byte) error {
	_, err := w.Write(wsFrame(op, payload, true))
	return err
}

// wsFrame is one final frame, masked as a client's or not as a server's.
func wsFrame(op byte, payload []byte, masked bool) []byte {
	b := []byte{0x80 | op}
	bit := byte(0)
	if masked {
		bit = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, bit|byte(n))
	case n < 1<<16:
		b = append(b, bit|126, byte(n>>8), byte(n))
	default:
		b = append(b, bit|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if !masked {
		return append(b, payload...)
	}
	key := [4]byte{9, 8, 7, 6}
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i%4])
	}
	return b
}

// readWSFrame reads one frame, a server's or a client's (unmasking it),
// joining continuations.
func readWSFrame(r io.Reader) (op byte, payload []byte, err error) {
	for {
		var h [2]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return 0, nil, err
		}
		n := uint64(h[1] & 0x7f)
		switch n {
		case 126:
			var l [2]byte
			if _, err := io.ReadFull(r, l[:]); err != nil {
				return 0, nil, err
			}
			n = uint64(binary.BigEndian.Uint16(l[:]))
		case 127:
			var l [8]byte
			if _, err := io.ReadFull(r, l[:]); err != nil {
				return 0, nil, err
			}
			n = binary.BigEndian.Uint64(l[:])
		}
		var key [4]byte
		if h[1]&0x80 != 0 {
			if _, err := io.ReadFull(r, key[:]); err != nil {
				return 0, nil, err
			}
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(r, p); err != nil {
			return 0, nil, err
		}
		for i := range p {
			p[i] ^= key[i%4]
		}
		if o := h[0] & 0x0f; o != 0 {
			op = o
		}
		payload = append(payload, p...)
		if h[0]&0x80 != 0 {
			return op, payload, nil
		}
	}
}
