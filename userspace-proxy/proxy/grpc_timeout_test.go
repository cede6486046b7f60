package proxy_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// startDeadlineServer serves a grpc-go server whose every call answers the
// time its context had left when it began (-1: no deadline), which
// grpc-go takes from the call's grpc-timeout.
func startDeadlineServer(t *testing.T) netip.AddrPort {
	t.Helper()
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		left := time.Duration(-1)
		if dl, ok := st.Context().Deadline(); ok {
			left = time.Until(dl)
		}
		if err := st.RecvMsg(new(wrapperspb.BytesValue)); err != nil {
			return err
		}
		return st.SendMsg(wrapperspb.Int64(int64(left)))
	}))
	l := listenLocal(t)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return l.Addr().(*net.TCPAddr).AddrPort()
}

// TestGRPCTimeoutBounded: a gRPC call under a rule's timeouts reaches its
// backend with a grpc-timeout no later than the proxy's bound — what is
// left of timeouts.request, or backendRequest for the try — when the app
// sent a later one or none (the backend got the app's hour, or no
// deadline, before, and worked on after the proxy had answered
// DEADLINE_EXCEEDED), and with the app's when it is the earlier; without
// timeouts the app's goes as it is, an hour.
func TestGRPCTimeoutBounded(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	m := &mesh{t: t}
	be := m.backend("dl", snapshot.Backend{Protocol: snapshot.ProtocolGRPC, Endpoints: endpoints(startDeadlineServer(t))})
	timed := func(prefix string, t snapshot.Timeouts) rule {
		return rule{[]snapshot.RouteMatch{prefixMatch(prefix)}, snapshot.RouteRule{Backends: to(be), Timeouts: &t}}
	}
	m.frontend("dl", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		timed("/request.S/", snapshot.Timeouts{Request: dur(2 * time.Second)}),
		timed("/backend.S/", snapshot.Timeouts{Request: dur(time.Hour), BackendRequest: dur(2 * time.Second)}),
		timed("/long.S/", snapshot.Timeouts{Request: dur(2 * time.Hour)}),
		rule{[]snapshot.RouteMatch{prefixMatch("/none.S/")}, snapshot.RouteRule{Backends: to(be)}},
	)))
	e.p.Update(m.snapshot(1))
	cc := e.grpcClient(t, "dl.b.svc:80", routedVIP)
	defer cc.Close()
	left := func(method string, app time.Duration) time.Duration {
		t.Helper()
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if app > 0 {
			ctx, cancel = context.WithTimeout(ctx, app)
		}
		defer cancel()
		out := new(wrapperspb.Int64Value)
		if err := cc.Invoke(ctx, method, wrapperspb.Bytes(nil), out); err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		return time.Duration(out.Value)
	}
	for _, c := range []struct {
		method string
		app    time.Duration // 0: no deadline
		most   time.Duration // the backend's deadline at most this far off
	}{
		{"/request.S/M", time.Hour, 2 * time.Second},
		{"/request.S/M", 0, 2 * time.Second},
		{"/backend.S/M", time.Hour, 2 * time.Second},
		{"/long.S/M", 2 * time.Second, 2 * time.Second}, // the app's, the earlier
	} {
		if got := left(c.method, c.app); got <= 0 || got > c.most {
			t.Errorf("%s, app deadline %v: the backend had %v left, want at most %v", c.method, c.app, got, c.most)
		}
	}
	// Without timeouts the proxy bounds nothing: the app's hour goes on.
	if got := left("/none.S/M", time.Hour); got <= time.Hour/2 || got > time.Hour {
		t.Errorf("no timeouts, app deadline 1h: the backend had %v left, want the app's hour", got)
	}
}
