package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/test/pki"
)

// scenario is one test's part of a node: a namespace of its own, the pods
// and objects it makes there, and the node's client pod.
type scenario struct {
	t  *testing.T
	n  *node
	ns string
}

var notDNSLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// newScenario makes the test's namespace, named after the test.
func newScenario(t *testing.T, n *node) *scenario {
	t.Helper()
	_, name, _ := strings.Cut(strings.ToLower(t.Name()), "/") // drop the top-level test's name
	name = strings.Trim(notDNSLabel.ReplaceAllString(name, "-"), "-")
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	n.c.newNamespace(t, name)
	return &scenario{t: t, n: n, ns: name}
}

// backend runs an echo backend in a new pod of the scenario.
func (s *scenario) backend(name string, o backendOptions) *backend {
	s.t.Helper()
	return startBackend(s.t, s.n.newPod(s.t, s.ns, name), o)
}

func (s *scenario) newCA() *pki.CA {
	s.t.Helper()
	ca, err := pki.NewCA("sockmesh e2e " + s.ns)
	if err != nil {
		s.t.Fatal(err)
	}
	return ca
}

func (s *scenario) leaf(ca *pki.CA, o pki.LeafOptions) *pki.Leaf {
	s.t.Helper()
	l, err := ca.Issue(o)
	if err != nil {
		s.t.Fatal(err)
	}
	return l
}

// serverCert issues a server certificate for the DNS names.
func (s *scenario) serverCert(ca *pki.CA, names ...string) *pki.Leaf {
	s.t.Helper()
	return s.leaf(ca, pki.LeafOptions{CommonName: names[0], DNSNames: names})
}

// apply server-side applies manifests in the scenario's namespace.
func (s *scenario) apply(manifests string) {
	s.t.Helper()
	s.n.c.apply(s.t, s.ns, manifests)
}

// applyFile applies the manifests in file (relative to the package) in
// the scenario's namespace. The mesh scenarios keep theirs in
// testdata/mesh, as the upstream conformance suite does.
func (s *scenario) applyFile(file string) {
	s.t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		s.t.Fatalf("read manifests: %v", err)
	}
	s.apply(string(b))
}

// yamlString quotes s as a YAML (JSON) string: PEM blocks in manifests.
func yamlString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// caConfigMap is a ConfigMap holding ca's certificate as ca.crt.
func caConfigMap(name string, ca *pki.CA) string {
	return fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s}\ndata: {ca.crt: %s}\n---\n",
		name, yamlString(string(ca.CertPEM)))
}

// servicePort is one port of a Service and the backend port it leads to.
type servicePort struct {
	Name             string
	Port, TargetPort uint16
	AppProtocol      string
}

// serviceSpec describes a Service the harness makes.
type serviceSpec struct {
	Ports []servicePort
	// Backend's pod is the Service's endpoint (an EndpointSlice per
	// family, and the kube-proxy stand-in's DNAT); nil: no endpoints, and
	// without sockmesh the address leads nowhere.
	Backend *backend
	// Families are the Service's IP families (nil: IPv4).
	Families    []corev1.IPFamily
	Annotations map[string]string
}

// service is a Service as allocated.
type service struct {
	name string
	ips  []netip.Addr
}

// ip is the Service's ClusterIP in family v6 (else IPv4).
func (sv *service) ip(v6 bool) netip.Addr {
	for _, ip := range sv.ips {
		if ip.Is6() == v6 {
			return ip
		}
	}
	panic(fmt.Sprintf("service %s has no IPv6=%v address", sv.name, v6))
}

func (sv *service) addr(v6 bool, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(sv.ip(v6), port)
}

// url is http://<ClusterIP>:port<path>.
func (sv *service) url(v6 bool, port uint16, path string) string {
	return "http://" + sv.addr(v6, port).String() + path
}

