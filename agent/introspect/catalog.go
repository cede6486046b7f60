package introspect

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Catalog is the agent's metrics registry, which also remembers what was
// registered on it: every metric's name, type, help and labels, including
// those of vectors that have no series yet (a scrape would not show them).
// docs/metrics.md is checked against it, so the reference cannot drift
// from the binary. It is safe for concurrent use.
type Catalog struct {
	*prometheus.Registry

	mu    sync.Mutex
	descs map[string]entry // by metric name
}

// entry is one registered metric.
type entry struct {
	info MetricInfo
	// kind is the type read from the collector's Go type ("" when it does
	// not tell): the type of a vector without series.
	kind string
}

// MetricInfo describes one registered metric.
type MetricInfo struct {
	Name string `json:"name"`
	// Type is counter, gauge, histogram, summary or untyped; "unknown" for a
	// custom collector that has no series yet.
	Type string `json:"type"`
	Help string `json:"help"`
	// Labels are the variable labels; ConstLabels the names of the labels
	// every series carries with one value.
	Labels      []string `json:"labels,omitempty"`
	ConstLabels []string `json:"constLabels,omitempty"`
}

// NewCatalog returns an empty Catalog around a new prometheus.Registry.
func NewCatalog() *Catalog {
	return &Catalog{Registry: prometheus.NewRegistry(), descs: map[string]entry{}}
}

// Register registers c and, when that succeeds, records its metrics.
func (c *Catalog) Register(col prometheus.Collector) error {
	if err := c.Registry.Register(col); err != nil {
		return err
	}
	kind := collectorKind(col)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range describe(col) {
		if info, ok := parseDesc(d); ok {
			c.descs[info.Name] = entry{info: info, kind: kind}
		}
	}
	return nil
}

// MustRegister registers each collector and panics on the first failure,
// as prometheus.Registry.MustRegister does.
func (c *Catalog) MustRegister(cs ...prometheus.Collector) {
	for _, col := range cs {
		if err := c.Register(col); err != nil {
			panic(err)
		}
	}
}

// Unregister unregisters col and forgets its metrics.
func (c *Catalog) Unregister(col prometheus.Collector) bool {
	if !c.Registry.Unregister(col) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range describe(col) {
		if info, ok := parseDesc(d); ok {
			delete(c.descs, info.Name)
		}
	}
	return true
}

// Metrics lists every registered metric, sorted by name. Types come from a
// Gather where the metric has series, else from the collector's Go type.
func (c *Catalog) Metrics() ([]MetricInfo, error) {
	families, err := c.Gather()
	types := map[string]string{}
	for _, mf := range families {
		types[mf.GetName()] = familyType(mf.GetType())
	}
	c.mu.Lock()
	out := make([]MetricInfo, 0, len(c.descs))
	for _, e := range c.descs {
		info := e.info
		info.Type = cmp.Or(types[info.Name], e.kind, "unknown")
		out = append(out, info)
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b MetricInfo) int { return cmp.Compare(a.Name, b.Name) })
	if err != nil {
		return out, fmt.Errorf("gather metrics: %w", err)
	}
	return out, nil
}

func describe(col prometheus.Collector) []*prometheus.Desc {
	ch := make(chan *prometheus.Desc)
	go func() {
		col.Describe(ch)
		close(ch)
	}()
	var out []*prometheus.Desc
	for d := range ch {
		out = append(out, d)
	}
	return out
}

// collectorKind is the metric type of the standard vectors and metrics;
// Gauge is checked before Counter, whose methods it also has. Histogram and
// Summary share their method set, so only the vectors tell them apart (a
// plain histogram or summary always has a series for Metrics to read).
func collectorKind(col prometheus.Collector) string {
	switch col.(type) {
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec:
		return "gauge"
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	case prometheus.Gauge:
		return "gauge"
	case prometheus.Counter:
		return "counter"
	}
	return ""
}

func familyType(t dto.MetricType) string {
	switch t {
	case dto.MetricType_COUNTER:
		return "counter"
	case dto.MetricType_GAUGE:
		return "gauge"
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		return "histogram"
	case dto.MetricType_SUMMARY:
		return "summary"
	}
	return "untyped"
}

// descRE matches prometheus.Desc.String(), the only way client_golang
// shows a Desc's parts: Desc{fqName: "x", help: "y", unit: "", constLabels:
// {a="b"}, variableLabels: {c,d}}. Names are Go-quoted, so the quoted
// groups cannot contain an unescaped quote.
var (
	descRE       = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), unit: "(?:[^"\\]|\\.)*", constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)
	constLabelRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)
)

func parseDesc(d *prometheus.Desc) (MetricInfo, bool) {
	if d.Err() != nil {
		return MetricInfo{}, false
	}
	m := descRE.FindStringSubmatch(d.String())
	if m == nil {
		return MetricInfo{}, false
	}
	name, err1 := strconv.Unquote(m[1])
	help, err2 := strconv.Unquote(m[2])
	if err1 != nil || err2 != nil {
		return MetricInfo{}, false
	}
	info := MetricInfo{Name: name, Help: help}
	for _, cl := range constLabelRE.FindAllStringSubmatch(m[3], -1) {
		info.ConstLabels = append(info.ConstLabels, cl[1])
	}
	if m[4] != "" {
		for l := range strings.SplitSeq(m[4], ",") {
			// "c(name)" marks a label with a value constraint.
			l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")")
			info.Labels = append(info.Labels, l)
		}
	}
	return info, true
}
