// Package metricsum reads counters and gauges back from a Prometheus
// registry, for tests that check what a component counted.
package metricsum

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Sum adds the values of the counter or gauge name over its series whose
// labels agree with every entry of labels (others are not compared);
// 0 when none does.
func Sum(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			} else {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
