package h2drain

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// sentFrame is a frame of the Transport's, as the backend reads it.
type sentFrame struct {
	typ     http2.FrameType
	stream  uint32
	length  uint32
	ack     bool
	opening bool // part of a header block that opens a stream
}

// FuzzSettingsAckHold: whatever frames the Transport writes and in what
// pieces, the backend reads them all, in order, header blocks whole, with
// each SETTINGS ACK where it was or later behind frames that may pass it
// (mayPass) and no further than the end of the first opening header block,
// and every ACK but the last held one.
func FuzzSettingsAckHold(f *testing.F) {
	f.Add([]byte{1, 0, 3, 1, 5, 0, 4, 3}, []byte{9, 200})
	f.Add([]byte{0, 1, 2, 2, 6, 0, 1, 0, 5}, []byte{1, 1, 30, 7})
	f.Fuzz(func(t *testing.T, ops, cuts []byte) {
		defer func(d time.Duration) { ackHold = d }(ackHold)
		ackHold = time.Hour
		stream, want := transportFrames(ops)
		var o outFrames
		var got bytes.Buffer
		for rest, i := stream, 0; len(rest) > 0; i++ {
			n := len(rest)
			if i < len(cuts) {
				n = min(n, 1+int(cuts[i])*7)
			}
			out, edited := o.edit(rest[:n], func() {})
			if !edited {
				out = rest[:n]
			}
			got.Write(out)
			rest = rest[n:]
		}
		if o.held {
			o.timer.Stop()
		}
		seen := readSent(t, got.Bytes())
		if !bytes.HasPrefix(got.Bytes(), []byte(http2.ClientPreface)) {
			t.Fatal("the preface did not go first")
		}
		var wantRest, seenRest []sentFrame
		var wantAcks, seenAcks []int // each ACK's place among the other frames
		for _, s := range want {
			if s.ack {
				wantAcks = append(wantAcks, len(wantRest))
			} else {
				wantRest = append(wantRest, s)
			}
		}
		for _, s := range seen {
			if s.ack {
				seenAcks = append(seenAcks, len(seenRest))
			} else {
				seenRest = append(seenRest, s)
			}
		}
		if len(seenRest) != len(wantRest) {
			t.Fatalf("%d frames besides ACKs, want %d", len(seenRest), len(wantRest))
		}
		for i := range wantRest {
			if seenRest[i] != wantRest[i] {
				t.Fatalf("frame %d: %+v, want %+v", i, seenRest[i], wantRest[i])
			}
		}
		if held := len(wantAcks) - len(seenAcks); held != 0 && (held != 1 || !o.held) {
			t.Fatalf("%d ACKs of %d went (held: %v)", len(seenAcks), len(wantAcks), o.held)
		}
		dataBefore := make([]int, len(wantRest)+1) // DATA bytes ahead of each frame, itself included
		for i, s := range wantRest {
			dataBefore[i+1] = dataBefore[i]
			if s.typ == http2.FrameData {
				dataBefore[i+1] += int(s.length)
			}
		}
		for k, at := range seenAcks {
			if at < wantAcks[k] {
				t.Fatalf("ACK %d went ahead of frames (%d < %d)", k, at, wantAcks[k])
			}
			passed := wantRest[wantAcks[k]:at]
			for j, s := range passed {
				if !mayPass(s, k == 0, dataBefore[wantAcks[k]+j+1]) {
					t.Fatalf("ACK %d went behind %+v", k, s)
				}
				if s.opening && j+1 < len(passed) && passed[j+1].typ != http2.FrameContinuation {
					t.Fatalf("ACK %d went behind %+v after an opening header block", k, passed[j+1])
				}
			}
		}
	})
}

// mayPass reports whether s may go ahead of an ACK, the connection's first
// or not, after data bytes of DATA (its own included).
func mayPass(s sentFrame, first bool, data int) bool {
	if s.length > initialMaxFrameSize {
		return false
	}
	switch s.typ {
	case http2.FrameData:
		return first && data <= initialWindowSize
	case http2.FrameHeaders, http2.FrameContinuation, http2.FrameWindowUpdate:
		return true
	}
	return false
}

// transportFrames writes the client preface and frames that ops choose, a
// header block's CONTINUATIONs following it, and returns the bytes and the
// frames.
func transportFrames(ops []byte) ([]byte, []sentFrame) {
	var b bytes.Buffer
	b.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&b, nil)
	var frames []sentFrame
	var lastID uint32
	inBlock, opening := false, false
	add := func(s sentFrame) { frames = append(frames, s) }
	for i, op := range append(ops, 2) { // 2: a block left open ends
		if inBlock {
			end := op%2 == 0 || i == len(ops)
			fr.WriteContinuation(lastID, end, []byte("c"))
			add(sentFrame{typ: http2.FrameContinuation, stream: lastID, length: 1, opening: opening})
			inBlock = !end
			continue
		}
		switch op % 7 {
		case 0:
			fr.WriteSettingsAck()
			add(sentFrame{typ: http2.FrameSettings, ack: true})
		case 1, 6:
			lastID += 2
			if lastID == 2 {
				lastID = 1
			}
			size := 1 + int(op)%40
			if op%7 == 6 {
				size = initialMaxFrameSize + 1
			}
			end := op&0x80 == 0
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: lastID, BlockFragment: make([]byte, size), EndHeaders: end})
			add(sentFrame{typ: http2.FrameHeaders, stream: lastID, length: uint32(size), opening: true})
			inBlock, opening = !end, true
		case 2:
			if lastID > 0 {
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: lastID, BlockFragment: []byte("t"), EndHeaders: true, EndStream: true})
				add(sentFrame{typ: http2.FrameHeaders, stream: lastID, length: 1})
			}
		case 3:
			n := int(op) * 50
			fr.WriteData(max(lastID, 1), false, make([]byte, n))
			add(sentFrame{typ: http2.FrameData, stream: max(lastID, 1), length: uint32(n)})
		case 4:
			fr.WriteWindowUpdate(0, 1000)
			add(sentFrame{typ: http2.FrameWindowUpdate, length: 4})
		case 5:
			fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
			add(sentFrame{typ: http2.FrameSettings, length: 6})
		}
	}
	return b.Bytes(), frames
}

// readSent reads the frames of b after the client preface; a Framer
// checks that header blocks come whole.
func readSent(t *testing.T, b []byte) []sentFrame {
	t.Helper()
	r := bytes.NewReader(b)
	io.CopyN(io.Discard, r, int64(len(http2.ClientPreface)))
	fr := http2.NewFramer(nil, r)
	fr.SetMaxReadFrameSize(1 << 24)
	var seen []sentFrame
	opening, lastID := false, uint32(0)
	for {
		f, err := fr.ReadFrame()
		if errors.Is(err, io.EOF) {
			return seen
		}
		if err != nil {
			t.Fatalf("after %d frames: %v", len(seen), err)
		}
		h := f.Header()
		s := sentFrame{typ: h.Type, stream: h.StreamID, length: h.Length}
		switch h.Type {
		case http2.FrameSettings:
			s.ack = h.Flags.Has(http2.FlagSettingsAck)
		case http2.FrameHeaders:
			opening = h.StreamID > lastID
			lastID = max(lastID, h.StreamID)
			s.opening = opening
		case http2.FrameContinuation:
			s.opening = opening
		}
		seen = append(seen, s)
	}
}
