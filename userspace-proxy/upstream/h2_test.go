package upstream

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
)

// TestH2PingsFrozenBackend: an HTTP/2 connection to a backend that stops
// answering (frozen, or gone with its node, while its kernel or a middle
// box still takes the bytes) is pinged after H2PingAfter without frames,
// and closed after H2PingTimeout without the ping's answer: the request on
// it fails then, not when the app gives up, and the next one gets a new
// connection.
func TestH2PingsFrozenBackend(t *testing.T) {
	w := newWorld(t)
	addr, freeze := startFreezer(t, w.addr)
	pools, err := New(Config{H2PingAfter: 100 * time.Millisecond, H2PingTimeout: 200 * time.Millisecond},
		dial.NewDirect(dial.Config{Unmarked: true}), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	be := backendAt(t, pools, addr, w.policy())
	rt := be.RoundTripper(WireH2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, body := roundTrip(t, rt, request(t, ctx, be, http.MethodGet, "/", nil)); body != "HTTP/2.0" {
		t.Fatalf("first request: %q", body)
	}
	freeze()
	start := time.Now()
	_, err = rt.RoundTrip(request(t, ctx, be, http.MethodGet, "/", nil))
	if err == nil || ctx.Err() != nil {
		t.Fatalf("a request to the frozen backend: %v after %v, want the ping's failure", err, time.Since(start))
	}
	if _, body := roundTrip(t, rt, request(t, ctx, be, http.MethodGet, "/", nil)); body != "HTTP/2.0" {
		t.Errorf("the request after: %q", body)
	}
}

// startFreezer relays TCP connections to target until freeze, after which
// the connections open then take bytes both ways and pass none on (a frozen
// peer whose kernel still acknowledges); later connections relay.
func startFreezer(t *testing.T, target netip.AddrPort) (netip.AddrPort, func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var flags []*atomic.Bool
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	pipe := func(dst, src net.Conn, frozen *atomic.Bool) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !frozen.Load() {
				dst.Write(buf[:n])
			}
			if err != nil {
				dst.Close()
				return
			}
		}
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target.String())
			if err != nil {
				c.Close()
				continue
			}
			f := new(atomic.Bool)
			mu.Lock()
			flags = append(flags, f)
			conns = append(conns, c, up)
			mu.Unlock()
			go pipe(up, c, f)
			go pipe(c, up, f)
		}
	}()
	freeze := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, f := range flags {
			f.Store(true)
		}
	}
	return l.Addr().(*net.TCPAddr).AddrPort(), freeze
}

// TestH2ProbeHandedBackWithoutDial: a request over net/http's HTTP/2
// Transport that holds an endpoint's probe and whose context ends before
// the Transport dials hands the probe back. Before, nothing did: the
// endpoint was passed over for probeWait (15 s).
func TestH2ProbeHandedBackWithoutDial(t *testing.T) {
	w := newWorld(t)
	b := backendAt(t, w.pools, w.addr, w.policy())
	h := w.pools.health
	h.Failed(w.addr, time.Now().Add(-time.Hour)) // an ejection long over
	c := b.Picker.Pick()
	if c == nil || c.Endpoint.Addr != w.addr {
		t.Fatalf("picked %v, want %v", c, w.addr)
	}
	if n := h.Ejected(time.Now()); n != 1 {
		t.Fatalf("endpoints passed over with the probe out: %d, want 1", n)
	}
	ctx, cancel := context.WithCancel(WithEndpoint(t.Context(), c))
	cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+w.addr.String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := b.RoundTripper(WireH2).RoundTrip(req); err == nil {
		resp.Body.Close()
		t.Fatal("a request whose context had ended was answered")
	}
	if n := h.Ejected(time.Now()); n != 0 {
		t.Errorf("endpoints passed over after the request left undialed: %d, want 0", n)
	}
}

// TestH2TransportRetiredAtFirstExpiry: net/http's HTTP/2 Transport of a
// wire is set aside for a new one when the first certificate chain its
// connections' handshakes verified expires, whether the connection that
// holds it was dialed first or last (expireAt), and not before.
func TestH2TransportRetiredAtFirstExpiry(t *testing.T) {
	for _, lives := range [][]time.Duration{{time.Minute, time.Hour}, {time.Hour, time.Minute}} {
		t.Run(fmt.Sprint(lives), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p, err := New(Config{}, dial.NewDirect(dial.Config{Unmarked: true}), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
				if err != nil {
					t.Fatal(err)
				}
				w := backendAt(t, p, netip.MustParseAddrPort("10.0.0.1:443"), nil).w
				first := w.transport(WireH2)
				for _, d := range lives {
					w.expireAt(WireH2, first, time.Now().Add(d))
				}
				time.Sleep(time.Minute - time.Nanosecond)
				if w.transport(WireH2) != first {
					t.Fatal("set aside before the first chain expired")
				}
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				if w.transport(WireH2) == first {
					t.Error("kept after the first chain expired")
				}
				// Dropped (its settings changed): its timer goes too, or it
				// would hold the dropped state until the chain expires.
				w.expireAt(WireH2, w.transport(WireH2), time.Now().Add(24*time.Hour))
				w.closeIdle()
				if w.expires[WireH2] != nil {
					t.Error("a dropped state's expiry timer still runs")
				}
			})
		})
	}
}
