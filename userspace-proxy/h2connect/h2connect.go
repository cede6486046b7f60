package h2connect

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
)

// Request is an extended CONNECT to open (RFC 8441 §4).
type Request struct {
	// Protocol is the :protocol pseudo-header: "websocket".
	Protocol string
	// Scheme is "http" over h2c, "https" over TLS.
	Scheme    string
	Authority string
	// Path is the :path, the query included.
	Path string
	// Header holds the regular fields, without the connection-specific
	// ones HTTP/2 forbids (RFC 9113 §8.2.2): the caller removes those.
	Header http.Header
}

// ErrNotSupported: the server's SETTINGS do not carry
// SETTINGS_ENABLE_CONNECT_PROTOCOL=1, without which a client must not send
// an extended CONNECT (RFC 8441 §3); nothing was sent.
var ErrNotSupported = errors.New("backend's HTTP/2 SETTINGS do not enable extended CONNECT (SETTINGS_ENABLE_CONNECT_PROTOCOL=1, RFC 8441)")

// ErrProtocol: the server broke RFC 9113 or RFC 8441 — a frame out of
// place, a setting out of range, DATA past the window the proxy gave, a
// window past 2^31-1, an answer's head past MaxHeaderListSize. The
// connection ended with a GOAWAY carrying the error's code.
var ErrProtocol = errors.New("backend broke the HTTP/2 protocol")

// ErrNoSettings: the server sent no SETTINGS within
// Config.SettingsTimeout of the preface: nothing serves the connection (a
// frozen process, whose kernel took it); no request went.
var ErrNoSettings = errors.New("backend sent no HTTP/2 SETTINGS")

// ErrPingTimeout: the server sent no frame, the ACK of the proxy's PING
// or any other, within Config.PingTimeout of that PING, which went after
// Config.PingAfter without a frame: the backend is gone (its node with
// it) or frozen. The connection was closed.
var ErrPingTimeout = errors.New("backend did not answer an HTTP/2 PING")

// Config bounds what a server may leave unanswered. The zero value bounds
// nothing but what Open's context bounds.
type Config struct {
	// SettingsTimeout bounds the wait for the server's first SETTINGS
	// (ErrNoSettings), as a TLS handshake's wait is bounded; 0: none.
	SettingsTimeout time.Duration
	// PingAfter is how long the connection may go without a frame from
	// the server before the proxy pings it; without a frame within
	// PingTimeout of the PING, the connection closes and the stream
	// fails (ErrPingTimeout), where a backend gone with its node would
	// hold the tunnel until TCP gives up. 0: no PING.
	PingAfter, PingTimeout time.Duration
	// Panics reports a panic of the goroutines that read the connection
	// and watch it.
	Panics *contain.Reporter
}

// errUnprocessed: a GOAWAY said the server did not process the stream.
var errUnprocessed = errors.New("backend sent GOAWAY before the stream")

const (
	id = 1 // the connection's one stream
	// window is the receive window of the stream and the connection: what
	// a WebSocket may hold here while its app does not read.
	window = 256 << 10
	// initialWindow and maxFrame are RFC 9113's defaults (§6.5.2), the
	// peer's until its SETTINGS say otherwise.
	initialWindow = 65535
	maxFrame      = 16384
	// maxWindow bounds every flow-control window (RFC 9113 §6.9.1).
	maxWindow = 1<<31 - 1
	// maxHeaderList bounds an answer's head, 1xx ones included, as
	// net/http's Transport bounds an HTTP/1.1 one; the SETTINGS say so.
	maxHeaderList = http.DefaultMaxHeaderBytes
	// max1xx bounds the 1xx answers before the final one, as net/http's
	// HTTP/1.1 client does.
	max1xx = 5
)

