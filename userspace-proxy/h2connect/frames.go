package h2connect

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/net/http2"
)

// defaultHeaderTable is HPACK's dynamic table size until the server's
// SETTINGS say otherwise (RFC 9113 §6.5.2).
const defaultHeaderTable = 4096

// protocolError is a breach of the server's that ends the connection
// with a GOAWAY carrying code (RFC 9113 §5.4.1). It is ErrProtocol.
type protocolError struct {
	code http2.ErrCode
	why  string
}

func (e *protocolError) Error() string        { return fmt.Sprintf("%v: %s (%v)", ErrProtocol, e.why, e.code) }
func (e *protocolError) Is(target error) bool { return target == ErrProtocol }

func breach(code http2.ErrCode, format string, args ...any) error {
	return &protocolError{code: code, why: fmt.Sprintf(format, args...)}
}

// readLoop reads the server's frames until the connection ends, with the
// liveness check on (watch). The server's first frame must be its
// SETTINGS (RFC 9113 §3.4), as Go's HTTP/2 client requires too.
func (s *Stream) readLoop() {
	var err error
	defer s.cfg.Panics.Recover("extended connect", &err, func() { s.fail(err); s.conn.Close() })
	defer s.unwatch()
	s.watch()
	for first := true; ; first = false {
		f, rerr := s.fr.ReadFrame()
		if rerr == nil {
			s.heard.Add(1)
			if s.idle != nil {
				s.idle.Reset(s.cfg.PingAfter)
			}
		}
		if rerr == nil && first {
			if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
				rerr = breach(http2.ErrCodeProtocol, "%s before its SETTINGS", f.Header().Type)
			}
		}
		if rerr == nil {
			rerr = s.handle(f)
		}
		if rerr != nil {
			s.end(framerBreach(rerr))
			return
		}
	}
}

// pingData is the payload of the proxy's PINGs. Any frame of the
// server's proves it alive, the ACK among them: none is matched.
var pingData = [8]byte{'s', 'o', 'c', 'k', 'm', 'e', 's', 'h'}

// watch starts the liveness check, as net/http's HTTP/2 client has one
// (ReadIdleTimeout, PingTimeout): after cfg.PingAfter without a frame of
// the server's, a PING (ping).
func (s *Stream) watch() {
	if s.cfg.PingAfter > 0 {
		s.idle = time.AfterFunc(s.cfg.PingAfter, s.ping)
	}
}

// ping sends a PING, and ends the stream (ErrPingTimeout) unless a frame
// comes within cfg.PingTimeout. The wait starts before the write, which a
// server that reads nothing may hold: closing the connection ends it.
func (s *Stream) ping() {
	heard := s.heard.Load()
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.pingWait = time.AfterFunc(s.cfg.PingTimeout, func() {
		if s.heard.Load() == heard {
			s.end(fmt.Errorf("%w within %v (sent after %v without a frame)", ErrPingTimeout, s.cfg.PingTimeout, s.cfg.PingAfter))
		}
	})
	s.mu.Unlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.fr.WritePing(false, pingData) // a failure is the connection's: the wait ends it
}

// unwatch stops the liveness check once the connection ended.
func (s *Stream) unwatch() {
	if s.idle != nil {
		s.idle.Stop()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pingWait != nil {
		s.pingWait.Stop()
	}
}

// framerBreach is err, from ReadFrame or handle, as a protocolError when
// the Framer judged the frames a breach (a frame too large, or malformed).
func framerBreach(err error) error {
	var ce http2.ConnectionError
	var se http2.StreamError
	switch {
	case errors.Is(err, http2.ErrFrameTooLarge):
		return breach(http2.ErrCodeFrameSize, "a frame over %d bytes", maxFrame)
	case errors.As(err, &ce):
		return breach(http2.ErrCode(ce), "a malformed frame")
	case errors.As(err, &se) && !errors.Is(se.Cause, errReset):
		return breach(se.Code, "a malformed frame: %v", se.Cause)
	}
	return err
}

// end ends the stream with err, read from the connection or a breach of
// the server's: after a breach it first sends a GOAWAY (no byte of the
// server's can be trusted after it), within goAwayWait, which also ends a
// write of the stream's held by a server that reads nothing; then it
// closes the connection.
func (s *Stream) end(err error) {
	var pe *protocolError
	if errors.As(err, &pe) {
		s.conn.SetWriteDeadline(time.Now().Add(goAwayWait))
		s.wmu.Lock()
		s.fr.WriteGoAway(0, pe.code, nil)
		s.wmu.Unlock()
	}
	s.fail(err)
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		s.conn.Close()
	}
}

