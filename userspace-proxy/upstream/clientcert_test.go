package upstream

import (
	"bufio"
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/tlsrefusal"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
)

// clientCertWires are the wires a client certificate goes over: the
// relay's connection (Dial), HTTP/1.1, HTTP/2, and negotiated by ALPN.
var clientCertWires = []struct {
	name  string
	relay bool
	wire  Wire
}{{"relay", true, WireH1}, {"h1", false, WireH1}, {"h2", false, WireH2}, {"negotiated", false, WireNegotiate}}

// send makes a request over wire, or, for the relay, a connection read as
// the proxy's relay reads it (ForRelay), returning what the backend
// answered, or why it did not: for the relay, the refused handshake's
// error first (Refused), as the proxy reports it.
func send(t *testing.T, be *Backend, relay bool, wire Wire) (string, error) {
	t.Helper()
	if !relay {
		resp, err := be.RoundTripper(wire).RoundTrip(request(t, t.Context(), be, http.MethodGet, "/", nil))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	c, err := be.Dial(t.Context(), be.Picker.Pick(), alpnH1)
	if err != nil {
		return "", err
	}
	rc := ForRelay(c)
	defer rc.Close()
	_, werr := io.WriteString(rc, "GET / HTTP/1.1\r\nHost: "+sni+"\r\nConnection: close\r\n\r\n")
	resp, rerr := http.ReadResponse(bufio.NewReader(rc), nil)
	if err := cmp.Or(Refused(rc), werr, rerr); err != nil {
		return "", err
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// serveMutualTLS serves, with w's certificate, HTTP/1.1 and HTTP/2 to
// clients that present a certificate w's CA issued, answering with the
// client certificate's common name.
func serveMutualTLS(t *testing.T, w *world) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Its log would hold each handshake the proxy gave up.
	srv := &http.Server{TLSConfig: requireClientCert(w), ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		io.WriteString(rw, r.TLS.PeerCertificates[0].Subject.CommonName)
	})}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).AddrPort()
}

// requireClientCert is w's backend TLS, asking for a client certificate
// that w's CA issued, speaking h2 and http/1.1.
func requireClientCert(w *world) *tls.Config {
	clients := x509.NewCertPool()
	clients.AddCert(w.ca.Cert)
	cfg := w.serverTLS.Clone()
	cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, clients
	cfg.NextProtos = []string{"h2", "http/1.1"}
	return cfg
}

// TestClientCertificateOutsideValidity: a request to a backend that
// requires the client certificate of its TLS settings (XBackend
// ClientAndServer, a BackendTLSPolicy's client certificate), when that
// certificate is past its NotAfter or before its NotBefore (the snapshot
// holds it until the agent translates again), fails 502 tls_handshake on
// every wire, over TLS 1.3 and 1.2: the proxy sends no certificate
// outside its validity. The handshake counts as failed, and the endpoint
// is not ejected — it answered; the certificate is ours to fix — so the
// next request goes there again, holding no probe, and the failure is not
// one to try on other endpoints (NoConnection). A valid certificate's
// handshake counts as full, once.
func TestClientCertificateOutsideValidity(t *testing.T) {
	w := newWorld(t)
	addr := serveMutualTLS(t, w)
	now := time.Now()
	issue := func(name string, notBefore, notAfter time.Time) *pki.Leaf {
		l, err := w.ca.Issue(pki.LeafOptions{CommonName: name, Client: true, NotBefore: notBefore, NotAfter: notAfter})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	valid := issue("proxy", time.Time{}, time.Time{})
	outside := map[string]*pki.Leaf{
		"expired":       issue("expired", now.Add(-2*time.Hour), now.Add(-time.Hour)),
		"not yet valid": issue("early", now.Add(time.Hour), now.Add(2*time.Hour)),
	}
	policy := func(l *pki.Leaf, version uint16) *snapshot.TLS {
		p := w.policy()
		p.Mode, p.ClientCertificatePEM, p.ClientKeyPEM = snapshot.TLSMutual, string(l.CertPEM), string(l.KeyPEM)
		p.MaxVersion = version
		return p
	}
	const failed, ejections = "sockmesh_proxy_upstream_tls_handshakes_total", "sockmesh_proxy_upstream_endpoint_ejections_total"
	for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		for _, c := range clientCertWires {
			t.Run(tls.VersionName(version)+"/"+c.name, func(t *testing.T) {
				full, failedBefore := w.counter(t, failed, "full"), w.counter(t, failed, "failed")
				if got, err := send(t, backendAt(t, w.pools, addr, policy(valid, version)), c.relay, c.wire); err != nil || !strings.Contains(got, "proxy") {
					t.Fatalf("valid client certificate: %q, %v; want the backend to name it", got, err)
				}
				// Under TLS 1.3, once the backend's answer settled it (Settle).
				if n, m := w.counter(t, failed, "full")-full, w.counter(t, failed, "failed")-failedBefore; n != 1 || m != 0 {
					t.Errorf("valid client certificate: %s{result=full} rose by %v, {result=failed} by %v; want 1 and 0", failed, n, m)
				}
				for what, l := range outside {
					be := backendAt(t, w.pools, addr, policy(l, version))
					before := w.counter(t, failed, "failed")
					got, err := send(t, be, c.relay, c.wire)
					if r := Classify(err); err == nil || r != ReasonTLSHandshake || r.Status() != http.StatusBadGateway || NoConnection(err) {
						t.Errorf("%s client certificate: %q, %v (reason %q, tried elsewhere: %v); want 502 tls_handshake, not tried elsewhere",
							what, got, err, r, NoConnection(err))
					}
					if n := w.counter(t, failed, "failed") - before; n != 1 {
						t.Errorf("%s client certificate: %s{result=failed} rose by %v, want 1", what, failed, n)
					}
					if n, m := w.pools.health.Ejected(time.Now()), w.counter(t, ejections, ref.Name); n != 0 || m != 0 {
						t.Errorf("%s client certificate: %d endpoints ejected, %s = %v; want none", what, n, ejections, m)
					}
					if c := be.Picker.Pick(); c.Endpoint.Addr != addr || c.Probing() {
						t.Errorf("%s client certificate: the next pick is %s (probe %v), want the endpoint again, as never ejected", what, c.Host, c.Probing())
					}
				}
			})
		}
	}
}

