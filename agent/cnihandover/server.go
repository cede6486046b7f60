package cnihandover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/cniwire"
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
	Enrol(ctx context.Context, p cniwire.Pod, netns *os.File) (cniwire.Answer, error)
}

// sockmesh_cni_handovers_total's results: the pod's namespace was
// enrolled, the pod is not captured anyway, or the ADD fails.
const (
	resultCaptured    = "captured"
	resultNotCaptured = "not_captured"
	resultFailed      = "failed"
)

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
	// Every result's series exists from the start, at 0: a rate or an
	// alert on failed needs no first failure to see the series.
	for _, r := range []string{resultCaptured, resultNotCaptured, resultFailed} {
		s.hand.WithLabelValues(r)
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
	var a cniwire.Answer
	p, netns, err := cniwire.Read(c)
	if err == nil {
		log := s.log.With("pod", p.Namespace+"/"+p.Name, "netns", p.NetNS, "container_id", p.ContainerID)
		a, err = s.en.Enrol(ctx, p, netns)
		if err != nil {
			log.Warn("pod handed over not enrolled: its sandbox waits", "err", err)
		} else {
			log.Debug("pod handed over", "captured", a.Captured, "reason", a.Reason)
		}
	}
	result := resultCaptured
	switch {
	case err != nil:
		result = resultFailed
	case !a.Captured:
		result = resultNotCaptured
	}
	s.hand.WithLabelValues(result).Inc()
	// The answer goes out after the timeout too: it says why.
	c.SetWriteDeadline(time.Now().Add(time.Second))
	cniwire.Reply(c, a, err)
}
