package render

import (
	"io"
	"slices"
	"strings"

	"github.com/sockmesh/sockmesh/agent/introspect"
)

// Metrics writes the agent's metric catalog, one row per metric.
func Metrics(w io.Writer, infos []introspect.MetricInfo) error {
	t := tw(w)
	row(t, "NAME", "TYPE", "LABELS", "HELP")
	for _, m := range infos {
		labels := strings.Join(slices.Concat(m.Labels, m.ConstLabels), ",")
		row(t, m.Name, m.Type, orDash(labels), m.Help)
	}
	return t.Flush()
}