// TestClientCertificateRefused: a backend that refuses the proxy's client
// certificate — one the proxy holds valid, signed by a CA the backend
// does not trust — or its lack of one fails the request 502 tls_handshake
// on every wire, over TLS 1.3 and 1.2, with the backend's alert in the
// error, and its handshake counts as failed, never as full, and never
// again: each request makes a handshake of its own, as none keeps the
// connection. A TLS 1.3 backend judges the certificate after the proxy's
// handshake ended, and the proxy meets its refusal either way it may
// come, each made certain here (tlsrefusal): the alert on the first read
// (the proxy wrote first), or its first write broken by the backend's
// reset with the alert queued to be read (the backend reset first).
func TestClientCertificateRefused(t *testing.T) {
	w := newWorld(t)
	untrusted := untrustedClient(t)
	certs := []struct {
		name string
		leaf *pki.Leaf // nil: none configured
		// alert is what the backend answers, by TLS version.
		alert map[uint16]string
	}{
		{"untrusted", untrusted, map[uint16]string{tls.VersionTLS13: "unknown certificate authority", tls.VersionTLS12: "unknown certificate authority"}},
		{"none", nil, map[uint16]string{tls.VersionTLS13: "certificate required", tls.VersionTLS12: "handshake failure"}},
	}
	const handshakes = "sockmesh_proxy_upstream_tls_handshakes_total"
	for _, backendFirst := range []bool{false, true} {
		r := &tlsrefusal.Refusal{BackendFirst: backendFirst}
		addr := r.Serve(t, requireClientCert(w))
		order := map[bool]string{false: "proxy writes first", true: "backend resets first"}[backendFirst]
		for _, cert := range certs {
			for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
				for _, c := range clientCertWires {
					t.Run(order+"/"+cert.name+"/"+tls.VersionName(version)+"/"+c.name, func(t *testing.T) {
						tw := &world{ca: w.ca, reg: prometheus.NewRegistry()}
						var err error
						tw.pools, err = New(Config{}, r.Dialer(dial.NewDirect(dial.Config{Unmarked: true})), slog.New(slog.DiscardHandler), tw.reg)
						if err != nil {
							t.Fatal(err)
						}
						pol := w.policy()
						if cert.leaf != nil {
							pol.Mode, pol.ClientCertificatePEM, pol.ClientKeyPEM = snapshot.TLSMutual, string(cert.leaf.CertPEM), string(cert.leaf.KeyPEM)
						}
						pol.MaxVersion = version
						be := backendAt(t, tw.pools, addr, pol)
						alert := "remote error: tls: " + cert.alert[version]
						for try := 1; try <= 2; try++ {
							got, err := send(t, be, c.relay, c.wire)
							reason := Classify(err)
							if err == nil || reason != ReasonTLSHandshake || reason.Status() != http.StatusBadGateway || NoConnection(err) || !strings.Contains(err.Error(), alert) {
								t.Errorf("try %d: %q, %v (reason %q, tried elsewhere: %v); want 502 tls_handshake naming the backend's alert %q, not tried elsewhere",
									try, got, err, reason, NoConnection(err), alert)
							}
							if n, full := tw.counter(t, handshakes, "failed"), tw.counter(t, handshakes, "full"); n != float64(try) || full != 0 {
								t.Errorf("try %d: %s{result=failed} = %v, {result=full} = %v; want %d and 0", try, handshakes, n, full, try)
							}
						}
						if n := tw.pools.health.Ejected(time.Now()); n != 0 {
							t.Errorf("%d endpoints ejected, want none: the backend answered", n)
						}
					})
				}
			}
		}
	}
}

