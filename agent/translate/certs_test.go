package translate_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testCerts produces the PEM files under testdata/certs. Ed25519 keys from
// fixed seeds, fixed serials and validity, and Ed25519's deterministic
// signatures make the output identical on every run, so fixtures can embed
// the files and TestCertsUpToDate can prove they are what this code makes.
func testCerts(t *testing.T) map[string][]byte {
	t.Helper()
	key := func(name string) ed25519.PrivateKey {
		seed := sha256.Sum256([]byte("sockmesh translate test key " + name))
		return ed25519.NewKeyFromSeed(seed[:])
	}
	notBefore := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	notAfter := time.Date(2046, 1, 1, 0, 0, 0, 0, time.UTC)
	ca := func(serial int64, cn string, k ed25519.PrivateKey, notBefore, notAfter time.Time) (*x509.Certificate, []byte) {
		tmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(serial),
			Subject:               pkix.Name{CommonName: cn},
			NotBefore:             notBefore,
			NotAfter:              notAfter,
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
			BasicConstraintsValid: true,
			IsCA:                  true,
		}
		der, err := x509.CreateCertificate(nil, tmpl, tmpl, k.Public(), k)
		if err != nil {
			t.Fatalf("create %s: %v", cn, err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatalf("parse %s: %v", cn, err)
		}
		return cert, der
	}
	caKey, ca2Key, clientKey, otherKey := key("ca"), key("ca2"), key("client"), key("other")
	caCert, caDER := ca(1, "sockmesh test CA", caKey, notBefore, notAfter)
	_, ca2DER := ca(2, "sockmesh test CA 2", ca2Key, notBefore, notAfter)
	// ca-expired.pem: the test CA's predecessor (its name and key), expired
	// before the fixtures' now, as a CA bundle keeps it through a rotation.
	_, expiredDER := ca(5, "sockmesh test CA", caKey, notBefore.AddDate(-1, 0, 0), notBefore)
	spiffe, _ := url.Parse("spiffe://cluster.local/ns/apps/sa/client")
	clientTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "client"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{spiffe},
	}
	clientDER, err := x509.CreateCertificate(nil, clientTmpl, caCert, clientKey.Public(), caKey)
	if err != nil {
		t.Fatalf("create client certificate: %v", err)
	}
	// client-short.pem: the same key, a certificate that expires in 2026,
	// the fixtures' year, for when the agent must translate again.
	shortTmpl := *clientTmpl
	shortTmpl.SerialNumber = big.NewInt(4)
	shortTmpl.NotAfter = time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	shortDER, err := x509.CreateCertificate(nil, &shortTmpl, caCert, clientKey.Public(), caKey)
	if err != nil {
		t.Fatalf("create short client certificate: %v", err)
	}
	keyPEM := func(k ed25519.PrivateKey) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatalf("marshal key: %v", err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}
	certPEM := func(der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}) }
	return map[string][]byte{
		"ca.pem":           certPEM(caDER),
		"ca2.pem":          certPEM(ca2DER),
		"ca-expired.pem":   certPEM(expiredDER),
		"client.pem":       certPEM(clientDER),
		"client-short.pem": certPEM(shortDER),
		"client-key.pem":   keyPEM(clientKey),
		"other-key.pem":    keyPEM(otherKey),
	}
}

// TestCertsUpToDate keeps testdata/certs equal to what testCerts makes
// (-update rewrites them, and the demo's copies in examples/demo).
func TestCertsUpToDate(t *testing.T) {
	for name, want := range testCerts(t) {
		path := filepath.Join("testdata", "certs", name)
		if *update {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("read %s: %v (run go test ./agent/translate -update)", path, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what testCerts generates; run go test ./agent/translate -update", path)
		}
	}
}
