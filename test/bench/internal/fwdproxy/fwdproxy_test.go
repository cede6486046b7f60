package fwdproxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

func TestMain(m *testing.M) {
	sandbox.Main(m, map[string]func([]string) error{"proxy": proxyHelper})
}

var vip = netip.MustParseAddrPort("10.96.0.10:80")

// proxyHelper serves on 127.0.0.1:15001 inside the child's netns, sending vip
// to args[0], and reports each failed connection on stdout.
func proxyHelper(args []string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:15001")
	if err != nil {
		return err
	}
	fmt.Println("ready")
	return Serve(ln, Config{
		Backends: map[netip.AddrPort]netip.AddrPort{vip: netip.MustParseAddrPort(args[0])},
		OnError:  func(err error) { fmt.Println("error:", err) },
	})
}

// TestForward runs the proxy behind iptables REDIRECT in a netns: a
// redirected connection reaches the backend; one that dials the proxy
// directly is closed without a byte relayed.
func TestForward(t *testing.T) {
	if _, err := exec.LookPath("iptables"); err != nil {
		testenv.SkipOrFail(t, "iptables not installed")
	}
	ns := sandbox.NewNetNS(t)
	// An address on lo makes the whole /16 local: connect() to the VIP gets
	// a source address and reaches the nat OUTPUT hook.
	ns.AddAddr(t, "lo", netip.MustParsePrefix("10.96.0.1/16"))
	var out bytes.Buffer
	cmd := exec.Command("iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", vip.Addr().String(),
		"--dport", "80", "-j", "REDIRECT", "--to-ports", "15001")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := sandbox.Start(t, cmd, ns, nil).Wait(); err != nil {
		t.Fatalf("iptables: %v\n%s", err, out.String())
	}
	backend, err := ns.Listen(context.Background(), nil, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()

	proxy := sandbox.HelperCommand(t, "proxy", backend.Addr().String())
	proxy.Stderr = os.Stderr
	stdout, err := proxy.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sandbox.Start(t, proxy, ns, nil)
	lines := bufio.NewReader(stdout)
	if l, err := lines.ReadString('\n'); l != "ready\n" {
		t.Fatalf("proxy: %q, %v", l, err)
	}

	dial := func(addr string) net.Conn {
		t.Helper()
		c, err := ns.Dial(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c
	}
	c := dial(vip.String())
	io.WriteString(c, "hello")
	c.(*net.TCPConn).CloseWrite()
	if got, err := io.ReadAll(c); string(got) != "hello" || err != nil {
		t.Errorf("through the proxy: read %q, %v; want the echo", got, err)
	}
	c.Close()

	c = dial("127.0.0.1:15001")
	io.WriteString(c, "hello")
	if got, _ := io.ReadAll(c); len(got) != 0 {
		t.Errorf("direct to the proxy: read %q, want nothing", got)
	}
	c.Close()
	if l, _ := lines.ReadString('\n'); !strings.Contains(l, "no original destination recorded") {
		t.Errorf("proxy reported %q, want the connection refused for lack of original destination", l)
	}
}
