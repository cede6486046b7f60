package apiserver

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the files kube-apiserver and its clients need: a CA that signs
// both the serving certificate and the client certificates, an admin client
// certificate in system:masters, and the service-account signing key.
type pki struct {
	caFile, serverCertFile, serverKeyFile string
	saKeyFile, saPubFile                  string
	caPEM, adminCertPEM, adminKeyPEM      []byte
}

// newPKI writes the PKI into dir. The serving certificate names loopback and
// the first address of the service range, which is what in-cluster clients
// of a real cluster would dial.
func newPKI(dir string, serviceIP net.IP) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ca key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "sockmesh-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := sign(caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("sign ca: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parse ca: %w", err)
	}

	p := &pki{
		caFile:         filepath.Join(dir, "ca.crt"),
		serverCertFile: filepath.Join(dir, "apiserver.crt"),
		serverKeyFile:  filepath.Join(dir, "apiserver.key"),
		saKeyFile:      filepath.Join(dir, "sa.key"),
		saPubFile:      filepath.Join(dir, "sa.pub"),
		caPEM:          pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
	}
	if err := os.WriteFile(p.caFile, p.caPEM, 0o600); err != nil {
		return nil, fmt.Errorf("write ca: %w", err)
	}

	serverCert, serverKey, err := leaf(ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, serviceIP},
	})
	if err != nil {
		return nil, fmt.Errorf("issue serving certificate: %w", err)
	}
	if err := writePair(p.serverCertFile, serverCert, p.serverKeyFile, serverKey); err != nil {
		return nil, err
	}

	// system:masters bypasses RBAC: the tests act as cluster admin; the
	// agent's own least-privilege RBAC is exercised by the cluster tier.
	p.adminCertPEM, p.adminKeyPEM, err = leaf(ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "sockmesh-test-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("issue admin certificate: %w", err)
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate service account key: %w", err)
	}
	saKeyDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, fmt.Errorf("marshal service account key: %w", err)
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("marshal service account public key: %w", err)
	}
	if err := writePair(
		p.saPubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}),
		p.saKeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: saKeyDER}),
	); err != nil {
		return nil, err
	}
	return p, nil
}

// leaf issues a certificate from tmpl signed by ca, returning PEM.
func leaf(ca *x509.Certificate, caKey crypto.Signer, tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	tmpl.NotBefore = ca.NotBefore
	tmpl.NotAfter = ca.NotAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := sign(tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("draw serial: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, fmt.Errorf("create certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	return der, nil
}

func writePair(certFile string, certPEM []byte, keyFile string, keyPEM []byte) error {
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", certFile, err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", keyFile, err)
	}
	return nil
}
