package proxy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// startGRPCStreams serves grpcStreams on a grpc-go server (in TLS with
// creds) and returns its address.
func startGRPCStreams(t *testing.T, creds credentials.TransportCredentials) netip.AddrPort {
	t.Helper()
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(append(opts, grpc.UnknownServiceHandler(grpcStreams))...)
	l := listenLocal(t)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return l.Addr().(*net.TCPAddr).AddrPort()
}

// grpcStreams answers the calls of TestGRPCRouteStreams by method:
//
//   - /s.S/Ready sends its head (x-ready) at once, then echoes each
//     message, as a subscription that acknowledges the stream before its
//     first event;
//   - /s.S/Sum reads every message to the client's half-close, then
//     answers their total size, and the sizes in a trailer;
//   - /s.S/Refuse ends the call with a status after one message, while
//     the client may still be sending;
//   - /s.S/Fill sends the sizes the client's one message asks for, each a
//     message of that many bytes, then a trailer.
func grpcStreams(_ any, st grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(st)
	switch method {
	case "/s.S/Ready":
		if err := st.SendHeader(metadata.Pairs("x-ready", "yes")); err != nil {
			return err
		}
		for {
			in := new(wrapperspb.BytesValue)
			if err := st.RecvMsg(in); err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
			if err := st.SendMsg(in); err != nil {
				return err
			}
		}
	case "/s.S/Sum":
		total, n := 0, 0
		for {
			in := new(wrapperspb.BytesValue)
			err := st.RecvMsg(in)
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			if !bytes.Equal(in.Value, pattern(len(in.Value))) {
				return status.Errorf(codes.DataLoss, "message %d corrupted", n)
			}
			total += len(in.Value)
			n++
		}
		st.SetTrailer(metadata.Pairs("x-messages", fmt.Sprint(n)))
		return st.SendMsg(wrapperspb.Int64(int64(total)))
	case "/s.S/Refuse":
		// Ends the call after one message, with the client still sending.
		if err := st.RecvMsg(new(wrapperspb.BytesValue)); err != nil {
			return err
		}
		st.SetTrailer(metadata.Pairs("x-refused", "yes"))
		return status.Error(codes.InvalidArgument, "refused: 100% of it")
	case "/s.S/Fill":
		in := new(wrapperspb.BytesValue)
		if err := st.RecvMsg(in); err != nil {
			return err
		}
		for _, size := range in.Value {
			if err := st.SendMsg(wrapperspb.Bytes(pattern(int(size) << 16))); err != nil {
				return err
			}
		}
		st.SetTrailer(metadata.Pairs("x-messages", fmt.Sprint(len(in.Value))))
		return status.Error(codes.OK, "")
	}
	return status.Errorf(codes.Unimplemented, "no method %s", method)
}

// pattern is n bytes that a lost or shifted chunk would change.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7 / 5)
	}
	return b
}

// TestGRPCRouteStreams: gRPC streams on the L7 path (a GRPCRoute with a
// Service parent, to h2c and TLS backends), as an app sees them: a head the
// backend sends before any message reaches the app at once (a client
// waiting in Header() for a subscription's acknowledgement got nothing
// until the first event: net/http's server sends the head with the first
// body write, and copyBody flushed it for every stream but gRPC's); a
// bidirectional stream goes in lockstep, each reply before the next send;
// large messages arrive whole both ways, the server's answer after the
// client's half-close, with trailers intact; a backend's status ends a call
// the client still sends on; a backend's trailers-only answer stays one
// (its status in the head).
func TestGRPCRouteStreams(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	m := &mesh{t: t}
	backends := map[string]snapshot.Backend{
		"h2c": {Protocol: snapshot.ProtocolGRPC, Endpoints: endpoints(startGRPCStreams(t, nil))},
		"tls": {Protocol: snapshot.ProtocolGRPC, TLS: tlsPolicy(e),
			Endpoints: endpoints(startGRPCStreams(t, credentials.NewTLS(serverTLS(e.pki.server))))},
	}
	vips := map[string]netip.AddrPort{}
	for name, be := range backends {
		ref := m.backend(name, be)
		vips[name] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 47, byte(len(vips) + 1)}), 9000)
		m.frontend(name, vips[name], ref, producer(routeSet(snapshot.KindGRPCRoute,
			rule{[]snapshot.RouteMatch{prefixMatch("/s.S/")}, snapshot.RouteRule{Backends: to(ref)}})))
	}
	e.p.Update(m.snapshot(1))
	for name, dst := range vips {
		t.Run(name, func(t *testing.T) {
			cc := e.grpcClient(t, name+".b.svc:9000", dst)
			defer cc.Close()
			t.Run("head-before-messages", func(t *testing.T) { grpcHeadFirst(t, cc) })
			t.Run("client-stream", func(t *testing.T) { grpcClientStream(t, cc) })
			t.Run("server-stream", func(t *testing.T) { grpcServerStream(t, cc) })
			t.Run("early-status", func(t *testing.T) { grpcEarlyStatus(t, cc) })
			t.Run("trailers-only", func(t *testing.T) { grpcTrailersOnly(t, e.client(dst, true), name) })
		})
	}
}

