package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/echo"
)

// Backend protocol scenarios: the Service's appProtocol (and a policy)
// say what the wire to the backend is; the app keeps speaking what it
// speaks.

const plainPort = 8080

// testH2C: appProtocol kubernetes.io/h2c turns the app's HTTP/1.1 into
// HTTP/2 with prior knowledge, in cleartext.
func testH2C(s *scenario) {
	b := s.backend("h2c", backendOptions{Wire: Plain, HTTPPort: plainPort})
	svc := s.service("h2c", serviceSpec{Backend: b, Ports: []servicePort{
		{Name: "http", Port: 80, TargetPort: plainPort, AppProtocol: "kubernetes.io/h2c"}}})
	s.waitCaptured(svc.addr(false, 80), speaks(snapshot.ProtocolH2C))
	rep := s.get(svc.url(false, 80, "/h2c"))
	if rep.Proto != "HTTP/2.0" || rep.TLS != nil {
		s.t.Errorf("backend saw %s (TLS %+v), want cleartext HTTP/2.0 (h2c)", rep.Proto, rep.TLS)
	}
	s.checkFromNode(rep, b.pod)
}

// testWS: appProtocol kubernetes.io/ws: a WebSocket upgrade reaches the
// backend and messages flow both ways.
func testWS(s *scenario) {
	b := s.backend("chat", backendOptions{Wire: Plain, HTTPPort: plainPort})
	svc := s.service("chat", serviceSpec{Backend: b, Ports: []servicePort{
		{Name: "ws", Port: 80, TargetPort: plainPort, AppProtocol: "kubernetes.io/ws"}}})
	s.waitCaptured(svc.addr(false, 80), speaks(snapshot.ProtocolWS))
	rep := s.websocket("ws://" + svc.addr(false, 80).String() + "/ws")
	if rep.TLS != nil || rep.Proto != "HTTP/1.1" {
		s.t.Errorf("backend saw the upgrade over %s (TLS %+v), want cleartext HTTP/1.1", rep.Proto, rep.TLS)
	}
	s.checkFromNode(rep, b.pod)
}

// testWSS: appProtocol kubernetes.io/wss with a policy: the app's
// cleartext WebSocket reaches the backend inside TLS, ALPN http/1.1.
func testWSS(s *scenario) {
	const hostname = "wss.e2e.test"
	ca := s.newCA()
	b := s.backend("feed", backendOptions{Wire: TLSOnly, Cert: s.serverCert(ca, hostname), HTTPPort: backendPort})
	svc := s.service("feed", serviceSpec{Backend: b, Ports: []servicePort{
		{Name: "https", Port: httpsPort, TargetPort: backendPort, AppProtocol: "kubernetes.io/wss"}}})
	s.apply(caConfigMap("feed-ca", ca) + tlsPolicy("feed", "feed", `    hostname: `+hostname+`
    caCertificateRefs: [{group: "", kind: ConfigMap, name: feed-ca}]`))
	s.waitCaptured(svc.addr(false, httpsPort), func(be *snapshot.Backend) error {
		return errors.Join(speaks(snapshot.ProtocolWSS)(be), originatesTLS(hostname)(be))
	})
	rep := s.websocket("ws://" + svc.addr(false, httpsPort).String() + "/ws")
	s.checkTLS(rep, hostname)
	if rep.TLS != nil && rep.TLS.NegotiatedProtocol != "http/1.1" {
		s.t.Errorf("backend negotiated ALPN %q for WSS, want http/1.1", rep.TLS.NegotiatedProtocol)
	}
	s.checkFromNode(rep, b.pod)
	s.checkNoPlaintext(b)
}

// websocket opens a WebSocket from the client pod, returns the backend's
// report (its first message) and checks that a message comes back.
func (s *scenario) websocket(url string) echo.Report {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: s.httpClient(nil)})
	if err != nil {
		s.t.Fatalf("websocket %s from the client pod: %v", url, err)
	}
	defer c.CloseNow()
	_, first, err := c.Read(ctx)
	if err != nil {
		s.t.Fatalf("websocket %s: first message: %v", url, err)
	}
	var rep echo.Report
	if err := json.Unmarshal(first, &rep); err != nil {
		s.t.Fatalf("websocket %s: report: %v (%s)", url, err, first)
	}
	const msg = "hello through sockmesh"
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		s.t.Fatalf("websocket %s: write: %v", url, err)
	}
	if _, got, err := c.Read(ctx); err != nil || string(got) != msg {
		s.t.Errorf("websocket %s: echo = %q, %v; want %q", url, got, err, msg)
	}
	c.Close(websocket.StatusNormalClosure, "")
	return rep
}

