package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath/mark"
	"github.com/sockmesh/sockmesh/test/pki"
)

// BackendTLSPolicy scenarios: the app speaks plaintext to a Service, the
// TLS-only backend sees TLS with the policy's SNI, verified as the policy
// says, and nothing ever reaches it in plaintext.

// httpsPort is the Service port of the TLS scenarios; backendPort the
// echo backend's.
const (
	httpsPort   = 443
	backendPort = 8443
)

// tlsPolicy is a BackendTLSPolicy for the https port of service; validation
// is the YAML body of spec.validation, indented by four spaces.
func tlsPolicy(name, service, validation string) string {
	return fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: %s}
spec:
  targetRefs: [{group: "", kind: Service, name: %s, sectionName: https}]
  validation:
%s
---
`, name, service, validation)
}

// tlsBackend runs a TLS-only backend with cert and a Service name:443
// leading to it.
func (s *scenario) tlsBackend(name string, cert *pki.Leaf) (*backend, *service) {
	s.t.Helper()
	b := s.backend(name, backendOptions{Wire: TLSOnly, Cert: cert, HTTPPort: backendPort})
	svc := s.service(name, serviceSpec{
		Ports:   []servicePort{{Name: "https", Port: httpsPort, TargetPort: backendPort}},
		Backend: b,
	})
	return b, svc
}

// trustedTLSBackend is a TLS-only backend with a certificate for hostname
// and a BackendTLSPolicy that trusts its CA from a ConfigMap (name-ca),
// once the agent captures it.
func (s *scenario) trustedTLSBackend(name, hostname string) (*backend, *service) {
	s.t.Helper()
	ca := s.newCA()
	b, svc := s.tlsBackend(name, s.serverCert(ca, hostname))
	s.apply(caConfigMap(name+"-ca", ca) + tlsPolicy(name, name, `    hostname: `+hostname+`
    caCertificateRefs: [{group: "", kind: ConfigMap, name: `+name+`-ca}]`))
	s.waitCaptured(svc.addr(false, httpsPort), originatesTLS(hostname))
	return b, svc
}

// testConfigMapCA: trust from a ConfigMap. The app's socket still sees
// the Service address as its peer (getpeername hook).
func testConfigMapCA(s *scenario) {
	const hostname = "web.e2e.test"
	b, svc := s.trustedTLSBackend("web", hostname)

	rep := s.get(svc.url(false, httpsPort, "/configmap-ca"))
	s.checkTLS(rep, hostname)
	s.checkFromNode(rep, b.pod)
	if rep.Proto != "HTTP/1.1" || rep.Path != "/configmap-ca" {
		s.t.Errorf("backend saw %s %s, want HTTP/1.1 /configmap-ca as the app sent it", rep.Proto, rep.Path)
	}
	// A pod that puts the proxy's mark on its socket is captured all the
	// same: the mark passes only the proxy's own sockets, in its netns.
	marked := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       s.n.client.dialer.marked(mark.Proxy),
	}}
	if r, err := s.request(marked, svc.url(false, httpsPort, "/marked")); err != nil {
		s.t.Errorf("GET with the proxy's mark on the pod's socket: %v", err)
	} else if r.status != http.StatusOK {
		s.t.Errorf("GET with the proxy's mark on the pod's socket: %d %q, want 200 through the proxy", r.status, r.body)
	} else {
		s.checkTLS(r.report, hostname)
	}
	c, err := s.n.client.dialer.DialContext(context.Background(), "tcp", svc.addr(false, httpsPort).String())
	if err != nil {
		s.t.Fatal(err)
	}
	if got := c.RemoteAddr().String(); got != svc.addr(false, httpsPort).String() {
		s.t.Errorf("the app's socket has peer %s, want the Service address %s", got, svc.addr(false, httpsPort))
	}
	c.Close()
	s.waitPolicyStatus("web", "web", accepted, resolvedRefs)
	s.checkNoPlaintext(b)
}

// testSecretCA: trust from a Secret's ca.crt.
func testSecretCA(s *scenario) {
	const hostname = "vault.e2e.test"
	ca := s.newCA()
	b, svc := s.tlsBackend("vault", s.serverCert(ca, hostname))
	s.apply(fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: vault-ca}
stringData: {ca.crt: %s}
---
`, yamlString(string(ca.CertPEM))) + tlsPolicy("vault", "vault", `    hostname: `+hostname+`
    caCertificateRefs: [{group: "", kind: Secret, name: vault-ca}]`))
	s.waitCaptured(svc.addr(false, httpsPort), originatesTLS(hostname))
	rep := s.get(svc.url(false, httpsPort, "/secret-ca"))
	s.checkTLS(rep, hostname)
	s.checkFromNode(rep, b.pod)
	s.waitPolicyStatus("vault", "vault", accepted, resolvedRefs)
	s.checkNoPlaintext(b)
}

