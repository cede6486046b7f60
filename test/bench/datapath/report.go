package main

import (
	"fmt"
	"io"
	"slices"
)

// scenario is one figure measured on every path.
type scenario struct {
	name           string
	kind           string // job kind
	size           int
	higherIsBetter bool // connections/s; round trips are better lower
}

// value is the figure of one sample: connections per second, or the median
// round trip in microseconds.
func (sc scenario) value(s sample) float64 {
	if sc.kind == "conn" {
		return float64(s.res.Ops) / s.res.Seconds
	}
	return float64(s.res.P50.Nanoseconds()) / 1e3
}

func (sc scenario) unit() string {
	if sc.kind == "conn" {
		return "conn/s"
	}
	return "µs"
}

// report prints, per scenario, each path's median value and proxy CPU per
// operation, and the medians (with min–max) of the per-round ratios.
func report(w io.Writer, scenarios []scenario, results map[string]map[string][]sample, rounds int) {
	fmt.Fprintf(w, "\nsockmesh datapath benchmark: %d interleaved rounds; medians of per-round values and ratios [min–max]\n\n", rounds)
	fmt.Fprintf(w, "| scenario | direct | iptables | ebpf | ebpf/iptables | iptables/direct | ebpf/direct | proxy CPU µs/op iptables | proxy CPU µs/op ebpf |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|\n")
	for _, sc := range scenarios {
		byPath := results[sc.name]
		vals := func(name string) []float64 {
			var out []float64
			for _, s := range byPath[name] {
				out = append(out, sc.value(s))
			}
			return out
		}
		cpu := func(name string) string {
			var out []float64
			for _, s := range byPath[name] {
				if s.res.Ops > 0 {
					out = append(out, s.proxyCPUs*1e6/float64(s.res.Ops))
				}
			}
			return fmt.Sprintf("%.1f", median(out))
		}
		d, i, e := vals("direct"), vals("iptables"), vals("ebpf")
		fmt.Fprintf(w, "| %s | %.0f %s | %.0f %s | %.0f %s | %s | %s | %s | %s | %s |\n", sc.name,
			median(d), sc.unit(), median(i), sc.unit(), median(e), sc.unit(),
			ratios(e, i), ratios(i, d), ratios(e, d), cpu("iptables"), cpu("ebpf"))
	}
	fmt.Fprintf(w, "\nconnections/s: a ratio above 1 means the numerator is faster; round trip: below 1 means faster.\n")
	fmt.Fprintf(w, "Target: ebpf/iptables >= 1 for connections/s and <= 1 for round trips.\n")
	fmt.Fprintf(w, "proxy CPU: user+system time of the proxy process (10 ms ticks) per operation.\n")
}

// ratios formats the median and range of a[k]/b[k] over rounds k.
func ratios(a, b []float64) string {
	var r []float64
	for k := range min(len(a), len(b)) {
		if b[k] != 0 {
			r = append(r, a[k]/b[k])
		}
	}
	if len(r) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f [%.2f–%.2f]", median(r), slices.Min(r), slices.Max(r))
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
