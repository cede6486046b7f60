package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/pki"
)

// XBackend scenarios: a selector-less Service stands for an
// ExternalHostname XBackend; the agent resolves the hostname through the
// node's DNS server (its own namespace) and the proxy originates TLS to
// the external host, presenting a client certificate for ClientAndServer.

const xbackendPort = 8443

// externalBackend runs a TLS-only echo backend on a host outside the
// cluster and publishes hostname for it in the node's DNS.
func (s *scenario) externalBackend(hostname string, o backendOptions) *backend {
	s.t.Helper()
	h := s.n.newExternalHost(s.t, "external")
	h.namespace = "outside"
	b := startBackend(s.t, h, o)
	s.n.dns.Set(hostname, 5, h.ip4)
	return b
}

// xbackendService is the XBackend name reaching hostname with protocol and
// tls (the YAML of spec.tls, indented by four spaces), and the annotated
// Service standing for it.
func (s *scenario) xbackendService(name, hostname, protocol, tls string) *service {
	s.t.Helper()
	s.apply(fmt.Sprintf(`apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackend
metadata: {name: %s}
spec:
  type: ExternalHostname
  externalHostname: {hostname: %s}
  port: {number: %d}
  protocol: %s
  tls:
%s
`, name, hostname, xbackendPort, protocol, tls))
	return s.service(name, serviceSpec{
		Annotations: map[string]string{"sockmesh.io/xbackend": name},
		Ports:       []servicePort{{Name: "http", Port: 80}},
	})
}

// resolvedTo accepts an XBackend Backend whose endpoints are exactly the
// external host's address.
func resolvedTo(h *host) func(*snapshot.Backend) error {
	want := netip.AddrPortFrom(h.ip4, xbackendPort)
	return func(be *snapshot.Backend) error {
		var got []netip.AddrPort
		for _, ep := range be.Endpoints {
			got = append(got, ep.Addr)
		}
		if be.Ref.Kind != snapshot.KindXBackend || !slices.Equal(got, []netip.AddrPort{want}) {
			return fmt.Errorf("backend %s endpoints %v (invalid %+v), want the XBackend resolved to %s", be.Ref, got, be.Invalid, want)
		}
		return nil
	}
}

// testXBackendServerOnly: TLS ServerOnly to an external hostname.
func testXBackendServerOnly(s *scenario) {
	hostname := "api." + s.ns + ".e2e.test"
	ca := s.newCA()
	b := s.externalBackend(hostname, backendOptions{Wire: TLSOnly, Cert: s.serverCert(ca, hostname), HTTPPort: xbackendPort})
	s.apply(caConfigMap("partner-ca", ca))
	svc := s.xbackendService("partner", hostname, "HTTP11", `    mode: ServerOnly
    validation:
      hostname: `+hostname+`
      caCertificateRefs: [{group: "", kind: ConfigMap, name: partner-ca}]`)
	addr := svc.addr(false, 80)
	s.waitCaptured(addr, func(be *snapshot.Backend) error {
		if err := resolvedTo(b.pod)(be); err != nil {
			return err
		}
		return originatesTLS(hostname)(be)
	})
	rep := s.get(svc.url(false, 80, "/server-only"))
	s.checkTLS(rep, hostname)
	// Its name and its port, not TLS's default (RFC 9110 §7.2).
	if want := fmt.Sprintf("%s:%d", hostname, xbackendPort); rep.Host != want {
		s.t.Errorf("external backend saw authority %q, want its own %s", rep.Host, want)
	}
	s.checkFromNode(rep, b.pod)
	if rep.TLS != nil && len(rep.TLS.PeerCertificates) != 0 {
		s.t.Errorf("ServerOnly: the backend saw client certificates %+v", rep.TLS.PeerCertificates)
	}
	if n, _ := s.n.dns.Queries(hostname); n == 0 {
		s.t.Errorf("the node's DNS server was never asked for %s", hostname)
	}
	s.waitXBackendStatus("partner", "partner", accepted)
	s.checkNoPlaintext(b)
}

// testXBackendMutual: ClientAndServer: the external backend requires a
// client certificate and sees the one the XBackend names, over HTTP/2.
func testXBackendMutual(s *scenario) {
	hostname := "mtls." + s.ns + ".e2e.test"
	const clientURI = "spiffe://e2e.test/ns/apps/sa/caller"
	serverCA, clientCA := s.newCA(), s.newCA()
	client := s.leaf(clientCA, pki.LeafOptions{CommonName: "e2e-caller", Client: true, URIs: []string{clientURI}})
	b := s.externalBackend(hostname, backendOptions{Wire: TLSOnly, Cert: s.serverCert(serverCA, hostname),
		ClientCA: clientCA, HTTPPort: xbackendPort})
	s.apply(caConfigMap("bank-ca", serverCA) + fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: bank-client}
type: kubernetes.io/tls
stringData: {tls.crt: %s, tls.key: %s}
---
`, yamlString(string(client.CertPEM)), yamlString(string(client.KeyPEM))))
	svc := s.xbackendService("bank", hostname, "HTTP2", `    mode: ClientAndServer
    clientCertificateRef: {name: bank-client}
    validation:
      hostname: `+hostname+`
      caCertificateRefs: [{group: "", kind: ConfigMap, name: bank-ca}]`)
	addr := svc.addr(false, 80)
	s.waitCaptured(addr, func(be *snapshot.Backend) error {
		if err := resolvedTo(b.pod)(be); err != nil {
			return err
		}
		if err := originatesTLS(hostname)(be); err != nil {
			return err
		}
		if be.TLS.Mode != snapshot.TLSMutual {
			return fmt.Errorf("backend %s TLS mode %s, want %s", be.Ref, be.TLS.Mode, snapshot.TLSMutual)
		}
		return nil
	})
	rep := s.get(svc.url(false, 80, "/mutual"))
	s.checkTLS(rep, hostname)
	s.checkFromNode(rep, b.pod)
	if rep.Proto != "HTTP/2.0" || rep.TLS == nil || rep.TLS.NegotiatedProtocol != "h2" {
		s.t.Errorf("backend saw %s (TLS %+v), want HTTP/2.0 over ALPN h2 (protocol HTTP2)", rep.Proto, rep.TLS)
	}
	if rep.TLS == nil || len(rep.TLS.PeerCertificates) == 0 ||
		!strings.Contains(rep.TLS.PeerCertificates[0].Subject, "CN=e2e-caller") ||
		!slices.Contains(rep.TLS.PeerCertificates[0].URIs, clientURI) {
		s.t.Errorf("backend saw client certificates %+v, want CN=e2e-caller with URI %s", rep.TLS, clientURI)
	}
	s.waitXBackendStatus("bank", "bank", accepted, resolvedRefs)
	s.checkNoPlaintext(b)
}
