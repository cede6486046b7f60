package upstream

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/pki"
)

// serveMutualTLS serves, with w's certificate, HTTP/1.1 and HTTP/2 to
// clients that present a certificate w's CA issued, answering with the
// client certificate's common name.
func serveMutualTLS(t *testing.T, w *world) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	clients := x509.NewCertPool()
	clients.AddCert(w.ca.Cert)
	cfg := w.serverTLS.Clone()
	cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, clients
	// Its log would hold each handshake the proxy gave up.
	srv := &http.Server{TLSConfig: cfg, ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		io.WriteString(rw, r.TLS.PeerCertificates[0].Subject.CommonName)
	})}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).AddrPort()
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
// one to try on other endpoints (NoConnection).
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
	// send makes a request over wire, or, for the relay, a connection,
	// returning what the backend answered.
	send := func(t *testing.T, be *Backend, relay bool, wire Wire) (string, error) {
		if relay {
			c, err := be.Dial(t.Context(), be.Picker.Pick(), alpnH1)
			if err != nil {
				return "", err
			}
			defer c.Close()
			return exchange(t, c), nil
		}
		resp, err := be.RoundTripper(wire).RoundTrip(request(t, t.Context(), be, http.MethodGet, "/", nil))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	const failed, ejections = "sockmesh_proxy_upstream_tls_handshakes_total", "sockmesh_proxy_upstream_endpoint_ejections_total"
	for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		for _, c := range []struct {
			name  string
			relay bool
			wire  Wire
		}{{"relay", true, WireH1}, {"h1", false, WireH1}, {"h2", false, WireH2}, {"negotiated", false, WireNegotiate}} {
			t.Run(tls.VersionName(version)+"/"+c.name, func(t *testing.T) {
				if got, err := send(t, backendAt(t, w.pools, addr, policy(valid, version)), c.relay, c.wire); err != nil || !strings.Contains(got, "proxy") {
					t.Fatalf("valid client certificate: %q, %v; want the backend to name it", got, err)
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
