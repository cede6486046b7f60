package upstreamtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/pki"
)

func TestNewRejectsWhatCannotBeHonoured(t *testing.T) {
	ca, err := pki.NewCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	ok := func() *snapshot.TLS {
		return &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: "a.test", RootsPEM: string(ca.CertPEM)}
	}
	for _, c := range []struct {
		name   string
		mutate func(*snapshot.TLS)
	}{
		{"no server name", func(s *snapshot.TLS) { s.ServerName = "" }},
		// crypto/tls sends no SNI for an address, and checks IP SANs instead.
		{"IPv4 server name", func(s *snapshot.TLS) { s.ServerName = "10.0.0.1" }},
		{"IPv6 server name", func(s *snapshot.TLS) { s.ServerName = "fd00::1" }},
		{"garbage bundle", func(s *snapshot.TLS) { s.RootsPEM = "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n" }},
		{"no roots", func(s *snapshot.TLS) { s.RootsPEM = "" }},
		{"both roots", func(s *snapshot.TLS) { s.SystemRoots = true }},
		{"max below min", func(s *snapshot.TLS) { s.MinVersion, s.MaxVersion = tls.VersionTLS13, tls.VersionTLS12 }},
		{"mutual without key", func(s *snapshot.TLS) { s.Mode = snapshot.TLSMutual }},
		{"unknown mode", func(s *snapshot.TLS) { s.Mode = "Sometimes" }},
		{"unknown san type", func(s *snapshot.TLS) { s.SubjectAltNames = []snapshot.SubjectAltName{{Type: "IP", Value: "1.2.3.4"}} }},
	} {
		s := ok()
		c.mutate(s)
		if _, err := New(s, Options{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: New = %v, want ErrInvalid", c.name, err)
		}
	}
	if _, err := New(ok(), Options{}); err != nil {
		t.Fatalf("valid settings: %v", err)
	}
}

