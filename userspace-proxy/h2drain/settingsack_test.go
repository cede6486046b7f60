package h2drain

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// step is one Write of the Transport to an Upstream, or its hold's end.
type step func(c *Upstream) error

// write is a Write of frames, as the Transport's flush of them; part, when
// not nil, takes the part of their bytes written.
func write(part func([]byte) []byte, frames ...func(*http2.Framer) error) step {
	return func(c *Upstream) error {
		var buf bytes.Buffer
		fr := http2.NewFramer(&buf, nil)
		for _, f := range frames {
			if err := f(fr); err != nil {
				return err
			}
		}
		p := buf.Bytes()
		if part != nil {
			p = part(p)
		}
		if n, err := c.Write(p); n != len(p) || err != nil {
			return fmt.Errorf("write = %d, %v", n, err)
		}
		return nil
	}
}

// holdEnds is what the hold's timer does when ackHold has passed.
func holdEnds(c *Upstream) error {
	c.ackHoldEnded()
	return nil
}

// framesTo takes an Upstream through steps, after the client preface, and
// returns the frames the backend read, each as "TYPE stream", with " ACK"
// for a SETTINGS ACK. The hold's timer does not end it (ackHold is long):
// holdEnds does.
func framesTo(t *testing.T, steps ...step) []string {
	t.Helper()
	defer func(d time.Duration) { ackHold = d }(ackHold)
	ackHold = time.Hour
	backend, transport := net.Pipe()
	c := NewUpstream(transport)
	got := make(chan []string, 1)
	go func() {
		got <- readFrames(backend)
	}()
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	for i, s := range steps {
		if err := s(c); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	c.Close()
	return <-got
}

// readFrames reads a client preface and frames from r until it closes.
func readFrames(r io.Reader) []string {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(r, preface); err != nil || string(preface) != http2.ClientPreface {
		return []string{fmt.Sprintf("preface %q, %v", preface, err)}
	}
	var seen []string
	fr := http2.NewFramer(nil, r)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
				seen = append(seen, err.Error())
			}
			return seen
		}
		s := fmt.Sprintf("%v %d", f.Header().Type, f.Header().StreamID)
		if f.Header().Flags.Has(http2.FlagSettingsAck) && f.Header().Type == http2.FrameSettings {
			s += " ACK"
		}
		seen = append(seen, s)
	}
}

func headers(id uint32, endHeaders bool) func(*http2.Framer) error {
	return func(fr *http2.Framer) error {
		return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: []byte("h"), EndHeaders: endHeaders})
	}
}

func continuation(id uint32) func(*http2.Framer) error {
	return func(fr *http2.Framer) error { return fr.WriteContinuation(id, true, []byte("c")) }
}

func data(id uint32, n int) func(*http2.Framer) error {
	return func(fr *http2.Framer) error { return fr.WriteData(id, false, bytes.Repeat([]byte{'d'}, n)) }
}

func ack(fr *http2.Framer) error { return fr.WriteSettingsAck() }

func settings(fr *http2.Framer) error { return fr.WriteSettings() }

