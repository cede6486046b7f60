package cnihandover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultTimeout bounds the agent's side of one handover when
// Config.Timeout is zero: below the plugin's own (10 s by default), so
// that the plugin reads the agent's reason rather than its own deadline.
const DefaultTimeout = 8 * time.Second

// Enroller settles handovers (the agent's Enroller, with translate's rule).
type Enroller interface {
	// Enrol enrols p's namespace and answers Captured, or answers why the
	// pod is not captured; an error when it could do neither before ctx
	// ended.
	Enrol(ctx context.Context, p Pod) (Answer, error)
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
	srv  *http.Server
	hand *prometheus.CounterVec
}

// NewServer returns a Server handing pods to en. reg may be nil.
func NewServer(cfg Config, en Enroller, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	s := &Server{cfg: cfg, en: en, log: log.With("component", "cnihandover"),
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
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+addPath, s.add)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: cfg.Timeout}
	return s, nil
}

// Serve serves ln until Close; it returns nil then.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve the CNI socket: %w", err)
	}
	return nil
}

// Close stops serving at once. A handover under way fails: the plugin
// fails its ADD, and the kubelet's retry reaches the next agent.
func (s *Server) Close() error { return s.srv.Close() }

func (s *Server) add(w http.ResponseWriter, r *http.Request) {
	var p Pod
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&p); err != nil {
		s.hand.WithLabelValues("failed").Inc()
		http.Error(w, fmt.Sprintf("decode handover: %v", err), http.StatusBadRequest)
		return
	}
	if p.Namespace == "" || p.Name == "" || p.NetNS == "" {
		s.hand.WithLabelValues("failed").Inc()
		http.Error(w, "a handover names the pod's namespace, name and network namespace (are K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS?)", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
	defer cancel()
	log := s.log.With("pod", p.Namespace+"/"+p.Name, "netns", p.NetNS, "container_id", p.ContainerID)
	a, err := s.en.Enrol(ctx, p)
	if err != nil {
		s.hand.WithLabelValues("failed").Inc()
		log.Warn("pod handed over not enrolled: its sandbox waits", "err", err)
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	result := "captured"
	if !a.Captured {
		result = "not_captured"
	}
	s.hand.WithLabelValues(result).Inc()
	log.Debug("pod handed over", "result", result, "reason", a.Reason)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(a)
}
