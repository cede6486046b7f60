package node

import (
	"fmt"
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
	kubeletClient, err := c.client("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, err
	}
	if c.kubeletClientCert, c.kubeletClientKey, err = kubeletClient.WriteFiles(dir, "apiserver-kubelet-client"); err != nil {
		return nil, err
	}
	if c.saKey, c.saPub, err = pki.WriteSigningKey(dir, "sa"); err != nil {
		return nil, err
	}
	return c, nil
}

// client issues a client certificate for user commonName in groups
// (Kubernetes reads them from the subject's Organization).
func (c *certs) client(commonName string, groups ...string) (*pki.Leaf, error) {
	return c.ca.Issue(pki.LeafOptions{CommonName: commonName, Organization: groups, Client: true})
}

// kubeconfig writes dir/name.kubeconfig for user commonName in groups,
// reaching the API server at server, and returns its path.
func (c *certs) kubeconfig(name, server, commonName string, groups ...string) (string, error) {
	leaf, err := c.client(commonName, groups...)
	if err != nil {
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["sockmesh-node"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: c.ca.CertPEM}
	kc.AuthInfos[commonName] = &clientcmdapi.AuthInfo{ClientCertificateData: leaf.CertPEM, ClientKeyData: leaf.KeyPEM}
	kc.Contexts["sockmesh-node"] = &clientcmdapi.Context{Cluster: "sockmesh-node", AuthInfo: commonName}
	kc.CurrentContext = "sockmesh-node"
	path := filepath.Join(c.dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("write kubeconfig %s: %w", name, err)
	}
	return path, nil
}