// goAwayWait bounds the wait to send a GOAWAY after a breach.
const goAwayWait = time.Second

// errReset is the cause of the StreamError a server's RST_STREAM ends
// the stream with.
var errReset = errors.New("backend reset the stream")

// handle acts on one frame of the server's.
func (s *Stream) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if err := s.settings(f); err != nil {
			return err
		}
		s.wmu.Lock()
		defer s.wmu.Unlock()
		return s.fr.WriteSettingsAck()
	case *http2.PingFrame:
		// Answered as it comes, on this goroutine: a flood of them is
		// held back by the server's own reading of the answers, and
		// nothing queues.
		if f.IsAck() {
			return nil
		}
		s.wmu.Lock()
		defer s.wmu.Unlock()
		return s.fr.WritePing(true, f.Data)
	case *http2.WindowUpdateFrame:
		return s.windowUpdate(f)
	case *http2.MetaHeadersFrame:
		return s.headers(f)
	case *http2.DataFrame:
		return s.data(f)
	case *http2.RSTStreamFrame:
		if err := s.onStream(f); err != nil {
			return err
		}
		return http2.StreamError{StreamID: f.StreamID, Code: f.ErrCode, Cause: errReset}
	case *http2.GoAwayFrame:
		if f.LastStreamID < id {
			return fmt.Errorf("%w (%v)", errUnprocessed, f.ErrCode)
		}
		if f.ErrCode != http2.ErrCodeNo {
			return fmt.Errorf("backend sent GOAWAY (%v)", f.ErrCode)
		}
	case *http2.PushPromiseFrame:
		return breach(http2.ErrCodeProtocol, "PUSH_PROMISE after SETTINGS_ENABLE_PUSH=0")
	}
	// PRIORITY and frames of unknown types are passed over (RFC 9113
	// §5.5, §6.3).
	return nil
}

// onStream checks that f, a frame on a stream, is on the proxy's one
// stream once its HEADERS went: every other stream is idle, on which the
// server may send none of these (RFC 9113 §5.1).
func (s *Stream) onStream(f http2.Frame) error {
	s.mu.Lock()
	opened := s.opened
	s.mu.Unlock()
	if sid := f.Header().StreamID; sid != id || !opened {
		return breach(http2.ErrCodeProtocol, "%s on stream %d, which the proxy did not open", f.Header().Type, sid)
	}
	return nil
}

// settings applies the server's SETTINGS. Whether it takes extended
// CONNECT is its first SETTINGS' word, as for Go's HTTP/2 client: the
// stream is opened on it. Taking it back later is a breach (RFC 8441 §3).
func (s *Stream) settings(f *http2.SettingsFrame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := f.ForeachSetting(func(st http2.Setting) error {
		var code http2.ConnectionError
		if errors.As(st.Valid(), &code) {
			return breach(http2.ErrCode(code), "SETTINGS with %v", st)
		}
		switch st.ID {
		case http2.SettingInitialWindowSize:
			// Applies to the stream's window as a delta (RFC 9113 §6.9.2).
			if s.sendStream+int64(st.Val)-s.initial > maxWindow {
				return breach(http2.ErrCodeFlowControl, "SETTINGS with %v: the stream's window past 2^31-1", st)
			}
			s.sendStream += int64(st.Val) - s.initial
			s.initial = int64(st.Val)
		case http2.SettingMaxFrameSize:
			s.maxFrame = st.Val
		case http2.SettingHeaderTableSize:
			s.headerTable = st.Val
		case http2.SettingEnableConnectProtocol:
			switch {
			case !s.settled:
				s.xconnect = st.Val == 1
			case s.xconnect && st.Val == 0:
				return breach(http2.ErrCodeProtocol, "SETTINGS took back SETTINGS_ENABLE_CONNECT_PROTOCOL=1")
			}
		}
		return nil
	})
	if err != nil {
		return err // the stream ends on it: no request goes
	}
	s.settled = true
	s.cond.Broadcast()
	return nil
}

