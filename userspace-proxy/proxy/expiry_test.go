package proxy_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestExpiredChainH2: an HTTP/2 upstream connection that net/http's
// Transport holds is not used for requests made after the certificate
// chain its handshake verified expired: they get a new connection, whose
// handshake meets the expired certificate (502 tls_verify), or the renewed
// one the backend serves by then (200). Before, they were answered over
// the old connection (200) for as long as it did not idle out. From an
// HTTP/2 app (L7, routed) to an h2 backend and to one that negotiates, and
// from an HTTP/1.1 app to an h2 backend; in a synctest bubble, whose clock
// passes the certificate's end without waiting.
func TestExpiredChainH2(t *testing.T) {
	for _, k := range []struct {
		name               string
		h2c                bool
		proto              snapshot.Protocol
		renewed, slowFirst bool
	}{
		{"h2c-to-h2", true, snapshot.ProtocolHTTP2, false, false},
		{"h2c-to-negotiated", true, snapshot.ProtocolAuto, false, false},
		{"http1-to-h2", false, snapshot.ProtocolHTTP2, false, false},
		{"h2c-to-h2-renewed", true, snapshot.ProtocolHTTP2, true, false},
		// The connection's first request is the slow one: the backend has
		// begun no answer on it when its chain expires, and it is set
		// aside all the same (before, it took requests until that answer
		// began).
		{"http1-to-h2-slow-first", false, snapshot.ProtocolHTTP2, false, true},
		{"h2c-to-h2-slow-first", true, snapshot.ProtocolHTTP2, false, true},
	} {
		t.Run(k.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testExpiredChainH2(t, k.h2c, k.proto, k.renewed, k.slowFirst) })
		})
	}
}

func testExpiredChainH2(t *testing.T, h2c bool, proto snapshot.Protocol, renewed, slowFirst bool) {
	ca, err := pki.NewCA("expiry test ca")
	if err != nil {
		t.Fatal(err)
	}
	var pn pipenet.Net
	backendAddr := netip.MustParseAddrPort("10.0.0.1:443")
	b := serveExpiring(t, &pn, backendAddr, ca, expiryLifetime)
	p, err := proxy.New(proxy.Config{Dialer: &pn}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	get := routedTo(t, p, proto, h2c, ca, backendAddr)
	if !slowFirst {
		if code, body := get("/"); code != 200 || body != "HTTP/2.0" {
			t.Fatalf("before the certificate expired: %d %q, want 200 over HTTP/2", code, body)
		}
	}
	// A request in flight when the certificate expires finishes (the
	// bubble's clock moves on once it waits in the backend).
	slow := make(chan string)
	go func() {
		code, body := get("/slow")
		slow <- fmt.Sprint(code, " ", body)
	}()
	if renewed {
		b.renew(t, ca, 24*time.Hour)
	}
	time.Sleep(expiryLifetime + time.Second)
	code, body := get("/")
	if got := <-slow; got != "200 HTTP/2.0" {
		t.Errorf("the request in flight when the certificate expired: %s, want 200 HTTP/2.0", got)
	}
	switch {
	case renewed && (code != 200 || b.conns.Load() != 2):
		t.Errorf("after the certificate was renewed and the old one expired: %d %q over %d backend connections, want 200 over a second one", code, body, b.conns.Load())
	case !renewed && (code != http.StatusBadGateway || !strings.Contains(body, "tls_verify")):
		t.Errorf("after the certificate expired: %d %q, want 502 tls_verify", code, body)
	}
	// Its last request over, the expired connection closes, where
	// net/http's Transport kept it for its idle timeout (90 s).
	synctest.Wait()
	if !b.firstClosed.Load() {
		t.Error("the expired connection is still open after its last request")
	}
}

// expiryLifetime is how long the certificates of serveExpiring live:
// within the Transport's idle timeout (90 s), so that a connection stays
// idle past their end.
const expiryLifetime = time.Minute

// expiringBackend is a TLS backend serving ca's certificate of the moment
// (renew), for lifetime at first, whose /slow answers after twice that;
// it counts its connections and tells whether its first one closed.
type expiringBackend struct {
	cert        atomic.Pointer[tls.Certificate]
	conns       atomic.Int32
	first       atomic.Pointer[net.Conn]
	firstClosed atomic.Bool
}

func serveExpiring(t *testing.T, pn *pipenet.Net, addr netip.AddrPort, ca *pki.CA, lifetime time.Duration) *expiringBackend {
	b := &expiringBackend{}
	b.renew(t, ca, lifetime)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				time.Sleep(2 * lifetime)
			}
			io.WriteString(w, r.Proto)
		}),
		TLSConfig: &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return b.cert.Load(), nil
		}},
		ErrorLog: log.New(io.Discard, "", 0), // the refused handshakes
		ConnState: func(c net.Conn, s http.ConnState) {
			switch {
			case s == http.StateNew:
				b.conns.Add(1)
				b.first.CompareAndSwap(nil, &c)
			case s == http.StateClosed && *b.first.Load() == c:
				b.firstClosed.Store(true)
			}
		},
	}
	go srv.ServeTLS(pipenet.Buffered(pn.Listen(addr)), "", "")
	t.Cleanup(func() { srv.Close() })
	return b
}

