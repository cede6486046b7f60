package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/internal/metricsum"
	"github.com/sockmesh/sockmesh/test/echo"
)

// Mesh routing beyond the upstream mesh suite: the backend-property tests
// upstream runs only through a Gateway (BackendTLSPolicy, h2c, WebSocket,
// timeouts, retries, mirrors), ported to routes with Service parents, and
// status for what cannot be honoured.

// testMeshBackendTLS: a route's backendRef Service with a BackendTLSPolicy
// gets TLS origination (SNI from the policy, nothing in plaintext), and
// one whose policy is invalid fails closed with 503 — the route and the
// backend's properties compose.
func testMeshBackendTLS(s *scenario) {
	const hostname = "secure.e2e.test"
	a := s.meshApps()
	ca := s.newCA()
	secure, _ := s.tlsBackend("secure", s.serverCert(ca, hostname))
	broken, _ := s.tlsBackend("broken", s.serverCert(ca, hostname))
	s.apply(caConfigMap("secure-ca", ca) +
		tlsPolicy("secure", "secure", "    hostname: "+hostname+"\n    caCertificateRefs: [{group: \"\", kind: ConfigMap, name: secure-ca}]") +
		tlsPolicy("broken", "broken", "    hostname: "+hostname+"\n    caCertificateRefs: [{group: \"\", kind: ConfigMap, name: no-such-ca}]") + `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: to-tls}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /secure}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /inside}}}]
    backendRefs: [{name: secure, port: 443}]
  - matches: [{path: {type: PathPrefix, value: /broken}}]
    backendRefs: [{name: broken, port: 443}]
  - backendRefs: [{name: echo-v2, port: 80}]
`)
	s.waitRouted(a.echo.v4(80), "to-tls")
	s.waitPolicyStatus("secure", "secure", accepted, resolvedRefs)
	r := s.expect(nil, call{url: httpURL(a.echo.v4(80), "/secure/x?q=1"), host: "echo"}, want{backend: "secure", path: "/inside/x", query: "q=1", host: "echo"})
	if r != nil {
		s.checkTLS(r.report, hostname)
	}
	s.expect(nil, call{url: httpURL(a.echo.v4(80), "/broken"), host: "echo"}, want{status: http.StatusServiceUnavailable})
	s.expect(nil, call{url: httpURL(a.echo.v4(80), "/other"), host: "echo"}, want{backend: "v2", path: "/other"})
	s.checkNoPlaintext(secure)
	s.checkNoPlaintext(broken)
	if st := broken.stats(s.t); st.Accepted != 0 {
		s.t.Errorf("backend with an invalid policy got %d connections, want none", st.Accepted)
	}
}

// testMeshBackendTLSGRPC is BackendTLSPolicyGRPCRoute with a Service
// parent: a GRPCRoute's backendRef Service without appProtocol, with an
// Accepted policy, gets the app's gRPC (h2c to the proxy) as h2 over TLS
// with the policy's hostname as SNI; one whose policy names a hostname its
// certificate lacks (Accepted too) fails the call, reaching no handler,
// until the policy names the certificate's hostname.
func testMeshBackendTLSGRPC(s *scenario) {
	const hostname, port = "abc.e2e.test", 7070
	ca := s.newCA()
	secure, _ := s.tlsBackend("secure", s.serverCert(ca, hostname))
	mismatch, _ := s.tlsBackend("mismatch", s.serverCert(ca, hostname))
	front := s.service("front", serviceSpec{Backend: secure, Ports: []servicePort{{Name: "grpc", Port: port, TargetPort: backendPort}}})
	s.apply(caConfigMap("tls-checks-ca", ca) +
		tlsPolicy("grpc-normative-test", "secure", "    hostname: "+hostname+"\n    caCertificateRefs: [{group: \"\", kind: ConfigMap, name: tls-checks-ca}]") +
		tlsPolicy("grpc-host-mismatch", "mismatch", "    hostname: mismatch.e2e.test\n    caCertificateRefs: [{group: \"\", kind: ConfigMap, name: tls-checks-ca}]") + `
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: backendtlspolicy-grpcroute}
spec:
  parentRefs: [{group: "", kind: Service, name: front, port: 7070}]
  rules:
  - matches: [{headers: [{name: x-test-case, value: host-mismatch}]}]
    backendRefs: [{name: mismatch, port: 443}]
  - backendRefs: [{name: secure, port: 443}]
`)
	s.waitRouted(front.v4(port), "backendtlspolicy-grpcroute")
	s.waitRouteStatus("GRPCRoute", s.ns, "backendtlspolicy-grpcroute", "front", routeAccepted...)
	s.waitPolicyStatus("grpc-normative-test", "secure", accepted, resolvedRefs)
	s.waitPolicyStatus("grpc-host-mismatch", "mismatch", accepted, resolvedRefs)

	cc, err := grpc.NewClient("passthrough:///"+front.v4(port).String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return s.n.client.dialer.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		s.t.Fatal(err)
	}
	defer cc.Close()
	call := func(testCase string) (string, error) {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-test-case", testCase), waitFor)
		defer cancel()
		var trailer metadata.MD
		err := cc.Invoke(ctx, echo.MethodUnary, wrapperspb.Bytes([]byte("ping")), new(wrapperspb.BytesValue), grpc.Trailer(&trailer))
		return strings.Join(trailer.Get(echo.TrailerKey), ","), err
	}
	if pod, err := call("normative"); err != nil || pod != secure.pod.name {
		s.t.Errorf("gRPC call to the backend with a valid policy: answered by %q, %v; want %s", pod, err, secure.pod.name)
	}
	if pod, err := call("host-mismatch"); err == nil {
		s.t.Errorf("gRPC call to the backend whose certificate lacks the policy's hostname succeeded (answered by %s), want a failure", pod)
	}
	// BackendTLSPolicyObservedGenerationBump: a new hostname is a new
	// generation, which the status then names; here the certificate's, so
	// the calls succeed.
	s.apply(tlsPolicy("grpc-host-mismatch", "mismatch", "    hostname: "+hostname+"\n    caCertificateRefs: [{group: \"\", kind: ConfigMap, name: tls-checks-ca}]"))
	s.waitPolicyStatus("grpc-host-mismatch", "mismatch", accepted, resolvedRefs)
	eventually(s.t, "a call through the fixed policy", func() error {
		if pod, err := call("host-mismatch"); err != nil || pod != mismatch.pod.name {
			return fmt.Errorf("answered by %q, %v; want %s", pod, err, mismatch.pod.name)
		}
		return nil
	})
	s.checkNoPlaintext(secure)
	s.checkNoPlaintext(mismatch)
}

