package podns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NS is an open network namespace: a file descriptor on its nsfs inode, valid
// however the namespace was found and as long as NS is open.
type NS struct {
	f *os.File
}

// Open opens the network namespace at path: a /proc/<pid>/ns/net link or a
// bind mount such as /var/run/netns/<name>.
func Open(path string) (*NS, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	return FromFile(f)
}

// FromFile takes f, a descriptor of a network namespace (one another
// process passed over a unix socket, from a path this process may not
// see), as an NS; Path is f's name. f is closed when it is none.
func FromFile(f *os.File) (*NS, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("open netns %s: %w", f.Name(), err)
	}
	if uint32(st.Type) != unix.NSFS_MAGIC {
		f.Close()
		return nil, fmt.Errorf("open netns %s: not a namespace file", f.Name())
	}
	return &NS{f: f}, nil
}

// Path is the path the namespace was opened from.
func (n *NS) Path() string { return n.f.Name() }

// Fd is the namespace's file descriptor, valid until Close.
func (n *NS) Fd() int { return int(n.f.Fd()) }

// Close releases the descriptor; the namespace itself lives on while any
// process, mount or socket holds it.
func (n *NS) Close() error { return n.f.Close() }

// Inode identifies the namespace: two NS with equal Inode are the same
// namespace.
func (n *NS) Inode() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(n.f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("stat netns %s: %w", n.Path(), err)
	}
	return st.Ino, nil
}

// Do runs fn on an OS thread inside the namespace and waits for it. fn must
// not rely on goroutines it starts being inside the namespace (they are not).
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No deferred unlock: a thread that cannot go back to its own netns
		// must die with this goroutine rather than serve other goroutines.
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current netns: %w", err)
			return
		}
		defer home.Close()
		if err := unix.Setns(n.Fd(), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", n.Path(), err)
			return
		}
		fnErr := fn()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(fnErr, fmt.Errorf("return from netns %s: %w", n.Path(), err))
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// Cookie returns the namespace's cookie (SO_NETNS_COOKIE, Linux 5.14): the
// key under which the datapath enrols it. It is stable for the namespace's
// lifetime and never reused.
func (n *NS) Cookie() (uint64, error) {
	var cookie uint64
	err := n.Do(func() (err error) {
		cookie, err = threadCookie()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("get cookie of netns %s: %w", n.Path(), err)
	}
	return cookie, nil
}

// CurrentCookie returns the cookie of the netns the calling thread is in:
// the process's own, unless the caller runs inside Do.
func CurrentCookie() (uint64, error) {
	cookie, err := threadCookie()
	if err != nil {
		return 0, fmt.Errorf("get cookie of the current netns: %w", err)
	}
	return cookie, nil
}

// threadCookie reads the cookie from a socket made for it: a socket is
// made in its thread's netns and keeps it.
func threadCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
}

// Listen opens a listener inside the namespace (the in-pod proxy mode). lc
// may be nil. The listener stays in the namespace; accepting from it needs no
// further setns.
func (n *NS) Listen(ctx context.Context, lc *net.ListenConfig, network, address string) (net.Listener, error) {
	if lc == nil {
		lc = &net.ListenConfig{}
	}
	var ln net.Listener
	err := n.Do(func() error {
		var err error
		ln, err = lc.Listen(ctx, network, address)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s %s in netns %s: %w", network, address, n.Path(), err)
	}
	return ln, nil
}

// ipvsDevice is the dummy interface on which kube-proxy's IPVS mode puts
// every Service's ClusterIPs, so that the node accepts their packets.
const ipvsDevice = "kube-ipvs0"

// Addrs lists the IP addresses configured on the namespace's interfaces,
// read over netlink, but those on kube-ipvs0: they are Services' addresses,
// not the namespace's own.
func (n *NS) Addrs() ([]netip.Addr, error) {
	var out []netip.Addr
	err := n.netlink(func(h *netlink.Handle) error {
		addrs, err := retryDump(func() ([]netlink.Addr, error) { return h.AddrList(nil, netlink.FAMILY_ALL) })
		if err != nil {
			return err
		}
		ipvs := -1
		if l, err := h.LinkByName(ipvsDevice); err == nil {
			ipvs = l.Attrs().Index
		}
		for _, a := range addrs {
			if a.LinkIndex == ipvs {
				continue
			}
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list addresses in netns %s: %w", n.Path(), err)
	}
	return out, nil
}

// netlink runs f with a route netlink handle opened inside the namespace.
func (n *NS) netlink(f func(*netlink.Handle) error) error {
	return n.Do(func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		return f(h)
	})
}
