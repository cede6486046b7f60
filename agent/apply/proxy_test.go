package apply

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// probeDatapath stands for the eBPF datapath in front of a real proxy:
// when its step runs, it redirects one connection to every Service
// address it still captures, as connect4 would, and wants the backend's
// echo back, not the reset the proxy sends for an address it does not
// know.
type probeDatapath struct {
	proxy    *proxy.Proxy
	captured []netip.AddrPort
	failures []string
}

func (d *probeDatapath) Apply(s *snapshot.Snapshot) error {
	for _, ap := range d.captured {
		if err := d.redirect(ap); err != nil {
			d.failures = append(d.failures, fmt.Sprintf("datapath step of snapshot %d: a connection to %s, still captured: %v",
				s.Version, ap, err))
		}
	}
	d.captured = d.captured[:0]
	for _, f := range s.Frontends {
		for _, a := range f.Addresses {
			d.captured = append(d.captured, netip.AddrPortFrom(a, f.Port))
		}
	}
	return nil
}

func (d *probeDatapath) Heartbeat() error { return nil }

// redirect hands the proxy a connection whose original destination is ap
// and checks that its bytes come back from the echo backend.
func (d *probeDatapath) redirect(ap netip.AddrPort) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	app, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	defer app.Close()
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	go d.proxy.ServeConn(c, ap, proxy.Client{Addr: c.RemoteAddr().(*net.TCPAddr).AddrPort()})
	// A leading NUL is no TLS, HTTP/2 or HTTP/1 start: relayed as opaque TCP.
	msg := []byte("\x00ping")
	if _, err := app.Write(msg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(app, got); err != nil {
		return fmt.Errorf("read the echo: %w", err)
	}
	return nil
}

type enrolNop struct{}

func (enrolNop) Update(*snapshot.Snapshot) error { return nil }

// echo serves a TCP backend that sends back what it reads.
func echo(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// TestRedirectedInGapIsServed: the datapath still redirects connections
// to a Service the new snapshot deletes until its own step runs; the real
// proxy must relay them to the Service's backend then, not reset them.
func TestRedirectedInGapIsServed(t *testing.T) {
	backend := echo(t)
	// Unmarked as root or not: no datapath captures this test's dials.
	px, err := proxy.New(proxy.Config{Dial: dial.Config{Unmarked: true}}, slog.New(slog.DiscardHandler),
		prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := px.Shutdown(context.Background()); err != nil {
			t.Errorf("proxy shutdown: %v", err)
		}
	})
	dp := &probeDatapath{proxy: px}
	a, err := New(Config{}, nil, px, dp, enrolNop{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}

	ref := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "app", Name: "db", Port: 80}
	s1, err := snapshot.New(1, []snapshot.Frontend{{Service: snapshot.ObjectRef{Namespace: "app", Name: "db"}, Port: 80,
		Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.2")}, FailurePolicy: snapshot.FailClosed, Backend: ref}},
		[]snapshot.Backend{{Ref: ref, Protocol: snapshot.ProtocolTCP,
			Endpoints: []snapshot.Endpoint{{Addr: backend, Ready: true, Serving: true}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := snapshot.New(2, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*snapshot.Snapshot{s1, s2} {
		if err := a.apply(s); err != nil {
			t.Fatalf("apply snapshot %d: %v", s.Version, err)
		}
	}
	for _, f := range dp.failures {
		t.Error(f)
	}
	if len(dp.captured) != 0 {
		t.Errorf("the datapath captures %v after snapshot 2, want nothing", dp.captured)
	}
}