// testSubjectAltNames: subjectAltNames replace the hostname for
// verification (the SNI stays the hostname). The certificates do not
// carry the hostname at all, so a proxy that verified it would fail; the
// certificates of the cases marked reject carry none of their policy's
// SANs and must be refused.
func testSubjectAltNames(s *scenario) {
	const sni = "sni.e2e.test"
	const uri, otherURI = "spiffe://e2e.test/ns/payments/sa/api", "spiffe://other.e2e.test/ns/payments/sa/api"
	ca := s.newCA()
	s.apply(caConfigMap("san-ca", ca))
	cases := []struct {
		name   string
		cert   pki.LeafOptions
		sans   string
		reject bool
	}{
		{"by-dns", pki.LeafOptions{CommonName: "dns", DNSNames: []string{"san.e2e.test"}},
			`[{type: Hostname, hostname: san.e2e.test}]`, false},
		{"by-uri", pki.LeafOptions{CommonName: "uri", URIs: []string{uri}},
			`[{type: URI, uri: "` + uri + `"}]`, false},
		{"wrong-san", pki.LeafOptions{CommonName: "other", DNSNames: []string{"other.e2e.test", sni}},
			`[{type: Hostname, hostname: san.e2e.test}]`, true},
		// BackendTLSPolicySANValidation's san-uri-mismatch, multiple-sans
		// and multiple-mismatch-sans: one matching name of either type
		// suffices, and none refuses.
		{"uri-mismatch", pki.LeafOptions{CommonName: "uri", URIs: []string{uri}},
			`[{type: URI, uri: "` + otherURI + `"}]`, true},
		{"multiple-sans", pki.LeafOptions{CommonName: "both", DNSNames: []string{"san.e2e.test"}, URIs: []string{uri}},
			`[{type: URI, uri: "` + uri + `"}, {type: Hostname, hostname: san.e2e.test}]`, false},
		{"multiple-mismatch", pki.LeafOptions{CommonName: "both", DNSNames: []string{"san.e2e.test"}, URIs: []string{uri}},
			`[{type: URI, uri: "` + otherURI + `"}, {type: Hostname, hostname: other.e2e.test}]`, true},
	}
	for _, tc := range cases {
		b, svc := s.tlsBackend(tc.name, s.leaf(ca, tc.cert))
		s.apply(tlsPolicy(tc.name, tc.name, `    hostname: `+sni+`
    subjectAltNames: `+tc.sans+`
    caCertificateRefs: [{group: "", kind: ConfigMap, name: san-ca}]`))
		s.waitCaptured(svc.addr(false, httpsPort), originatesTLS(sni))
		url := svc.url(false, httpsPort, "/"+tc.name)
		if tc.reject {
			// Its certificate even names the SNI: only the SAN decides.
			if code, body := s.getStatus(url); code < 500 {
				s.t.Errorf("%s: a backend without the policy's SAN answered %d %s, want a 5xx from the proxy", tc.name, code, body)
			}
		} else {
			rep := s.get(url)
			s.checkTLS(rep, sni)
			s.checkFromNode(rep, b.pod)
		}
		s.waitPolicyStatus(tc.name, tc.name, accepted, resolvedRefs)
		s.checkNoPlaintext(b)
	}
}