// Open sends req as an extended CONNECT on conn, a connection to an
// HTTP/2 server nothing was sent on yet, once the server's first SETTINGS
// enable it, and returns its answer: the status and fields of its final
// HEADERS, and as Body the stream (a *Stream), which carries the tunnel's
// bytes after a 2xx and the answer's body otherwise. ctx bounds the wait
// for the answer, as a request's context bounds an HTTP/1.1 Upgrade's; it
// does not bound the stream. cfg bounds the wait for SETTINGS, and the
// connection's silences, the answer's wait's too. On error conn is closed.
func Open(ctx context.Context, conn net.Conn, req *Request, cfg Config) (*http.Response, error) {
	s := &Stream{conn: conn, fr: http2.NewFramer(conn, conn), cfg: cfg, sendConn: initialWindow,
		sendStream: initialWindow, initial: initialWindow, recvConn: window, recvStream: window, maxFrame: maxFrame,
		headerTable: defaultHeaderTable, headRoom: maxHeaderList}
	s.cond.L = &s.mu
	s.fr.ReadMetaHeaders = hpack.NewDecoder(defaultHeaderTable, nil)
	s.fr.MaxHeaderListSize = maxHeaderList
	s.fr.SetMaxReadFrameSize(maxFrame)
	stop := context.AfterFunc(ctx, func() {
		s.fail(ctx.Err())
		conn.SetDeadline(time.Unix(1, 0)) // unblocks the preface's write, and the reader
	})
	resp, err := s.open(req)
	if !stop() {
		err = ctx.Err() // it cut the connection: what failed then is its doing
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("extended connect to %s: %w", conn.RemoteAddr(), err)
	}
	return resp, nil
}

