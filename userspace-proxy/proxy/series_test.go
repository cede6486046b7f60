package proxy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestSeriesOfGoneBackends: the metric series of a Service or backend go
// with it from the snapshot — requests, upstream connections, ejections,
// GOAWAYs. Each stayed for the agent's life: a node proxy that saw a
// thousand Services come and go (a namespace per CI run, per preview
// environment) exported, and held in memory, a thousand Services' series.
func TestSeriesOfGoneBackends(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	be := startEcho(t, "web-0", serverTLS(e.pki.server))
	// Trust withdrawn (another CA only): a trust that only widens would
	// keep the relayed connection (upstreamtls.Keeper), and no GOAWAY
	// series would be made.
	rotated := tlsPolicy(e)
	rotated.RootsPEM = string(e.pki.other.CertPEM)
	svc := func(name string, pol *snapshot.TLS) service {
		return service{name: name, vip: vip, backend: snapshot.Backend{TLS: pol, Endpoints: endpoints(be.addr)}}
	}
	for v := range 3 {
		name := fmt.Sprint("web-", v)
		e.p.Update(buildSnapshot(t, uint64(2*v+1), svc(name, tlsPolicy(e))))
		h1, h2 := e.client(vip, false), e.client(vip, true)
		for _, c := range []*http.Client{h1, h2} {
			if code, _ := get(t, c, "http://web.b.svc/"); code != http.StatusOK {
				t.Fatalf("%s: status %d", name, code)
			}
		}
		// New TLS settings ask the relayed HTTP/2 connection to go away.
		e.p.Update(buildSnapshot(t, uint64(2*v+2), svc(name, rotated)))
		if got := e.counterReaches("sockmesh_proxy_goaways_total", map[string]string{"backend": name}, 1); got != 1 {
			t.Fatalf("%s: goaways = %v, want 1", name, got)
		}
		for _, c := range []*http.Client{h1, h2} {
			c.Transport.(*http.Transport).CloseIdleConnections()
		}
	}
	eventually(t, func() bool { return e.counter("sockmesh_proxy_active_connections", nil) == 0 }, "the apps' connections to end")
	e.p.Update(buildSnapshot(t, 7, svc("web-2", rotated)))
	names := seriesNames(t, e.reg)
	for _, gone := range []string{"web-0", "web-1"} {
		if metrics, ok := names[gone]; ok {
			t.Errorf("%s, gone from the snapshot, still has series of %v", gone, metrics)
		}
	}
	if len(names["web-2"]) == 0 {
		t.Errorf("web-2, in the snapshot, has no series: %v", names)
	}
}

// TestSeriesOfGoneServiceStragglers: a request still under way on the
// snapshot its Service left makes no series for it when it ends. Before,
// it made its requests series again, which stayed until the next snapshot.
func TestSeriesOfGoneServiceStragglers(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	release := make(chan struct{})
	rec := startRecorder(t, serverTLS(e.pki.server), func(http.ResponseWriter, *http.Request, int) bool {
		<-release
		return false
	})
	svc := func(name string) service {
		return service{name: name, vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(rec.addr)}}
	}
	e.p.Update(buildSnapshot(t, 1, svc("web-0")))
	code := make(chan int, 1)
	go func() {
		resp, err := e.client(vip, false).Get("http://web.b.svc/")
		if err != nil {
			code <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		code <- resp.StatusCode
	}()
	<-rec.seen
	e.p.Update(buildSnapshot(t, 2, svc("web-1")))
	close(release)
	if c := <-code; c != http.StatusOK {
		t.Fatalf("request under way at the swap: status %d", c)
	}
	if metrics := seriesNames(t, e.reg)["web-0"]; slices.Contains(metrics, "sockmesh_proxy_requests_total") {
		t.Errorf("web-0, gone from the snapshot, has its requests series again after a request under way ended")
	}
}

// TestSeriesOfGoneBackendGoAway: a relayed HTTP/2 connection to a backend
// gone from the snapshot, asked to go away later (the certificate chain its
// handshake verified expired), makes no goaways series for it; one of a
// backend still there does. Before, it made one that no later snapshot
// dropped (each drops those of the backends the one before had). In a
// synctest bubble, whose clock passes the certificate's end without
// waiting.
func TestSeriesOfGoneBackendGoAway(t *testing.T) {
	for _, gone := range []bool{false, true} {
		t.Run(map[bool]string{false: "kept", true: "gone"}[gone], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testSeriesOfGoneBackendGoAway(t, gone) })
		})
	}
}

func testSeriesOfGoneBackendGoAway(t *testing.T, gone bool) {
	ca, err := pki.NewCA("expiry test ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "echo", DNSNames: []string{sniName}, NotAfter: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	var pn pipenet.Net
	backendAddr := netip.MustParseAddrPort("10.0.0.1:443")
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Proto) }),
		TLSConfig: serverTLS(leaf),
	}
	go srv.ServeTLS(pipenet.Buffered(pn.Listen(backendAddr)), "", "")
	t.Cleanup(func() { srv.Close() })
	reg := prometheus.NewRegistry()
	p, err := proxy.New(proxy.Config{Dialer: &pn}, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	m := &mesh{t: t}
	be := m.backend("tls", snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, Endpoints: endpoints(backendAddr),
		TLS: &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: sniName, RootsPEM: string(ca.CertPEM)}})
	m.frontend("tls", routedVIP, be, nil)
	p.Update(m.snapshot(1))
	resp, err := pipeClient(t, p, true).Get("http://tls.b.svc/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if gone {
		m = &mesh{t: t}
	}
	p.Update(m.snapshot(2))
	time.Sleep(time.Minute + time.Second)
	synctest.Wait()
	if has := slices.Contains(seriesNames(t, reg)["tls"], "sockmesh_proxy_goaways_total"); has == gone {
		t.Errorf("backend gone from the snapshot %v, its connection asked to go away: goaways series %v, want %v", gone, has, !gone)
	}
}

// seriesNames returns the Services and backends reg's metrics name (their
// "service" and "backend" labels), each with the metrics naming it.
func seriesNames(t *testing.T, reg prometheus.Gatherer) map[string][]string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string][]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if n := l.GetName(); (n == "service" || n == "backend") && l.GetValue() != "" && !slices.Contains(names[l.GetValue()], mf.GetName()) {
					names[l.GetValue()] = append(names[l.GetValue()], mf.GetName())
				}
			}
		}
	}
	return names
}
