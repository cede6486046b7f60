package upstream

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/test/pki"
)

// TestH2DialEndedByRouteTimeout: a request toward an HTTP/2 backend whose
// context ends while the connection net/http's Transport dials for it is
// still connecting or in its TLS handshake ends then, and so does the
// dial, counted as a route's timeout (route_timeout) or the app leaving
// (canceled), as on the HTTP/1.1 wire — unless another request still
// waits for that dial: it goes on for that one, and ends with the last.
// Before, the Transport dialed apart from the request's context: the
// handshake went on until HandshakeTimeout (10 s), counted timeout, and
// ejected the endpoint. In a synctest bubble, where times are exact.
func TestH2DialEndedByRouteTimeout(t *testing.T) {
	for _, c := range []struct {
		name     string
		connects bool // the backend takes the connection (its handshake never answered)
		// ends are the requests' contexts' ends, at once: a deadline, or
		// a cancel (the app leaving) when negative.
		ends   []time.Duration
		metric string
		result string
	}{
		{"connect", false, []time.Duration{500 * time.Millisecond}, "sockmesh_proxy_upstream_dials_total", "route_timeout"},
		{"handshake", true, []time.Duration{500 * time.Millisecond}, "sockmesh_proxy_upstream_tls_handshakes_total", "route_timeout"},
		{"handshake-left", true, []time.Duration{-500 * time.Millisecond}, "sockmesh_proxy_upstream_tls_handshakes_total", "canceled"},
		{"handshake-waited-for", true, []time.Duration{500 * time.Millisecond, 2 * time.Second}, "sockmesh_proxy_upstream_tls_handshakes_total", "route_timeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var pn pipenet.Net
				addr := netip.MustParseAddrPort("10.0.0.1:8443")
				l := pn.Listen(addr)
				defer l.Close()
				var accepted atomic.Int32
				if c.connects {
					go func() {
						for {
							conn, err := l.Accept()
							if err != nil {
								return
							}
							accepted.Add(1)
							go func() {
								io.Copy(io.Discard, conn) // the ClientHello, unanswered
								conn.Close()
							}()
						}
					}()
				}
				ca, err := pki.NewCA("h2 dial test ca")
				if err != nil {
					t.Fatal(err)
				}
				w := &world{reg: prometheus.NewRegistry()}
				pools, err := New(Config{}, &pn, slog.New(slog.DiscardHandler), w.reg)
				if err != nil {
					t.Fatal(err)
				}
				be := backendAt(t, pools, addr, &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: sni, RootsPEM: string(ca.CertPEM)})
				rt := be.RoundTripper(WireH2)
				start := time.Now()
				errs := make([]chan error, len(c.ends))
				for i, end := range c.ends {
					ctx, cancel := context.WithTimeout(t.Context(), end)
					if end < 0 {
						ctx, cancel = context.WithCancel(t.Context())
						time.AfterFunc(-end, cancel)
					}
					defer cancel()
					errs[i] = make(chan error, 1)
					go func() {
						_, err := rt.RoundTrip(request(t, ctx, be, http.MethodGet, "/", nil))
						errs[i] <- err
					}()
				}
				for i, end := range c.ends {
					err := <-errs[i]
					want := context.DeadlineExceeded
					if end < 0 {
						end, want = -end, context.Canceled
					}
					if !errors.Is(err, want) || time.Since(start) != end {
						t.Errorf("request %d: %v after %v, want %v after %v", i, err, time.Since(start), want, end)
					}
					synctest.Wait()
					counted := 0.0
					if i == len(c.ends)-1 {
						counted = 1 // the last request waiting for it ended the dial
					}
					if got := w.counter(t, c.metric, c.result); got != counted {
						t.Errorf("after request %d: %s{%s} = %v, want %v", i, c.metric, c.result, got, counted)
					}
				}
				time.Sleep(time.Minute) // past HandshakeTimeout
				synctest.Wait()
				if got := w.counter(t, "sockmesh_proxy_upstream_tls_handshakes_total", "timeout"); got != 0 {
					t.Errorf("handshakes counted timeout: %v, want none (no dial outlived its requests)", got)
				}
				if c.connects && accepted.Load() != 1 {
					t.Errorf("the backend took %d connections, want 1 (the requests waited for one dial)", accepted.Load())
				}
			})
		})
	}
}