// grpcHeadFirst waits for the head of a stream whose backend sends it
// before any message, sends its first message only then, and each next
// one once the last came back.
func grpcHeadFirst(t *testing.T, cc *grpc.ClientConn) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/s.S/Ready")
	if err != nil {
		t.Fatal(err)
	}
	head, err := st.Header()
	if err != nil || len(head.Get("x-ready")) != 1 {
		t.Fatalf("head = %v, %v; want x-ready before any message", head, err)
	}
	// Each reply comes before the next send: neither direction may wait
	// for more.
	got := new(wrapperspb.BytesValue)
	for i := range 20 {
		msg := fmt.Appendf(nil, "after the head %d", i)
		if err := st.SendMsg(wrapperspb.Bytes(msg)); err != nil {
			t.Fatal(err)
		}
		if err := st.RecvMsg(got); err != nil || !bytes.Equal(got.Value, msg) {
			t.Fatalf("echo %d = %q, %v", i, got.Value, err)
		}
	}
	st.CloseSend()
	if err := st.RecvMsg(got); err != io.EOF {
		t.Errorf("end = %v, want EOF", err)
	}
}

// grpcClientStream sends messages of up to 3 MiB, half-closes, and reads
// the backend's one answer and its trailer.
func grpcClientStream(t *testing.T, cc *grpc.ClientConn) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, "/s.S/Sum")
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{0, 1, 3 << 20, 16<<10 - 5, 1 << 20, 7}
	want := 0
	for _, n := range sizes {
		if err := st.SendMsg(wrapperspb.Bytes(pattern(n))); err != nil {
			t.Fatalf("send %d bytes: %v", n, err)
		}
		want += n
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	got := new(wrapperspb.Int64Value)
	if err := st.RecvMsg(got); err != nil || got.Value != int64(want) {
		t.Fatalf("sum = %d, %v; want %d", got.Value, err, want)
	}
	if err := st.RecvMsg(got); err != io.EOF {
		t.Fatalf("end = %v, want EOF", err)
	}
	if tr := st.Trailer().Get("x-messages"); len(tr) != 1 || tr[0] != fmt.Sprint(len(sizes)) {
		t.Errorf("trailer x-messages = %v, want %d", tr, len(sizes))
	}
}

// grpcServerStream asks for messages of up to 4 MiB (the client's default
// limit) and checks each and the trailer.
func grpcServerStream(t *testing.T, cc *grpc.ClientConn) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/s.S/Fill")
	if err != nil {
		t.Fatal(err)
	}
	sizes := []byte{1, 63, 0, 32, 2} // in units of 64 KiB
	if err := st.SendMsg(wrapperspb.Bytes(sizes)); err != nil {
		t.Fatal(err)
	}
	st.CloseSend()
	for i, size := range sizes {
		got := new(wrapperspb.BytesValue)
		if err := st.RecvMsg(got); err != nil || !bytes.Equal(got.Value, pattern(int(size)<<16)) {
			t.Fatalf("message %d: %d bytes, %v; want %d", i, len(got.Value), err, int(size)<<16)
		}
	}
	if err := st.RecvMsg(new(wrapperspb.BytesValue)); !errors.Is(err, io.EOF) {
		t.Fatalf("end = %v, want EOF", err)
	}
	if tr := st.Trailer().Get("x-messages"); len(tr) != 1 || tr[0] != fmt.Sprint(len(sizes)) {
		t.Errorf("trailer x-messages = %v, want %d", tr, len(sizes))
	}
}

