package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/agent/introspect"
)

// docMetric is one row of docs/metrics.md.
type docMetric struct {
	name, typ, when, meaning string
	labels                   []string
}

var (
	docRowRE  = regexp.MustCompile("^\\| `([a-z_*]+)` \\| ([a-z]+) \\|([^|]*)\\| ([a-z-]+) \\| (.+) \\|$")
	labelRE   = regexp.MustCompile("`([a-z_]+)`")
	metricRE  = regexp.MustCompile(`^sockmesh_[a-z]+_[a-z_]+$`)
	docTypes  = []string{"counter", "gauge", "histogram", "summary", "various"}
	docWhens  = []string{"always", "kubernetes", "file", "leader"}
	wildcards = func(name string) bool { return strings.HasSuffix(name, "*") }
)

// readDoc parses docs/metrics.md's tables.
func readDoc(t *testing.T) []docMetric {
	t.Helper()
	raw, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []docMetric
	for n, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		m := docRowRE.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("%s:%d: not a | `name` | type | labels | when | meaning | row: %q", docPath, n+1, line)
			continue
		}
		d := docMetric{name: m[1], typ: m[2], when: m[4], meaning: strings.TrimSpace(m[5])}
		for _, l := range labelRE.FindAllStringSubmatch(m[3], -1) {
			d.labels = append(d.labels, l[1])
		}
		out = append(out, d)
	}
	return out
}

// TestMetricsDocFormat checks docs/metrics.md on its own: well-formed rows,
// names by the project's convention, each documented once.
func TestMetricsDocFormat(t *testing.T) {
	doc := readDoc(t)
	if len(doc) < 30 {
		t.Fatalf("%s has %d metrics; the parser must be missing rows", docPath, len(doc))
	}
	seen := map[string]bool{}
	for _, d := range doc {
		if seen[d.name] {
			t.Errorf("%s documented twice", d.name)
		}
		seen[d.name] = true
		if !slices.Contains(docTypes, d.typ) || !slices.Contains(docWhens, d.when) || d.meaning == "" {
			t.Errorf("%s: type %q, when %q, meaning %q", d.name, d.typ, d.when, d.meaning)
		}
		if wildcards(d.name) {
			continue
		}
		if !metricRE.MatchString(d.name) {
			t.Errorf("%s: not sockmesh_<subsystem>_<what>_<unit>", d.name)
		}
		if (d.typ == "counter") != strings.HasSuffix(d.name, "_total") {
			t.Errorf("%s: a %s; counters, and only counters, end in _total", d.name, d.typ)
		}
	}
}

// checkCatalog fails t with catalogProblems.
func checkCatalog(t *testing.T, catalog []introspect.MetricInfo, when ...string) {
	t.Helper()
	for _, p := range catalogProblems(readDoc(t), catalog, when) {
		t.Error(p)
	}
}

// catalogProblems lists every metric of catalog (an agent's registry, run
// with the conditions when) that doc lacks or describes with another type
// or labels, and every documented metric of those conditions that the
// agent did not register.
func catalogProblems(doc []docMetric, catalog []introspect.MetricInfo, when []string) []string {
	var out []string
	byName := map[string]docMetric{}
	for _, d := range doc {
		byName[d.name] = d
	}
	registered := map[string]bool{}
	for _, m := range catalog {
		registered[m.Name] = true
		d, ok := byName[m.Name]
		if !ok {
			if !slices.ContainsFunc(doc, func(d docMetric) bool {
				return wildcards(d.name) && strings.HasPrefix(m.Name, strings.TrimSuffix(d.name, "*"))
			}) {
				out = append(out, fmt.Sprintf("metric %s (%s, labels %v: %q) is registered but not documented in %s", m.Name, m.Type, m.Labels, m.Help, docPath))
			}
			continue
		}
		labels := slices.Concat(m.Labels, m.ConstLabels)
		slices.Sort(labels)
		want := slices.Sorted(slices.Values(d.labels))
		if d.typ != m.Type || !slices.Equal(labels, want) {
			out = append(out, fmt.Sprintf("metric %s is a %s with labels %v; %s says a %s with labels %v", m.Name, m.Type, labels, docPath, d.typ, want))
		}
		if !slices.Contains(when, d.when) {
			out = append(out, fmt.Sprintf("metric %s is registered with %v; %s says only when %q", m.Name, when, docPath, d.when))
		}
	}
	for _, d := range doc {
		if !wildcards(d.name) && slices.Contains(when, d.when) && !registered[d.name] {
			out = append(out, fmt.Sprintf("%s documents %s (when %s), which an agent run with %v does not register", docPath, d.name, d.when, when))
		}
	}
	return out
}

// TestCatalogProblems checks that the documentation check catches what it
// is for.
func TestCatalogProblems(t *testing.T) {
	doc := []docMetric{
		{name: "sockmesh_a_total", typ: "counter", when: "always", labels: []string{"x"}},
		{name: "sockmesh_b", typ: "gauge", when: "file"},
		{name: "go_*", typ: "various", when: "always"},
	}
	for _, c := range []struct {
		name    string
		catalog []introspect.MetricInfo
		when    []string
		want    []string
	}{
		{"all documented", []introspect.MetricInfo{
			{Name: "sockmesh_a_total", Type: "counter", Labels: []string{"x"}}, {Name: "go_threads", Type: "gauge"},
		}, []string{"always"}, nil},
		{"undocumented", []introspect.MetricInfo{
			{Name: "sockmesh_a_total", Type: "counter", Labels: []string{"x"}}, {Name: "sockmesh_c_total", Type: "counter"},
		}, []string{"always"}, []string{"sockmesh_c_total (counter, labels []: \"\") is registered but not documented"}},
		{"other labels and type", []introspect.MetricInfo{
			{Name: "sockmesh_a_total", Type: "gauge", Labels: []string{"y"}},
		}, []string{"always"}, []string{"sockmesh_a_total is a gauge with labels [y]"}},
		{"documented, not registered", []introspect.MetricInfo{
			{Name: "sockmesh_a_total", Type: "counter", Labels: []string{"x"}},
		}, []string{"always", "file"}, []string{"documents sockmesh_b (when file)"}},
		{"registered where the doc says it is not", []introspect.MetricInfo{
			{Name: "sockmesh_a_total", Type: "counter", Labels: []string{"x"}}, {Name: "sockmesh_b", Type: "gauge"},
		}, []string{"always"}, []string{`sockmesh_b is registered with [always]; ../../docs/metrics.md says only when "file"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := catalogProblems(doc, c.catalog, c.when)
			if len(got) != len(c.want) {
				t.Fatalf("catalogProblems() = %q, want %d problems like %q", got, len(c.want), c.want)
			}
			for i := range c.want {
				if !strings.Contains(got[i], c.want[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], c.want[i])
				}
			}
		})
	}
}