// testGRPC: a gRPC app (h2c, prior knowledge) to a Service whose backend
// speaks HTTP/2 over TLS only (appProtocol h2c plus a policy): unary and
// streaming calls work, trailers survive, and the backend saw TLS with the
// policy's SNI and ALPN h2.
func testGRPC(s *scenario) {
	const hostname = "grpc.e2e.test"
	const grpcPort = 9000
	ca := s.newCA()
	b := s.backend("greeter", backendOptions{Wire: TLSOnly, Cert: s.serverCert(ca, hostname), HTTPPort: backendPort})
	svc := s.service("greeter", serviceSpec{Backend: b, Ports: []servicePort{
		{Name: "https", Port: grpcPort, TargetPort: backendPort, AppProtocol: "kubernetes.io/h2c"}}})
	s.apply(caConfigMap("greeter-ca", ca) + tlsPolicy("greeter", "greeter", `    hostname: `+hostname+`
    caCertificateRefs: [{group: "", kind: ConfigMap, name: greeter-ca}]`))
	addr := svc.addr(false, grpcPort)
	s.waitCaptured(addr, func(be *snapshot.Backend) error {
		return errors.Join(speaks(snapshot.ProtocolHTTP2)(be), originatesTLS(hostname)(be))
	})

	conn, err := grpc.NewClient("passthrough:///"+addr.String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return s.n.client.dialer.DialContext(ctx, "tcp", a)
		}))
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var trailer metadata.MD
	out := new(wrapperspb.BytesValue)
	if err := conn.Invoke(ctx, echo.MethodUnary, wrapperspb.Bytes([]byte("unary")), out, grpc.Trailer(&trailer)); err != nil {
		s.t.Fatalf("unary call: %v", err)
	}
	if string(out.Value) != "unary" || !slices.Equal(trailer.Get(echo.TrailerKey), []string{b.pod.name}) {
		s.t.Errorf("unary call = %q, trailer %v; want the echo and %s=%s", out.Value, trailer, echo.TrailerKey, b.pod.name)
	}
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, echo.MethodStream)
	if err != nil {
		s.t.Fatalf("stream: %v", err)
	}
	for i := range 3 {
		msg := fmt.Sprintf("stream %d", i)
		if err := st.SendMsg(wrapperspb.Bytes([]byte(msg))); err != nil {
			s.t.Fatalf("stream send: %v", err)
		}
		got := new(wrapperspb.BytesValue)
		if err := st.RecvMsg(got); err != nil || string(got.Value) != msg {
			s.t.Fatalf("stream reply = %q, %v; want %q while the stream is open", got.Value, err, msg)
		}
	}
	st.CloseSend()
	if err := st.RecvMsg(new(wrapperspb.BytesValue)); !errors.Is(err, io.EOF) {
		s.t.Errorf("stream end: %v, want EOF", err)
	}

	hs := b.stats(s.t).Handshakes
	if len(hs) == 0 {
		s.t.Fatal("the gRPC backend saw no TLS handshake")
	}
	for _, h := range hs {
		if h.ServerName != hostname || h.ALPN != "h2" {
			s.t.Errorf("gRPC backend handshake SNI %q ALPN %q, want %s and h2", h.ServerName, h.ALPN, hostname)
		}
	}
	s.checkNoPlaintext(b)
}

// testIPv6: an IPv6-only Service (connect6 and getpeername6, the node's
// IPv6 listener, an IPv6 endpoint) and a dual-stack one, both with TLS
// origination.
func testIPv6(s *scenario) {
	const hostname = "six.e2e.test"
	ca := s.newCA()
	b := s.backend("six", backendOptions{Wire: TLSOnly, Cert: s.serverCert(ca, hostname), HTTPPort: backendPort})
	port := []servicePort{{Name: "https", Port: httpsPort, TargetPort: backendPort}}
	v6only := s.service("six", serviceSpec{Backend: b, Ports: port, Families: []corev1.IPFamily{corev1.IPv6Protocol}})
	dual := s.service("dual", serviceSpec{Backend: b, Ports: port,
		Families: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}})
	validation := `    hostname: ` + hostname + `
    caCertificateRefs: [{group: "", kind: ConfigMap, name: six-ca}]`
	s.apply(caConfigMap("six-ca", ca) + tlsPolicy("six", "six", validation) + tlsPolicy("dual", "dual", validation))

	addr := v6only.addr(true, httpsPort)
	s.waitCaptured(addr, originatesTLS(hostname))
	rep := s.get(v6only.url(true, httpsPort, "/ipv6"))
	s.checkTLS(rep, hostname)
	s.checkFromNode(rep, b.pod)
	if got := rep.RemoteAddr; len(got) == 0 || got[0] != '[' {
		s.t.Errorf("backend's peer %s, want the node's IPv6 address (the only endpoint is IPv6)", got)
	}
	c, err := s.n.client.dialer.DialContext(context.Background(), "tcp", addr.String())
	if err != nil {
		s.t.Fatal(err)
	}
	if got := c.RemoteAddr().String(); got != addr.String() {
		s.t.Errorf("the app's IPv6 socket has peer %s, want the Service address %s", got, addr)
	}
	c.Close()

	for _, v6 := range []bool{false, true} {
		s.waitCaptured(dual.addr(v6, httpsPort), originatesTLS(hostname))
		rep := s.get(dual.url(v6, httpsPort, "/dual-stack"))
		s.checkTLS(rep, hostname)
		s.checkFromNode(rep, b.pod)
	}
	s.checkNoPlaintext(b)
}