// renew has b serve a certificate of ca's that lives for valid.
func (b *expiringBackend) renew(t *testing.T, ca *pki.CA, valid time.Duration) {
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "echo", DNSNames: []string{sniName}, NotAfter: time.Now().Add(valid)})
	if err != nil {
		t.Fatal(err)
	}
	b.cert.Store(&leaf.TLS)
}

// routedTo routes a producer's requests to routedVIP through p to a TLS
// backend of protocol proto at addrs, verified with ca, and returns a GET
// from an h2c or HTTP/1.1 app (a failed one: 0 and its error).
func routedTo(t *testing.T, p *proxy.Proxy, proto snapshot.Protocol, h2c bool, ca *pki.CA, addrs ...netip.AddrPort) func(path string) (int, string) {
	m := &mesh{t: t}
	be := m.backend("tls", snapshot.Backend{Protocol: proto, Endpoints: endpoints(addrs...),
		TLS: &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: sniName, RootsPEM: string(ca.CertPEM)}})
	m.frontend("tls", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute, rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be)}})))
	p.Update(m.snapshot(1))
	client := pipeClient(t, p, h2c)
	return func(path string) (int, string) {
		resp, err := client.Get("http://tls.b.svc" + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
}

// TestExpiryPerConnectionH2: of the HTTP/2 connections net/http's
// Transport holds for a backend, only the one whose certificate chain
// expired is set aside (counted as pool_dropped_total{reason="expired"}):
// another endpoint's, whose chain is valid still, keeps serving. All were
// set aside at the first expiry among them, and each endpoint connected
// again, uncounted.
func TestExpiryPerConnectionH2(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca, err := pki.NewCA("expiry test ca")
		if err != nil {
			t.Fatal(err)
		}
		var pn pipenet.Net
		addrs := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:443"), netip.MustParseAddrPort("10.0.0.2:443")}
		soon, later := serveExpiring(t, &pn, addrs[0], ca, expiryLifetime), serveExpiring(t, &pn, addrs[1], ca, time.Hour)
		reg := prometheus.NewRegistry()
		p, err := proxy.New(proxy.Config{Dialer: &pn}, slog.New(slog.DiscardHandler), reg)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Shutdown(context.Background())
		get := routedTo(t, p, snapshot.ProtocolHTTP2, false, ca, addrs...)
		for range 4 { // round robin: two to each endpoint
			if code, body := get("/"); code != 200 {
				t.Fatalf("before the first certificate expired: %d %q", code, body)
			}
		}
		if soon.conns.Load() != 1 || later.conns.Load() != 1 {
			t.Fatalf("connections before: %d and %d, want one to each endpoint", soon.conns.Load(), later.conns.Load())
		}
		soon.renew(t, ca, time.Hour)
		time.Sleep(expiryLifetime + time.Second)
		for range 4 {
			if code, body := get("/"); code != 200 {
				t.Fatalf("after the first certificate expired: %d %q", code, body)
			}
		}
		synctest.Wait()
		if !soon.firstClosed.Load() || soon.conns.Load() != 2 {
			t.Errorf("the endpoint whose certificate expired: first connection closed %v, %d connections; want it closed and a second", soon.firstClosed.Load(), soon.conns.Load())
		}
		if later.firstClosed.Load() || later.conns.Load() != 1 {
			t.Errorf("the endpoint whose certificate is valid: first connection closed %v, %d connections; want the first only, open", later.firstClosed.Load(), later.conns.Load())
		}
		if n := counterValue(t, reg, "sockmesh_proxy_upstream_pool_dropped_total", "reason", "expired"); n != 1 {
			t.Errorf("pool_dropped_total{reason=expired} = %v, want 1", n)
		}
	})
}