// service creates a Service (the API server allocates its ClusterIPs), its
// EndpointSlices and its kube-proxy stand-in rules.
func (s *scenario) service(name string, spec serviceSpec) *service {
	s.t.Helper()
	ctx := context.Background()
	families := spec.Families
	if families == nil {
		families = []corev1.IPFamily{corev1.IPv4Protocol}
	}
	policy := corev1.IPFamilyPolicySingleStack
	if len(families) > 1 {
		policy = corev1.IPFamilyPolicyRequireDualStack
	}
	obj := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: spec.Annotations},
		Spec:       corev1.ServiceSpec{IPFamilies: families, IPFamilyPolicy: &policy},
	}
	for _, p := range spec.Ports {
		sp := corev1.ServicePort{Name: p.Name, Port: int32(p.Port), Protocol: corev1.ProtocolTCP}
		if p.TargetPort != 0 {
			sp.TargetPort = intstr.FromInt32(int32(p.TargetPort))
		}
		if p.AppProtocol != "" {
			sp.AppProtocol = &p.AppProtocol
		}
		obj.Spec.Ports = append(obj.Spec.Ports, sp)
	}
	if spec.Backend != nil {
		obj.Spec.Selector = map[string]string{"app": spec.Backend.pod.name}
	}
	got, err := s.n.c.api.Kube.CoreV1().Services(s.ns).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatalf("create service %s: %v", name, err)
	}
	sv := &service{name: name}
	for _, ip := range got.Spec.ClusterIPs {
		sv.ips = append(sv.ips, netip.MustParseAddr(ip))
	}
	if b := spec.Backend; b != nil {
		for _, ip := range sv.ips {
			s.endpointSlice(name, spec.Ports, b, ip.Is6())
			for _, p := range spec.Ports {
				s.n.kubeProxy(s.t, ip, p.Port, b.addr(ip.Is6(), p.TargetPort))
			}
		}
	}
	return sv
}

// endpointSlice writes what the EndpointSlice controller would for a
// Service whose one endpoint is b's pod.
func (s *scenario) endpointSlice(service string, ports []servicePort, b *backend, v6 bool) {
	s.t.Helper()
	family, suffix := discoveryv1.AddressTypeIPv4, "ipv4"
	if v6 {
		family, suffix = discoveryv1.AddressTypeIPv6, "ipv6"
	}
	yes, tcp := true, corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   service + "-" + suffix,
			Labels: map[string]string{discoveryv1.LabelServiceName: service},
		},
		AddressType: family,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{b.pod.ip(v6).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes},
			NodeName:   &s.n.name,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: s.ns, Name: b.pod.name},
		}},
	}
	for _, p := range ports {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &p.Name, Port: new(int32(p.TargetPort)), Protocol: &tcp})
	}
	if _, err := s.n.c.api.Kube.DiscoveryV1().EndpointSlices(s.ns).Create(context.Background(), es, metav1.CreateOptions{}); err != nil {
		s.t.Fatalf("create endpointslice %s: %v", es.Name, err)
	}
}

// httpClient makes requests from the client pod, one connection each.
// tlsCfg, when set, is the client's own TLS (https URLs).
func (s *scenario) httpClient(tlsCfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       s.n.client.dialer.DialContext,
		TLSClientConfig:   tlsCfg,
	}}
}

// h2cKeptClient is the client pod's HTTP client for one h2c connection
// that its requests share (prior knowledge, no TLS).
func (s *scenario) h2cKeptClient() *http.Client {
	t := &http.Transport{DialContext: s.n.client.dialer.DialContext, Protocols: new(http.Protocols)}
	t.Protocols.SetUnencryptedHTTP2(true)
	s.t.Cleanup(t.CloseIdleConnections)
	return &http.Client{Timeout: 15 * time.Second, Transport: t}
}

// response is what the client pod got.
type response struct {
	status int
	body   []byte
	// report is the backend's, when the body is one.
	report echo.Report
}

// request sends one plaintext request from the client pod.
func (s *scenario) request(c *http.Client, url string) (*response, error) {
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	r := &response{status: resp.StatusCode}
	if r.body, err = io.ReadAll(resp.Body); err != nil {
		return nil, fmt.Errorf("read the response: %w", err)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		json.Unmarshal(r.body, &r.report)
	}
	return r, nil
}