// testMeshH2CWebSocket: HTTPRouteBackendProtocolH2C and
// HTTPRouteBackendProtocolWebSocket with a Service parent: a route's
// backendRef Service with appProtocol kubernetes.io/h2c gets the app's
// HTTP/1.1 as h2c, one with kubernetes.io/ws a WebSocket upgrade.
func testMeshH2CWebSocket(s *scenario) {
	a := s.meshApps()
	b := s.backend("proto", backendOptions{Wire: Plain, HTTPPort: meshPort})
	s.service("h2c", serviceSpec{Backend: b, Ports: []servicePort{{Name: "http", Port: 80, TargetPort: meshPort, AppProtocol: "kubernetes.io/h2c"}}})
	s.service("ws", serviceSpec{Backend: b, Ports: []servicePort{{Name: "http", Port: 80, TargetPort: meshPort, AppProtocol: "kubernetes.io/ws"}}})
	s.applyFile("testdata/mesh/mesh-h2c-websocket.yaml")
	s.waitRouted(a.echo.v4(80), "protocols")
	s.waitRouteStatus("HTTPRoute", s.ns, "protocols", "echo", routeAccepted...)
	r := s.expect(nil, call{url: httpURL(a.echo.v4(80), "/h2c"), host: "echo"}, want{backend: "proto", path: "/h2c"})
	if r != nil && (r.report.Proto != "HTTP/2.0" || r.report.TLS != nil) {
		s.t.Errorf("h2c backend saw %s (TLS %+v), want cleartext HTTP/2.0", r.report.Proto, r.report.TLS)
	}
	rep := s.websocket("ws://" + a.echo.v4(80).String() + "/ws")
	if rep.Pod != "proto" || rep.Proto != "HTTP/1.1" || rep.TLS != nil {
		s.t.Errorf("websocket through the route: pod %q over %s (TLS %+v), want proto over cleartext HTTP/1.1", rep.Pod, rep.Proto, rep.TLS)
	}
	s.checkFromNode(rep, b.pod)
}

// simBackend is a backend with the behaviour the upstream timeout and
// retry tests ask of echo-basic: it waits ?delay= (and ?delayRetry= more
// for every request after the first with the same ?uuid=), answers
// ?responseCode= to the first ?succeedAfter= requests of each uuid, and
// otherwise 200 with an echo report. It counts the requests per uuid, and
// those cut short: ended by the proxy while it waited.
type simBackend struct {
	*backend
	mu          sync.Mutex
	counts, cut map[string]int
}

func (s *scenario) simBackend(name string) *simBackend {
	s.t.Helper()
	sb := &simBackend{counts: map[string]int{}, cut: map[string]int{}}
	desc := echo.New(echo.Config{Namespace: s.ns, Pod: name})
	sb.backend = s.handlerPod(name, meshPort, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		q := r.URL.Query()
		sb.mu.Lock()
		sb.counts[q.Get("uuid")]++
		n := sb.counts[q.Get("uuid")]
		sb.mu.Unlock()
		delay, _ := time.ParseDuration(q.Get("delay"))
		if n > 1 {
			extra, _ := time.ParseDuration(q.Get("delayRetry"))
			delay += extra
		}
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			sb.mu.Lock()
			sb.cut[q.Get("uuid")]++
			sb.mu.Unlock()
			return
		}
		if after, _ := strconv.Atoi(q.Get("succeedAfter")); n <= after {
			code, _ := strconv.Atoi(q.Get("responseCode"))
			w.WriteHeader(code)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(desc.Describe(r, int64(len(body)), ""))
	}))
	return sb
}

