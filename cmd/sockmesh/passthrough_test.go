package main

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/nshttp"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/test/pki"
)

// TestAgentPassthroughPastClientCertificate: an app that speaks TLS itself
// to an XBackend whose tls.mode is ClientAndServer is passed through
// untouched, as to any captured Service (never TLS inside TLS): the
// backend, which requires a client certificate, sees the app's own
// handshake — its SNI, its certificate — and not the XBackend's client
// certificate, which the proxy presents only where it originates TLS (a
// plaintext app's connection, checked first).
func TestAgentPassthroughPastClientCertificate(t *testing.T) {
	e := newEnv(t)
	dns := e.serveDNS(t)
	// The external host: an address in the backend pod's namespace that
	// no EndpointSlice lists, so the agent does not refuse it.
	ext := netip.MustParseAddr("10.232.3.20")
	e.backend.AddAddr(t, "lo", netip.PrefixFrom(ext, 32))
	e.node.AddRoute(t, netip.PrefixFrom(ext, 32), addrs.Backend.Addr())
	dns.Set("api.example.test", 60, ext)

	ca, err := pki.NewCA("sockmesh passthrough test CA")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(o pki.LeafOptions) *pki.Leaf {
		l, err := ca.Issue(o)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	server := issue(pki.LeafOptions{CommonName: "api", DNSNames: []string{"api.example.test", "app.example.test"}})
	mesh := issue(pki.LeafOptions{CommonName: "mesh-identity", Client: true})
	own := issue(pki.LeafOptions{CommonName: "app-own", Client: true})

	ln, err := e.backend.Listen(context.Background(), nil, "tcp", netip.AddrPortFrom(ext, backendPort).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := echo.New(echo.Config{Namespace: "external", Pod: "api", TLS: &tls.Config{Certificates: []tls.Certificate{server.TLS},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}})
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	e.writeFile(t, "bank.yaml", fmt.Sprintf(bankYAML, indent(string(ca.CertPEM), "    "), b64(mesh.CertPEM), b64(mesh.KeyPEM), backendPort))

	a := e.startAgent(t, "--proxy-mode=node-ip", "--proxy-listen="+addrs.Node.String()+":0", "--dns-server="+dns.Addr)
	a.waitReady(t)
	waitExt(t, a, "mutual TLS toward the external host", func(b *snapshot.Backend) bool {
		return b.Invalid == nil && b.TLS != nil && b.TLS.Mode == snapshot.TLSMutual && len(b.Endpoints) == 1 && b.Endpoints[0].Addr.Addr() == ext
	})

	bank := "10.96.232.12:443"
	rep := fetch(t, nshttp.Client(e.client, 10*time.Second), "http://"+bank+"/originated")
	if got := peerSubjects(rep); rep.TLS == nil || rep.TLS.ServerName != "api.example.test" || got != "CN=mesh-identity" {
		t.Errorf("plaintext app: backend saw TLS %+v, client certificates %s; want SNI api.example.test and the XBackend's CN=mesh-identity", rep.TLS, got)
	}

	tr := nshttp.Transport(e.client)
	tr.TLSClientConfig = &tls.Config{ServerName: "app.example.test", RootCAs: ca.Pool(), Certificates: []tls.Certificate{own.TLS}}
	rep = fetch(t, &http.Client{Timeout: 10 * time.Second, Transport: tr}, "https://"+bank+"/passthrough")
	if got := peerSubjects(rep); rep.TLS == nil || rep.TLS.ServerName != "app.example.test" || got != "CN=app-own" {
		t.Errorf("app speaking TLS: backend saw TLS %+v, client certificates %s; want the app's own handshake: SNI app.example.test, CN=app-own", rep.TLS, got)
	}
	a.stop(t)
}

// peerSubjects lists the subjects of the client certificates the backend
// saw, "none" for none.
func peerSubjects(rep echo.Report) string {
	if rep.TLS == nil || len(rep.TLS.PeerCertificates) == 0 {
		return "none"
	}
	s := rep.TLS.PeerCertificates[0].Subject
	for _, c := range rep.TLS.PeerCertificates[1:] {
		s += ", " + c.Subject
	}
	return s
}

// bankYAML is an ExternalHostname XBackend with tls.mode ClientAndServer
// and its Service: the CA (indented), the client certificate and key
// (base64), the port.
const bankYAML = `apiVersion: v1
kind: ConfigMap
metadata: {name: bank-ca, namespace: app}
data:
  ca.crt: |
%s
---
apiVersion: v1
kind: Secret
metadata: {name: bank-client, namespace: app}
type: kubernetes.io/tls
data: {tls.crt: %s, tls.key: %s}
---
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackend
metadata: {name: bank, namespace: app}
spec:
  type: ExternalHostname
  port: {number: %d}
  externalHostname: {hostname: api.example.test}
  protocol: HTTP
  tls:
    mode: ClientAndServer
    clientCertificateRef: {name: bank-client}
    validation:
      hostname: api.example.test
      caCertificateRefs: [{group: "", kind: ConfigMap, name: bank-ca}]
---
apiVersion: v1
kind: Service
metadata: {name: bank, namespace: app, annotations: {sockmesh.io/xbackend: bank}}
spec:
  clusterIP: 10.96.232.12
  clusterIPs: [10.96.232.12]
  ports: [{name: https, port: 443, protocol: TCP}]
`