// get sends one plaintext HTTP/1.1 request from the client pod and returns
// the backend's report; anything but 200 fails the test.
func (s *scenario) get(url string) echo.Report {
	s.t.Helper()
	r, err := s.request(s.httpClient(nil), url)
	if err != nil {
		s.t.Fatalf("GET %s from the client pod: %v", url, err)
	}
	if r.status != http.StatusOK {
		s.t.Fatalf("GET %s from the client pod: %d %s", url, r.status, r.body)
	}
	return r.report
}

// getStatus sends one plaintext request and returns the status code.
func (s *scenario) getStatus(url string) (int, string) {
	s.t.Helper()
	r, err := s.request(s.httpClient(nil), url)
	if err != nil {
		s.t.Fatalf("GET %s from the client pod: %v", url, err)
	}
	return r.status, string(r.body)
}

// frontend finds the Frontend serving addr and its Backend.
func frontend(snap *snapshot.Snapshot, addr netip.AddrPort) (*snapshot.Frontend, *snapshot.Backend) {
	for i := range snap.Frontends {
		fe := &snap.Frontends[i]
		if fe.Port != addr.Port() || !slices.Contains(fe.Addresses, addr.Addr()) {
			continue
		}
		for j := range snap.Backends {
			if snap.Backends[j].Ref == fe.Backend {
				return fe, &snap.Backends[j]
			}
		}
		return fe, nil
	}
	return nil, nil
}

// waitCaptured waits until the node's agent serves a Snapshot in which
// addr is captured and cond accepts its Backend.
func (s *scenario) waitCaptured(addr netip.AddrPort, cond func(*snapshot.Backend) error) {
	s.t.Helper()
	s.n.agent.waitSnapshot(s.t, addr.String(), func(snap *snapshot.Snapshot) error {
		fe, be := frontend(snap, addr)
		if fe == nil {
			return fmt.Errorf("%s not captured", addr)
		}
		if be == nil {
			return fmt.Errorf("%s captured, its backend %s missing", addr, fe.Backend)
		}
		if err := cond(be); err != nil {
			return err
		}
		// A backend that works must also have somewhere to go, or the first
		// request races the EndpointSlice and gets 503.
		if be.Invalid == nil && be.Hostname == "" && !slices.ContainsFunc(be.Endpoints, func(e snapshot.Endpoint) bool { return e.Ready }) {
			return fmt.Errorf("%s captured, its backend %s has no ready endpoint yet", addr, fe.Backend)
		}
		return nil
	})
}

// originatesTLS accepts a Backend with TLS origination to serverName.
func originatesTLS(serverName string) func(*snapshot.Backend) error {
	return func(be *snapshot.Backend) error {
		switch {
		case be.Invalid != nil:
			return fmt.Errorf("backend invalid: %s: %s", be.Invalid.Reason, be.Invalid.Message)
		case be.TLS == nil:
			return fmt.Errorf("backend %s has no TLS", be.Ref)
		case be.TLS.ServerName != serverName:
			return fmt.Errorf("backend %s originates TLS to %q, want %q", be.Ref, be.TLS.ServerName, serverName)
		}
		return nil
	}
}

// speaks accepts a Backend whose protocol is p.
func speaks(p snapshot.Protocol) func(*snapshot.Backend) error {
	return func(be *snapshot.Backend) error {
		if be.Protocol != p {
			return fmt.Errorf("backend %s speaks %q, want %q", be.Ref, be.Protocol, p)
		}
		return nil
	}
}