func (sb *simBackend) count(uuid string) int {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.counts[uuid]
}

func (sb *simBackend) cutShort(uuid string) int {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.cut[uuid]
}

// testMeshCORS is HTTPRouteCORS and HTTPRouteCORSAllowCredentialsBehavior
// with a Service parent: the client node's proxy answers a preflight
// itself, 200 with the filter's headers for an allowed origin (listed, a
// "*." wildcard with labels to its left, "*") and without them for
// another, and the backend never sees one; a cross-origin request reaches
// the backend and comes back with its origin echoed (never "*", which
// credentials forbid), credentials and exposed headers.
func testMeshCORS(s *scenario) {
	sim := s.simBackend("cors")
	svc := s.service("cors", serviceSpec{Backend: sim.backend, Ports: meshPorts()})
	s.applyFile("testdata/mesh/mesh-cors.yaml")
	routes := []string{"cors-multiple-origins-methods-headers", "cors-wildcard-methods", "cors-wildcard-origin"}
	s.waitRouted(svc.v4(80), routes...)
	for _, r := range routes {
		s.waitRouteStatus("HTTPRoute", s.ns, r, "cors", routeAccepted...)
	}
	listed := func(origin string) map[string]string {
		return map[string]string{"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true",
			"Access-Control-Allow-Methods": "GET, OPTIONS", "Access-Control-Allow-Headers": "x-header-1, x-header-2",
			"Access-Control-Expose-Headers": "x-header-3, x-header-4", "Access-Control-Max-Age": "3600", "Vary": "Origin"}
	}
	for _, c := range []struct {
		uuid, path, origin, method string // method: the preflight's Access-Control-Request-Method
		want                       map[string]string
		absent                     []string
	}{
		{"p1", "/cors-1", "https://www.foo.com", "GET", listed("https://www.foo.com"), nil},
		{"p2", "/cors-1", "https://www.bar.com", "GET", listed("https://www.bar.com"), nil},
		{"p3", "/cors-1", "https://xpto.www.bar.com", "GET", listed("https://xpto.www.bar.com"), nil},
		{"p4", "/cors-1", "https://foobar.com", "GET", nil, []string{"Access-Control-Allow-Origin"}},
		{"p5", "/cors-2", "https://www.foo.com", "POST", map[string]string{"Access-Control-Allow-Origin": "https://www.foo.com",
			"Access-Control-Allow-Methods": "POST", "Access-Control-Max-Age": "5"}, []string{"Access-Control-Allow-Credentials"}},
		{"p6", "/cors-wildcard-origin", "https://foobar.com:12345", "PUT", map[string]string{"Access-Control-Allow-Origin": "https://foobar.com:12345",
			"Access-Control-Allow-Credentials": "true", "Access-Control-Allow-Methods": "PUT"}, nil},
	} {
		r := s.expect(nil, call{method: http.MethodOptions, url: httpURL(svc.v4(80), c.path+"?uuid="+c.uuid),
			header: map[string]string{"Origin": c.origin, "Access-Control-Request-Method": c.method}},
			want{respHeaders: c.want, respAbsent: c.absent})
		if r != nil && len(r.body) > 0 {
			s.t.Errorf("preflight %s from %s: body %q, want none", c.path, c.origin, truncate(r.body))
		}
		if n := sim.count(c.uuid); n != 0 {
			s.t.Errorf("preflight %s from %s reached the backend %d times, want never", c.path, c.origin, n)
		}
	}
	for _, c := range []struct {
		uuid, path, origin string
		want               map[string]string
		absent             []string
		credentialed       bool // with a Cookie and an Authorization
	}{
		{"r1", "/cors-1", "https://www.foo.com", map[string]string{"Access-Control-Allow-Origin": "https://www.foo.com",
			"Access-Control-Allow-Credentials": "true", "Access-Control-Expose-Headers": "x-header-3, x-header-4", "Vary": "Origin"},
			[]string{"Access-Control-Allow-Methods", "Access-Control-Max-Age"}, false},
		{"r2", "/cors-1", "https://foobar.com", map[string]string{"Vary": "Origin"},
			[]string{"Access-Control-Allow-Origin", "Access-Control-Allow-Credentials"}, false},
		{"r3", "/cors-wildcard-origin", "https://app.example", map[string]string{"Access-Control-Allow-Origin": "https://app.example",
			"Access-Control-Allow-Credentials": "true"}, nil, false},
		// HTTPRouteCORSAllowCredentialsBehavior: a credentialed request
		// gets no CORS header without allowCredentials, the origin and
		// Allow-Credentials with it.
		{"r4", "/cors-2", "https://www.foo.com", map[string]string{"Vary": "Origin"},
			[]string{"Access-Control-Allow-Origin", "Access-Control-Allow-Credentials"}, true},
		{"r5", "/cors-wildcard-origin", "https://app.example", map[string]string{"Access-Control-Allow-Origin": "https://app.example",
			"Access-Control-Allow-Credentials": "true"}, nil, true},
	} {
		h := map[string]string{"Origin": c.origin}
		if c.credentialed {
			h["Cookie"], h["Authorization"] = "sid=abc123", "Bearer test"
		}
		s.expect(nil, call{url: httpURL(svc.v4(80), c.path+"?uuid="+c.uuid), header: h},
			want{backend: "cors", respHeaders: c.want, respAbsent: c.absent})
		if n := sim.count(c.uuid); n != 1 {
			s.t.Errorf("GET %s from %s reached the backend %d times, want once", c.path, c.origin, n)
		}
	}
}

