package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

type scenarioResult struct {
	s   scenario
	res map[string][]result
}

type metric struct {
	name string
	f    func(result) float64
}

var (
	rps = metric{"req/s", func(r result) float64 { return r.rps }}
	p50 = metric{"p50", func(r result) float64 { return r.p50 }}
	p99 = metric{"p99", func(r result) float64 { return r.p99 }}
	cpu = metric{"CPU/req", func(r result) float64 { return r.cpuPerReq }}
	// all is the CPU of proxy, backend and load generator together per
	// request: on shared cores, the budget requests/s comes out of.
	allCPU = metric{"all CPU/req", func(r result) float64 { return r.cpuPerReq + r.backendCPU + r.loadCPU }}
	idle   = metric{"idle", func(r result) float64 { return r.idle }}
)

// report prints one scenario as a Markdown table: medians per target, then
// each target's per-round ratios to a (direct) and to c (nginx or HAProxy).
func report(s scenario, c benchConfig, targets []target, res map[string][]result) {
	fmt.Printf("\n## %s\n\n`%s <url>`\n\n", s.name, strings.Join(loadCommand(s, c), " "))
	fmt.Println("| target | req/s | p50 | p99 | CPU µs/req proxy / backend / load gen. | idle | req/s ÷a | p50 ÷a | p99 ÷a | req/s ÷c | p50 ÷c | p99 ÷c | CPU/req ÷c |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	a, n := res["a direct TLS"], res[c.versusName()]
	backend := metric{"backend", func(r result) float64 { return r.backendCPU }}
	loadgen := metric{"load", func(r result) float64 { return r.loadCPU }}
	for _, t := range targets {
		rs := res[t.name]
		fmt.Printf("| %s | %.0f | %s | %s | %s / %s / %s | %.0f %% |", t.name, median(rs, rps), dur(median(rs, p50)), dur(median(rs, p99)),
			cpuStr(median(rs, cpu)), cpuStr(median(rs, backend)), cpuStr(median(rs, loadgen)), 100*median(rs, idle))
		for _, m := range []metric{rps, p50, p99} {
			fmt.Printf(" %s |", ratio(rs, a, m))
		}
		for _, m := range []metric{rps, p50, p99, cpu} {
			fmt.Printf(" %s |", ratio(rs, n, m))
		}
		fmt.Println()
	}
}

// reportSummary prints each sockmesh speed against target c, scenario by
// scenario: the targets against nginx are req/s ≥ 1.0 and p99 ≤ 1.0.
func reportSummary(c benchConfig, targets []target, all []scenarioResult) {
	fmt.Printf("\n## Summary: sockmesh ÷ %s (target: req/s ≥ 1.0, p99 ≤ 1.0)\n\n", c.versus)
	vs := c.versusName()
	fmt.Println("| scenario | speed | req/s | p50 | p99 | proxy CPU/req | all CPU/req | idle b / c |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, sr := range all {
		for _, t := range targets {
			if !strings.HasPrefix(t.name, "b ") {
				continue
			}
			fmt.Printf("| %s | %s |", sr.s.name, strings.TrimPrefix(t.name, "b sockmesh "))
			for _, m := range []metric{rps, p50, p99, cpu, allCPU} {
				fmt.Printf(" %s |", ratio(sr.res[t.name], sr.res[vs], m))
			}
			fmt.Printf(" %.0f %% / %.0f %% |\n", 100*median(sr.res[t.name], idle), 100*median(sr.res[vs], idle))
		}
	}
}

func median(rs []result, m metric) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = m.f(r)
	}
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}

// ratio is the median of per-round ratios num/den with min–max.
func ratio(num, den []result, m metric) string {
	var v []float64
	for i := range min(len(num), len(den)) {
		if d := m.f(den[i]); d > 0 && m.f(num[i]) > 0 {
			v = append(v, m.f(num[i])/d)
		}
	}
	if len(v) == 0 {
		return "–"
	}
	slices.Sort(v)
	return fmt.Sprintf("%.2f (%.2f–%.2f)", v[len(v)/2], v[0], v[len(v)-1])
}

func dur(s float64) string {
	d := time.Duration(s * 1e9)
	if d < time.Millisecond {
		return d.Round(time.Microsecond).String()
	}
	return d.Round(10 * time.Microsecond).String()
}

func cpuStr(s float64) string {
	if s == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f", s*1e6)
}
