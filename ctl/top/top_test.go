package top

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func parse(t *testing.T, at time.Time, text string) Sample {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return Sample{Time: at, Families: mfs}
}

func TestCompute(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prev := parse(t, t0, `# TYPE sockmesh_proxy_requests_total counter
sockmesh_proxy_requests_total{namespace="app",service="a",code="200",protocol="HTTP11"} 100
sockmesh_proxy_requests_total{namespace="app",service="a",code="503",protocol="HTTP11"} 10
# TYPE sockmesh_datapath_redirects_total counter
sockmesh_datapath_redirects_total{decision="redirected"} 50
sockmesh_datapath_redirects_total{decision="skipped_no_service"} 1000
# TYPE sockmesh_proxy_connections_total counter
sockmesh_proxy_connections_total{path="l4_tls"} 7
`)
	cur := parse(t, t0.Add(2*time.Second), `# TYPE sockmesh_proxy_requests_total counter
sockmesh_proxy_requests_total{namespace="app",service="a",code="200",protocol="HTTP11"} 120
sockmesh_proxy_requests_total{namespace="app",service="a",code="503",protocol="HTTP11"} 14
sockmesh_proxy_requests_total{namespace="app",service="b",code="404",protocol="H2C"} 30
sockmesh_proxy_requests_total{namespace="app",service="b",code="200",protocol="H2C"} 60
# TYPE sockmesh_datapath_redirects_total counter
sockmesh_datapath_redirects_total{decision="redirected"} 60
sockmesh_datapath_redirects_total{decision="skipped_no_service"} 1000
# TYPE sockmesh_proxy_connections_total counter
sockmesh_proxy_connections_total{path="l4_tls"} 3
# TYPE sockmesh_proxy_active_connections gauge
sockmesh_proxy_active_connections{path="l4_tls"} 2
sockmesh_proxy_active_connections{path="http1"} 1
`)
	v := Compute(prev, cur)
	if len(v.Services) != 2 {
		t.Fatalf("Compute() = %+v", v)
	}
	// b appeared since prev: its counters count from zero, so it is the
	// busiest (45/s against 12/s).
	b, a := v.Services[0], v.Services[1]
	if b.Service != "b" || b.Requests != 45 || b.ClientErrors != 15 || b.Errors != 0 || b.Total != 90 {
		t.Errorf("service b = %+v, want 45 req/s, 15 4xx/s", b)
	}
	if a.Service != "a" || a.Requests != 12 || a.Errors != 2 || a.Total != 134 {
		t.Errorf("service a = %+v, want 12 req/s, 2 5xx/s", a)
	}
	if v.Decisions["redirected"] != 5 || v.Decisions["skipped_no_service"] != 0 {
		t.Errorf("decisions = %v", v.Decisions)
	}
	// The counter went down: the agent restarted, 3 new connections.
	if v.Connections["l4_tls"] != 1.5 || v.Active["l4_tls"] != 2 || v.Active["http1"] != 1 {
		t.Errorf("connections = %v, active = %v", v.Connections, v.Active)
	}
	if z := Compute(cur, cur); z.Services[0].Requests != 0 {
		t.Errorf("no time between samples: %+v, want zero rates", z.Services[0])
	}
}

// TestComputeAcrossRestart: another agent process answers the second
// scrape (a restart, an upgrade taking the socket over) and its counters
// passed the old process's values already. They count from zero; the
// datapath's decisions, the kernel's, go on from where they were.
func TestComputeAcrossRestart(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prev := parse(t, t0, `# TYPE process_start_time_seconds gauge
process_start_time_seconds 900
# TYPE sockmesh_proxy_requests_total counter
sockmesh_proxy_requests_total{namespace="app",service="a",code="200",protocol="HTTP11"} 10
# TYPE sockmesh_proxy_connections_total counter
sockmesh_proxy_connections_total{path="l4_tls"} 4
# TYPE sockmesh_datapath_redirects_total counter
sockmesh_datapath_redirects_total{decision="redirected"} 500
`)
	cur := parse(t, t0.Add(2*time.Second), `# TYPE process_start_time_seconds gauge
process_start_time_seconds 1001
# TYPE sockmesh_proxy_requests_total counter
sockmesh_proxy_requests_total{namespace="app",service="a",code="200",protocol="HTTP11"} 30
# TYPE sockmesh_proxy_connections_total counter
sockmesh_proxy_connections_total{path="l4_tls"} 6
# TYPE sockmesh_datapath_redirects_total counter
sockmesh_datapath_redirects_total{decision="redirected"} 506
`)
	v := Compute(prev, cur)
	if len(v.Services) != 1 || v.Services[0].Requests != 15 {
		t.Errorf("Compute() across a restart: services %+v, want app/a at 15 req/s (30 since the new agent started)", v.Services)
	}
	if v.Connections["l4_tls"] != 3 {
		t.Errorf("Compute() across a restart: connections %v, want l4_tls=3 (6 since the new agent started)", v.Connections)
	}
	if v.Decisions["redirected"] != 3 {
		t.Errorf("Compute() across a restart: decisions %v, want redirected=3: the kernel's counters survive restarts", v.Decisions)
	}
}

// TestViewJSON: top -o json gave the interval as a time.Duration, an
// integer of nanoseconds under "interval" that a script had to know to
// divide. It is seconds now, as every rate beside it is per second. And
// with no HTTP request answered yet, services was null, not a list.
func TestViewJSON(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b, err := json.Marshal(Compute(Sample{Time: t0}, Sample{Time: t0.Add(1500 * time.Millisecond)}))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got["intervalSeconds"] != 1.5 || got["interval"] != nil {
		t.Errorf("View JSON = %s, want intervalSeconds 1.5 and no interval", b)
	}
	if s, ok := got["services"].([]any); !ok || len(s) != 0 {
		t.Errorf("View JSON = %s, want services an empty list", b)
	}
}
