package h2drain

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"golang.org/x/net/http2"
)

// TestUpstreamGoAwayBetweenFrames: whatever pieces the backend's bytes
// come in and whenever the GOAWAY is asked for (the Transport's read
// waiting on the backend or not), the Transport reads every frame of the
// backend, in order, and one GOAWAY between two of them, as from a Conn.
func TestUpstreamGoAwayBetweenFrames(t *testing.T) {
	stream := serverFrames(t)
	want := parse(t, stream)
	for round := range 300 {
		rng := rand.New(rand.NewPCG(uint64(round), 11))
		backend, transport := net.Pipe()
		c := NewUpstream(transport)
		got := make(chan []byte, 1)
		go func() {
			all, _ := io.ReadAll(c)
			got <- all
		}()
		pieces := randomPieces(rng, stream, round)
		ask := rng.IntN(len(pieces) + 1)
		writeAsking(t, backend, pieces, ask, func() bool { return c.GoAway(ReasonExpired) })
		backend.Close()
		wantGoAwayAmong(t, round, parse(t, <-got), want, "sockmesh: expired")
	}
}

// TestUpstreamGoAwayWhileIdle: a GOAWAY asked for while the backend is
// between frames, once it has begun an answer, reaches the Transport with
// nothing more from the backend: the read deadline GoAway sets wakes the
// read, whose error the Transport never sees, nor the deadline after.
func TestUpstreamGoAwayWhileIdle(t *testing.T) {
	backend, transport := net.Pipe()
	defer backend.Close()
	c := NewUpstream(transport)
	defer c.Close()
	var start, ping bytes.Buffer
	fw := http2.NewFramer(&start, nil)
	fw.WriteSettings()
	fw.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("h"), EndHeaders: true})
	http2.NewFramer(&ping, nil).WritePing(false, [8]byte{1})
	go backend.Write(start.Bytes())
	fr := http2.NewFramer(nil, c)
	for _, want := range []http2.FrameType{http2.FrameSettings, http2.FrameHeaders} {
		if f, err := fr.ReadFrame(); err != nil || f.Header().Type != want {
			t.Fatalf("frame %v, %v; want %v", f, err, want)
		}
	}
	if !c.GoAway(ReasonPolicyChanged) {
		t.Fatal("GoAway refused")
	}
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := f.(*http2.GoAwayFrame); !ok || string(g.DebugData()) != "sockmesh: policy_changed" {
		t.Fatalf("got %v, want the GOAWAY", f)
	}
	go backend.Write(ping.Bytes())
	if f, err := fr.ReadFrame(); err != nil || f.Header().Type != http2.FramePing {
		t.Fatalf("after the GOAWAY: %v, %v; want the backend's PING", f, err)
	}
}
