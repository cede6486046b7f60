package datapath

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector exposes the per-decision and acceleration counters, read from the
// kernel at each scrape.
type collector struct {
	d     *Datapath
	desc  *prometheus.Desc
	accel *prometheus.Desc
}

func newCollector(d *Datapath) *collector {
	return &collector{
		d: d,
		desc: prometheus.NewDesc("sockmesh_datapath_redirects_total",
			"TCP connect() calls seen by the datapath's connect hooks, by decision: redirected to the proxy, "+
				"or why not (skipped_not_enrolled, skipped_no_service, skipped_marked, skipped_proxy_stale, "+
				"skipped_no_proxy) or refused (denied_no_proxy).",
			[]string{"decision"}, nil),
		accel: prometheus.NewDesc("sockmesh_datapath_accel_sockets_total",
			"Sockets of redirected connections under acceleration (--accelerate), by event: joined the map, "+
				"redirected (bytes go to the peer directly), peer_missing (first message before the peer joined: TCP), "+
				"over_budget (256 KiB unanswered or unread: TCP from then on), peer_gone (the peer closed: TCP).",
			[]string{"event"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.accel
}

// Collect reads each map on its own: one that cannot be read fails its
// metric only.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	if counts, err := c.d.Counters(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
	} else {
		for _, dec := range Decisions() {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(counts[dec]), dec.String())
		}
	}
	a, err := c.d.AccelCounters()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.accel, err)
		return
	}
	for event, n := range map[string]uint64{
		"joined": a.Joined, "redirected": a.Redirected, "peer_missing": a.PeerMissing,
		"over_budget": a.OverBudget, "peer_gone": a.PeerGone,
	} {
		ch <- prometheus.MustNewConstMetric(c.accel, prometheus.CounterValue, float64(n), event)
	}
}
