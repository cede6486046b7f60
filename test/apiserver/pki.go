package apiserver

import (
	"fmt"
	"net/netip"

	"github.com/sockmesh/sockmesh/test/pki"
)

// apiPKI holds the files kube-apiserver and its clients need: a CA that
// signs both the serving certificate and the client certificates, an admin
// client certificate in system:masters, and the service-account signing key.
type apiPKI struct {
	caFile, serverCertFile, serverKeyFile string
	saKeyFile, saPubFile                  string
	caPEM, adminCertPEM, adminKeyPEM      []byte
}

// newPKI writes the PKI into dir. The serving certificate names loopback and
// the first address of the service range, which is what in-cluster clients
// of a real cluster would dial.
func newPKI(dir string, serviceIP netip.Addr) (*apiPKI, error) {
	ca, err := pki.NewCA("sockmesh-test-ca")
	if err != nil {
		return nil, err
	}
	p := &apiPKI{caPEM: ca.CertPEM}
	if p.caFile, err = ca.WriteFile(dir, "ca"); err != nil {
		return nil, err
	}
	server, err := ca.Issue(pki.LeafOptions{
		CommonName: "kube-apiserver",
		DNSNames:   []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPs:        []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback(), serviceIP},
	})
	if err != nil {
		return nil, fmt.Errorf("issue serving certificate: %w", err)
	}
	if p.serverCertFile, p.serverKeyFile, err = server.WriteFiles(dir, "apiserver"); err != nil {
		return nil, err
	}
	// system:masters bypasses RBAC: the tests act as cluster admin; the
	// agent's own least-privilege RBAC is exercised by the cluster tier.
	admin, err := ca.Issue(pki.LeafOptions{CommonName: "sockmesh-test-admin", Organization: []string{"system:masters"}, Client: true})
	if err != nil {
		return nil, fmt.Errorf("issue admin certificate: %w", err)
	}
	p.adminCertPEM, p.adminKeyPEM = admin.CertPEM, admin.KeyPEM
	if p.saKeyFile, p.saPubFile, err = pki.WriteSigningKey(dir, "sa"); err != nil {
		return nil, err
	}
	return p, nil
}
