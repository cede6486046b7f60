package upstream

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
)

// resultRouteTimeout is the dials' and TLS handshakes' result for one that
// a route's timeout ended (endedBy); the handshakes' "timeout" is
// HandshakeTimeout's, the endpoint's doing.
const resultRouteTimeout = "route_timeout"

type metrics struct {
	dials          *prometheus.CounterVec
	dialsOK        prometheus.Counter
	handshakes     *prometheus.CounterVec
	handshakesFull prometheus.Counter
	// handshakesResumed counts resumptions (TLS session tickets): with
	// pooling rare, without it the per-connection cost of the L4 path.
	handshakesResumed prometheus.Counter
	handshakeSeconds  prometheus.Histogram
	open              *prometheus.GaugeVec
	ejections         *prometheus.CounterVec
	poolGets          [2]prometheus.Counter // new, reused
	poolDropped       [4]prometheus.Counter // by pool.DropReason
	poolBusyAtShare   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, health *balance.Health) (*metrics, error) {
	m := &metrics{
		dials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_upstream_dials_total",
			Help: "TCP connections the proxy opened to backend endpoints, by result (ok, refused, dial_failed, canceled: the app left, route_timeout: a route's timeout passed).",
		}, []string{"result"}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_upstream_tls_handshakes_total",
			Help: "TLS handshakes toward backends, by result (full, resumed, verify_failed, timeout, failed, canceled: the app left, route_timeout: a route's timeout passed).",
		}, []string{"result"}),
		handshakeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sockmesh_proxy_upstream_tls_handshake_duration_seconds",
			Help:    "Duration of TLS handshakes toward backends.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sockmesh_proxy_upstream_connections",
			Help: "Open connections to backend endpoints (pooled, in use, or relaying), by backend.",
		}, []string{"namespace", "backend"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_upstream_endpoint_ejections_total",
			Help: "Times an endpoint was passed over for a while because a connect to it failed for want of it (refused, unreachable, timed out, or a TLS handshake it did not answer or broke off), by backend.",
		}, []string{"namespace", "backend"}),
	}
	ejected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sockmesh_proxy_upstream_endpoints_ejected",
		Help: "Endpoints passed over now because their last connect failed, or awaiting the one connection that tries them again.",
	}, func() float64 { return float64(health.Ejected(time.Now())) })
	poolGets := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sockmesh_proxy_upstream_pool_gets_total",
		Help: "HTTP/1.1 upstream connections taken for a request, by result (reused: from the pool, new: dialed).",
	}, []string{"result"})
	m.poolGets = [2]prometheus.Counter{poolGets.WithLabelValues("new"), poolGets.WithLabelValues("reused")}
	poolDropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sockmesh_proxy_upstream_pool_dropped_total",
		Help: "Pooled upstream connections (HTTP/1.1; HTTP/2 for expired and settings_changed, set aside to close once their requests end) closed instead of reused, by reason (closed: the backend ended the connection while idle; unsolicited: it sent bytes nobody asked for; expired: the certificate chain its TLS handshake verified expired; settings_changed: the backend's TLS settings or protocol changed, and the new ones would not have made it).",
	}, []string{"reason"})
	m.poolDropped = [4]prometheus.Counter{pool.DropClosed: poolDropped.WithLabelValues("closed"), pool.DropUnsolicited: poolDropped.WithLabelValues("unsolicited"),
		pool.DropExpired: poolDropped.WithLabelValues("expired"), pool.DropSettingsChanged: poolDropped.WithLabelValues("settings_changed")}
	m.poolBusyAtShare = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sockmesh_proxy_upstream_pool_busy_at_share_total",
		Help: "HTTP/1.1 requests that failed pool_busy having waited because their pod held its share of the endpoint's connections (--pool-pod-share of them, all but an eighth by default): one pod's exchanges that do not end, not the node's load.",
	})
	m.dialsOK = m.dials.WithLabelValues("ok")
	m.handshakesFull, m.handshakesResumed = m.handshakes.WithLabelValues("full"), m.handshakes.WithLabelValues("resumed")
	for _, c := range []prometheus.Collector{m.dials, m.handshakes, m.handshakeSeconds, m.open, m.ejections, ejected, poolGets, poolDropped, m.poolBusyAtShare} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register upstream metrics: %w", err)
		}
	}
	return m, nil
}
