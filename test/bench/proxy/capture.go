package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/test/bench/internal/benchrun"
)

// capture sends the load generator's connections to a Service address to a
// sockmesh proxy the way a node does: sockmesh's eBPF programs (connect
// rewrites the destination once, sockops hands the original destination to
// the accepted socket, getsockopt answers SO_ORIGINAL_DST) on a throwaway
// cgroup that holds the load generators and the proxies. Every process of
// the bench runs in a throwaway netns, the enrolled pod; the proxies listen
// on its loopback (in-pod mode). nginx and the backend stay outside the
// cgroup, as they would be.
type capture struct {
	ns     *sandbox.NetNS
	dp     *datapath.Datapath
	netns  uint64
	cgroup *os.File
}

// newCapture makes the netns and installs the datapath capturing services,
// fail-closed as TLS services are, with the app-to-proxy leg accelerated
// (sk_msg) when accelerate is set.
func newCapture(r *benchrun.Runner, services []netip.AddrPort, accelerate bool) (*capture, error) {
	ns := sandbox.NewNetNS(r)
	cg := sandbox.NewCgroup(r)
	dp, err := datapath.Open(datapath.Config{BPFFS: sandbox.TempBPFFS(r), Cgroup: cg.Path, Accelerate: accelerate}, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("open datapath: %w", err)
	}
	r.Cleanup(func() { dp.Uninstall() })
	var svcs []datapath.Service
	for _, s := range services {
		svcs = append(svcs, datapath.Service{Addr: s})
	}
	if err := dp.SetServices(svcs); err != nil {
		return nil, err
	}
	cookie, err := ns.Cookie()
	if err != nil {
		return nil, err
	}
	f, err := os.Open(cg.Path)
	if err != nil {
		return nil, err
	}
	r.Cleanup(func() { f.Close() })
	return &capture{ns: ns, dp: dp, netns: cookie, cgroup: f}, nil
}

// to sends the captured connections made from now on to the proxy listening
// on listen.
func (c *capture) to(listen netip.AddrPort) error {
	return c.dp.Enrol(c.netns, datapath.Proxy{NetNSCookie: c.netns, V4: listen})
}

// inCgroup makes cmd start inside the capture's cgroup (CLONE_INTO_CGROUP).
func (c *capture) inCgroup(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(c.cgroup.Fd())}
	return cmd
}

// start starts cmd in the netns.
func (c *capture) start(cmd *exec.Cmd) error { return c.ns.Do(cmd.Start) }

// listening says whether something listens on addr in the netns, where
// the proxies listen: a proxy closes a connection that was not redirected
// at once, sometimes before connect returns (a reset), so only a refused
// connection or no answer at all says no one is there.
func (c *capture) listening(addr netip.AddrPort) error {
	return c.ns.Do(func() error {
		conn, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
		if err == nil {
			return conn.Close()
		}
		var ne net.Error
		if errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &ne) && ne.Timeout() {
			return err
		}
		return nil
	})
}

// output runs cmd in the netns and returns its combined output.
func (c *capture) output(cmd *exec.Cmd) (out []byte, err error) {
	c.ns.Do(func() error {
		out, err = cmd.CombinedOutput()
		return nil
	})
	return out, err
}

// check says whether the connections went the datapath's way: redirected,
// and with acceleration, accelerated.
func (c *capture) check(accelerate bool) error {
	n, err := c.dp.Counters()
	if err != nil {
		return err
	}
	if n[datapath.Redirected] == 0 {
		return fmt.Errorf("the datapath redirected no connection")
	}
	if !accelerate {
		return nil
	}
	a, err := c.dp.AccelCounters()
	if err != nil {
		return err
	}
	if a.Redirected == 0 {
		return fmt.Errorf("the datapath accelerated no socket (%+v)", a)
	}
	return nil
}