// testMeshExternalAuth is HTTPRouteExternalAuthHTTP and
// HTTPRouteExternalAuthForwardBody with a Service parent: the client
// node's proxy asks the authorization Service (its path prefixed, Host,
// Authorization, the allowed header, the body within maxSize, no other
// header) before each request; a 200 lets the request on with the
// allowed header of the answer, a 401 reaches the client as the server
// gave it, a body over maxSize gets 413, and a refused request never
// reaches the backend. HTTPRouteExternalAuthGRPC likewise: an ext_authz
// server's OK lets the request on with its header, its denial reaches the
// client with the DeniedHttpResponse's status and body.
func testMeshExternalAuth(s *scenario) {
	sim := s.simBackend("extauth")
	svc := s.service("extauth", serviceSpec{Backend: sim.backend, Ports: meshPorts()})
	var mu sync.Mutex
	asked := map[string]*http.Request{}
	bodies := map[string]string{}
	auth := s.handlerPod("auth", meshPort, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		asked[r.URL.Query().Get("uuid")], bodies[r.URL.Query().Get("uuid")] = r, string(body)
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer good" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mesh"`)
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, "denied")
			return
		}
		w.Header().Set("X-Auth-User", "alice")
		w.Header().Set("X-Other", "other")
	}))
	s.service("auth", serviceSpec{Backend: auth, Ports: meshPorts()})
	gs := grpc.NewServer()
	authv3.RegisterAuthorizationServer(gs, meshAuthz{})
	s.service("authz", serviceSpec{Backend: s.handlerPod("authz", meshPort, gs),
		Ports: []servicePort{{Name: "grpc", Port: 9000, TargetPort: meshPort, AppProtocol: "kubernetes.io/h2c"}}})
	s.applyFile("testdata/mesh/mesh-extauth.yaml")
	s.waitRouted(svc.v4(80), "ext-auth")
	s.waitRouteStatus("HTTPRoute", s.ns, "ext-auth", "extauth", routeAccepted...)
	good := map[string]string{"Authorization": "Bearer good", "X-Tenant": "t1", "X-Secret": "s"}
	s.expect(nil, call{method: http.MethodPost, url: httpURL(svc.v4(80), "/guarded/a?uuid=a1"), header: good, body: "small body"},
		want{backend: "extauth", path: "/guarded/a", headers: map[string]string{"X-Auth-User": "alice", "X-Secret": "s"}, absent: []string{"X-Other"}})
	mu.Lock()
	if r := asked["a1"]; r == nil || r.Method != http.MethodPost || r.URL.Path != "/check/guarded/a" || r.Host != svc.v4(80).String() ||
		r.Header.Get("X-Tenant") != "t1" || r.Header["X-Secret"] != nil || bodies["a1"] != "small body" {
		s.t.Errorf("the authorization server saw %+v with body %q", r, bodies["a1"])
	}
	mu.Unlock()
	r := s.expect(nil, call{url: httpURL(svc.v4(80), "/guarded/b?uuid=d1"), header: map[string]string{"Authorization": "Bearer bad"}},
		want{status: http.StatusUnauthorized, respHeaders: map[string]string{"WWW-Authenticate": `Bearer realm="mesh"`}})
	if r != nil && string(r.body) != "denied" {
		s.t.Errorf("denied request: body %q, want the authorization server's", truncate(r.body))
	}
	s.expect(nil, call{method: http.MethodPost, url: httpURL(svc.v4(80), "/guarded/c?uuid=d2"), header: good, body: "a body over sixteen bytes"},
		want{status: http.StatusRequestEntityTooLarge})
	s.expect(nil, call{url: httpURL(svc.v4(80), "/guarded-grpc?uuid=g1"), header: good},
		want{backend: "extauth", headers: map[string]string{"X-Auth-User": "alice"}})
	r = s.expect(nil, call{url: httpURL(svc.v4(80), "/guarded-grpc?uuid=d3"), header: map[string]string{"Authorization": "Bearer bad"}},
		want{status: http.StatusUnauthorized})
	if r != nil && string(r.body) != "denied" {
		s.t.Errorf("denied gRPC-authorized request: body %q, want the DeniedHttpResponse's", truncate(r.body))
	}
	for _, uuid := range []string{"d1", "d2", "d3"} {
		if n := sim.count(uuid); n != 0 {
			s.t.Errorf("refused request %s reached the backend %d times", uuid, n)
		}
	}
}

// meshAuthz is an ext_authz v3 server that lets "Bearer good" on as alice
// and denies anything else 401.
type meshAuthz struct {
	authv3.UnimplementedAuthorizationServer
}

func (meshAuthz) Check(_ context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	if req.GetAttributes().GetRequest().GetHttp().GetHeaders()["authorization"] != "Bearer good" {
		return &authv3.CheckResponse{Status: &status.Status{Code: int32(codes.Unauthenticated)},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode_Unauthorized}, Body: "denied"}}}, nil
	}
	return &authv3.CheckResponse{Status: &status.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
		Headers: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-auth-user", Value: "alice"}}}}}}, nil
}

// testMeshTimeouts is HTTPRouteTimeoutRequest and
// HTTPRouteTimeoutBackendRequest with a Service parent: a slow backend
// gets 504 within the timeout, "0s" disables it. The backend of a 504
// would answer only after the client gave up (waitFor): the 504 can only
// be the proxy's, which ends the request it gave up on.
func testMeshTimeouts(s *scenario) {
	sim := s.simBackend("slow")
	svc := s.service("slow", serviceSpec{Backend: sim.backend, Ports: meshPorts()})
	s.applyFile("testdata/mesh/mesh-timeouts.yaml")
	s.waitRouted(svc.v4(80), "request-timeout")
	s.waitRouteStatus("HTTPRoute", s.ns, "request-timeout", "slow", routeAccepted...)
	for i, c := range []struct {
		path, query string
		status      int
	}{
		{"/request-timeout", "", 200},
		{"/request-timeout", "delay=1m", 504},
		{"/disable-request-timeout", "delay=1s", 200},
		{"/backend-timeout", "", 200},
		{"/backend-timeout", "delay=1m", 504},
		{"/disable-backend-timeout", "delay=1s", 200},
	} {
		w := want{status: c.status}
		if c.status == 200 {
			w = want{backend: "slow"}
		}
		uuid := strconv.Itoa(i)
		url := httpURL(svc.v4(80), c.path+"?"+c.query+"&uuid="+uuid)
		s.expect(nil, call{url: url}, w)
		if c.status == 504 {
			eventually(s.t, url+": the backend's request cut short", func() error {
				if n := sim.cutShort(uuid); n != 1 {
					return fmt.Errorf("%d of the backend's %d requests cut short", n, sim.count(uuid))
				}
				return nil
			})
		}
	}
}

// testMeshRetries is HTTPRouteRetry, HTTPRouteRetryWithRequestTimeout,
// HTTPRouteRetryWithBackendTimeout and HTTPRouteRetryConnectionError with
// a Service parent, with the upstream manifests and cases, and the number
// of requests the backend got checked too.
func testMeshRetries(s *scenario) {
	sim := s.simBackend("retry")
	svc := s.service("retry", serviceSpec{Backend: sim.backend, Ports: meshPorts()})
	dead := s.n.newPod(s.t, s.ns, "dead") // nothing listens: connections are refused
	s.serviceOf(s.ns, "conn-error", []servicePort{{Name: "http", Port: 80, TargetPort: meshPort}}, dead, sim.pod)
	s.applyFile("testdata/mesh/mesh-retries.yaml")
	s.waitRouted(svc.v4(80), "retries")
	s.waitRouteStatus("HTTPRoute", s.ns, "retries", "retry", routeAccepted...)
	id := 0
	for _, c := range []struct {
		path, query string
		status      int
		seen        int // requests the backend got; 0: not checked
	}{
		{"/retry/code-500-attempts-3", "responseCode=500&succeedAfter=2", 200, 3},
		{"/retry/code-500-attempts-3", "responseCode=500&succeedAfter=4", 500, 4},
		{"/retry/code-500-attempts-3", "responseCode=503&succeedAfter=2", 503, 1},
		{"/retry/code-all-attempts-2", "responseCode=500&succeedAfter=1", 200, 2},
		{"/retry/code-all-attempts-2", "responseCode=500&succeedAfter=3", 500, 3},
		{"/retry/code-all-attempts-2", "responseCode=502&succeedAfter=1", 200, 2},
		{"/retry/code-all-attempts-2", "responseCode=502&succeedAfter=3", 502, 3},
		{"/retry/code-all-attempts-2", "responseCode=503&succeedAfter=1", 200, 2},
		{"/retry/code-all-attempts-2", "responseCode=503&succeedAfter=3", 503, 3},
		{"/retry/code-all-attempts-2", "responseCode=504&succeedAfter=1", 200, 2},
		{"/retry/code-all-attempts-2", "responseCode=504&succeedAfter=3", 504, 3},
		{"/retry/code-all-attempts-0", "responseCode=500&succeedAfter=1", 500, 1},
		{"/retry/code-all-attempts-0", "responseCode=504&succeedAfter=1", 504, 1},
		{"/retry/request-timeout-500ms", "responseCode=500&succeedAfter=1", 200, 2},
		{"/retry/request-timeout-500ms", "responseCode=500&succeedAfter=2&delayRetry=300ms", 504, 0},
		{"/retry/backend-timeout-500ms", "responseCode=500&succeedAfter=2&delayRetry=100ms&delay=100ms", 200, 3},
		{"/retry/backend-timeout-500ms", "responseCode=500&succeedAfter=2&delayRetry=1s&delay=1s", 504, 4},
	} {
		for _, body := range []string{"", "replayed"} {
			id++
			uuid := strconv.Itoa(id)
			cl := call{url: httpURL(svc.v4(80), c.path+"?"+c.query+"&uuid="+uuid)}
			w := want{status: c.status}
			if c.status == 200 {
				w = want{backend: "retry", path: c.path}
			}
			if body != "" {
				cl.method, cl.body = http.MethodPost, body
			}
			if r := s.expect(nil, cl, w); r != nil && c.status == 200 && r.report.BodyBytes != int64(len(body)) {
				s.t.Errorf("%s: the last try carried %d body bytes, want %d", cl.url, r.report.BodyBytes, len(body))
			}
			if c.seen != 0 {
				if n := sim.count(uuid); n != c.seen {
					s.t.Errorf("%s %s: the backend got %d requests, want %d", cl.method, cl.url, n, c.seen)
				}
			}
		}
	}
	for range 20 {
		s.expect(nil, call{url: httpURL(svc.v4(80), "/retry-on-connection-errors")}, want{backend: "retry"})
	}
}

// recorder is a backend that records the requests it gets.
type recorder struct {
	*backend
	seen chan echo.Report
}

func (s *scenario) recorder(name string) *recorder {
	s.t.Helper()
	rec := &recorder{seen: make(chan echo.Report, 1024)}
	desc := echo.New(echo.Config{Namespace: s.ns, Pod: name})
	rec.backend = s.handlerPod(name, meshPort, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.seen <- desc.Describe(r, int64(len(body)), "")
		io.WriteString(w, "recorded")
	}))
	return rec
}

// testMeshMirror is HTTPRouteRequestMirror, HTTPRouteRequestMultipleMirrors
// and HTTPRouteRequestPercentageMirror with a Service parent: mirrors get
// the request as the rule changed it while the client gets the main
// backend's answer; a percentage mirrors about that share.
func testMeshMirror(s *scenario) {
	a := s.meshApps()
	m1, m2 := s.recorder("mirror-1"), s.recorder("mirror-2")
	s.service("mirror-1", serviceSpec{Backend: m1.backend, Ports: meshPorts()})
	s.service("mirror-2", serviceSpec{Backend: m2.backend, Ports: meshPorts()})
	s.applyFile("testdata/mesh/mesh-mirror.yaml")
	s.waitRouted(a.echo.v4(80), "request-mirror")
	s.waitRouteStatus("HTTPRoute", s.ns, "request-mirror", "echo", routeAccepted...)
	modified := map[string]string{"X-Header-Add": "header-val-1", "X-Header-Add-Append": "append-val-1,header-val-2", "X-Header-Set": "set-overwrites-values"}
	s.expect(nil, call{method: http.MethodPost, url: httpURL(a.echo.v4(80), "/mirror-and-modify-headers?x=1"), host: "echo", body: "mirrored",
		header: map[string]string{"X-Header-Remove": "remove-val", "X-Header-Add-Append": "append-val-1"}},
		want{backend: "v1", path: "/mirror-and-modify-headers", headers: modified, absent: []string{"X-Header-Remove"}})
	got := waitMirror(s, m1, "/mirror-and-modify-headers")
	if got.Method != http.MethodPost || got.RawQuery != "x=1" || got.Host != "echo" || got.BodyBytes != int64(len("mirrored")) {
		s.t.Errorf("mirror saw %s %s?%s Host %q with %d body bytes", got.Method, got.Path, got.RawQuery, got.Host, got.BodyBytes)
	}
	for k, v := range modified {
		if g := strings.Join(got.Headers.Values(k), ","); g != v {
			s.t.Errorf("mirror saw %s %q, want %q", k, g, v)
		}
	}
	if got.Headers["X-Header-Remove"] != nil {
		s.t.Errorf("mirror saw X-Header-Remove")
	}
	s.expect(nil, call{url: httpURL(a.echo.v4(80), "/multiple-mirrors"), host: "echo"}, want{backend: "v1"})
	waitMirror(s, m1, "/multiple-mirrors")
	waitMirror(s, m2, "/multiple-mirrors")

	// HTTPRouteRequestPercentageMirror, counted exactly: each request
	// carries its number, which the mirror records, and the count waits
	// for every copy drawn to have landed.
	before, _ := s.mirrorsLanded()
	const n = 200
	sent := make(map[string]bool, n)
	for i := range n {
		id := strconv.Itoa(i)
		sent[id] = true
		s.expect(nil, call{url: httpURL(a.echo.v4(80), "/percent-mirror?id="+id), host: "echo"}, want{backend: "v1"})
	}
	after, failed := s.mirrorsLanded()
	mirrored := map[string]bool{}
	for done := false; !done; {
		select {
		case r := <-m2.seen:
			id, ok := strings.CutPrefix(r.RawQuery, "id=")
			switch {
			case r.Path != "/percent-mirror" || !ok || !sent[id]:
				s.t.Errorf("mirror saw %s?%s, which the test did not send", r.Path, r.RawQuery)
			case mirrored[id]:
				s.t.Errorf("request %s mirrored twice", id)
			default:
				mirrored[id] = true
			}
		default:
			done = true
		}
	}
	// gamma-mirror is the only scenario of its node that mirrors: what
	// its proxy sent is what the mirror saw.
	if after-before != float64(len(mirrored)) || failed != 0 {
		s.t.Errorf("the proxy sent %v mirrors (%v failed); the mirror saw %d", after-before, failed, len(mirrored))
	}
	// Binomial(200, 0.2): mean 40, σ ≈ 5.7. ±4σ fails a right proxy about
	// once in 10⁴ runs; 0 %, 50 % and 100 % fall far outside.
	if len(mirrored) < 40-23 || len(mirrored) > 40+23 {
		s.t.Errorf("a 20%% mirror got %d of %d requests", len(mirrored), n)
	} else {
		s.t.Logf("a 20%% mirror got %d of %d requests", len(mirrored), n)
	}
}

// mirrorsLanded waits until the node's proxy has no mirrored request in
// flight and its count of those that ended is the same in two scrapes in
// a row (a scrape may read the gauge before a mirror ends and the counter
// after), then returns that count by result: sent and failed. Every copy
// it sent is then in its target's recorder, which records before it
// answers.
func (s *scenario) mirrorsLanded() (sent, failed float64) {
	s.t.Helper()
	const total = "sockmesh_proxy_mirrored_requests_total"
	last := -1.0
	eventually(s.t, "mirrors landed", func() error {
		m := s.n.agent.metrics(s.t)
		inFlight := metricsum.Sum(s.t, m, "sockmesh_proxy_mirrored_requests_in_flight", nil)
		sent = metricsum.Sum(s.t, m, total, map[string]string{"result": "sent"})
		failed = metricsum.Sum(s.t, m, total, map[string]string{"result": "failed"})
		ended, prev := sent+failed, last
		last = ended
		if inFlight != 0 || ended != prev {
			return fmt.Errorf("%v in flight, %v ended (%v the scrape before)", inFlight, ended, prev)
		}
		return nil
	})
	return sent, failed
}

// waitMirror returns the next request rec saw for path.
func waitMirror(s *scenario, rec *recorder, path string) echo.Report {
	s.t.Helper()
	timeout := time.After(waitFor)
	for {
		select {
		case r := <-rec.seen:
			if r.Path == path {
				return r
			}
		case <-timeout:
			s.t.Fatalf("mirror %s got no request for %s", rec.pod.name, path)
		}
	}
}

// testMeshStatus: what the API server says about routes that cannot be
// fully honoured, and what their requests get: a backendRef to a missing
// Service (BackendNotFound, 500 for its share; the Service appearing
// fixes both), a parent that does not exist (NoMatchingParent); and the
// XMesh's Accepted condition and supportedFeatures.
func testMeshStatus(s *scenario) {
	a := s.meshApps()
	s.apply(fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: refs}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /missing}}]
    backendRefs: [{name: no-such-service, port: 80}]
  - backendRefs: [{name: echo-v2, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: orphan}
spec:
  parentRefs: [{group: "", kind: Service, name: no-such-parent}]
  rules:
  - backendRefs: [{name: echo-v2, port: 80}]
---
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XMesh
metadata: {name: sockmesh-%s}
spec: {controllerName: %s}
`, s.ns, translate.ControllerName))
	s.waitRouted(a.echo.v4(80), "refs")
	s.waitRouteStatus("HTTPRoute", s.ns, "refs", "echo", accepted, condition{"ResolvedRefs", "False", "BackendNotFound"})
	s.waitRouteStatus("HTTPRoute", s.ns, "orphan", "no-such-parent", condition{"Accepted", "False", "NoMatchingParent"})
	s.expect(nil, call{url: httpURL(a.echo.v4(80), "/missing")}, want{status: http.StatusInternalServerError})
	s.expect(nil, call{url: httpURL(a.echo.v4(80), "/")}, want{backend: "v2"})

	s.serviceOf(s.ns, "no-such-service", meshPorts(), a.v1.pod)
	s.waitRouteStatus("HTTPRoute", s.ns, "refs", "echo", routeAccepted...)
	eventually(s.t, "the new backend answering", func() error {
		r, err := s.send(nil, call{url: httpURL(a.echo.v4(80), "/missing")})
		if err != nil {
			return err
		}
		return r.check(want{backend: "v1", path: "/missing"})
	})

	eventually(s.t, "status of XMesh sockmesh-"+s.ns, func() error {
		m, err := s.n.c.api.Gateway.ExperimentalV1alpha1().XMeshes().Get(context.Background(), "sockmesh-"+s.ns, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := hasConditions(m.Status.Conditions, m.Generation, []condition{accepted}); err != nil {
			return err
		}
		got := featureNames(m.Status.SupportedFeatures)
		// The list depends on whether the cluster serves ClusterTrustBundles.
		if !slices.Equal(got, featureNames(translate.SupportedFeatures(false))) && !slices.Equal(got, featureNames(translate.SupportedFeatures(true))) {
			return fmt.Errorf("supportedFeatures %v, want %v", got, featureNames(translate.SupportedFeatures(false)))
		}
		return nil
	})
}

