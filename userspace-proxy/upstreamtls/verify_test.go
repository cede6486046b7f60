package upstreamtls

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// minted is a certificate a test made, with its key.
type minted struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// mint signs tmpl with parent's key (nil: self-signed), filling what every
// certificate needs that tmpl leaves unset.
func mint(t *testing.T, tmpl *x509.Certificate, parent *minted) *minted {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(time.Hour)
	}
	issuer, signer := tmpl, crypto.Signer(key)
	if parent != nil {
		issuer, signer = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, key.Public(), signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &minted{cert: c, key: key}
}

func (m *minted) pem() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: m.cert.Raw}))
}

// serving is what a server presents: leaf's key, leaf and the
// intermediates after it.
func serving(leaf *minted, intermediates ...*minted) tls.Certificate {
	c := tls.Certificate{Certificate: [][]byte{leaf.cert.Raw}, PrivateKey: leaf.key}
	for _, i := range intermediates {
		c.Certificate = append(c.Certificate, i.cert.Raw)
	}
	return c
}

func caTemplate(cn string) *x509.Certificate {
	return &x509.Certificate{Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
}

func serverTemplate(dns ...string) *x509.Certificate {
	return &x509.Certificate{DNSNames: dns, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
}

// TestVerify holds the backend's certificate to RFC 5280 and RFC 6125 and
// the API's text, through real handshakes, with the hostname (crypto/tls
// verifies) and with subjectAltNames (verify.go does): no name from the
// common name, EKU serverAuth, a wildcard for one label only, IP SANs
// never a DNS name, the CA's name constraints, validity of every
// certificate of the chain, certificate signatures only by CAs (a pinned
// non-CA certificate stands for itself alone), and, with subjectAltNames,
// the hostname not checked at all.
func TestVerify(t *testing.T) {
	now := time.Now()
	root := mint(t, caTemplate("root"), nil)
	inter := mint(t, caTemplate("intermediate"), root)
	expiredTmpl := caTemplate("expired intermediate")
	expiredTmpl.NotBefore, expiredTmpl.NotAfter = now.Add(-2*time.Hour), now.Add(-time.Hour)
	expiredInter := mint(t, expiredTmpl, root)
	constrainedTmpl := caTemplate("constrained")
	constrainedTmpl.PermittedDNSDomains, constrainedTmpl.PermittedURIDomains = []string{"ok.test"}, []string{"ok.test"}
	constrained := mint(t, constrainedTmpl, nil)
	notCATmpl := serverTemplate("x.test")
	notCATmpl.BasicConstraintsValid = true
	notCA := mint(t, notCATmpl, root) // an intermediate that is none
	pinnedTmpl := serverTemplate("a.test")
	pinnedTmpl.BasicConstraintsValid = true // cA false: a self-signed server certificate
	pinned := mint(t, pinnedTmpl, nil)

	leaf := func(parent *minted, f func(*x509.Certificate)) *minted {
		tmpl := serverTemplate("a.test")
		f(tmpl)
		return mint(t, tmpl, parent)
	}
	uri := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	host := func(h string) []snapshot.SubjectAltName {
		return []snapshot.SubjectAltName{{Type: snapshot.SANHostname, Value: h}}
	}
	spiffe := []snapshot.SubjectAltName{{Type: snapshot.SANURI, Value: "spiffe://ok.test/ns/a/sa/b"}}

	for _, c := range []struct {
		name       string
		roots      *minted
		presented  tls.Certificate
		serverName string // "" is a.test
		sans       []snapshot.SubjectAltName
		ok         bool
	}{
		{name: "hostname", roots: root, presented: serving(leaf(root, func(*x509.Certificate) {})), ok: true},
		{name: "hostname via intermediate", roots: root, presented: serving(leaf(inter, func(*x509.Certificate) {}), inter), ok: true},
		{name: "intermediate not sent", roots: root, presented: serving(leaf(inter, func(*x509.Certificate) {}))},
		{name: "common name only", roots: root, presented: serving(leaf(root, func(c *x509.Certificate) {
			c.DNSNames, c.Subject.CommonName = nil, "a.test"
		}))},
		{name: "common name only, subjectAltName", roots: root, sans: host("a.test"), presented: serving(leaf(root, func(c *x509.Certificate) {
			c.DNSNames, c.Subject.CommonName = nil, "a.test"
		}))},
		{name: "clientAuth only", roots: root, presented: serving(leaf(root, func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}))},
		{name: "clientAuth only, subjectAltName", roots: root, sans: host("a.test"), presented: serving(leaf(root, func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}))},
		{name: "no EKU: any use (RFC 5280 4.2.1.12)", roots: root, presented: serving(leaf(root, func(c *x509.Certificate) { c.ExtKeyUsage = nil })), ok: true},
		{name: "wildcard, one label", roots: root, serverName: "b.example.test",
			presented: serving(leaf(root, func(c *x509.Certificate) { c.DNSNames = []string{"*.example.test"} })), ok: true},
		{name: "wildcard, two labels", roots: root, serverName: "a.b.example.test",
			presented: serving(leaf(root, func(c *x509.Certificate) { c.DNSNames = []string{"*.example.test"} }))},
		{name: "wildcard, its parent", roots: root, serverName: "example.test",
			presented: serving(leaf(root, func(c *x509.Certificate) { c.DNSNames = []string{"*.example.test"} }))},
		{name: "partial wildcard", roots: root, serverName: "ab.example.test",
			presented: serving(leaf(root, func(c *x509.Certificate) { c.DNSNames = []string{"a*.example.test"} }))},
		{name: "wildcard, subjectAltName", roots: root, sans: host("b.example.test"),
			presented: serving(leaf(root, func(c *x509.Certificate) { c.DNSNames = []string{"*.example.test"} })), ok: true},
		{name: "wildcard, subjectAltName two labels down", roots: root, sans: host("a.b.example.test"),
			presented: serving(leaf(root, func(c *x509.Certificate) { c.DNSNames = []string{"*.example.test"} }))},
		{name: "wildcard subjectAltName, the same wildcard", roots: root, sans: host("*.example.test"),
			presented: serving(leaf(root, func(c *x509.Certificate) { c.DNSNames = []string{"*.example.test"} })), ok: true},
		{name: "wildcard subjectAltName, a name it would cover", roots: root, sans: host("*.example.test"),
			presented: serving(leaf(root, func(c *x509.Certificate) { c.DNSNames = []string{"b.example.test"} }))},
		{name: "IP address SAN only", roots: root, presented: serving(leaf(root, func(c *x509.Certificate) {
			c.DNSNames, c.IPAddresses = nil, []net.IP{net.IPv4(127, 0, 0, 1)}
		}))},
		{name: "subjectAltNames replace the hostname", roots: root, sans: spiffe, presented: serving(leaf(root, func(*x509.Certificate) {}))},
		{name: "SPIFFE ID, hostname absent", roots: root, sans: spiffe, presented: serving(leaf(root, func(c *x509.Certificate) {
			c.DNSNames, c.URIs = nil, []*url.URL{uri("spiffe://ok.test/ns/a/sa/b")}
		})), ok: true},
		{name: "SPIFFE ID with a longer path", roots: root, sans: spiffe, presented: serving(leaf(root, func(c *x509.Certificate) {
			c.URIs = []*url.URL{uri("spiffe://ok.test/ns/a/sa/b/c")}
		}))},
		{name: "name constraints kept", roots: constrained, serverName: "a.ok.test",
			presented: serving(leaf(constrained, func(c *x509.Certificate) { c.DNSNames = []string{"a.ok.test"} })), ok: true},
		{name: "name constraints broken", roots: constrained, serverName: "a.bad.test",
			presented: serving(leaf(constrained, func(c *x509.Certificate) { c.DNSNames = []string{"a.bad.test"} }))},
		{name: "name constraints broken by another SAN", roots: constrained, sans: host("a.ok.test"),
			presented: serving(leaf(constrained, func(c *x509.Certificate) { c.DNSNames = []string{"a.ok.test", "a.bad.test"} }))},
		{name: "URI name constraints broken", roots: constrained, sans: []snapshot.SubjectAltName{{Type: snapshot.SANURI, Value: "spiffe://bad.test/x"}},
			presented: serving(leaf(constrained, func(c *x509.Certificate) { c.DNSNames, c.URIs = nil, []*url.URL{uri("spiffe://bad.test/x")} }))},
		{name: "expired", roots: root, presented: serving(leaf(root, func(c *x509.Certificate) { c.NotAfter = now.Add(-time.Minute) }))},
		{name: "expired, subjectAltName", roots: root, sans: host("a.test"), presented: serving(leaf(root, func(c *x509.Certificate) { c.NotAfter = now.Add(-time.Minute) }))},
		{name: "not yet valid", roots: root, presented: serving(leaf(root, func(c *x509.Certificate) { c.NotBefore = now.Add(time.Hour) }))},
		{name: "not yet valid, subjectAltName", roots: root, sans: host("a.test"), presented: serving(leaf(root, func(c *x509.Certificate) { c.NotBefore = now.Add(time.Hour) }))},
		{name: "expired intermediate", roots: root, presented: serving(leaf(expiredInter, func(*x509.Certificate) {}), expiredInter)},
		{name: "expired intermediate, subjectAltName", roots: root, sans: host("a.test"), presented: serving(leaf(expiredInter, func(*x509.Certificate) {}), expiredInter)},
		{name: "intermediate not a CA", roots: root, presented: serving(leaf(notCA, func(*x509.Certificate) {}), notCA)},
		{name: "pinned certificate", roots: pinned, presented: serving(pinned), ok: true},
		{name: "pinned certificate, subjectAltName", roots: pinned, sans: host("a.test"), presented: serving(pinned), ok: true},
		{name: "signed by a pinned certificate", roots: pinned, presented: serving(leaf(pinned, func(*x509.Certificate) {}))},
		{name: "signed by a pinned certificate, subjectAltName", roots: pinned, sans: host("a.test"), presented: serving(leaf(pinned, func(*x509.Certificate) {}))},
	} {
		name := c.serverName
		if name == "" {
			name = "a.test"
		}
		o, err := New(&snapshot.TLS{ServerName: name, RootsPEM: c.roots.pem(), SubjectAltNames: c.sans}, Options{})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		conn, err := handshake(t, listen(t), c.presented, o)
		if err == nil {
			conn.Close()
		}
		if (err == nil) != c.ok {
			t.Errorf("%s: handshake error %v, want success %v", c.name, err, c.ok)
		} else if err != nil && !IsVerifyError(err) {
			t.Errorf("%s: handshake error %v, want a verification error", c.name, err)
		}
	}
}

