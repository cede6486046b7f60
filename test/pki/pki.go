package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a self-signed certificate authority.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// NewCA returns a CA named commonName, valid from an hour ago for a day.
func NewCA(commonName string) (*CA, error) { return newCA(commonName, nil) }

// NewIntermediate returns a CA named commonName that ca signed, valid from
// an hour ago for a day. Its CertPEM holds its own certificate only.
func (ca *CA) NewIntermediate(commonName string) (*CA, error) { return newCA(commonName, ca) }

// newCA makes a CA signed by parent, or self-signed when parent is nil.
func newCA(commonName string, parent *CA) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ca key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	issuer, signer := tmpl, crypto.Signer(key)
	if parent != nil {
		issuer, signer = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, key.Public(), signer)
	if err != nil {
		return nil, fmt.Errorf("create ca %s: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse ca %s: %w", commonName, err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: pemBlock("CERTIFICATE", der)}, nil
}

// Pool returns a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// LeafOptions describe a certificate to issue. The zero value is a server
// certificate with no names, valid for a day.
type LeafOptions struct {
	CommonName string
	// Organization is the subject's O: Kubernetes reads a client
	// certificate's groups from it (system:masters, system:nodes).
	Organization []string
	DNSNames     []string
	IPs          []netip.Addr
	// URIs are URI subjectAltNames such as spiffe://cluster.local/ns/a/sa/b.
	URIs []string
	// Client issues a client-authentication certificate instead of a server one.
	Client bool
	// NotBefore and NotAfter override the validity (an hour ago to a day
	// from now): a past NotAfter gives an expired certificate, a future
	// NotBefore one not yet valid.
	NotBefore, NotAfter time.Time
}

// Leaf is an issued certificate with its key, in both forms tests need.
type Leaf struct {
	TLS     tls.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// Issue signs a leaf certificate described by o.
func (ca *CA) Issue(o LeafOptions) (*Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate leaf key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: o.CommonName, Organization: o.Organization},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     o.NotAfter,
		DNSNames:     o.DNSNames,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if !o.NotBefore.IsZero() {
		tmpl.NotBefore = o.NotBefore
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	}
	if o.Client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	for _, ip := range o.IPs {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.IP(ip.AsSlice()))
	}
	for _, s := range o.URIs {
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("parse uri san %q: %w", s, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("issue %s: %w", o.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key of %s: %w", o.CommonName, err)
	}
	certPEM, keyPEM := pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", keyDER)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load pair of %s: %w", o.CommonName, err)
	}
	return &Leaf{TLS: pair, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// WriteFiles writes the leaf as <name>.crt and <name>.key in dir and returns
// both paths.
func (l *Leaf) WriteFiles(dir, name string) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := writeFiles(file{certFile, l.CertPEM}, file{keyFile, l.KeyPEM}); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// WriteFile writes the CA certificate as <name>.crt in dir and returns its path.
func (ca *CA) WriteFile(dir, name string) (string, error) {
	p := filepath.Join(dir, name+".crt")
	if err := writeFiles(file{p, ca.CertPEM}); err != nil {
		return "", err
	}
	return p, nil
}

// file is one file to write: key material, readable by the owner only.
type file struct {
	path string
	data []byte
}

func writeFiles(files ...file) error {
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", f.path, err)
		}
	}
	return nil
}

// WriteSigningKey generates a P-256 key pair, such as the one
// kube-apiserver signs service-account tokens with, and writes it as
// <name>.key (PKCS #8) and <name>.pub (PKIX) in dir.
func WriteSigningKey(dir, name string) (keyFile, pubFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generate signing key %s: %w", name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", fmt.Errorf("marshal signing key %s: %w", name, err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("marshal public key %s: %w", name, err)
	}
	keyFile, pubFile = filepath.Join(dir, name+".key"), filepath.Join(dir, name+".pub")
	if err := writeFiles(file{keyFile, pemBlock("PRIVATE KEY", keyDER)}, file{pubFile, pemBlock("PUBLIC KEY", pubDER)}); err != nil {
		return "", "", err
	}
	return keyFile, pubFile, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		// crypto/rand never fails on Linux (getrandom); a fixed serial would
		// still give a valid certificate.
		return big.NewInt(1)
	}
	return n
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
