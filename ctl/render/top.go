package render

import (
	"fmt"
	"io"
	"time"

	"github.com/sockmesh/sockmesh/ctl/top"
)

// Top writes one refresh of sockmeshctl top.
func Top(w io.Writer, v top.View) error {
	node := ""
	if v.Node != "" {
		node = "node " + v.Node + ", "
	}
	// Milliseconds: the scrapes' own latency makes the nanoseconds noise.
	interval := time.Duration(v.IntervalSeconds * float64(time.Second)).Round(time.Millisecond)
	fmt.Fprintf(w, "%srates over %s\n", node, interval)
	t := tw(w)
	row(t, "NAMESPACE", "SERVICE", "REQ/S", "5XX/S", "4XX/S", "ERROR%", "TOTAL")
	for _, s := range v.Services {
		errPct := "-"
		if s.Requests > 0 {
			errPct = fmt.Sprintf("%.1f", 100*s.Errors/s.Requests)
		}
		row(t, s.Namespace, s.Service, fmt.Sprintf("%.1f", s.Requests), fmt.Sprintf("%.1f", s.Errors),
			fmt.Sprintf("%.1f", s.ClientErrors), errPct, fmt.Sprintf("%.0f", s.Total))
	}
	if len(v.Services) == 0 {
		row(t, "-", "(no HTTP requests answered by the proxy yet)", "", "", "", "", "")
	}
	if err := t.Flush(); err != nil {
		return err
	}
	b := newBlock(w, 0)
	b.add("Datapath decisions/s", "%s", counts(v.Decisions, "%.1f"))
	b.add("Proxy connections/s", "%s", counts(v.Connections, "%.1f"))
	b.add("Proxy failures/s", "%s", counts(v.Failures, "%.1f"))
	b.add("Proxy open now", "%s", counts(v.Active, "%.0f"))
	b.flush()
	return nil
}