func (s *Stream) open(req *Request) (*http.Response, error) {
	if _, err := io.WriteString(s.conn, http2.ClientPreface); err != nil {
		return nil, err
	}
	err := s.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: window},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList})
	if err == nil {
		err = s.fr.WriteWindowUpdate(0, window-initialWindow)
	}
	if err != nil {
		return nil, err
	}
	go s.readLoop()
	xconnect, err := s.awaitSettings()
	switch {
	case err != nil:
		return nil, err
	case !xconnect:
		return nil, ErrNotSupported
	}
	if err := s.writeHeaders(req); err != nil {
		// The reader's error, when it closed the connection under the
		// write, says why.
		s.mu.Lock()
		defer s.mu.Unlock()
		return nil, cmp.Or(s.err, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.status == 0 && s.err == nil {
		s.cond.Wait()
	}
	if s.status == 0 {
		return nil, s.err
	}
	return &http.Response{Status: strconv.Itoa(s.status) + " " + http.StatusText(s.status), StatusCode: s.status,
		Proto: "HTTP/2.0", ProtoMajor: 2, Header: s.header, ContentLength: -1, Body: s}, nil
}

// awaitSettings waits for the server's first SETTINGS, within
// cfg.SettingsTimeout, and returns whether they enable extended CONNECT.
func (s *Stream) awaitSettings() (xconnect bool, err error) {
	if d := s.cfg.SettingsTimeout; d > 0 {
		t := time.AfterFunc(d, func() {
			s.mu.Lock()
			settled := s.settled
			s.mu.Unlock()
			if !settled {
				s.end(fmt.Errorf("%w within %v", ErrNoSettings, d))
			}
		})
		defer t.Stop()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.settled && s.err == nil {
		s.cond.Wait()
	}
	return s.xconnect, s.err
}

// writeHeaders sends req's HEADERS (and CONTINUATIONs past the server's
// frame size). The stream stays open: its DATA are the tunnel's.
func (s *Stream) writeHeaders(req *Request) error {
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	s.mu.Lock()
	// The server's decoder holds no more of a dynamic table than its
	// SETTINGS_HEADER_TABLE_SIZE (RFC 7541 §4.2); with 0, none.
	enc.SetMaxDynamicTableSizeLimit(s.headerTable)
	size := int(s.maxFrame)
	// From here the stream is open (RFC 9113 §5.1): frames of the
	// server's for it are in place.
	s.opened = true
	s.mu.Unlock()
	field := func(k, v string) { enc.WriteField(hpack.HeaderField{Name: k, Value: v}) }
	field(":method", http.MethodConnect)
	field(":protocol", req.Protocol)
	field(":scheme", req.Scheme)
	field(":authority", req.Authority)
	field(":path", req.Path)
	for k, vv := range req.Header {
		for _, v := range vv {
			field(strings.ToLower(k), v)
		}
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	b := block.Bytes()
	first := b[:min(len(b), size)]
	b = b[len(first):]
	err := s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(b) == 0})
	for err == nil && len(b) > 0 {
		next := b[:min(len(b), size)]
		b = b[len(next):]
		err = s.fr.WriteContinuation(id, len(b) == 0, next)
	}
	return err
}

// Stream is an extended CONNECT's stream as a byte stream: reads return
// its DATA, writes send DATA within the server's flow-control windows,
// CloseWrite ends it (END_STREAM), and Close closes its connection.
type Stream struct {
	conn net.Conn
	fr   *http2.Framer // read by readLoop alone; written under wmu
	wmu  sync.Mutex
	once sync.Once
	cfg  Config
	// heard counts the server's frames, which the liveness check
	// (ping) watches; idle fires after cfg.PingAfter without one, and
	// pingWait, under mu, cfg.PingTimeout after a PING.
	heard    atomic.Uint64
	idle     *time.Timer
	pingWait *time.Timer

	mu   sync.Mutex
	cond sync.Cond // on mu: any change below
	err  error     // the stream's end other than END_STREAM, once set
	// settled: the server's first SETTINGS came; xconnect: they allow
	// extended CONNECT. opened: the request's HEADERS went.
	settled, xconnect, opened bool
	status                    int // the final answer's; 0 before
	header                    http.Header
	// informational counts the 1xx answers; headRoom is what the heads
	// to come may still hold (maxHeaderList for them all).
	informational int
	headRoom      uint32
	in            bytes.Buffer // DATA not read yet
	// recvEnd and sentEnd: END_STREAM came, went.
	recvEnd, sentEnd bool
	// Send windows, the server's initial one, its frame size and its
	// HPACK decoder's table size.
	sendConn, sendStream, initial int64
	maxFrame, headerTable         uint32
	// recvConn and recvStream are what the server may still send;
	// unacked what was read and not yet given back (WINDOW_UPDATE).
	recvConn, recvStream, unacked int64
}

// Read reads the stream's DATA; io.EOF once the server's END_STREAM came.
func (s *Stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	for s.in.Len() == 0 && !s.recvEnd && s.err == nil {
		s.cond.Wait()
	}
	if s.in.Len() == 0 {
		defer s.mu.Unlock()
		if s.recvEnd {
			return 0, io.EOF
		}
		return 0, s.err
	}
	n, _ := s.in.Read(p)
	credit, stream := s.consumed(int64(n))
	s.mu.Unlock()
	s.giveBack(credit, stream)
	return n, nil
}

// consumed counts n bytes of the windows as taken off the connection (read,
// or padding), and returns the credit to give back now and whether the
// stream's window takes it too. Credit goes back in quarters of the
// window, not per read: a relay reads a byte first, then the rest. s.mu
// is held.
func (s *Stream) consumed(n int64) (credit int64, stream bool) {
	s.unacked += n
	if s.unacked < window/4 {
		return 0, false
	}
	credit, s.unacked = s.unacked, 0
	s.recvConn += credit
	if !s.recvEnd {
		s.recvStream += credit
	}
	return credit, !s.recvEnd
}

// giveBack sends WINDOW_UPDATEs for n bytes, if any, for the stream too
// while it is open toward the proxy.
func (s *Stream) giveBack(n int64, stream bool) {
	if n == 0 {
		return
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	err := s.fr.WriteWindowUpdate(0, uint32(n))
	if err == nil && stream {
		err = s.fr.WriteWindowUpdate(id, uint32(n))
	}
	if err != nil {
		s.fail(err)
	}
}

// Write sends p as DATA, waiting for the server's windows as they fill.
func (s *Stream) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		s.mu.Lock()
		for s.err == nil && !s.sentEnd && (s.sendConn <= 0 || s.sendStream <= 0) {
			s.cond.Wait()
		}
		err := s.err
		if err == nil && s.sentEnd {
			err = errors.New("write after the stream's END_STREAM")
		}
		if err != nil {
			s.mu.Unlock()
			return n, err
		}
		k := int(min(int64(len(p)), s.sendConn, s.sendStream, int64(s.maxFrame)))
		s.sendConn -= int64(k)
		s.sendStream -= int64(k)
		s.mu.Unlock()
		s.wmu.Lock()
		err = s.fr.WriteData(id, false, p[:k])
		s.wmu.Unlock()
		if err != nil {
			s.fail(err)
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// CloseWrite ends the stream toward the server: END_STREAM, as RFC 8441
// §5 maps a TCP FIN.
func (s *Stream) CloseWrite() error {
	s.mu.Lock()
	if s.sentEnd || s.err != nil {
		s.mu.Unlock()
		return s.err
	}
	s.sentEnd = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.fr.WriteData(id, true, nil)
}

// Close closes the stream's connection: after both END_STREAMs its
// orderly end, before them an abort the server sees as the connection's
// loss (RFC 8441 §5: a TCP reset is a stream reset; this is the stronger
// of the two).
func (s *Stream) Close() error {
	var err error
	s.once.Do(func() {
		s.fail(net.ErrClosed)
		err = s.conn.Close()
	})
	return err
}

// fail ends the stream with err, unless it ended before.
func (s *Stream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	s.cond.Broadcast()
}
