package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/echo"
)

// GAMMA scenarios (issue 6): HTTPRoute and GRPCRoute with Service parents,
// applied by the client node's proxy. The upstream mesh conformance tests
// (gateway-api v1.7.0 conformance/tests/mesh) are ported in
// gamma_conformance_test.go, stricter: besides which backend answered,
// they check the path, Host and headers the backend saw, the Location the
// client got, that the request went through the proxy, and the route
// status written to the API server. gamma_beyond_test.go adds what
// upstream only runs through a Gateway: backend TLS, h2c and WebSocket
// behind a route, timeouts, retries and mirrors, and status for broken
// references and ReferenceGrants.

// gammaScenarios join the fast tier's matrix (main_test.go).
var gammaScenarios = []scenarioDef{
	{name: "gamma-basic-split", bothModes: true, run: testMeshBasicSplit},
	{name: "gamma-consumer-route", bothModes: true, run: testMeshConsumerRoute},
	{name: "gamma-simple-same-namespace", run: testMeshSimpleSameNamespace},
	{name: "gamma-frontend", run: testMeshFrontend},
	{name: "gamma-ports", run: testMeshPorts},
	{name: "gamma-matching", run: testMeshMatching},
	{name: "gamma-redirects", run: testMeshRedirects},
	{name: "gamma-rewrite-headers", bothModes: true, run: testMeshRewriteAndHeaders},
	{name: "gamma-weight", run: testMeshWeight},
	{name: "gamma-grpc", bothModes: true, run: testMeshGRPC},
	{name: "gamma-backend-tls", bothModes: true, run: testMeshBackendTLS},
	{name: "gamma-backend-tls-grpc", run: testMeshBackendTLSGRPC},
	{name: "gamma-h2c-websocket", run: testMeshH2CWebSocket},
	{name: "gamma-timeouts", bothModes: true, run: testMeshTimeouts},
	{name: "gamma-retries", bothModes: true, run: testMeshRetries},
	{name: "gamma-retry-budget", run: testMeshRetryBudget},
	{name: "gamma-mirror", run: testMeshMirror},
	{name: "gamma-cors", run: testMeshCORS},
	{name: "gamma-external-auth", run: testMeshExternalAuth},
	{name: "gamma-status", run: testMeshStatus},
	{name: "gamma-reference-grant", run: testMeshReferenceGrant},
	{name: "gamma-session-persistence", bothModes: true, run: testMeshSessionPersistence},
}

// meshPort is the echo backends' port, and the Services' http-alt port.
const meshPort = plainPort

// meshApps is the upstream mesh suite's base (conformance/mesh/
// manifests.yaml) in a scenario's namespace: pods v1 and v2 running echo
// backends, Services echo-v1 and echo-v2 selecting one each, and echo,
// the routes' usual parent (its own endpoint is v1: without a route its
// traffic goes there). Each Service has ports http (80) and http-alt
// (8080), both to the pods' 8080.
type meshApps struct {
	v1, v2               *backend
	echo, echoV1, echoV2 *service
}

func (s *scenario) meshApps() *meshApps {
	s.t.Helper()
	a := &meshApps{
		v1: s.backend("v1", backendOptions{Wire: Plain, HTTPPort: meshPort}),
		v2: s.backend("v2", backendOptions{Wire: Plain, HTTPPort: meshPort}),
	}
	a.echoV1 = s.service("echo-v1", serviceSpec{Backend: a.v1, Ports: meshPorts()})
	a.echoV2 = s.service("echo-v2", serviceSpec{Backend: a.v2, Ports: meshPorts()})
	a.echo = s.service("echo", serviceSpec{Backend: a.v1, Ports: meshPorts()})
	return a
}

func meshPorts() []servicePort {
	return []servicePort{{Name: "http", Port: 80, TargetPort: meshPort}, {Name: "http-alt", Port: 8080, TargetPort: meshPort}}
}

// call is one request from a client pod.
type call struct {
	method string // "" is GET
	url    string
	host   string // the Host header; "" is the URL's
	header map[string]string
	body   string
}

// gammaResponse is what the client got.
type gammaResponse struct {
	status int
	header http.Header
	body   []byte
	report echo.Report // when the body is an echo report
}

// want is what a call must get. Zero fields are not checked.
type want struct {
	status  int    // 0 means 200
	backend string // the pod that must answer
	path    string // the path the backend must see
	query   string // the query the backend must see
	host    string // the Host the backend must see
	// headers and absent are what the backend must and must not see
	// (values of a repeated header joined by ",").
	headers map[string]string
	absent  []string
	// respHeaders and respAbsent are the client's side.
	respHeaders map[string]string
	respAbsent  []string
	location    string // the Location the client must get
	// direct: the request must not go through the proxy (the backend's
	// peer is the client pod itself).
	direct bool
}