// testMeshReferenceGrant: a backendRef to a Service in another namespace
// is RefNotPermitted (and its requests 500) until a ReferenceGrant there
// allows it; then ResolvedRefs and the backend answers.
func testMeshReferenceGrant(s *scenario) {
	a := s.meshApps()
	other := "x-" + s.ns
	if len(other) > 63 {
		other = other[:63]
	}
	s.n.c.newNamespace(s.t, other)
	elsewhere := s.n.newPod(s.t, other, "elsewhere")
	startBackend(s.t, elsewhere, backendOptions{Wire: Plain, HTTPPort: meshPort})
	s.serviceOf(other, "elsewhere", meshPorts(), elsewhere)
	s.apply(fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: cross}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /elsewhere}}]
    backendRefs: [{name: elsewhere, namespace: %s, port: 80}]
  - backendRefs: [{name: echo-v2, port: 80}]
`, other))
	s.waitRouted(a.echo.v4(80), "cross")
	s.waitRouteStatus("HTTPRoute", s.ns, "cross", "echo", accepted, condition{"ResolvedRefs", "False", "RefNotPermitted"})
	s.expect(nil, call{url: httpURL(a.echo.v4(80), "/elsewhere")}, want{status: http.StatusInternalServerError})

	s.n.c.apply(s.t, other, fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: from-%s}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: %s}]
  to: [{group: "", kind: Service, name: elsewhere}]
`, s.ns, s.ns))
	s.waitRouteStatus("HTTPRoute", s.ns, "cross", "echo", routeAccepted...)
	eventually(s.t, "the granted backend answering", func() error {
		r, err := s.send(nil, call{url: httpURL(a.echo.v4(80), "/elsewhere")})
		if err != nil {
			return err
		}
		return r.check(want{backend: "elsewhere", path: "/elsewhere"})
	})
}