// TestConfigPerEndpoint: options reach the config; each endpoint has its own
// session cache (a shared one would offer one pod's tickets to another),
// and the same endpoint gets the same config back.
func TestConfigPerEndpoint(t *testing.T) {
	ca, _ := pki.NewCA("ca")
	o, err := New(&snapshot.TLS{ServerName: "a.test", RootsPEM: string(ca.CertPEM), MinVersion: tls.VersionTLS13,
		Curves: []tls.CurveID{tls.X25519}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := netip.MustParseAddrPort("10.0.0.1:443"), netip.MustParseAddrPort("10.0.0.2:443")
	ca1, cb := o.Config(a, []string{ALPNH2}), o.Config(b, []string{ALPNH2})
	if ca1 == cb || ca1.ClientSessionCache == cb.ClientSessionCache {
		t.Error("endpoints share a config or session cache")
	}
	if o.Config(a, []string{ALPNH2}) != ca1 {
		t.Error("same endpoint and ALPN built a second config")
	}
	if ca1.ServerName != "a.test" || ca1.MinVersion != tls.VersionTLS13 || ca1.CurvePreferences[0] != tls.X25519 || ca1.NextProtos[0] != ALPNH2 {
		t.Errorf("config = %+v", ca1)
	}
}

func TestEqual(t *testing.T) {
	a := &snapshot.TLS{ServerName: "a", SubjectAltNames: []snapshot.SubjectAltName{{Type: snapshot.SANURI, Value: "spiffe://x"}}}
	b := *a
	if !Equal(a, &b) {
		t.Error("copies differ")
	}
	b.SubjectAltNames = []snapshot.SubjectAltName{{Type: snapshot.SANURI, Value: "spiffe://y"}}
	if Equal(a, &b) || Equal(a, nil) || !Equal(nil, nil) {
		t.Error("Equal ignores a difference")
	}
}

// TestSANVerifierChainExpiry: with subjectAltNames, a leaf verified once
// is accepted again only while the chain it was verified with is valid:
// once its CA expires, a handshake presenting it fails, as the first would
// have. The verifier used to remember the leaf until the leaf's own
// expiry, and took a certificate whose CA had expired for a day.
func TestSANVerifierChainExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca, err := pki.NewCA("ca") // valid for a day
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := ca.Issue(pki.LeafOptions{DNSNames: []string{"a.test"}, NotAfter: time.Now().Add(48 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		o, err := New(&snapshot.TLS{ServerName: "a.test", RootsPEM: string(ca.CertPEM),
			SubjectAltNames: []snapshot.SubjectAltName{{Type: snapshot.SANHostname, Value: "a.test"}}}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		l := listen(t)
		first, err := handshake(t, l, leaf.TLS, o)
		if err != nil {
			t.Fatalf("handshake while the chain is valid: %v", err)
		}
		defer first.Close()
		time.Sleep(25 * time.Hour)
		second, err := handshake(t, l, leaf.TLS, o)
		if err == nil {
			second.Close()
		}
		if !IsVerifyError(err) {
			t.Errorf("handshake after the CA expired, with the leaf still valid: %v, want a verification error", err)
		}
	})
}

// TestSANVerifierURICase: a URI subjectAltName matches the certificate's
// with its scheme and host in any case, as RFC 3986 (§3.1, §3.2.2) makes
// them case-insensitive, and its path only as written. The policy's URI
// was compared as written with the certificate's as Go prints it (scheme
// lowercased), so "SPIFFE://..." matched no certificate and the backend
// answered 502.
func TestSANVerifierURICase(t *testing.T) {
	ca, err := pki.NewCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{URIs: []string{"spiffe://cluster.local/ns/a/sa/b"}})
	if err != nil {
		t.Fatal(err)
	}
	l := listen(t)
	for _, c := range []struct {
		uri  string
		want bool
	}{
		{"spiffe://cluster.local/ns/a/sa/b", true},
		{"SPIFFE://cluster.local/ns/a/sa/b", true},
		{"Spiffe://Cluster.LOCAL/ns/a/sa/b", true},
		{"spiffe://cluster.local/ns/a/sa/B", false},
		{"spiffe://cluster.local/NS/a/sa/b", false},
	} {
		o, err := New(&snapshot.TLS{ServerName: "a.test", RootsPEM: string(ca.CertPEM),
			SubjectAltNames: []snapshot.SubjectAltName{{Type: snapshot.SANURI, Value: c.uri}}}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := handshake(t, l, leaf.TLS, o)
		if err == nil {
			conn.Close()
		}
		if got := err == nil; got != c.want {
			t.Errorf("subjectAltName %s against the certificate's spiffe://cluster.local/ns/a/sa/b: handshake error %v, want a match %v", c.uri, err, c.want)
		}
		if err != nil && !IsVerifyError(err) {
			t.Errorf("subjectAltName %s: handshake error %v, want a verification error", c.uri, err)
		}
	}
}

// listen opens the TCP listener handshake serves on (net.Pipe does not
// buffer: a client's alert and the server's flight would wait for each
// other).
func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// handshake serves one TLS handshake on l presenting cert, and returns the
// client's end, configured by o, with its handshake's error.
func handshake(t *testing.T, l net.Listener, cert tls.Certificate, o *Origination) (*tls.Conn, error) {
	t.Helper()
	return handshakeWith(t, l, &tls.Config{Certificates: []tls.Certificate{cert}}, o)
}

// handshakeWith is handshake with the server's configuration: one kept
// across handshakes keeps its session ticket keys, so they can resume.
// resumes handshakes with srv through l, then reads the session tickets
// the server sends after the handshake (TLS 1.3) until it closes, and
// reports whether the session was resumed.
func resumes(t *testing.T, l net.Listener, srv *tls.Config, o *Origination) (bool, error) {
	t.Helper()
	c, err := handshakeWith(t, l, srv, o)
	if err != nil {
		return false, err
	}
	defer c.Close()
	io.Copy(io.Discard, c)
	return c.ConnectionState().DidResume, nil
}

func handshakeWith(t *testing.T, l net.Listener, srv *tls.Config, o *Origination) (*tls.Conn, error) {
	t.Helper()
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := l.Accept()
		if err != nil {
			return
		}
		tls.Server(c, srv).Handshake()
		c.Close()
	}()
	defer func() { <-served }()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(a, o.Config(netip.MustParseAddrPort("10.0.0.1:443"), nil))
	if err := c.Handshake(); err != nil {
		// Closed, as the proxy closes it: a TLS 1.3 client whose
		// GetClientCertificate fails sends no alert, and the server would
		// wait for its certificate.
		c.Close()
		return c, err
	}
	return c, nil
}

// TestClientCertificateWhateverTheServerNames: with ClientAndServer the
// client certificate goes whichever CAs the server's request names, as
// OpenSSL's and Envoy's clients send theirs. Here the Secret's tls.crt
// holds the leaf alone, issued by an intermediate, and the server names
// only its root (nginx's ssl_client_certificate beside an
// ssl_trusted_certificate holding the intermediate): crypto/tls's own
// choice sent no certificate, and the handshake failed.
func TestClientCertificateWhateverTheServerNames(t *testing.T) {
	root, err := pki.NewCA("root")
	if err != nil {
		t.Fatal(err)
	}
	inter, err := root.NewIntermediate("intermediate")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := root.Issue(pki.LeafOptions{DNSNames: []string{"a.test"}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := inter.Issue(pki.LeafOptions{CommonName: "app", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	o, err := New(&snapshot.TLS{ServerName: "a.test", RootsPEM: string(root.CertPEM), Mode: snapshot.TLSMutual,
		ClientCertificatePEM: string(client.CertPEM), ClientKeyPEM: string(client.KeyPEM)}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	intermediates := x509.NewCertPool()
	intermediates.AddCert(inter.Cert)
	verify := func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("no client certificate")
		}
		c, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return err
		}
		_, err = c.Verify(x509.VerifyOptions{Roots: root.Pool(), Intermediates: intermediates,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return err
	}
	l := listen(t)
	seen := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			seen <- err
			return
		}
		defer c.Close()
		s := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{leaf.TLS}, ClientAuth: tls.RequireAnyClientCert,
			ClientCAs: root.Pool(), VerifyPeerCertificate: verify})
		if err := s.Handshake(); err != nil {
			seen <- err
			return
		}
		if p := s.ConnectionState().PeerCertificates; len(p) != 1 || p[0].Subject.CommonName != "app" {
			seen <- fmt.Errorf("server saw %d certificates, want the app's", len(p))
			return
		}
		seen <- nil
	}()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c := tls.Client(a, o.Config(netip.MustParseAddrPort("10.0.0.1:443"), nil))
	// In TLS 1.3 the client's handshake ends before the server has read its
	// certificate; the server's verdict is the one that counts.
	cerr := c.Handshake()
	if err := <-seen; err != nil {
		t.Fatalf("server: %v (client: %v)", err, cerr)
	}
	if cerr != nil {
		t.Fatalf("client handshake: %v", cerr)
	}
}

// TestClientCertificateOnlyWhileValid: with ClientAndServer the client
// certificate goes only within its validity at the handshake's instant.
// Translate judges its dates when it runs, so between NotAfter and the
// next translation the snapshot, and the Origination built from it, still
// hold it; the proxy sent it. Now the handshake fails, before NotBefore
// and after NotAfter alike, and no session made while it was valid is
// offered (resumed, the backend would take the identity without checking
// it). The backend here requests a certificate and checks none, so what
// it saw is what the proxy sent.
func TestClientCertificateOnlyWhileValid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca, err := pki.NewCA("ca") // valid for a day
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := ca.Issue(pki.LeafOptions{DNSNames: []string{"a.test"}})
		if err != nil {
			t.Fatal(err)
		}
		mutual := func(notBefore, notAfter time.Time) *Origination {
			t.Helper()
			client, err := ca.Issue(pki.LeafOptions{CommonName: "app", Client: true, NotBefore: notBefore, NotAfter: notAfter})
			if err != nil {
				t.Fatal(err)
			}
			o, err := New(&snapshot.TLS{ServerName: "a.test", RootsPEM: string(ca.CertPEM), Mode: snapshot.TLSMutual,
				ClientCertificatePEM: string(client.CertPEM), ClientKeyPEM: string(client.KeyPEM)}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			return o
		}
		var sent []*x509.Certificate // what the backend saw in the last handshake
		offered := 0                 // session tickets the proxy offered
		srv := &tls.Config{Certificates: []tls.Certificate{leaf.TLS}, ClientAuth: tls.RequestClientCert}
		srv.VerifyConnection = func(cs tls.ConnectionState) error { sent = cs.PeerCertificates; return nil }
		srv.UnwrapSession = func(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
			offered++
			return srv.DecryptTicket(identity, cs)
		}
		l := listen(t)
		connect := func(o *Origination) (resumed bool, err error) {
			sent = nil
			return resumes(t, l, srv, o)
		}
		identity := func() string {
			if len(sent) == 0 {
				return "none"
			}
			return sent[0].Subject.CommonName
		}

		o := mutual(time.Time{}, time.Now().Add(time.Hour))
		if _, err := connect(o); err != nil || identity() != "app" {
			t.Fatalf("handshake while the certificate is valid: %v, backend saw certificate %s; want the app's", err, identity())
		}
		if resumed, err := connect(o); err != nil || !resumed || offered != 1 {
			t.Fatalf("second handshake: resumed %v, error %v, %d tickets offered; want a resumption", resumed, err, offered)
		}
		time.Sleep(2 * time.Hour) // past NotAfter; the CA and the server's tickets still valid
		resumed, err := connect(o)
		if !errors.Is(err, errClientCertificate) || resumed {
			t.Errorf("handshake after NotAfter: resumed %v, error %v; want it failed for the client certificate", resumed, err)
		}
		if identity() != "none" || offered != 1 {
			t.Errorf("handshake after NotAfter: backend saw certificate %s, %d tickets offered; want none sent, no ticket offered", identity(), offered)
		}

		early := mutual(time.Now().Add(time.Hour), time.Now().Add(3*time.Hour))
		if _, err := connect(early); !errors.Is(err, errClientCertificate) || identity() != "none" {
			t.Errorf("handshake before NotBefore: error %v, backend saw certificate %s; want it failed, none sent", err, identity())
		}
		time.Sleep(time.Hour) // at NotBefore: valid from there on
		if _, err := connect(early); err != nil || identity() != "app" {
			t.Errorf("handshake at NotBefore: %v, backend saw certificate %s; want the app's", err, identity())
		}
	})
}