// TestUpstreamHoldsSettingsAck: the Transport's ACK of the backend's
// SETTINGS reaches the backend after the header block that opens the next
// stream (its CONTINUATION included), so that a stream whose slot was
// taken before the SETTINGS were applied is refused, not a protocol error;
// frames the settings cannot govern pass it meanwhile (header blocks,
// WINDOW_UPDATE, RST_STREAM, PING, and DATA within the initial window
// before the first ACK), and it goes before any other (DATA past that, a
// frame larger than the initial maximum, another SETTINGS, one whose
// header it cannot see whole). Every other frame goes as written, in
// order.
func TestUpstreamHoldsSettingsAck(t *testing.T) {
	large := func(fr *http2.Framer) error {
		return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 9, BlockFragment: make([]byte, 1<<14+1), EndHeaders: true})
	}
	control := func(fr *http2.Framer) error {
		return errors.Join(fr.WriteWindowUpdate(0, 1000), fr.WriteRSTStream(1, http2.ErrCodeCancel), fr.WritePing(false, [8]byte{}))
	}
	firstBytes := func(p []byte) []byte { return p[:4] }
	restBytes := func(p []byte) []byte { return p[4:] }
	const frame = 1 << 14
	for _, tc := range []struct {
		name  string
		steps []step
		want  []string
	}{
		{"a stream opens",
			[]step{write(nil, ack), write(nil, headers(3, false)), write(nil, continuation(3), data(3, 10))},
			[]string{"HEADERS 3", "CONTINUATION 3", "SETTINGS 0 ACK", "DATA 3"}},
		{"within one write",
			[]step{write(nil, data(1, 10), ack, headers(3, true), data(3, 1))},
			[]string{"DATA 1", "HEADERS 3", "SETTINGS 0 ACK", "DATA 3"}},
		{"DATA within the initial window",
			[]step{write(nil, data(1, 100)), write(nil, ack), write(nil, data(1, frame), data(1, frame), data(1, frame), data(1, frame-101)), write(nil, headers(3, true))},
			[]string{"DATA 1", "DATA 1", "DATA 1", "DATA 1", "DATA 1", "HEADERS 3", "SETTINGS 0 ACK"}},
		{"DATA past the initial window",
			[]step{write(nil, data(1, 100)), write(nil, ack), write(nil, data(1, frame), data(1, frame), data(1, frame), data(1, frame-100)), write(nil, headers(3, true))},
			[]string{"DATA 1", "DATA 1", "DATA 1", "DATA 1", "SETTINGS 0 ACK", "DATA 1", "HEADERS 3"}},
		{"a large DATA frame",
			[]step{write(nil, ack), write(nil, data(1, frame+1)), write(nil, headers(3, true))},
			[]string{"SETTINGS 0 ACK", "DATA 1", "HEADERS 3"}},
		{"trailers and control frames",
			[]step{write(nil, ack), write(nil, headers(1, true), control), write(nil, headers(3, true))},
			[]string{"HEADERS 1", "WINDOW_UPDATE 0", "RST_STREAM 1", "PING 0", "HEADERS 3", "SETTINGS 0 ACK"}},
		{"a large header block",
			[]step{write(nil, ack), write(nil, large)},
			[]string{"SETTINGS 0 ACK", "HEADERS 9"}},
		{"another SETTINGS",
			[]step{write(nil, ack), write(nil, settings)},
			[]string{"SETTINGS 0 ACK", "SETTINGS 0"}},
		{"a frame header in pieces",
			[]step{write(nil, ack), write(firstBytes, headers(3, true)), write(restBytes, headers(3, true))},
			[]string{"SETTINGS 0 ACK", "HEADERS 3"}},
		{"a second ACK",
			[]step{write(nil, ack), write(nil, ack), write(nil, headers(3, true)), write(nil, data(3, 1))},
			[]string{"SETTINGS 0 ACK", "HEADERS 3", "SETTINGS 0 ACK", "DATA 3"}},
		{"DATA after the first ACK",
			[]step{write(nil, ack), write(nil, headers(3, true)), write(nil, ack), write(nil, data(3, 1))},
			[]string{"HEADERS 3", "SETTINGS 0 ACK", "SETTINGS 0 ACK", "DATA 3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := append([]step{write(nil, settings, headers(1, false), continuation(1))}, tc.steps...)
			want := append([]string{"SETTINGS 0", "HEADERS 1", "CONTINUATION 1"}, tc.want...)
			if got := framesTo(t, steps...); !slices.Equal(got, want) {
				t.Fatalf("the backend read\n%q\nwant\n%q", got, want)
			}
		})
	}
}

// TestUpstreamSettingsAckHoldEnds: with nothing written after it that
// sends it, a held ACK goes once ackHold has passed; inside a frame then,
// at the frame's end (a header block's), and not again.
func TestUpstreamSettingsAckHoldEnds(t *testing.T) {
	firstBytes := func(p []byte) []byte { return p[:20] }
	restBytes := func(p []byte) []byte { return p[20:] }
	for _, tc := range []struct {
		name  string
		steps []step
		want  []string
	}{
		{"between frames",
			[]step{write(nil, ack), holdEnds, write(nil, headers(3, true))},
			[]string{"SETTINGS 0 ACK", "HEADERS 3"}},
		{"inside an opening block",
			[]step{write(nil, ack), write(nil, headers(3, false)), holdEnds, write(nil, continuation(3)), holdEnds, write(nil, data(3, 1))},
			[]string{"HEADERS 3", "CONTINUATION 3", "SETTINGS 0 ACK", "DATA 3"}},
		{"inside DATA",
			[]step{write(nil, ack), write(firstBytes, data(1, 100)), holdEnds, write(restBytes, data(1, 100)), write(nil, headers(3, true))},
			[]string{"DATA 1", "SETTINGS 0 ACK", "HEADERS 3"}},
		{"after its ACK went",
			[]step{write(nil, ack), write(nil, headers(3, true)), holdEnds, write(nil, data(3, 1))},
			[]string{"HEADERS 3", "SETTINGS 0 ACK", "DATA 3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := append([]step{write(nil, settings, headers(1, true))}, tc.steps...)
			want := append([]string{"SETTINGS 0", "HEADERS 1"}, tc.want...)
			if got := framesTo(t, steps...); !slices.Equal(got, want) {
				t.Fatalf("the backend read\n%q\nwant\n%q", got, want)
			}
		})
	}
}

// TestUpstreamSettingsAckHoldTimer: the hold's timer sends a held ACK by
// itself, with nothing more from the Transport.
func TestUpstreamSettingsAckHoldTimer(t *testing.T) {
	backend, transport := net.Pipe()
	defer backend.Close()
	c := NewUpstream(transport)
	defer c.Close()
	go func() {
		c.Write([]byte(http2.ClientPreface))
		write(nil, settings)(c)
		write(nil, ack)(c)
	}()
	backend.SetReadDeadline(time.Now().Add(time.Minute)) // a hang guard, not a bound
	if _, err := io.ReadFull(backend, make([]byte, len(http2.ClientPreface))); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(nil, backend)
	for _, wantAck := range []bool{false, true} {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if f, ok := f.(*http2.SettingsFrame); !ok || f.IsAck() != wantAck {
			t.Fatalf("read %v, want SETTINGS (ACK: %v)", f, wantAck)
		}
	}
}
