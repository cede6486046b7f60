package h2connect

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// hangGuard tells a hang from an end in these tests; it measures nothing.
const hangGuard = 30 * time.Second

// TestNoSettings: a backend whose kernel took the connection but that
// sends no SETTINGS (a frozen process) fails Open with ErrNoSettings
// within Config.SettingsTimeout, its connection closed, though Open's
// context has no end: it held Open until the app gave up.
func TestNoSettings(t *testing.T) {
	c, b := dialBackend(t)
	got := openWith(context.Background(), c, nil, Config{SettingsTimeout: 50 * time.Millisecond})
	b.preface()
	select {
	case o := <-got:
		if !errors.Is(o.err, ErrNoSettings) {
			t.Fatalf("Open = %v, want ErrNoSettings", o.err)
		}
	case <-time.After(hangGuard):
		t.Fatal("Open still waits for SETTINGS that never come")
	}
	b.c.SetReadDeadline(time.Now().Add(hangGuard))
	if f, err := b.fr.ReadFrame(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the backend read %v, %v; want the connection closed", f, err)
	}
}

// TestPingUnanswered: a stream whose backend went silent (gone with its
// node, frozen) is pinged after Config.PingAfter without a frame; an
// answered PING keeps it (and the next silence is pinged again), one left
// unanswered for Config.PingTimeout ends it — its reads fail with
// ErrPingTimeout, so the WebSocket's app side is closed, and the
// connection closes — where it waited for TCP to give up.
func TestPingUnanswered(t *testing.T) {
	// PingTimeout is long beside the backend's answer, which a loaded
	// machine may delay: the answered PING must keep the stream.
	b, resp := openAnsweredWith(t, Config{PingAfter: 20 * time.Millisecond, PingTimeout: time.Second})
	b.c.SetReadDeadline(time.Now().Add(hangGuard))
	p := b.awaitPing()
	b.write(b.fr.WritePing(true, p.Data))
	b.awaitPing() // the stream lived on, and was idle again: left unanswered

	read := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(make([]byte, 1))
		read <- err
	}()
	select {
	case err := <-read:
		if !errors.Is(err, ErrPingTimeout) {
			t.Fatalf("Read = %v, want ErrPingTimeout", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("the stream still waits on a backend that answers no PING")
	}
	for {
		if _, err := b.fr.ReadFrame(); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Error("the connection is still open")
			}
			return
		}
	}
}

// awaitPing reads the proxy's frames up to a PING of its own, and returns
// it.
func (b *backend) awaitPing() *http2.PingFrame {
	b.t.Helper()
	for {
		f, err := b.fr.ReadFrame()
		if err != nil {
			b.t.Fatalf("waiting for a PING: %v", err)
		}
		if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
			return p
		}
	}
}