// testInvalidCA: a CA bundle that holds no certificate fails closed: 5xx
// for HTTP, a reset for opaque TCP, nothing reaches the backend, and the
// status says why.
func testInvalidCA(s *scenario) {
	const hostname = "broken.e2e.test"
	const tcpPort, backendTCPPort = 9000, 9443
	ca := s.newCA()
	b := s.backend("broken", backendOptions{Wire: TLSOnly, Cert: s.serverCert(ca, hostname), HTTPPort: backendPort, TCPPort: backendTCPPort})
	svc := s.service("broken", serviceSpec{Backend: b, Ports: []servicePort{
		{Name: "https", Port: httpsPort, TargetPort: backendPort},
		{Name: "tcp", Port: tcpPort, TargetPort: backendTCPPort},
	}})
	s.apply(`apiVersion: v1
kind: ConfigMap
metadata: {name: broken-ca}
data:
  ca.crt: "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: broken}
spec:
  targetRefs: [{group: "", kind: Service, name: broken}]
  validation:
    hostname: ` + hostname + `
    caCertificateRefs: [{group: "", kind: ConfigMap, name: broken-ca}]
`)
	invalid := func(be *snapshot.Backend) error {
		if be.Invalid == nil || be.Invalid.Reason != "NoValidCACertificate" {
			return fmt.Errorf("backend %s invalid=%+v, want NoValidCACertificate", be.Ref, be.Invalid)
		}
		return nil
	}
	s.waitCaptured(svc.addr(false, httpsPort), invalid)
	s.waitCaptured(svc.addr(false, tcpPort), invalid)

	if code, body := s.getStatus(svc.url(false, httpsPort, "/invalid-ca")); code < 500 {
		s.t.Errorf("HTTP through an invalid policy: %d %s, want a 5xx", code, body)
	}
	c, err := s.n.client.dialer.DialContext(context.Background(), "tcp", svc.addr(false, tcpPort).String())
	if err != nil {
		s.t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "opaque bytes\n")
	got, err := io.ReadAll(c)
	c.Close()
	if len(got) != 0 || !errors.Is(err, syscall.ECONNRESET) {
		s.t.Errorf("opaque TCP through an invalid policy: read %q, %v; want a reset and no byte", got, err)
	}

	s.waitPolicyStatus("broken", "broken",
		condition{"Accepted", "False", "NoValidCACertificate"},
		condition{"ResolvedRefs", "False", "InvalidCACertificateRef"})
	if st := b.stats(s.t); st.Accepted != 0 {
		s.t.Errorf("the backend behind an invalid policy accepted %d connections (%d plaintext), want none", st.Accepted, st.Plaintext)
	}
}