// send makes c from the client pod h (nil: the node's client pod), one
// connection per request, redirects not followed.
func (s *scenario) send(h *host, c call) (*gammaResponse, error) {
	if h == nil {
		h = s.n.client
	}
	cl := &http.Client{Timeout: waitFor, Transport: &http.Transport{DisableKeepAlives: true, DialContext: h.dialer.DialContext},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	method := c.method
	if method == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequest(method, c.url, strings.NewReader(c.body))
	if err != nil {
		return nil, err
	}
	if c.body == "" {
		req.Body, req.ContentLength = nil, 0
	}
	if c.host != "" {
		req.Host = c.host
	}
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	r := &gammaResponse{status: resp.StatusCode, header: resp.Header}
	if r.body, err = io.ReadAll(resp.Body); err != nil {
		return nil, fmt.Errorf("read the response: %w", err)
	}
	if len(r.body) > 0 && r.body[0] == '{' {
		json.Unmarshal(r.body, &r.report)
	}
	return r, nil
}

// expect sends c from the client pod h (nil: the node's) and checks w.
func (s *scenario) expect(h *host, c call, w want) *gammaResponse {
	s.t.Helper()
	r, err := s.send(h, c)
	if err != nil {
		s.t.Errorf("%s %s (Host %q): %v", c.method, c.url, c.host, err)
		return nil
	}
	if err := r.check(w); err != nil {
		s.t.Errorf("%s %s (Host %q): %v", c.method, c.url, c.host, err)
	}
	if w.backend != "" && w.status == 0 && err == nil {
		b := r.report
		peer, perr := netip.ParseAddrPort(b.RemoteAddr)
		fromClient := perr == nil && (peer.Addr() == s.clientIP(h))
		if fromClient != w.direct {
			s.t.Errorf("%s %s: backend's peer %s; went through the proxy = %v, want %v", c.method, c.url, b.RemoteAddr, !fromClient, !w.direct)
		}
	}
	return r
}

func (s *scenario) clientIP(h *host) netip.Addr {
	if h == nil {
		h = s.n.client
	}
	return h.ip4
}

func (r *gammaResponse) check(w want) error {
	status := w.status
	if status == 0 {
		status = http.StatusOK
	}
	var errs []string
	if r.status != status {
		errs = append(errs, fmt.Sprintf("status %d (%q), want %d", r.status, truncate(r.body), status))
	}
	b := r.report
	if w.backend != "" && b.Pod != w.backend {
		errs = append(errs, fmt.Sprintf("answered by %q, want %q", b.Pod, w.backend))
	}
	if w.path != "" && b.Path != w.path {
		errs = append(errs, fmt.Sprintf("backend saw path %q, want %q", b.Path, w.path))
	}
	if w.query != "" && b.RawQuery != w.query {
		errs = append(errs, fmt.Sprintf("backend saw query %q, want %q", b.RawQuery, w.query))
	}
	if w.host != "" && b.Host != w.host {
		errs = append(errs, fmt.Sprintf("backend saw Host %q, want %q", b.Host, w.host))
	}
	for k, v := range w.headers {
		if got := strings.Join(b.Headers.Values(k), ","); got != v {
			errs = append(errs, fmt.Sprintf("backend saw %s %q, want %q", k, got, v))
		}
	}
	for _, k := range w.absent {
		if v := b.Headers.Values(k); v != nil {
			errs = append(errs, fmt.Sprintf("backend saw %s %q, want none", k, v))
		}
	}
	for k, v := range w.respHeaders {
		if got := strings.Join(r.header.Values(k), ","); got != v {
			errs = append(errs, fmt.Sprintf("client got %s %q, want %q", k, got, v))
		}
	}
	for _, k := range w.respAbsent {
		if v := r.header.Values(k); v != nil {
			errs = append(errs, fmt.Sprintf("client got %s %q, want none", k, v))
		}
	}
	if w.location != "" && r.header.Get("Location") != w.location {
		errs = append(errs, fmt.Sprintf("Location %q, want %q", r.header.Get("Location"), w.location))
	}
	if errs != nil {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 120 {
		return string(b[:120]) + "..."
	}
	return string(b)
}

// waitRouted waits until the node's agent serves a snapshot in which the
// frontend at addr has rules of every route named (by name, any
// namespace and role).
func (s *scenario) waitRouted(addr netip.AddrPort, routes ...string) {
	s.t.Helper()
	s.n.agent.waitSnapshot(s.t, fmt.Sprintf("%s routed by %v", addr, routes), func(snap *snapshot.Snapshot) error {
		fe, _ := frontend(snap, addr)
		if fe == nil || fe.Routes == nil {
			return fmt.Errorf("%s has no route table", addr)
		}
		have := map[string]bool{}
		fe.Routes.Sets(func(rs *snapshot.RouteSet) {
			for _, r := range rs.Rules {
				have[r.Route.Name] = true
			}
		})
		for _, r := range routes {
			if !have[r] {
				return fmt.Errorf("%s has no rule of route %s (has %v)", addr, r, have)
			}
		}
		return nil
	})
}

// waitRouteStatus waits until the route kind/ns/name has, for its parent
// Service parent under sockmesh's controllerName, every condition in
// want, for its current generation.
func (s *scenario) waitRouteStatus(kind, ns, name, parent string, want ...condition) {
	s.t.Helper()
	eventually(s.t, fmt.Sprintf("status of %s %s/%s", kind, ns, name), func() error {
		var gen int64
		var status gwv1.RouteStatus
		ctx := context.Background()
		switch kind {
		case "HTTPRoute":
			r, err := s.n.c.api.Gateway.GatewayV1().HTTPRoutes(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			gen, status = r.Generation, r.Status.RouteStatus
		case "GRPCRoute":
			r, err := s.n.c.api.Gateway.GatewayV1().GRPCRoutes(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			gen, status = r.Generation, r.Status.RouteStatus
		default:
			s.t.Fatalf("route kind %s", kind)
		}
		for _, p := range status.Parents {
			if p.ControllerName == translate.ControllerName && string(p.ParentRef.Name) == parent {
				return hasConditions(p.Conditions, gen, want)
			}
		}
		return fmt.Errorf("no parent %s under %s", parent, translate.ControllerName)
	})
}

// clientPod makes another client pod, in namespace ns, and waits until
// the agent enrolled it.
func (s *scenario) clientPod(ns, name string) *host {
	s.t.Helper()
	h := s.n.newPod(s.t, ns, name)
	h.dialer = startDialer(s.t, h.ns, s.n.cg)
	s.n.agent.waitEnrolled(s.t, h)
	return h
}

// handlerPod runs h (an http.Handler, over HTTP/1.1 and h2c) in this test
// process, listening inside a new pod's namespace on port: a backend
// whose behaviour the test programs (delays, failures, recording).
func (s *scenario) handlerPod(name string, port uint16, h http.Handler) *backend {
	s.t.Helper()
	pod := s.n.newPod(s.t, s.ns, name)
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	s.listenIn(pod, port, func(l net.Listener) { srv.Serve(l) })
	s.t.Cleanup(func() { srv.Close() })
	return &backend{pod: pod}
}

// listenIn listens on port in every family inside pod's namespace and
// serves each listener with serve in the background.
func (s *scenario) listenIn(pod *host, port uint16, serve func(net.Listener)) {
	s.t.Helper()
	l, err := pod.ns.Listen(context.Background(), nil, "tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		s.t.Fatalf("listen in pod %s: %v", pod.name, err)
	}
	s.t.Cleanup(func() { l.Close() })
	go serve(l)
}

// serviceOf creates Service ns/name whose endpoints are pods, IPv4 only,
// without a selector (the harness writes the EndpointSlice): a Service of
// several pods, or in another namespace than the scenario's.
func (s *scenario) serviceOf(ns, name string, ports []servicePort, pods ...*host) *service {
	s.t.Helper()
	ctx := context.Background()
	obj := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, p := range ports {
		sp := corev1.ServicePort{Name: p.Name, Port: int32(p.Port), Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(int32(p.TargetPort))}
		if p.AppProtocol != "" {
			sp.AppProtocol = &p.AppProtocol
		}
		obj.Spec.Ports = append(obj.Spec.Ports, sp)
	}
	got, err := s.n.c.api.Kube.CoreV1().Services(ns).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatalf("create service %s: %v", name, err)
	}
	sv := &service{name: name}
	for _, ip := range got.Spec.ClusterIPs {
		sv.ips = append(sv.ips, netip.MustParseAddr(ip))
	}
	yes, tcp := true, corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-ipv4", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range pods {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.ip4.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes},
			NodeName:   &s.n.name,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.namespace, Name: p.name},
		})
	}
	for _, p := range ports {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &p.Name, Port: new(int32(p.TargetPort)), Protocol: &tcp})
	}
	if _, err := s.n.c.api.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		s.t.Fatalf("create endpointslice %s: %v", es.Name, err)
	}
	return sv
}

// routeAccepted is the status a fully valid route gets for its parent.
var routeAccepted = []condition{accepted, resolvedRefs}

// httpURL is http://<addr><path>.
func httpURL(addr netip.AddrPort, path string) string { return "http://" + addr.String() + path }

// v4 is the Service's IPv4 address on port.
func (sv *service) v4(port uint16) netip.AddrPort { return sv.addr(false, port) }
