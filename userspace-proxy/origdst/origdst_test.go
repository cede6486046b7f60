package origdst

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

// These tests redirect with iptables; datapath's tests cover the eBPF
// redirect through the same Get.

var (
	vip4 = netip.MustParseAddrPort("10.96.0.10:80")
	vip6 = netip.MustParseAddrPort("[fd00:96::10]:80")
)

const redirectPort = "15001"

// redirectingNetNS returns a netns whose locally generated connections to
// vip4 and vip6 are redirected to port 15001 by iptables, which maps them to
// 127.0.0.1 and ::1.
func redirectingNetNS(t *testing.T) *sandbox.NetNS {
	t.Helper()
	for _, bin := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(bin); err != nil {
			testenv.SkipOrFail(t, "%s not installed", bin)
		}
	}
	ns := sandbox.NewNetNS(t)
	// The Service ranges need a route (and a source address) for connect()
	// to get as far as the nat OUTPUT hook. An IPv4 address on lo makes its
	// whole prefix local; IPv6 takes the range routed out of lo.
	ns.AddAddr(t, "lo", netip.MustParsePrefix("10.96.0.1/16"))
	ns.AddDeviceRoute(t, netip.MustParsePrefix("fd00:96::/64"), "lo")
	run := func(bin string, vip netip.AddrPort) {
		var out bytes.Buffer
		cmd := exec.Command(bin, "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", vip.Addr().String(),
			"--dport", "80", "-j", "REDIRECT", "--to-ports", redirectPort)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := sandbox.Start(t, cmd, ns, nil).Wait(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out.String())
		}
	}
	run("iptables", vip4)
	run("ip6tables", vip6)
	return ns
}

// acceptFrom dials dst inside ns and returns the connection ln accepted,
// after checking that bytes flow on it.
func acceptFrom(t *testing.T, ns *sandbox.NetNS, ln net.Listener, dst netip.AddrPort) *net.TCPConn {
	t.Helper()
	c, err := ns.Dial(&net.Dialer{Timeout: 10 * time.Second}, "tcp", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 1)
	if _, err := s.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(buf); err != nil {
		t.Fatalf("connection to %s carries no data: %v", dst, err)
	}
	return s.(*net.TCPConn)
}

func listen(t *testing.T, ns *sandbox.NetNS, addr string) net.Listener {
	t.Helper()
	ln, err := ns.Listen(context.Background(), nil, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func TestIptablesRedirect(t *testing.T) {
	ns := redirectingNetNS(t)
	ln4 := listen(t, ns, "127.0.0.1:"+redirectPort)
	ln6 := listen(t, ns, "[::1]:"+redirectPort)

	tests := []struct {
		name string
		ln   net.Listener
		dial netip.AddrPort
		want netip.AddrPort
		err  error
	}{
		{"ipv4 redirected", ln4, vip4, vip4, nil},
		{"ipv6 redirected", ln6, vip6, vip6, nil},
		{"ipv4 direct", ln4, netip.MustParseAddrPort("127.0.0.1:" + redirectPort), netip.AddrPort{}, ErrNotRedirected},
		{"ipv6 direct", ln6, netip.MustParseAddrPort("[::1]:" + redirectPort), netip.AddrPort{}, ErrNotRedirected},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Get(acceptFrom(t, ns, tc.ln, tc.dial))
			if got != tc.want || !errors.Is(err, tc.err) {
				t.Errorf("Get() = %v, %v; want %v, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

// TestDualStackListener: an IPv4 connection accepted on an IPv6 wildcard
// listener has an IPv4-mapped local address and is asked at SOL_IP.
func TestDualStackListener(t *testing.T) {
	ns := redirectingNetNS(t)
	ln := listen(t, ns, "[::]:"+redirectPort)
	c := acceptFrom(t, ns, ln, vip4)
	if local := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr(); !local.Is4In6() {
		t.Fatalf("accepted local address %s is not IPv4-mapped; the test does not test what it says", local)
	}
	if got, err := Get(c); got != vip4 || err != nil {
		t.Errorf("Get() = %v, %v; want %v", got, err, vip4)
	}
}

// TestNoConntrack: in a netns where nothing loaded conntrack rules, a direct
// connection is not redirected either.
func TestNoConntrack(t *testing.T) {
	ns := sandbox.NewNetNS(t)
	for _, addr := range []string{"127.0.0.1:" + redirectPort, "[::1]:" + redirectPort} {
		ln := listen(t, ns, addr)
		got, err := Get(acceptFrom(t, ns, ln, netip.MustParseAddrPort(addr)))
		if !errors.Is(err, ErrNotRedirected) {
			t.Errorf("Get(%s) = %v, %v; want ErrNotRedirected", addr, got, err)
		}
	}
}

func TestClosedConn(t *testing.T) {
	ns := sandbox.NewNetNS(t)
	ln := listen(t, ns, "127.0.0.1:"+redirectPort)
	c := acceptFrom(t, ns, ln, netip.MustParseAddrPort("127.0.0.1:"+redirectPort))
	c.Close()
	if _, err := Get(c); err == nil || errors.Is(err, ErrNotRedirected) {
		t.Errorf("Get(closed) = %v; want an error other than ErrNotRedirected", err)
	}
}