// TestSANVerifierRemembersByDER: the verifier remembers a certificate
// once, however many times crypto/tls parsed it (it parses one again once
// no connection or session holds it), and forgets those whose chain has
// expired when it remembers the next (a rotated certificate). Keyed by
// the parsed certificate, each parse stayed an entry until its chain
// expired.
func TestSANVerifierRemembersByDER(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca, err := pki.NewCA("ca") // valid for a day
		if err != nil {
			t.Fatal(err)
		}
		sans := []snapshot.SubjectAltName{{Type: snapshot.SANHostname, Value: "a.test"}}
		pool := x509.NewCertPool()
		pool.AddCert(ca.Cert)
		v, err := newSANVerifier(sans, pool)
		if err != nil {
			t.Fatal(err)
		}
		present := func(l *pki.Leaf) {
			t.Helper()
			leaf, err := x509.ParseCertificate(l.TLS.Certificate[0]) // a fresh parse each time
			if err != nil {
				t.Fatal(err)
			}
			if err := v.verify(tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}); err != nil {
				t.Fatal(err)
			}
		}
		leaf, err := ca.Issue(pki.LeafOptions{DNSNames: []string{"a.test"}, NotAfter: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			present(leaf)
		}
		if n := len(v.verified); n != 1 {
			t.Errorf("one certificate parsed three times: %d entries, want 1", n)
		}
		time.Sleep(2 * time.Hour)
		rotated, err := ca.Issue(pki.LeafOptions{DNSNames: []string{"a.test"}, NotAfter: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		present(rotated)
		if n := len(v.verified); n != 1 {
			t.Errorf("after a rotation past the old certificate's expiry: %d entries, want 1", n)
		}
	})
}

