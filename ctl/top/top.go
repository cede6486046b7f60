package top

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// The metrics top reads.
const (
	metricRequests  = "sockmesh_proxy_requests_total"
	metricDecisions = "sockmesh_datapath_redirects_total"
	metricActive    = "sockmesh_proxy_active_connections"
	metricConns     = "sockmesh_proxy_connections_total"
	metricFailures  = "sockmesh_proxy_connection_failures_total"
	// metricStart is client_golang's process collector's: it changes when
	// another agent process answers (a restart, an upgrade's takeover).
	metricStart = "process_start_time_seconds"
)

// Sample is one scrape and when it was taken.
type Sample struct {
	Time     time.Time
	Families map[string]*dto.MetricFamily
}

// View is what changed between two samples.
type View struct {
	Node string `json:"node,omitempty"`
	// IntervalSeconds is the time between the two samples, in seconds.
	IntervalSeconds float64 `json:"intervalSeconds"`
	// Services are sorted by requests per second, busiest first.
	Services []Service `json:"services"`
	// Decisions are datapath decisions per second, by decision label.
	Decisions map[string]float64 `json:"decisions"`
	// Connections are new proxy connections per second; Failures are
	// connections reset because the backend could not be reached or
	// honoured, per second; Active are open now. Each by path.
	Connections map[string]float64 `json:"connections"`
	Failures    map[string]float64 `json:"failures"`
	Active      map[string]float64 `json:"active"`
}

// Service is one captured Service's HTTP traffic through the proxy.
type Service struct {
	Namespace string  `json:"namespace"`
	Service   string  `json:"service"`
	Requests  float64 `json:"requestsPerSecond"`
	// Errors are 5xx answers per second (the proxy's own fail-closed 503s
	// included); ClientErrors 4xx.
	Errors       float64 `json:"errorsPerSecond"`
	ClientErrors float64 `json:"clientErrorsPerSecond"`
	// Total is every request answered since the agent started.
	Total float64 `json:"total"`
}

// Compute returns the rates between prev and cur. The proxy's counters
// count from zero when another agent process answers cur than prev (its
// process_start_time_seconds differs): a restarted agent's counters may
// have passed the old ones' values by the time of cur. The datapath's
// decisions are the kernel's and survive restarts. Any counter that went
// down counts from zero too.
func Compute(prev, cur Sample) View {
	dt := cur.Time.Sub(prev.Time)
	// Empty, not nil: JSON null where a script expects a list breaks it.
	v := View{IntervalSeconds: dt.Seconds(), Services: []Service{}, Decisions: map[string]float64{}, Connections: map[string]float64{},
		Failures: map[string]float64{}, Active: map[string]float64{}}
	restarted := startTime(prev) != startTime(cur)
	rate := func(name string, m *dto.Metric) float64 {
		now := value(m)
		before := value(find(prev.Families[name], m))
		if now < before || restarted && name != metricDecisions {
			before = 0
		}
		if dt <= 0 {
			return 0
		}
		return (now - before) / dt.Seconds()
	}
	type key struct{ ns, svc string }
	svcs := map[key]*Service{}
	for _, m := range cur.Families[metricRequests].GetMetric() {
		k := key{label(m, "namespace"), label(m, "service")}
		s := svcs[k]
		if s == nil {
			s = &Service{Namespace: k.ns, Service: k.svc}
			svcs[k] = s
		}
		r := rate(metricRequests, m)
		s.Requests += r
		s.Total += value(m)
		code, _ := strconv.Atoi(label(m, "code"))
		switch {
		case code >= 500:
			s.Errors += r
		case code >= 400:
			s.ClientErrors += r
		}
	}
	for _, s := range svcs {
		v.Services = append(v.Services, *s)
	}
	slices.SortFunc(v.Services, func(a, b Service) int {
		return cmp.Or(cmp.Compare(b.Requests, a.Requests), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Service, b.Service))
	})
	for _, m := range cur.Families[metricDecisions].GetMetric() {
		v.Decisions[label(m, "decision")] += rate(metricDecisions, m)
	}
	for _, m := range cur.Families[metricConns].GetMetric() {
		v.Connections[label(m, "path")] += rate(metricConns, m)
	}
	for _, m := range cur.Families[metricFailures].GetMetric() {
		v.Failures[label(m, "path")] += rate(metricFailures, m)
	}
	for _, m := range cur.Families[metricActive].GetMetric() {
		v.Active[label(m, "path")] += value(m)
	}
	return v
}

// startTime is the agent process's start time in s, 0 if it has none.
func startTime(s Sample) float64 {
	if ms := s.Families[metricStart].GetMetric(); len(ms) > 0 {
		return value(ms[0])
	}
	return 0
}

// find returns the metric of mf with the same labels as m.
func find(mf *dto.MetricFamily, m *dto.Metric) *dto.Metric {
	for _, o := range mf.GetMetric() {
		if slices.EqualFunc(o.GetLabel(), m.GetLabel(), func(a, b *dto.LabelPair) bool {
			return a.GetName() == b.GetName() && a.GetValue() == b.GetValue()
		}) {
			return o
		}
	}
	return nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m == nil:
		return 0
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
