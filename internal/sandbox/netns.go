package sandbox

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/datapath/podns"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

// NetNS is a network namespace made for one test, bind-mounted at
// /var/run/netns/<Name> (so `ip netns exec <Name>` works while debugging)
// with its loopback up. The embedded podns.NS gives Do, Cookie, Listen and
// Addrs.
type NetNS struct {
	*podns.NS
	Name string
}

// NewNetNS creates a network namespace that is removed when t ends.
func NewNetNS(t TB) *NetNS {
	t.Helper()
	testenv.RequireRoot(t)
	name := Name()
	path := filepath.Join(podns.NamedDir, name)

	if err := os.MkdirAll(podns.NamedDir, 0o755); err != nil {
		t.Fatalf("create %s: %v", podns.NamedDir, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		t.Fatalf("create netns mount point: %v", err)
	}
	f.Close()
	t.Cleanup(func() {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmount netns %s: %v", name, err)
		}
		if err := os.Remove(path); err != nil {
			t.Errorf("remove netns %s: %v", name, err)
		}
	})
	if err := newNamedNetNS(path); err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}

	ns, err := podns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	n := &NetNS{NS: ns, Name: name}
	n.do(t, func() error {
		// Interfaces made later skip duplicate address detection, so their
		// link-local addresses are usable at once (a test netns has no
		// duplicates to detect).
		for _, conf := range []string{"all", "default"} {
			p := "/proc/sys/net/ipv6/conf/" + conf + "/accept_dad"
			if err := os.WriteFile(p, []byte("0"), 0); err != nil {
				return err
			}
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	return n
}

// newNamedNetNS unshares a new netns on a locked thread, bind-mounts it at
// path and returns the thread to its own netns (or lets it die).
func newNamedNetNS(path string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer home.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		mountErr := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stay locked: the runtime destroys this thread when we return.
			errc <- fmt.Errorf("return to own netns: %w", err)
			return
		}
		runtime.UnlockOSThread()
		if mountErr != nil {
			mountErr = fmt.Errorf("bind mount: %w", mountErr)
		}
		errc <- mountErr
	}()
	return <-errc
}

// do runs fn inside n and fails t on error.
func (n *NetNS) do(t TB, fn func() error) {
	t.Helper()
	if err := n.Do(fn); err != nil {
		t.Fatalf("in netns %s: %v", n.Name, err)
	}
}

// Go runs fn on a thread inside n in the background; the channel yields
// fn's error once it returns.
func (n *NetNS) Go(fn func() error) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- n.Do(fn) }()
	return errc
}

// Dial connects from inside n. d may be nil.
func (n *NetNS) Dial(d *net.Dialer, network, address string) (net.Conn, error) {
	if d == nil {
		d = &net.Dialer{}
	}
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = d.Dial(network, address)
		return err
	})
	return c, err
}

// AddAddr adds prefix to the interface dev inside n (IPv6 without duplicate
// address detection, so it is usable at once).
func (n *NetNS) AddAddr(t TB, dev string, prefix netip.Prefix) {
	t.Helper()
	n.do(t, func() error { return addAddr(dev, prefix) })
}

// AddBridge adds a bridge named dev inside n, left down: an interface to
// put addresses on (this kernel has no dummy driver). It goes with n.
func (n *NetNS) AddBridge(t TB, dev string) {
	t.Helper()
	n.do(t, func() error {
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: dev}}); err != nil {
			return fmt.Errorf("add bridge %s: %w", dev, err)
		}
		return nil
	})
}

// DelLink deletes the interface dev inside n, and its addresses with it.
func (n *NetNS) DelLink(t TB, dev string) {
	t.Helper()
	n.do(t, func() error {
		link, err := netlink.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("find %s: %w", dev, err)
		}
		if err := netlink.LinkDel(link); err != nil {
			return fmt.Errorf("delete %s: %w", dev, err)
		}
		return nil
	})
}

func addAddr(dev string, prefix netip.Prefix) error {
	link, err := netlink.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("find %s: %w", dev, err)
	}
	a := &netlink.Addr{IPNet: ipNet(prefix)}
	if prefix.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := netlink.AddrAdd(link, a); err != nil {
		return fmt.Errorf("add %s to %s: %w", prefix, dev, err)
	}
	return nil
}

// AddRoute adds a route to dst via the gateway inside n (0.0.0.0/0 or ::/0
// for a default route).
func (n *NetNS) AddRoute(t TB, dst netip.Prefix, via netip.Addr) {
	t.Helper()
	n.do(t, func() error {
		r := &netlink.Route{Dst: ipNet(dst), Gw: via.AsSlice()}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("add route %s via %s: %w", dst, via, err)
		}
		return nil
	})
}

// AddDeviceRoute adds a route to dst out of interface dev inside n, without
// gateway (e.g. a Service range out of "lo" for iptables REDIRECT tests).
func (n *NetNS) AddDeviceRoute(t TB, dst netip.Prefix, dev string) {
	t.Helper()
	n.do(t, func() error {
		link, err := netlink.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("find %s: %w", dev, err)
		}
		r := &netlink.Route{Dst: ipNet(dst), LinkIndex: link.Attrs().Index}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("add route %s dev %s: %w", dst, dev, err)
		}
		return nil
	})
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