// TestKeep: a connection made under one set of settings is kept under
// another only when that one would have made it as it is — its
// certificate verified by the new roots and names, its server name and
// client certificate the same, its version, cipher suite, curve and ALPN
// protocol among the new ones.
func TestKeep(t *testing.T) {
	ca, err := pki.NewCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{DNSNames: []string{"a.test", "b.test"}, URIs: []string{"spiffe://a"}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(pki.LeafOptions{Client: true})
	if err != nil {
		t.Fatal(err)
	}
	base := func() *snapshot.TLS { return &snapshot.TLS{ServerName: "a.test", RootsPEM: string(ca.CertPEM)} }
	uri := func(v string) snapshot.SubjectAltName {
		return snapshot.SubjectAltName{Type: snapshot.SANURI, Value: v}
	}
	tls12 := func(suites ...uint16) func(*snapshot.TLS) {
		return func(s *snapshot.TLS) { s.MaxVersion, s.CipherSuites = tls.VersionTLS12, suites }
	}
	const aes, chacha = tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305
	l := listen(t)
	for _, c := range []struct {
		name     string
		from, to func(*snapshot.TLS)
		keep     bool
	}{
		{"same settings", func(*snapshot.TLS) {}, func(*snapshot.TLS) {}, true},
		{"CA added", func(*snapshot.TLS) {}, func(s *snapshot.TLS) { s.RootsPEM += string(other.CertPEM) }, true},
		{"CA replaced", func(*snapshot.TLS) {}, func(s *snapshot.TLS) { s.RootsPEM = string(other.CertPEM) }, false},
		{"server name changed", func(*snapshot.TLS) {}, func(s *snapshot.TLS) { s.ServerName = "b.test" }, false},
		{"client certificate added", func(*snapshot.TLS) {}, func(s *snapshot.TLS) {
			s.Mode, s.ClientCertificatePEM, s.ClientKeyPEM = snapshot.TLSMutual, string(client.CertPEM), string(client.KeyPEM)
		}, false},
		{"max version below its own", func(*snapshot.TLS) {}, func(s *snapshot.TLS) { s.MaxVersion = tls.VersionTLS12 }, false},
		{"cipher suite added", tls12(aes), tls12(aes, chacha), true},
		{"cipher suite removed", tls12(aes), tls12(chacha), false},
		{"cipher suites listed, none before", tls12(), tls12(chacha), false},
		{"curve added", func(s *snapshot.TLS) { s.Curves = []tls.CurveID{tls.X25519} }, func(s *snapshot.TLS) { s.Curves = []tls.CurveID{tls.CurveP256, tls.X25519} }, true},
		{"curve removed", func(s *snapshot.TLS) { s.Curves = []tls.CurveID{tls.X25519} }, func(s *snapshot.TLS) { s.Curves = []tls.CurveID{tls.CurveP256} }, false},
		{"ALPN offered, none before", func(*snapshot.TLS) {}, func(s *snapshot.TLS) { s.ALPN = []string{ALPNH2} }, false},
		{"subjectAltName added", func(s *snapshot.TLS) { s.SubjectAltNames = []snapshot.SubjectAltName{uri("spiffe://a")} },
			func(s *snapshot.TLS) {
				s.SubjectAltNames = []snapshot.SubjectAltName{uri("spiffe://b"), uri("spiffe://a")}
			}, true},
		{"subjectAltName replaced", func(s *snapshot.TLS) { s.SubjectAltNames = []snapshot.SubjectAltName{uri("spiffe://a")} },
			func(s *snapshot.TLS) { s.SubjectAltNames = []snapshot.SubjectAltName{uri("spiffe://b")} }, false},
		{"subjectAltNames dropped for the hostname", func(s *snapshot.TLS) { s.SubjectAltNames = []snapshot.SubjectAltName{uri("spiffe://a")} },
			func(*snapshot.TLS) {}, true},
	} {
		from, to := base(), base()
		c.from(from)
		c.to(to)
		was, err := New(from, Options{})
		if err != nil {
			t.Fatal(err)
		}
		now, err := New(to, Options{})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := handshake(t, l, leaf.TLS, was)
		if err != nil {
			t.Fatalf("%s: handshake: %v", c.name, err)
		}
		conn.Close()
		h, err := now.Keeper().Keep(was.Hold(conn.ConnectionState(), nil))
		if (err == nil) != c.keep {
			t.Errorf("%s: Keep = %v, want kept %v", c.name, err, c.keep)
		}
		if err == nil && !h.Until().Equal(leaf.TLS.Leaf.NotAfter) {
			t.Errorf("%s: kept until %v, want the certificate's %v", c.name, h.Until(), leaf.TLS.Leaf.NotAfter)
		}
	}
	if _, err := (&Origination{}).Keeper().Keep(Held{}); err == nil {
		t.Error("a cleartext connection kept")
	}
	if _, err := (*Origination)(nil).Keeper().Keep(Held{}); err == nil {
		t.Error("a connection kept under no settings")
	}
}

// TestKeeperPerConnection: a Keeper verifies each distinct certificate
// chain once, and still judges each connection by its own: its chain's
// verdict, and what else its handshake settled (here its server name).
func TestKeeperPerConnection(t *testing.T) {
	ca, err := pki.NewCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	kept, err := ca.Issue(pki.LeafOptions{DNSNames: []string{"a.test", "b.test"}})
	if err != nil {
		t.Fatal(err)
	}
	untrusted, err := other.Issue(pki.LeafOptions{DNSNames: []string{"a.test"}})
	if err != nil {
		t.Fatal(err)
	}
	settings := func(name string, roots ...*pki.CA) *Origination {
		s := &snapshot.TLS{ServerName: name}
		for _, r := range roots {
			s.RootsPEM += string(r.CertPEM)
		}
		o, err := New(s, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	was, wasB, now := settings("a.test", ca, other), settings("b.test", ca), settings("a.test", ca)
	l := listen(t)
	held := func(leaf *pki.Leaf, o *Origination) Held {
		t.Helper()
		c, err := handshake(t, l, leaf.TLS, o)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		return o.Hold(c.ConnectionState(), nil)
	}
	k := now.Keeper()
	for i, c := range []struct {
		held Held
		keep bool
	}{
		{held(kept, was), true},
		{held(untrusted, was), false},
		{held(kept, was), true},
		{held(untrusted, was), false},
		{held(kept, wasB), false}, // its chain verifies; its server name changed
	} {
		if _, err := k.Keep(c.held); (err == nil) != c.keep {
			t.Errorf("connection %d: Keep = %v, want kept %v", i, err, c.keep)
		}
	}
	if n := len(k.verified); n != 2 {
		t.Errorf("%d chains verified for two distinct ones", n)
	}
}