// windowUpdate adds the server's credit to a send window; none may grow
// past 2^31-1 (RFC 9113 §6.9.1). The Framer refuses an increment of 0.
func (s *Stream) windowUpdate(f *http2.WindowUpdateFrame) error {
	w := &s.sendConn
	if f.StreamID != 0 {
		if err := s.onStream(f); err != nil {
			return err
		}
		w = &s.sendStream
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if *w+int64(f.Increment) > maxWindow {
		return breach(http2.ErrCodeFlowControl, "WINDOW_UPDATE on stream %d past 2^31-1", f.StreamID)
	}
	*w += int64(f.Increment)
	s.cond.Broadcast()
	return nil
}

// headers takes the answer's HEADERS: up to max1xx 1xx ones are passed
// over, the first final one is the answer, a later one its trailers,
// which must end the stream (RFC 9113 §8.1; dropped: a tunnel has none
// to pass on). All of them together hold at most maxHeaderList.
func (s *Stream) headers(f *http2.MetaHeadersFrame) error {
	if err := s.onStream(f); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	size := uint32(0)
	for _, hf := range f.Fields {
		size += hf.Size()
	}
	switch {
	case f.Truncated || size > s.headRoom:
		return breach(http2.ErrCodeProtocol, "answer's heads past %d bytes", maxHeaderList)
	case s.recvEnd:
		return breach(http2.ErrCodeStreamClosed, "HEADERS after END_STREAM")
	case s.status != 0:
		if !f.StreamEnded() || len(f.PseudoFields()) > 0 {
			return breach(http2.ErrCodeProtocol, "trailers without END_STREAM, or with pseudo-fields")
		}
		s.recvEnd = true
		s.cond.Broadcast()
		return nil
	}
	s.headRoom -= size
	code, err := strconv.Atoi(f.PseudoValue("status"))
	switch {
	case err != nil || code < 100 || code > 999:
		return breach(http2.ErrCodeProtocol, "answer with :status %q", f.PseudoValue("status"))
	case code < 200 && f.StreamEnded():
		return breach(http2.ErrCodeProtocol, "a %d answer with END_STREAM", code)
	case code < 200:
		if s.informational++; s.informational > max1xx {
			return breach(http2.ErrCodeProtocol, "more than %d 1xx answers", max1xx)
		}
		return nil
	}
	s.status = code
	s.header = make(http.Header, len(f.Fields))
	for _, hf := range f.RegularFields() {
		s.header.Add(hf.Name, hf.Value)
	}
	s.recvEnd = f.StreamEnded()
	s.cond.Broadcast()
	return nil
}

// data takes a DATA frame of the stream, within the windows the proxy
// gave (RFC 9113 §6.9.1), its padding included: a frame past them is a
// FLOW_CONTROL_ERROR, never buffered. The padding goes back with the
// next WINDOW_UPDATE, as it is never read.
func (s *Stream) data(f *http2.DataFrame) error {
	if err := s.onStream(f); err != nil {
		return err
	}
	n := int64(f.Header().Length)
	s.mu.Lock()
	switch {
	case s.status == 0:
		s.mu.Unlock()
		return breach(http2.ErrCodeProtocol, "DATA before the answer's HEADERS")
	case s.recvEnd:
		s.mu.Unlock()
		return breach(http2.ErrCodeStreamClosed, "DATA after END_STREAM")
	case n > s.recvConn || n > s.recvStream:
		s.mu.Unlock()
		return breach(http2.ErrCodeFlowControl, "DATA of %d bytes past the window (connection %d, stream %d)", n, s.recvConn, s.recvStream)
	}
	s.recvConn -= n
	s.recvStream -= n
	s.in.Write(f.Data())
	s.recvEnd = f.StreamEnded()
	credit, stream := s.consumed(n - int64(len(f.Data())))
	s.cond.Broadcast()
	s.mu.Unlock()
	s.giveBack(credit, stream)
	return nil
}
