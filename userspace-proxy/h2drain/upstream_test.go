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

// TestUpstreamGoAwayOnceStreamOpened: a GOAWAY asked for before the
// backend began an answer waits while the Transport has opened no stream
// (one read then would fail the connection's first request), and reaches
// the Transport as soon as it has opened one, the backend silent: a
// connection whose first answer is slow to begin is set aside at once.
func TestUpstreamGoAwayOnceStreamOpened(t *testing.T) {
	backend, transport := net.Pipe()
	defer backend.Close()
	c := NewUpstream(transport)
	defer c.Close()
	go io.Copy(io.Discard, backend)
	var settings, ping bytes.Buffer
	http2.NewFramer(&settings, nil).WriteSettings()
	http2.NewFramer(&ping, nil).WritePing(false, [8]byte{1})
	go backend.Write(settings.Bytes())
	fr := http2.NewFramer(nil, c)
	if f, err := fr.ReadFrame(); err != nil || f.Header().Type != http2.FrameSettings {
		t.Fatalf("frame %v, %v; want SETTINGS", f, err)
	}
	if !c.GoAway(ReasonExpired) {
		t.Fatal("GoAway refused")
	}
	go backend.Write(ping.Bytes())
	if f, err := fr.ReadFrame(); err != nil || f.Header().Type != http2.FramePing {
		t.Fatalf("before a stream opened: %v, %v; want the backend's PING alone", f, err)
	}
	openStream(t, c)
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := f.(*http2.GoAwayFrame); !ok || string(g.DebugData()) != "sockmesh: expired" {
		t.Fatalf("once a stream opened: %v, want the GOAWAY", f)
	}
}

// TestUpstreamGoAwayAfterBackendSettings: a GOAWAY asked for before the
// backend sent anything, the Transport's first stream open, reaches the
// Transport after the backend's SETTINGS, never before them (a client
// takes another first frame for a protocol error).
func TestUpstreamGoAwayAfterBackendSettings(t *testing.T) {
	backend, transport := net.Pipe()
	defer backend.Close()
	c := NewUpstream(transport)
	defer c.Close()
	go io.Copy(io.Discard, backend)
	if !c.GoAway(ReasonPolicyChanged) {
		t.Fatal("GoAway refused")
	}
	openStream(t, c)
	var settings bytes.Buffer
	http2.NewFramer(&settings, nil).WriteSettings()
	go backend.Write(settings.Bytes())
	fr := http2.NewFramer(nil, c)
	for _, want := range []http2.FrameType{http2.FrameSettings, http2.FrameGoAway} {
		if f, err := fr.ReadFrame(); err != nil || f.Header().Type != want {
			t.Fatalf("frame %v, %v; want %v", f, err, want)
		}
	}
}

// openStream writes what the Transport writes to open its first stream:
// the client preface, its SETTINGS and the stream's HEADERS.
func openStream(t *testing.T, c *Upstream) {
	t.Helper()
	var opening bytes.Buffer
	opening.WriteString(http2.ClientPreface)
	fw := http2.NewFramer(&opening, nil)
	fw.WriteSettings()
	fw.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("h"), EndHeaders: true})
	if _, err := c.Write(opening.Bytes()); err != nil {
		t.Fatal(err)
	}
}
