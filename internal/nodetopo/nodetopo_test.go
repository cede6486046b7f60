package nodetopo_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/internal/nodetopo"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

func TestPlan(t *testing.T) {
	a := nodetopo.Plan(229)
	for _, c := range []struct {
		name string
		got  netip.Addr
		bits int
		want string
	}{
		{"Node", a.Node, 32, "10.229.0.1/32"},
		{"ClientGW", a.ClientGW.Addr(), a.ClientGW.Bits(), "10.229.1.1/24"},
		{"Client", a.Client.Addr(), a.Client.Bits(), "10.229.1.10/24"},
		{"BackendGW", a.BackendGW.Addr(), a.BackendGW.Bits(), "10.229.2.1/24"},
		{"Backend", a.Backend.Addr(), a.Backend.Bits(), "10.229.2.20/24"},
	} {
		if got := netip.PrefixFrom(c.got, c.bits).String(); got != c.want {
			t.Errorf("Plan(229).%s = %s, want %s", c.name, got, c.want)
		}
	}
}

// TestNew connects from each pod to the node IP (through its default
// route) and from the node to each pod. The node does not forward between
// pods: the agent's proxy, in the node, connects to backends.
func TestNew(t *testing.T) {
	testenv.RequireRoot(t)
	topo := nodetopo.New(t, nodetopo.Plan(229))
	for _, c := range []struct {
		name string
		from interface {
			Dial(*net.Dialer, string, string) (net.Conn, error)
		}
		to interface {
			Listen(context.Context, *net.ListenConfig, string, string) (net.Listener, error)
		}
		listenAddr netip.Addr
	}{
		{"client to node IP", topo.Client, topo.Node, topo.Addrs.Node},
		{"backend to node IP", topo.Backend, topo.Node, topo.Addrs.Node},
		{"node to client", topo.Node, topo.Client, topo.Addrs.Client.Addr()},
		{"node to backend", topo.Node, topo.Backend, topo.Addrs.Backend.Addr()},
	} {
		ln, err := c.to.Listen(context.Background(), nil, "tcp", netip.AddrPortFrom(c.listenAddr, 8080).String())
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			if s, err := ln.Accept(); err == nil {
				io.WriteString(s, "hi")
				s.Close()
			}
		}()
		conn, err := c.from.Dial(&net.Dialer{Timeout: 10 * time.Second}, "tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		b, err := io.ReadAll(conn)
		conn.Close()
		ln.Close()
		if string(b) != "hi" {
			t.Errorf("%s: read %q, %v", c.name, b, err)
		}
	}
}