// testConflict: two policies for the same port; the older one wins even
// though the newer one sorts first by name, and the newer one is told it
// conflicts.
func testConflict(s *scenario) {
	ca := s.newCA()
	b, svc := s.tlsBackend("shared", s.serverCert(ca, "old.e2e.test", "new.e2e.test"))
	validation := func(hostname string) string {
		return `    hostname: ` + hostname + `
    caCertificateRefs: [{group: "", kind: ConfigMap, name: shared-ca}]`
	}
	s.apply(caConfigMap("shared-ca", ca) + tlsPolicy("zz-older", "shared", validation("old.e2e.test")))
	older, err := s.n.c.api.Gateway.GatewayV1().BackendTLSPolicies(s.ns).Get(context.Background(), "zz-older", metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	// creationTimestamp has one-second resolution: only a later second
	// makes the second policy newer rather than a tie broken by name.
	time.Sleep(time.Until(older.CreationTimestamp.Add(time.Second)))
	s.apply(tlsPolicy("aa-newer", "shared", validation("new.e2e.test")))
	s.waitPolicyStatus("aa-newer", "shared", condition{"Accepted", "False", "Conflicted"})
	s.waitPolicyStatus("zz-older", "shared", accepted, resolvedRefs)
	s.waitCaptured(svc.addr(false, httpsPort), originatesTLS("old.e2e.test"))
	rep := s.get(svc.url(false, httpsPort, "/conflict"))
	s.checkTLS(rep, "old.e2e.test")
	s.checkNoPlaintext(b)
}

// testCARotation: the backend's certificate moves to a new CA, which the
// proxy refuses (fail closed) until the ConfigMap trusts the new CA;
// then traffic recovers, with the same agent process.
func testCARotation(s *scenario) {
	const hostname = "rotating.e2e.test"
	pid := s.n.agent.p.Cmd.Process.Pid
	oldCA, newCA := s.newCA(), s.newCA()
	b, svc := s.tlsBackend("rotating", s.serverCert(oldCA, hostname))
	s.apply(caConfigMap("rotating-ca", oldCA) + tlsPolicy("rotating", "rotating", `    hostname: `+hostname+`
    caCertificateRefs: [{group: "", kind: ConfigMap, name: rotating-ca}]`))
	s.waitCaptured(svc.addr(false, httpsPort), originatesTLS(hostname))
	s.checkTLS(s.get(svc.url(false, httpsPort, "/before")), hostname)

	// The backend restarts with a certificate of the new CA: its old
	// connections (the proxy's pool) are gone. Refused, as
	// BackendTLSPolicy's cert-mismatch case wants.
	b.restart(s.t, backendOptions{Wire: TLSOnly, Cert: s.serverCert(newCA, hostname), HTTPPort: backendPort})
	if code, body := s.getStatus(svc.url(false, httpsPort, "/untrusted")); code < 500 {
		s.t.Errorf("a backend certificate from a CA the policy does not trust: %d %s, want a 5xx", code, body)
	}

	s.apply(caConfigMap("rotating-ca", newCA))
	s.waitCaptured(svc.addr(false, httpsPort), func(be *snapshot.Backend) error {
		if be.TLS == nil || !strings.Contains(be.TLS.RootsPEM, string(newCA.CertPEM)) {
			return errors.New("the new CA is not trusted yet")
		}
		return nil
	})
	rep := s.get(svc.url(false, httpsPort, "/after"))
	s.checkTLS(rep, hostname)
	s.checkFromNode(rep, b.pod)
	if got := s.n.agent.p.Cmd.Process.Pid; got != pid {
		s.t.Errorf("agent pid %d after the rotation, want %d: no restart", got, pid)
	}
	select {
	case <-s.n.agent.exited:
		s.t.Error("the agent exited during the rotation")
	default:
	}
	s.checkNoPlaintext(b)
}

// testPolicyDeletion: deleting the policy releases the Service: the app's
// connection then goes directly to the backend (through the kube-proxy
// stand-in), in plaintext.
func testPolicyDeletion(s *scenario) {
	const hostname = "transient.e2e.test"
	ca := s.newCA()
	b := s.backend("transient", backendOptions{Wire: Dual, Cert: s.serverCert(ca, hostname), HTTPPort: backendPort})
	svc := s.service("transient", serviceSpec{Backend: b,
		Ports: []servicePort{{Name: "https", Port: httpsPort, TargetPort: backendPort}}})
	s.apply(caConfigMap("transient-ca", ca) + tlsPolicy("transient", "transient", `    hostname: `+hostname+`
    caCertificateRefs: [{group: "", kind: ConfigMap, name: transient-ca}]`))
	addr := svc.addr(false, httpsPort)
	s.waitCaptured(addr, originatesTLS(hostname))
	rep := s.get(svc.url(false, httpsPort, "/with-policy"))
	s.checkTLS(rep, hostname)
	s.checkFromNode(rep, b.pod)

	if err := s.n.c.api.Gateway.GatewayV1().BackendTLSPolicies(s.ns).Delete(context.Background(), "transient", metav1.DeleteOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.n.agent.waitSnapshot(s.t, "no capture of "+addr.String(), func(snap *snapshot.Snapshot) error {
		if fe, _ := frontend(snap, addr); fe != nil {
			return fmt.Errorf("%s still captured", addr)
		}
		return nil
	})
	rep = s.get(svc.url(false, httpsPort, "/without-policy"))
	if rep.TLS != nil {
		s.t.Errorf("after the policy's deletion the backend saw TLS %+v, want plaintext", rep.TLS)
	}
	if peer := rep.RemoteAddr; !strings.HasPrefix(peer, s.n.client.ip4.String()+":") {
		s.t.Errorf("after the policy's deletion the backend's peer was %s, want the client pod %s (no proxy)", peer, s.n.client.ip4)
	}
}

// testPassthrough: an app that speaks TLS itself is passed through: the
// backend sees the app's own SNI, once (no TLS inside TLS), and the app
// verifies the backend's own certificate end to end.
func testPassthrough(s *scenario) {
	const policyName, appName = "policy.e2e.test", "app-chosen.e2e.test"
	ca := s.newCA()
	b, svc := s.tlsBackend("direct", s.serverCert(ca, policyName, appName))
	s.apply(caConfigMap("direct-ca", ca) + tlsPolicy("direct", "direct", `    hostname: `+policyName+`
    caCertificateRefs: [{group: "", kind: ConfigMap, name: direct-ca}]`))
	addr := svc.addr(false, httpsPort)
	s.waitCaptured(addr, originatesTLS(policyName))

	c := s.httpClient(&tls.Config{ServerName: appName, RootCAs: ca.Pool()})
	r, err := s.request(c, "https://"+addr.String()+"/passthrough")
	if err != nil {
		s.t.Fatalf("the app's own TLS through the proxy: %v", err)
	}
	if r.status != http.StatusOK || r.report.TLS == nil {
		s.t.Fatalf("the app's own TLS through the proxy: %d %s", r.status, r.body)
	}
	if got := r.report.TLS.ServerName; got != appName {
		s.t.Errorf("backend saw SNI %q, want the app's own %q (passed through, not re-originated)", got, appName)
	}
	s.checkFromNode(r.report, b.pod)
	s.checkNoPlaintext(b)
}