// testMeshSessionPersistence: a rule's sessionPersistence (GEP-1619,
// route-inline) pins a client's requests to one endpoint of a Service
// with two, by cookie or by header, while requests without a session keep
// spreading over both; a session naming an endpoint that is gone starts
// over on a ready one.
func testMeshSessionPersistence(s *scenario) {
	a := s.meshApps()
	s.serviceOf(s.ns, "pair", meshPorts(), a.v1.pod, a.v2.pod)
	s.applyFile("testdata/mesh/mesh-session-persistence.yaml")
	s.waitRouted(a.echo.v4(80), "sticky")
	s.waitRouteStatus("HTTPRoute", s.ns, "sticky", "echo", routeAccepted...)
	url := func(path string) string { return httpURL(a.echo.v4(80), path) }

	// Without a session the Service's two endpoints share the requests.
	seen := map[string]int{}
	for range 8 {
		if r := s.expect(nil, call{url: url("/plain")}, want{}); r != nil {
			seen[r.report.Pod]++
		}
	}
	if seen["v1"] == 0 || seen["v2"] == 0 {
		s.t.Errorf("requests without a session went to %v, want both v1 and v2", seen)
	}

	// A cookie session: the first answer sets it, later requests carrying
	// it all reach the same pod.
	first := s.expect(nil, call{url: url("/cookie")}, want{})
	if first == nil {
		return
	}
	var cookie *http.Cookie
	for _, c := range (&http.Response{Header: first.header}).Cookies() {
		if c.Name == "sticky" {
			cookie = c
		}
	}
	if cookie == nil {
		s.t.Fatalf("first request of a cookie session: Set-Cookie %q, want a cookie named sticky", first.header.Values("Set-Cookie"))
	}
	if !cookie.HttpOnly || cookie.Path != "/" {
		s.t.Errorf("session cookie %s, want HttpOnly with Path=/", cookie)
	}
	for range 6 {
		s.expect(nil, call{url: url("/cookie/again"), header: map[string]string{"Cookie": "sticky=" + cookie.Value}},
			want{backend: first.report.Pod, path: "/cookie/again"})
	}

	// A header session works the same way through X-Session.
	h := s.expect(nil, call{url: url("/header")}, want{})
	if h == nil {
		return
	}
	token := h.header.Get("X-Session")
	if token == "" {
		s.t.Fatalf("first request of a header session: no X-Session in the answer (%v)", h.header)
	}
	for range 6 {
		s.expect(nil, call{url: url("/header/again"), header: map[string]string{"X-Session": token}},
			want{backend: h.report.Pod, path: "/header/again"})
	}

	// A session naming no endpoint of the Service starts a new one.
	r := s.expect(nil, call{url: url("/cookie"), header: map[string]string{"Cookie": "sticky=0123456789abcdef"}}, want{})
	if r != nil && !strings.Contains(strings.Join(r.header.Values("Set-Cookie"), ";"), "sticky=") {
		s.t.Errorf("a session naming no endpoint got Set-Cookie %q, want a new sticky session", r.header.Values("Set-Cookie"))
	}
}

func featureNames(fs []gwv1.SupportedFeature) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = string(f.Name)
	}
	return out
}
