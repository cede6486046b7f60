package cnihandover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// DefaultTimeout bounds the agent's side of one handover when
// Config.Timeout is zero: below the plugin's own (10 s by default), so
// that the plugin reads the agent's reason rather than its own deadline.
const DefaultTimeout = 8 * time.Second

// Enroller settles handovers (the agent's Enroller, with translate's rule).
type Enroller interface {
	// Enrol enrols p's network namespace, netns, and answers Captured, or
	// answers why the pod is not captured; an error when it could do
	// neither before ctx ended. It takes netns over.
	Enrol(ctx context.Context, p Pod, netns *os.File) (Answer, error)
}

// Config configures a Server.
type Config struct {
	// Timeout bounds one handover (zero: DefaultTimeout).
	Timeout time.Duration
}

// Server serves the plugin's handovers.
type Server struct {
	cfg  Config
	en   Enroller
	log  *slog.Logger
	hand *prometheus.CounterVec

	mu     sync.Mutex
	closed bool
	lns    []net.Listener
	conns  map[net.Conn]bool
}

// NewServer returns a Server handing pods to en. reg may be nil.
func NewServer(cfg Config, en Enroller, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	s := &Server{cfg: cfg, en: en, log: log.With("component", "cnihandover"), conns: map[net.Conn]bool{},
		hand: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_cni_handovers_total",
			Help: "Pod network namespaces the CNI plugin handed over at CNI ADD, by result (captured, not_captured: the pod is not captured anyway, failed: the ADD fails and the kubelet retries).",
		}, []string{"result"}),
	}
	if reg != nil {
		if err := reg.Register(s.hand); err != nil {
			return nil, fmt.Errorf("register CNI handover metrics: %w", err)
		}
	}
	return s, nil
}

// Serve serves ln until Close; it returns nil then.
func (s *Server) Serve(ln *net.UnixListener) error {
	if !s.track(ln, func() { s.lns = append(s.lns, ln) }) {
		return nil
	}
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			return fmt.Errorf("serve the CNI socket: %w", err)
		}
		if !s.track(c, func() { s.conns[c] = true }) {
			return nil
		}
		go s.handle(c)
	}
}

// track runs add with s.mu held unless s is closed (then it closes c).
func (s *Server) track(c io.Closer, add func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return false
	}
	add()
	return true
}

// Close stops serving at once. A handover under way fails: the plugin
// fails its ADD, and the kubelet's retry reaches the next agent.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var errs []error
	for _, ln := range s.lns {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for c := range s.conns {
		c.Close()
	}
	return errors.Join(errs...)
}

// handle settles one handover on c.
func (s *Server) handle(c *net.UnixConn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	dl, _ := ctx.Deadline()
	c.SetReadDeadline(dl)
	var r reply
	p, netns, err := read(c)
	if err == nil {
		log := s.log.With("pod", p.Namespace+"/"+p.Name, "netns", p.NetNS, "container_id", p.ContainerID)
		r.Answer, err = s.en.Enrol(ctx, p, netns)
		if err != nil {
			log.Warn("pod handed over not enrolled: its sandbox waits", "err", err)
		} else {
			log.Debug("pod handed over", "captured", r.Captured, "reason", r.Reason)
		}
	}
	result := "captured"
	switch {
	case err != nil:
		result, r.Error = "failed", err.Error()
	case !r.Captured:
		result = "not_captured"
	}
	s.hand.WithLabelValues(result).Inc()
	data, _ := json.Marshal(r)
	// The answer goes out after the timeout too: it says why.
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write(data)
}

// read reads one handover: the pod, and the namespace's descriptor that
// came with its first bytes.
func read(c *net.UnixConn) (Pod, *os.File, error) {
	buf := make([]byte, maxMessage)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return Pod{}, nil, fmt.Errorf("read handover: %w", err)
	}
	fd := rights(oob[:oobn])
	rest, err := io.ReadAll(io.LimitReader(c, int64(len(buf)-n)))
	var p Pod
	if err == nil {
		err = json.Unmarshal(append(buf[:n], rest...), &p)
	}
	switch {
	case err == nil && (p.Namespace == "" || p.Name == ""):
		err = errors.New("a handover names the pod's namespace and name (are K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS?)")
	case err == nil && fd < 0:
		err = errors.New("no network namespace came with the handover")
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return Pod{}, nil, fmt.Errorf("read handover: %w", err)
	}
	return p, os.NewFile(uintptr(fd), p.NetNS), nil
}

// rights returns the descriptor oob carries (-1: none), closing any more.
func rights(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1
	}
	fd := -1
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, f := range fds {
			if fd < 0 {
				fd = f
			} else {
				unix.Close(f)
			}
		}
	}
	return fd
}