// checkTLS fails unless the backend saw the request inside TLS 1.2 or
// 1.3 with SNI serverName.
func (s *scenario) checkTLS(rep echo.Report, serverName string) {
	s.t.Helper()
	if rep.TLS == nil {
		s.t.Fatalf("backend saw %s %s in plaintext, want TLS with SNI %s", rep.Proto, rep.Path, serverName)
	}
	if rep.TLS.ServerName != serverName {
		s.t.Errorf("backend saw SNI %q, want %q", rep.TLS.ServerName, serverName)
	}
	if v := rep.TLS.Version; v != "TLS 1.3" && v != "TLS 1.2" {
		s.t.Errorf("backend saw TLS version %s, want 1.2 or 1.3", v)
	}
}

// checkFromNode fails unless the peer of the backend on h was the node's
// end of h's link (the proxy dials from the node), not the client pod: the
// connection went through sockmesh. h may be a pod or an external host.
func (s *scenario) checkFromNode(rep echo.Report, h *host) {
	s.t.Helper()
	peer, err := netip.ParseAddrPort(rep.RemoteAddr)
	if err != nil {
		s.t.Fatalf("backend report: remote address %q: %v", rep.RemoteAddr, err)
	}
	if want := h.gw(peer.Addr().Is6()); peer.Addr() != want {
		s.t.Errorf("backend's peer was %s, want the node's %s (the proxy); the client pod is %s",
			peer.Addr(), want, s.n.client.ip4)
	}
}

// checkNoPlaintext fails if a TLS-only backend was ever spoken to in
// plaintext.
func (s *scenario) checkNoPlaintext(b *backend) {
	s.t.Helper()
	if st := b.stats(s.t); st.Plaintext != 0 {
		s.t.Errorf("TLS-only backend %s got %d plaintext connections (of %d)", b.pod.name, st.Plaintext, st.Accepted)
	}
}

// condition is a status condition to look for.
type condition struct{ Type, Status, Reason string }

var (
	accepted     = condition{"Accepted", "True", "Accepted"}
	resolvedRefs = condition{"ResolvedRefs", "True", "ResolvedRefs"}
)

// waitPolicyStatus waits until the BackendTLSPolicy's ancestor entry for
// service, under sockmesh's controllerName, has every condition in want.
func (s *scenario) waitPolicyStatus(policy, service string, want ...condition) {
	s.t.Helper()
	eventually(s.t, "status of BackendTLSPolicy "+policy, func() error {
		p, err := s.n.c.api.Gateway.GatewayV1().BackendTLSPolicies(s.ns).Get(context.Background(), policy, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, a := range p.Status.Ancestors {
			if a.ControllerName == translate.ControllerName && string(a.AncestorRef.Name) == service {
				return hasConditions(a.Conditions, p.Generation, want)
			}
		}
		return fmt.Errorf("no ancestor %s under %s: %+v", service, translate.ControllerName, p.Status.Ancestors)
	})
}

// waitXBackendStatus is waitPolicyStatus for an XBackend.
func (s *scenario) waitXBackendStatus(name, service string, want ...condition) {
	s.t.Helper()
	eventually(s.t, "status of XBackend "+name, func() error {
		x, err := s.n.c.api.Gateway.ExperimentalV1alpha1().XBackends(s.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, a := range x.Status.Ancestors {
			if a.ControllerName == translate.ControllerName && string(a.AncestorRef.Name) == service {
				return hasConditions(a.Conditions, x.Generation, want)
			}
		}
		return fmt.Errorf("no ancestor %s under %s: %+v", service, translate.ControllerName, x.Status.Ancestors)
	})
}

func hasConditions(have []metav1.Condition, generation int64, want []condition) error {
	for _, w := range want {
		i := slices.IndexFunc(have, func(c metav1.Condition) bool { return c.Type == w.Type })
		if i < 0 {
			return fmt.Errorf("no %s condition in %+v", w.Type, have)
		}
		c := have[i]
		if string(c.Status) != w.Status || c.Reason != w.Reason || c.ObservedGeneration != generation {
			return fmt.Errorf("%s=%s/%s (generation %d: %q), want %s/%s for generation %d",
				c.Type, c.Status, c.Reason, c.ObservedGeneration, c.Message, w.Status, w.Reason, generation)
		}
	}
	return nil
}
