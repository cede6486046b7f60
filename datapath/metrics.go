package datapath

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector exposes the per-decision counters, read from the kernel at each
// scrape.
type collector struct {
	d    *Datapath
	desc *prometheus.Desc
}

func newCollector(d *Datapath) *collector {
	return &collector{
		d: d,
		desc: prometheus.NewDesc("sockmesh_datapath_redirects_total",
			"TCP connect() calls seen by the datapath's connect hooks, by decision: redirected to the proxy, "+
				"or why not (skipped_not_enrolled, skipped_no_service, skipped_marked, skipped_proxy_stale, "+
				"skipped_no_proxy) or refused (denied_no_proxy).",
			[]string{"decision"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.d.Counters()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, dec := range Decisions() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(counts[dec]), dec.String())
	}
}