// TestResumption: sessions resume under the settings that made them, and
// never let a handshake skip what new settings or the passing of time
// ask of the backend's certificate: a CA rotated out, subjectAltNames
// replaced, a CA expired. Each is judged with the hostname (crypto/tls
// re-checks a session's chains) and with subjectAltNames (VerifyConnection
// runs on resumed handshakes, where crypto/tls checks nothing).
func TestResumption(t *testing.T) {
	for _, sans := range [][]snapshot.SubjectAltName{nil, {{Type: snapshot.SANHostname, Value: "a.test"}}} {
		synctest.Test(t, func(t *testing.T) {
			root := mint(t, caTemplate("root"), nil) // valid for an hour
			other := mint(t, caTemplate("other"), nil)
			leaf := mint(t, &x509.Certificate{DNSNames: []string{"a.test"}, NotAfter: time.Now().Add(48 * time.Hour),
				ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, root)
			srv := &tls.Config{Certificates: []tls.Certificate{serving(leaf)}} // one set of ticket keys
			settings := func(roots string, sans []snapshot.SubjectAltName) *Origination {
				o, err := New(&snapshot.TLS{ServerName: "a.test", RootsPEM: roots, SubjectAltNames: sans}, Options{})
				if err != nil {
					t.Fatal(err)
				}
				return o
			}
			l := listen(t)
			connect := func(o *Origination) (bool, error) { return resumes(t, l, srv, o) }
			o := settings(root.pem(), sans)
			if _, err := connect(o); err != nil {
				t.Fatalf("sans %v: first handshake: %v", sans, err)
			}
			if resumed, err := connect(o); err != nil || !resumed {
				t.Fatalf("sans %v: second handshake under the same settings: resumed %v, error %v; want it resumed", sans, resumed, err)
			}
			for name, now := range map[string]*Origination{
				"CA rotated out":          settings(other.pem(), sans),
				"subjectAltName replaced": settings(root.pem(), []snapshot.SubjectAltName{{Type: snapshot.SANHostname, Value: "b.test"}}),
			} {
				if resumed, err := connect(now); !IsVerifyError(err) {
					t.Errorf("sans %v: %s: resumed %v, error %v; want a verification error", sans, name, resumed, err)
				}
			}
			time.Sleep(2 * time.Hour) // the CA expired, the leaf and the server's tickets not
			if resumed, err := connect(o); !IsVerifyError(err) {
				t.Errorf("sans %v: after the CA expired: resumed %v, error %v; want a verification error", sans, resumed, err)
			}
		})
	}
}
