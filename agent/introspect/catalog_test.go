package introspect

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCatalog(t *testing.T) {
	c := NewCatalog()
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "a_total", Help: `say "hi", {x}`}, []string{"x", "y"})
	hist := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "b_seconds", Help: "b"}, []string{"z"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "c", Help: "c", ConstLabels: prometheus.Labels{"v": "1,2"}})
	c.MustRegister(vec, hist, g)
	if err := c.Register(prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "dup"})); err == nil {
		t.Error("registering a clashing metric: no error")
	}
	got, err := c.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	want := []MetricInfo{
		{Name: "a_total", Type: "counter", Help: `say "hi", {x}`, Labels: []string{"x", "y"}},
		{Name: "b_seconds", Type: "histogram", Help: "b", Labels: []string{"z"}},
		{Name: "c", Type: "gauge", Help: "c", ConstLabels: []string{"v"}},
	}
	if len(got) != len(want) {
		t.Fatalf("Metrics() = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Name != want[i].Name || got[i].Type != want[i].Type || got[i].Help != want[i].Help ||
			!slices.Equal(got[i].Labels, want[i].Labels) || !slices.Equal(got[i].ConstLabels, want[i].ConstLabels) {
			t.Errorf("Metrics()[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	if !c.Unregister(vec) {
		t.Fatal("Unregister: false")
	}
	if got, _ := c.Metrics(); len(got) != 2 || got[0].Name != "b_seconds" {
		t.Errorf("after Unregister: %+v", got)
	}
}
