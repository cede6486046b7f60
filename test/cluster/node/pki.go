package node

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/sockmesh/sockmesh/test/pki"
)

// certs are the files of the node's PKI: one CA signs the API server's and
// the kubelet's serving certificates and every client certificate; the
// service-account key pair signs tokens.
type certs struct {
	dir                                 string
	ca                                  *pki.CA
	caFile                              string
	apiserverCert, apiserverKey         string
	kubeletCert, kubeletKey             string
	kubeletClientCert, kubeletClientKey string // the API server's client certificate for kubelets
	saKey, saPub                        string
}

// newCerts writes the node's PKI into dir. The API server's certificate
// names the node IP, loopback and the kubernetes Service's ClusterIP that
// in-cluster clients dial.
func newCerts(dir string, nodeName string, nodeIP, kubernetesIP netip.Addr) (*certs, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	ca, err := pki.NewCA("sockmesh-node-ca")
	if err != nil {
		return nil, err
	}
	c := &certs{dir: dir, ca: ca}
	if c.caFile, err = ca.WriteFile(dir, "ca"); err != nil {
		return nil, err
	}
	api, err := ca.Issue(pki.LeafOptions{
		CommonName: "kube-apiserver",
		DNSNames:   []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPs:        []netip.Addr{nodeIP, kubernetesIP, netip.MustParseAddr("127.0.0.1")},
	})
	if err != nil {
		return nil, err
	}
	if c.apiserverCert, c.apiserverKey, err = api.WriteFiles(dir, "apiserver"); err != nil {
		return nil, err
	}
	kubelet, err := ca.Issue(pki.LeafOptions{CommonName: nodeName, DNSNames: []string{nodeName}, IPs: []netip.Addr{nodeIP}})
	if err != nil {
		return nil, err
	}
	if c.kubeletCert, c.kubeletKey, err = kubelet.WriteFiles(dir, "kubelet"); err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := c.client("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, err
	}
	c.kubeletClientCert, c.kubeletClientKey = filepath.Join(dir, "apiserver-kubelet-client.crt"), filepath.Join(dir, "apiserver-kubelet-client.key")
	if err := writeFiles(c.kubeletClientCert, certPEM, c.kubeletClientKey, keyPEM); err != nil {
		return nil, err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate service account key: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, fmt.Errorf("marshal service account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("marshal service account public key: %w", err)
	}
	c.saKey, c.saPub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writeFiles(
		c.saKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		c.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}),
	); err != nil {
		return nil, err
	}
	return c, nil
}

// client issues a client certificate for user commonName in groups. It
// signs with the CA directly because Kubernetes takes groups from the
// subject's Organization, which pki.LeafOptions does not set.
func (c *certs) client(commonName string, groups ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key for %s: %w", commonName, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, fmt.Errorf("draw serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName, Organization: groups},
		NotBefore:    c.ca.Cert.NotBefore,
		NotAfter:     c.ca.Cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca.Cert, key.Public(), c.ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue client certificate %s: %w", commonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal key of %s: %w", commonName, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// kubeconfig writes dir/name.kubeconfig for user commonName in groups,
// reaching the API server at server, and returns its path.
func (c *certs) kubeconfig(name, server, commonName string, groups ...string) (string, error) {
	certPEM, keyPEM, err := c.client(commonName, groups...)
	if err != nil {
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["sockmesh-node"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: c.ca.CertPEM}
	kc.AuthInfos[commonName] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kc.Contexts["sockmesh-node"] = &clientcmdapi.Context{Cluster: "sockmesh-node", AuthInfo: commonName}
	kc.CurrentContext = "sockmesh-node"
	path := filepath.Join(c.dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("write kubeconfig %s: %w", name, err)
	}
	return path, nil
}

func writeFiles(certFile string, certPEM []byte, keyFile string, keyPEM []byte) error {
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", certFile, err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", keyFile, err)
	}
	return nil
}
