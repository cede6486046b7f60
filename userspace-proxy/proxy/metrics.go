package proxy

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/h2drain"
	"github.com/sockmesh/sockmesh/userspace-proxy/relay"
)

type metrics struct {
	conns    *prometheus.CounterVec
	active   *prometheus.GaugeVec
	rejected *prometheus.CounterVec
	// acceptErrors counts accepts that failed for want of descriptors or
	// memory, which the proxy waits out.
	acceptErrors prometheus.Counter
	failed       *prometheus.CounterVec
	bytesUp      prometheus.Counter
	bytesDown    prometheus.Counter
	version      prometheus.Gauge
	goAways      *prometheus.CounterVec
	// backends are those of the snapshot forgetGoAways last had (nil
	// before): a connection of one gone since, asked to go away later
	// (its TLS trust ended), makes no goaways series, which no snapshot
	// after would drop.
	mu       sync.Mutex
	backends map[[2]string]bool
	// byPath holds each path's connection counter and gauge, looked up
	// once here rather than per connection.
	byPath map[Path]pathMetrics
}

type pathMetrics struct {
	conns  prometheus.Counter
	active prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, bufs *relay.Pool) (*metrics, error) {
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sockmesh_proxy_bytes_total",
		Help: "Bytes the proxy moved on client connections, by direction (upstream: from clients, downstream: to clients).",
	}, []string{"direction"})
	m := &metrics{
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_connections_total",
			Help: "Redirected connections served, by path (passthrough, l4, l4_tls, l7, http1).",
		}, []string{"path"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sockmesh_proxy_active_connections",
			Help: "Client connections being served, by path.",
		}, []string{"path"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_rejected_connections_total",
			Help: "Connections closed unserved, by reason (not_redirected, not_captured, closed_early, shutting_down, client_limit).",
		}, []string{"reason"}),
		acceptErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sockmesh_proxy_accept_errors_total",
			Help: "Accepts that failed for want of file descriptors or memory; the proxy waits (5 ms, doubling to 1 s) and accepts again.",
		}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_connection_failures_total",
			Help: "Relayed connections reset because the backend could not be reached or honoured, by path and reason.",
		}, []string{"path", "reason"}),
		bytesUp:   bytes.WithLabelValues("upstream"),
		bytesDown: bytes.WithLabelValues("downstream"),
		version: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sockmesh_proxy_snapshot_version",
			Help: "Version of the snapshot the proxy serves new connections with.",
		}),
		goAways: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_goaways_total",
			Help: "Relayed HTTP/2 connections the proxy asked (GOAWAY) to open their next streams on a new connection, by backend and reason (endpoint_gone, preferred_back, rebalance, policy_changed, expired, shutdown); counted once the GOAWAY is written.",
		}, []string{"namespace", "backend", "reason"}),
	}
	m.byPath = make(map[Path]pathMetrics)
	for _, p := range []Path{PathPassthrough, PathL4, PathL4TLS, PathL7, PathHTTP1} {
		m.byPath[p] = pathMetrics{conns: m.conns.WithLabelValues(string(p)), active: m.active.WithLabelValues(string(p))}
	}
	buffers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sockmesh_proxy_copy_buffers_in_use",
		Help: "Copy buffers (64 KiB each) held by relays and streamed answer bodies; an idle relayed connection holds none.",
	}, func() float64 { return float64(bufs.InUse()) })
	for _, c := range []prometheus.Collector{m.conns, m.active, m.rejected, m.acceptErrors, m.failed, bytes, m.version, buffers, m.goAways} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register proxy metrics: %w", err)
		}
	}
	return m, nil
}

// goAway counts a GOAWAY written to a relayed HTTP/2 connection of backend
// ref (h2drain.Registry).
func (m *metrics) goAway(ref snapshot.BackendRef, why h2drain.Reason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.backends == nil || m.backends[[2]string{ref.Namespace, ref.Name}] {
		m.goAways.WithLabelValues(ref.Namespace, ref.Name, string(why)).Inc()
	}
}

// forgetGoAways drops the goaways series of the backends of old that s
// does not have, and makes none for them until the next call: the node's
// proxy outlives many Services, and each kept its series for the agent's
// life.
func (m *metrics) forgetGoAways(old, s *snapshot.Snapshot) {
	current := make(map[[2]string]bool, len(s.Backends))
	for i := range s.Backends {
		current[[2]string{s.Backends[i].Ref.Namespace, s.Backends[i].Ref.Name}] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.backends = current
	for i := range old.Backends {
		if ref := old.Backends[i].Ref; !current[[2]string{ref.Namespace, ref.Name}] {
			m.goAways.DeletePartialMatch(prometheus.Labels{"namespace": ref.Namespace, "backend": ref.Name})
		}
	}
}
