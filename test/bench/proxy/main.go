// Command proxy benchmarks sockmesh's proxy doing TLS origination against the
// alternatives (../shared/BENCH.md): (a) the load generator speaks TLS to the
// backend itself, (b) sockmesh's proxy on each of its speeds for HTTP/1.x
// apps — pooled (the HTTP/1 fast path, the default), l4 (TLS wrapping of the
// app's bytes), l7 (net/http's server and Transport) — and (c) Debian's
// nginx configured fairly (proxy_pass https, verify on, upstream keepalive,
// session reuse), or with -versus haproxy Debian's HAProxy, which unlike
// nginx keeps HTTP/2 to the backend for h2c clients (alpn h2). Same backend, same load generators (wrk for HTTP/1.1,
// h2load for h2c), interleaved rounds; for each scenario it prints
// requests/s, p50/p99 latency, CPU per request (proxy, backend, load
// generator) and the share of the machine's CPU left idle, and the medians
// of the per-round ratios to a and to c with their min–max, then a summary
// of the default path against c.
//
// Traffic reaches each proxy as it does from a pod: every process runs in
// a throwaway network namespace, the enrolled pod; the load generator
// connects to a Service address and sockmesh's own eBPF programs, on a
// throwaway cgroup holding the load generator and the proxies, send the
// connection to the proxy on the namespace's loopback (in-pod mode) and
// answer its SO_ORIGINAL_DST. Every proxy runs throughout behind its own
// Service address; the pod's enrolment points at the proxy being
// measured. nginx (or HAProxy) is reached at its own address, as an app
// configured to use it would.
//
// Like with like: the backend offers TLS 1.3 with X25519 only, and the
// proxy's policy asks for X25519 only (-curves default lets Go offer
// X25519MLKEM768 too, which costs a key generation per handshake).
//
// Run as root:
//
//	go run ./test/bench/proxy [-rounds 5] [-duration 5s] [-paths pooled,l4,l7] [-only keep-alive] [-streams 10] [-gogc 100] [-accelerate] [-versus nginx|haproxy] [-backend go|nginx] [-cpuprofile DIR]
//	go run ./test/bench/proxy -idle 1000 -only "h2c client 64" -paths pooled   # memory per idle connection
//
// With the Go backend two upload rows follow: the app POSTs 64 KiB and
// gets 100 B back, over HTTP/1.1 (wrk -s) and h2c (h2load -d). nginx keeps
// request bodies up to 128 KiB in memory there (client_body_buffer_size;
// by default it writes those over 16 KiB to a file first); nginx as the
// backend serves files and refuses POSTs, so -backend nginx skips them.
// So it does the MCP row: the app POSTs a JSON-RPC message (about 100 B)
// with the Mcp-Session-Id of its session and gets 100 B back; through
// sockmesh it goes to a second Service whose backend (the same server) is
// declared MCP, so each request is parsed, the ID's prefix cut and the
// endpoint pinned; nginx forwards the same requests with the backend's
// own ID (it cannot pin a session by it, nor does it need to with one
// endpoint).
//
// HTTP/2 clients run twice: with one stream per connection (h2load -m 1,
// HTTP/2 used as HTTP/1.1 is, one request at a time) and with -streams
// concurrent streams per connection (10 by default), as gRPC channels and
// browsers multiplex. nginx keeps as many idle upstream connections per
// worker as requests can be in flight (at least 64, ../shared/BENCH.md's
// value): with 64 and 500 requests in flight, most of its requests paid a
// new TLS connection to the backend, and it made a quarter of the
// requests/s it makes with enough of them. The row "keep-alive 100 B, 200
// conns" (four times -conns) puts more requests in flight than sockmesh's
// pool keeps idle per endpoint for long (64): a node's proxy carries many
// pods' requests to one backend.
//
// The backend is Go's net/http (the echo backend) unless -backend nginx:
// Debian's nginx serving the same answers as files, on the same address,
// certificate and TLS settings. Go's HTTP/2 server costs it 1.5–1.75× the
// CPU per request of its HTTP/1.1; nginx's costs about the same, so with
// it the h2c rows measure the proxies rather than the backend's h2. On
// shared cores the backend's cost also dilutes the proxies' differences.
//
// Results, with what each change measured, what was tried without gain
// and why the rows that miss nginx miss, are in RESULTS.md beside this
// file; add to it when a change is measured.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	role := flag.String("role", "", "internal: backend | proxy | idle")
	rounds := flag.Int("rounds", 5, "interleaved rounds")
	duration := flag.Duration("duration", 0, "duration of one load run (default 5s)")
	conns := flag.Int("conns", 50, "client connections")
	streams := flag.Int("streams", 10, "concurrent streams per connection in the multiplexed h2c scenarios (h2load -m)")
	dir := flag.String("dir", "", "internal: working directory with certificates")
	mode := flag.String("mode", "", "internal: proxy speed for HTTP/1.1 over TLS (pooled | l4 | l7 | http11: pooled, with the backend's protocol HTTP11)")
	listen := flag.String("listen", "", "internal: proxy listen address")
	vip := flag.String("vip", "", "internal: the Service address the proxy captures")
	paths := flag.String("paths", "pooled,l4,l7", "sockmesh speeds to measure, comma-separated; a speed may add environment variables for its proxy: pooled@GOGC=400")
	only := flag.String("only", "", "run only scenarios whose name contains this")
	gogc := flag.String("gogc", "", "GOGC for the proxies (empty: Go's default, 100)")
	procs := flag.String("gomaxprocs", "", "GOMAXPROCS for the proxies (empty: Go's default, the CPUs)")
	curves := flag.String("curves", "x25519", "key exchanges the proxy offers: x25519 | default")
	accelerate := flag.Bool("accelerate", false, "accelerate the app-to-proxy leg with sk_msg, as the agent's --accelerate does")
	versus := flag.String("versus", "nginx", "the proxy sockmesh is compared with (target c): nginx | haproxy (keeps h2 to the backend for h2c clients)")
	backend := flag.String("backend", "go", "the backend behind every target: go (net/http, whose HTTP/2 costs it 1.5–1.75× its HTTP/1.1) | nginx")
	profile := flag.String("cpuprofile", "", "write each proxy's CPU profile over the whole run to this directory (<n>-<speed>.pprof)")
	idle := flag.Int("idle", 0, "instead of load, the memory each proxy keeps per idle connection, with this many connections (one scenario a run: -only keep-alive or -only h2c)")
	url := flag.String("url", "", "internal: the idle client's URL")
	n := flag.Int("n", 0, "internal: the idle client's connections")
	h2c := flag.Bool("h2c", false, "internal: the idle client speaks h2c")
	flag.Parse()
	var err error
	switch *role {
	case "backend":
		err = runBackend(*dir)
	case "proxy":
		err = runProxy(*dir, *mode, *listen, *vip, *curves, *profile)
	case "idle":
		err = runIdleClient(*url, *n, *h2c)
	case "":
		if *streams < 1 {
			err = fmt.Errorf("-streams %d: want at least 1", *streams)
			break
		}
		if os.Geteuid() != 0 {
			err = fmt.Errorf("needs root (network namespace, cgroup, eBPF)")
			break
		}
		err = runBench(benchConfig{rounds: *rounds, duration: *duration, conns: *conns, streams: *streams, only: *only,
			paths: strings.Split(*paths, ","), gogc: *gogc, gomaxprocs: *procs, curves: *curves, profile: *profile, accelerate: *accelerate, versus: *versus, backend: *backend, command: commandLine(),
			idle: *idle})
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
	return strings.TrimSpace("go run ./test/bench/proxy " + strings.Join(os.Args[1:], " "))
}
