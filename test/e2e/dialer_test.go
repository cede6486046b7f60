package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/datapath/mark"
	"github.com/sockmesh/sockmesh/internal/sandbox"
)

// A pod's client sockets must be created by a process in the pod's network
// namespace and in the cgroup the agent attaches to: the connect hook runs
// then, in that process, for that socket. The dialer is such a process: it
// connects on the test's behalf and passes the connected socket back over
// a SOCK_SEQPACKET socketpair (SCM_RIGHTS). The socket keeps its namespace
// and cgroup wherever its descriptor goes, so the test then speaks HTTP,
// gRPC or TLS on it in-process, and getpeername on it still runs the
// agent's getpeername hook (the app sees the Service address).

const dialerHelper = "e2e-dialer"

// dialRequest asks the dialer for one connection.
type dialRequest struct {
	Network string        `json:"network"`
	Addr    string        `json:"addr"`
	Timeout time.Duration `json:"timeout"`
	// Mark, when set, is put on the socket before it connects (SO_MARK),
	// as a pod with CAP_NET_RAW, a container runtime's default, may.
	Mark uint32 `json:"mark,omitempty"`
}

// dialReply answers it; on success the socket travels as SCM_RIGHTS.
type dialReply struct {
	Err   string `json:"err,omitempty"`
	Errno int    `json:"errno,omitempty"`
}

// runDialer is the dialer process: it serves requests on descriptor 3 until
// the test closes its end.
func runDialer([]string) error {
	f := os.NewFile(3, "dialer-control")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("dialer control socket: %w", err)
	}
	ctrl, ok := c.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("dialer control socket is a %T", c)
	}
	buf := make([]byte, 4096)
	for {
		n, _, _, _, err := ctrl.ReadMsgUnix(buf, nil)
		if err != nil || n == 0 {
			return nil // the test is done with this pod
		}
		var req dialRequest
		if err := json.Unmarshal(buf[:n], &req); err != nil {
			return fmt.Errorf("dialer request: %w", err)
		}
		reply, sock := dialOnce(req)
		b, _ := json.Marshal(reply)
		var oob []byte
		if sock != nil {
			oob = unix.UnixRights(int(sock.Fd()))
		}
		_, _, err = ctrl.WriteMsgUnix(b, oob, nil)
		if sock != nil {
			sock.Close()
		}
		if err != nil {
			return fmt.Errorf("dialer reply: %w", err)
		}
	}
}

func dialOnce(req dialRequest) (dialReply, *os.File) {
	d := net.Dialer{Timeout: req.Timeout}
	if req.Mark != 0 {
		d.Control = mark.ControlWith(req.Mark)
	}
	c, err := d.Dial(req.Network, req.Addr)
	if err != nil {
		r := dialReply{Err: err.Error()}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			r.Errno = int(errno)
		}
		return r, nil
	}
	defer c.Close()
	f, err := c.(*net.TCPConn).File()
	if err != nil {
		return dialReply{Err: err.Error()}, nil
	}
	return dialReply{}, f
}

// dialer is the test's end of a pod's dialer process.
type dialer struct {
	mu   sync.Mutex // one request at a time on the control socket
	ctrl *net.UnixConn
}

// startDialer runs a dialer process in ns and cgroup cg.
func startDialer(t testing.TB, ns *sandbox.NetNS, cg *sandbox.Cgroup) *dialer {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("dialer socketpair: %v", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "dialer-control"), os.NewFile(uintptr(fds[1]), "dialer-control-peer")
	cmd := sandbox.HelperCommand(t, dialerHelper)
	cmd.ExtraFiles = []*os.File{theirs} // descriptor 3 in the child
	cmd.Stderr = newOutputBuffer(t, "dialer")
	sandbox.Start(t, cmd, ns, cg)
	theirs.Close()
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		t.Fatalf("dialer control socket: %v", err)
	}
	d := &dialer{ctrl: c.(*net.UnixConn)}
	// Closing our end ends the dialer; sandbox kills it if it lingers.
	t.Cleanup(func() { d.ctrl.Close() })
	return d
}

// DialContext connects from the pod. A failed connect returns an error
// that wraps the errno the pod saw (errors.Is(err, syscall.ECONNREFUSED)).
func (d *dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return d.dial(ctx, network, addr, 0)
}

// marked is DialContext for sockets that carry mark m.
func (d *dialer) marked(m uint32) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.dial(ctx, network, addr, m)
	}
}

func (d *dialer) dial(ctx context.Context, network, addr string, m uint32) (net.Conn, error) {
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if timeout <= 0 {
		return nil, &net.OpError{Op: "dial", Net: network, Err: context.DeadlineExceeded}
	}
	req, _ := json.Marshal(dialRequest{Network: network, Addr: addr, Timeout: timeout, Mark: m})
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, _, err := d.ctrl.WriteMsgUnix(req, nil, nil); err != nil {
		return nil, fmt.Errorf("ask the pod's dialer: %w", err)
	}
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := d.ctrl.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("read the pod's dialer: %w", err)
	}
	var reply dialReply
	if err := json.Unmarshal(buf[:n], &reply); err != nil {
		return nil, fmt.Errorf("decode the pod's dialer reply: %w", err)
	}
	if reply.Err != "" {
		var cause error = errors.New(reply.Err)
		if reply.Errno != 0 {
			cause = os.NewSyscallError("connect", syscall.Errno(reply.Errno))
		}
		return nil, &net.OpError{Op: "dial", Net: network, Err: cause}
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("the pod's dialer sent no socket (%d messages): %v", len(msgs), err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, fmt.Errorf("the pod's dialer sent %d descriptors: %v", len(fds), err)
	}
	f := os.NewFile(uintptr(fds[0]), "pod-socket")
	defer f.Close()
	return net.FileConn(f)
}
