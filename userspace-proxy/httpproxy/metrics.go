package httpproxy

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// metrics are the Handler's series of requests and their outcomes (docs/metrics.md).
type metrics struct {
	requests      *prometheus.CounterVec
	failures      *prometheus.CounterVec
	upgradedBytes prometheus.Counter
	// GAMMA routes: the proxy's own answers, retries, timeouts, mirrors.
	routeAnswers *prometheus.CounterVec
	retries      *prometheus.CounterVec
	// budgetExhausted counts retries a backend's retry budget refused.
	budgetExhausted *prometheus.CounterVec
	timeouts        *prometheus.CounterVec
	mirrors         *prometheus.CounterVec
	mu              sync.Mutex
	cache           map[requestKey]prometheus.Counter
	// captured holds the Services of the last retain's snapshot (nil
	// before the first). A request under way on an older snapshot that
	// ends after its Service left counts in gone, registered nowhere: its
	// series, made again, would stay until the next snapshot (as one that
	// found its counter before counts in the series dropped).
	captured map[[2]string]bool
	gone     prometheus.Counter
}

type requestKey struct {
	namespace, service string
	code               int
	protocol           string
}

// newMetrics registers the Handler's series; mirrorSlots, the mirrors'
// semaphore, is read for the mirrors in flight.
func newMetrics(reg prometheus.Registerer, mirrorSlots chan struct{}) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_requests_total",
			Help: "HTTP requests the proxy answered, by captured Service, status code and backend protocol.",
		}, []string{"namespace", "service", "code", "protocol"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_request_failures_total",
			Help: "HTTP requests the proxy could not forward, by reason.",
		}, []string{"reason"}),
		upgradedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sockmesh_proxy_upgraded_bytes_total",
			Help: "Bytes relayed over upgraded (WebSocket) streams, both directions.",
		}),
		routeAnswers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_route_answers_total",
			Help: "Requests a GAMMA route had the proxy answer itself (no rule matched, a redirect, a CORS preflight, an ExternalAuth denial...), by reason; docs/metrics.md lists the reasons.",
		}, []string{"reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_request_retries_total",
			Help: "Retries of routed requests, and resends of streams an HTTP/2 backend refused, by what was retried (connect, status, grpc_unavailable, backend_timeout, refused_stream).",
		}, []string{"reason"}),
		budgetExhausted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_retry_budget_exhausted_total",
			Help: "Retries of routed requests that the backend's retry budget (XBackendTrafficPolicy) refused, the client getting 503, by what would have been retried (connect, status, grpc_unavailable, backend_timeout).",
		}, []string{"reason"}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_request_timeouts_total",
			Help: "Routed requests a route timeout ended, by timeout (request, backend_request).",
		}, []string{"timeout"}),
		mirrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_proxy_mirrored_requests_total",
			Help: "Request copies for RequestMirror filters, by result (sent, failed, dropped_busy, dropped_body, dropped_upgrade).",
		}, []string{"result"}),
		cache: make(map[requestKey]prometheus.Counter),
		gone:  prometheus.NewCounter(prometheus.CounterOpts{Name: "sockmesh_proxy_requests_gone_total"}),
	}
	// A slot is held from before the main request is sent until the
	// mirror's goroutine has counted its result: once this reads 0, every
	// copy taken is in mirrors.
	mirrorsInFlight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sockmesh_proxy_mirrored_requests_in_flight",
		Help: "Request copies for RequestMirror filters under way: sent or being sent, not yet counted in sockmesh_proxy_mirrored_requests_total.",
	}, func() float64 { return float64(len(mirrorSlots)) })
	for _, c := range []prometheus.Collector{m.requests, m.failures, m.upgradedBytes, m.routeAnswers, m.retries, m.budgetExhausted, m.timeouts, m.mirrors, mirrorsInFlight} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// request counts one answered request.
func (m *metrics) request(f *snapshot.Frontend, code int, protocol string) {
	m.counter(f, code, protocol).Inc()
}

// counter returns the requests counter for these labels; the cache keeps
// the hot path free of label hashing and slice allocations.
func (m *metrics) counter(f *snapshot.Frontend, code int, protocol string) prometheus.Counter {
	var k requestKey
	if f != nil {
		k = requestKey{f.Service.Namespace, f.Service.Name, code, protocol}
	} else {
		k = requestKey{code: code, protocol: protocol}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.cache[k]
	if !ok {
		if k.service != "" && m.captured != nil && !m.captured[[2]string{k.namespace, k.service}] {
			return m.gone
		}
		c = m.requests.WithLabelValues(k.namespace, k.service, httpCode(code), protocol)
		m.cache[k] = c
	}
	return c
}

// retain drops the requests series, and their cached counters, of the
// Services s does not capture, and makes none for them until the next
// call: the node's proxy outlives many Services, and each kept a series
// per code and protocol for the agent's life.
func (m *metrics) retain(s *snapshot.Snapshot) {
	captured := make(map[[2]string]bool, len(s.Frontends))
	for i := range s.Frontends {
		captured[[2]string{s.Frontends[i].Service.Namespace, s.Frontends[i].Service.Name}] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.captured = captured
	for k := range m.cache {
		if k.service != "" && !captured[[2]string{k.namespace, k.service}] {
			delete(m.cache, k)
			m.requests.DeleteLabelValues(k.namespace, k.service, httpCode(k.code), k.protocol)
		}
	}
}

func httpCode(c int) string {
	const digits = "0123456789"
	if c < 100 || c > 999 {
		return "other"
	}
	return string([]byte{digits[c/100], digits[c/10%10], digits[c%10]})
}