// grpcTrailersOnly calls a method the backend does not have, which grpc-go
// answers trailers-only, with c, an HTTP/2 client that shows where the
// status came: in the head.
func grpcTrailersOnly(t *testing.T, c *http.Client, name string) {
	req, err := http.NewRequest(http.MethodPost, "http://"+name+".b.svc:9000/s.S/None", bytes.NewReader([]byte{0, 0, 0, 0, 0}))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = http.Header{"Content-Type": {"application/grpc"}, "Te": {"trailers"}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || len(body) != 0 || resp.Header.Get("Grpc-Status") != fmt.Sprint(int(codes.Unimplemented)) || len(resp.Trailer) != 0 {
		t.Errorf("answer: head %v, %d body bytes (%v), trailers %v; want grpc-status %d in the head alone",
			resp.Header, len(body), err, resp.Trailer, codes.Unimplemented)
	}
}

// grpcEarlyStatus sends to a backend that ends the call after the first
// message: the app gets the backend's status, message and trailer, however
// much it sent after it.
func grpcEarlyStatus(t *testing.T, cc *grpc.ClientConn) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, "/s.S/Refuse")
	if err != nil {
		t.Fatal(err)
	}
	for range 64 {
		if err := st.SendMsg(wrapperspb.Bytes(pattern(64 << 10))); err != nil {
			break // io.EOF: the call has ended; RecvMsg says how
		}
	}
	st.CloseSend()
	err = st.RecvMsg(new(wrapperspb.Int64Value))
	if s := status.Convert(err); s.Code() != codes.InvalidArgument || s.Message() != "refused: 100% of it" {
		t.Errorf("status = %v, want InvalidArgument: refused: 100%% of it", err)
	}
	if tr := st.Trailer().Get("x-refused"); len(tr) != 1 {
		t.Errorf("trailer = %v, want x-refused", st.Trailer())
	}
}

// TestGRPCRouteHealthReflection: GRPCRoute matches as translate writes
// them (an Exact method: the path; a service alone: the path prefix; a
// method alone: an expression over the service segment) meet the calls of
// grpc-go's own health and reflection clients, streams included; the
// health List no rule matches is the route's UNIMPLEMENTED, as from a
// server without the method.
func TestGRPCRouteHealthReflection(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	m := &mesh{t: t}
	srv := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("s.S", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	l := listenLocal(t)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	ref := m.backend("meta", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, Endpoints: endpoints(l.Addr().(*net.TCPAddr).AddrPort())})
	// As translate writes method: {service: grpc.health.v1.Health, method:
	// Check}, {service: grpc.reflection.v1.ServerReflection} and {method:
	// Watch}.
	byMethod := snapshot.RouteMatch{Path: snapshot.PathMatch{Type: snapshot.PathRegularExpression, Value: "/[^/]+/Watch"}}
	m.frontend("meta", routedVIP, ref, producer(routeSet(snapshot.KindGRPCRoute,
		rule{[]snapshot.RouteMatch{exactMatch("/grpc.health.v1.Health/Check")}, snapshot.RouteRule{Backends: to(ref)}},
		rule{[]snapshot.RouteMatch{prefixMatch("/grpc.reflection.v1.ServerReflection")}, snapshot.RouteRule{Backends: to(ref)}},
		rule{[]snapshot.RouteMatch{byMethod}, snapshot.RouteRule{Backends: to(ref)}},
	)))
	e.p.Update(m.snapshot(1))
	cc := e.grpcClient(t, "meta.b.svc:80", routedVIP)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()

	hc := healthpb.NewHealthClient(cc)
	if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "s.S"}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health Check = %v, %v; want SERVING", resp, err)
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "s.S"})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := w.Recv(); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health Watch = %v, %v; want SERVING", resp, err)
	}
	if _, err := hc.List(ctx, &healthpb.HealthListRequest{}); status.Code(err) != codes.Unimplemented || status.Convert(err).Message() != "sockmesh: no_match" {
		t.Errorf("health List, which no rule matches: %v; want Unimplemented: sockmesh: no_match", err)
	}

	st, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !slices.Contains(names, "grpc.health.v1.Health") {
		t.Errorf("reflection lists %v, want grpc.health.v1.Health among them", names)
	}
	st.CloseSend()
	if _, err := st.Recv(); err != io.EOF {
		t.Errorf("reflection stream end: %v, want EOF", err)
	}
}