// TestClientCertificateClosedWithoutAlert: a backend that asked for a
// client certificate and closes the connection without an alert before
// its first word — a FIN (with close_notify) or a reset, before the
// proxy's first write or after it — refused nothing the proxy can tell:
// TLS stacks refuse a certificate with an alert (Go's, OpenSSL's,
// BoringSSL's; RFC 8446 §6.2), and a backend that closes so — nginx's
// stream module refusing a certificate it checks after its handshake, or
// any backend restarting — does the same under TLS 1.2, where nothing
// waits for a judgement. The request fails 502 upstream_error on every
// wire, over TLS 1.3 as over TLS 1.2, as a connection closed unanswered
// does, not tried elsewhere, no endpoint ejected, and the handshake
// counts as full, once, never as failed.
func TestClientCertificateClosedWithoutAlert(t *testing.T) {
	w := newWorld(t)
	untrusted := untrustedClient(t)
	// No session to resume: each try's handshake asks for the certificate
	// again (nginx drops the session of a certificate it refused).
	cfg := requireClientCert(w)
	cfg.SessionTicketsDisabled = true
	const handshakes = "sockmesh_proxy_upstream_tls_handshakes_total"
	for _, r := range []*tlsrefusal.Refusal{
		{Silent: true, BackendFirst: true, FIN: true},
		{Silent: true, BackendFirst: true},
		{Silent: true},
	} {
		addr := r.Serve(t, cfg)
		ending := map[bool]string{false: "reset", true: "fin"}[r.FIN] + map[bool]string{false: " after the proxy wrote", true: " first"}[r.BackendFirst]
		for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
			for _, c := range clientCertWires {
				t.Run(ending+"/"+tls.VersionName(version)+"/"+c.name, func(t *testing.T) {
					tw := &world{ca: w.ca, reg: prometheus.NewRegistry()}
					var err error
					tw.pools, err = New(Config{}, r.Dialer(dial.NewDirect(dial.Config{Unmarked: true})), slog.New(slog.DiscardHandler), tw.reg)
					if err != nil {
						t.Fatal(err)
					}
					pol := w.policy()
					pol.Mode, pol.ClientCertificatePEM, pol.ClientKeyPEM = snapshot.TLSMutual, string(untrusted.CertPEM), string(untrusted.KeyPEM)
					pol.MaxVersion = version
					be := backendAt(t, tw.pools, addr, pol)
					for try := 1; try <= 2; try++ {
						got, err := send(t, be, c.relay, c.wire)
						if reason := Classify(err); err == nil || reason != ReasonUpstream || reason.Status() != http.StatusBadGateway || NoConnection(err) {
							t.Errorf("try %d: %q, %v (reason %q, tried elsewhere: %v); want 502 upstream_error, not tried elsewhere",
								try, got, err, reason, NoConnection(err))
						}
						if full, n := tw.counter(t, handshakes, "full"), tw.counter(t, handshakes, "failed"); full != float64(try) || n != 0 {
							t.Errorf("try %d: %s{result=full} = %v, {result=failed} = %v; want %d and 0", try, handshakes, full, n, try)
						}
					}
					if n := tw.pools.health.Ejected(time.Now()); n != 0 {
						t.Errorf("%d endpoints ejected, want none: the handshake ended", n)
					}
				})
			}
		}
	}
}

// untrustedClient is a client certificate of a CA no backend trusts.
func untrustedClient(t *testing.T) *pki.Leaf {
	t.Helper()
	other, err := pki.NewCA("a ca the backend does not trust")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := other.Issue(pki.LeafOptions{CommonName: "proxy", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}
