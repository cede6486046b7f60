// Command proxy benchmarks sockmesh's proxy doing TLS origination against the
// alternatives (../shared/BENCH.md): (a) the load generator speaks TLS to the
// backend itself, (b) sockmesh's proxy on each of its speeds for HTTP/1.x
// apps — pooled (the HTTP/1 fast path, the default), l4 (TLS wrapping of the
// app's bytes), l7 (net/http's server and Transport) — and (c) Debian's
// nginx configured fairly (proxy_pass https, verify on, upstream keepalive,
// session reuse). Same backend, same load generators (wrk for HTTP/1.1,
// h2load for h2c), interleaved rounds; for each scenario it prints
// requests/s, p50/p99 latency and proxy CPU per request, and the medians of
// the per-round ratios to a and to c with their min–max, then a summary of
// the default path against nginx.
//
// Traffic reaches each proxy as it would from a pod: the load generator
// connects to a Service address and an iptables REDIRECT in a throwaway
// network namespace sends it to the proxy, whose SO_ORIGINAL_DST lookup
// conntrack answers just as sockmesh's eBPF getsockopt program does. Every
// proxy runs throughout, each behind its own Service address.
//
// Like with like: the backend offers TLS 1.3 with X25519 only, and the
// proxy's policy asks for X25519 only (-curves default lets Go offer
// X25519MLKEM768 too, which costs a key generation per handshake).
//
// Run as root:
//
//	go run ./test/bench/proxy [-rounds 5] [-duration 5s] [-paths pooled,l4,l7] [-only keep-alive] [-gogc 100]
//
// Measured on the 2-core machine of ../shared/BENCH.md, whose cores other
// builds shared (provisional: the same code path measured twice in one run
// differed by up to 20 %, so read ratios to one decimal). Medians of
// per-round ratios to nginx (min–max), -rounds 7 -duration 4s:
//
//	scenario                 default (pooled)            l4                  l7 (net/http)       proxy CPU/req pooled ÷ nginx
//	keep-alive 100 B         req/s 0.80 (0.67–1.32) p99 1.02   0.98 / 0.95         0.65 / 1.52         1.09
//	keep-alive 64 KiB        req/s 1.06 (0.95–1.55) p99 0.95   1.00 / 0.98         0.91 / 1.15         0.99
//	conn-per-request 100 B   req/s 0.87 (0.77–0.99) p99 1.02   0.26 / 4.16         0.69 / 1.50         1.51
//	h2c client 100 B         (L4 for every speed)              0.87 / 1.09                             1.11 (l4)
//
// and on a quieter run (-rounds 5): keep-alive 100 B 0.88 / p99 0.82,
// 64 KiB 1.03 / 1.11, connection per request 0.86 / 1.10. Before the pooled
// path, the default for HTTP/1.x to TLS backends was l4 (0.16–0.26 of nginx
// with a connection per request).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

func main() {
	role := flag.String("role", "", "internal: backend | proxy | inner")
	rounds := flag.Int("rounds", 5, "interleaved rounds")
	duration := flag.Duration("duration", 0, "duration of one load run (default 5s)")
	conns := flag.Int("conns", 50, "client connections")
	dir := flag.String("dir", "", "internal: working directory with certificates")
	mode := flag.String("mode", "", "internal: proxy speed for HTTP/1.1 over TLS (pooled | l4 | l7 | http11: pooled, with the backend's protocol HTTP11)")
	listen := flag.String("listen", "", "internal: proxy listen address")
	vip := flag.String("vip", "", "internal: the Service address the proxy captures")
	paths := flag.String("paths", "pooled,l4,l7", "sockmesh speeds to measure, comma-separated; a speed may add environment variables for its proxy: pooled@GOGC=400")
	only := flag.String("only", "", "run only scenarios whose name contains this")
	gogc := flag.String("gogc", "", "GOGC for the proxies (empty: Go's default, 100)")
	procs := flag.String("gomaxprocs", "", "GOMAXPROCS for the proxies (empty: Go's default, the CPUs)")
	curves := flag.String("curves", "x25519", "key exchanges the proxy offers: x25519 | default")
	profile := flag.String("cpuprofile", "", "write each proxy's CPU profile over the whole run to this directory (<n>-<speed>.pprof)")
	flag.Parse()
	var err error
	switch *role {
	case "backend":
		err = runBackend(*dir)
	case "proxy":
		err = runProxy(*dir, *mode, *listen, *vip, *curves, *profile)
	case "inner":
		err = runBench(benchConfig{rounds: *rounds, duration: *duration, conns: *conns, only: *only,
			paths: strings.Split(*paths, ","), gogc: *gogc, gomaxprocs: *procs, curves: *curves, profile: *profile, command: commandLine()})
	case "":
		err = inNetns(os.Args[1:])
	default:
		err = fmt.Errorf("unknown role %q", *role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// commandLine is how this run was started, for the report's header.
func commandLine() string {
	var args []string
	for _, a := range os.Args[1:] {
		if a == "-role" || a == "inner" {
			continue
		}
		args = append(args, a)
	}
	return strings.TrimSpace("go run ./test/bench/proxy " + strings.Join(args, " "))
}

// inNetns re-runs this program with -role inner inside a throwaway network
// namespace, so its iptables rules and addresses vanish with it.
func inNetns(args []string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (network namespace, iptables)")
	}
	ns := "smt-" + strconv.Itoa(os.Getpid()) + "-bench"
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %v: %s", ns, err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, exe, "-role", "inner"}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}
