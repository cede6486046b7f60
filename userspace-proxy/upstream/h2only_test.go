package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
)

// pipeHandshakes connects each dial over net.Pipe to a TLS server of its
// own, which handshakes under cfg and closes.
type pipeHandshakes struct{ cfg *tls.Config }

func (d pipeHandshakes) Dial(context.Context, snapshot.Endpoint) (net.Conn, error) {
	c, s := net.Pipe()
	go func() {
		tc := tls.Server(s, d.cfg)
		defer tc.Close()
		tc.Handshake()
	}()
	return c, nil
}

// TestSpeaksH2Only: an endpoint that refuses GetH1's offer of http/1.1
// alone for want of a common protocol (TLS alert no_application_protocol:
// it speaks h2 alone, as rustls refuses) fails it with ErrDeclinedHTTP11,
// still tls_handshake, and its backend is taken to speak h2 only for
// h1OnlyFor; an endpoint that refuses the handshake for another reason
// (no client certificate) teaches nothing.
func TestSpeaksH2Only(t *testing.T) {
	for _, c := range []struct {
		name   string
		server *tls.Config // its certificate added
		learns bool
	}{
		// crypto/tls lets http/1.1 through to a server naming "h2" alone
		// (Go issue 46310): a list without either refuses it.
		{"h2-only", &tls.Config{NextProtos: []string{"h2-only"}}, true},
		{"client-cert", &tls.Config{MaxVersion: tls.VersionTLS12, ClientAuth: tls.RequireAnyClientCert}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ca, err := pki.NewCA("ca") // in the bubble: valid at its time
				if err != nil {
					t.Fatal(err)
				}
				leaf, err := ca.Issue(pki.LeafOptions{DNSNames: []string{sni}})
				if err != nil {
					t.Fatal(err)
				}
				server := c.server.Clone()
				server.Certificates = []tls.Certificate{leaf.TLS}
				p, err := New(Config{}, pipeHandshakes{server}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
				if err != nil {
					t.Fatal(err)
				}
				be := backendAt(t, p, netip.MustParseAddrPort("10.0.0.1:443"),
					&snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: sni, RootsPEM: string(ca.CertPEM)})
				if be.SpeaksH2Only() {
					t.Fatal("a new backend speaks h2 only")
				}
				_, err = be.GetH1(t.Context(), be.Picker.Pick(), pool.Client{})
				if got := Classify(err); got != ReasonTLSHandshake || errors.Is(err, ErrDeclinedHTTP11) != c.learns {
					t.Fatalf("GetH1: %v (%s); want tls_handshake, ErrDeclinedHTTP11 %v", err, got, c.learns)
				}
				if got := be.SpeaksH2Only(); got != c.learns {
					t.Fatalf("SpeaksH2Only after the refusal = %v, want %v", got, c.learns)
				}
				time.Sleep(h1OnlyFor - time.Second)
				if got := be.SpeaksH2Only(); got != c.learns {
					t.Errorf("SpeaksH2Only %v after = %v, want %v", h1OnlyFor-time.Second, got, c.learns)
				}
				time.Sleep(time.Second)
				if be.SpeaksH2Only() {
					t.Errorf("SpeaksH2Only %v after = true, want false", h1OnlyFor)
				}
			})
		})
	}
}
