package main

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/test/bench/internal/benchrun"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

type benchConfig struct {
	rounds   int
	duration time.Duration
	conns    int
	streams  int // concurrent streams per connection in the multiplexed h2c scenarios
	only     string
	paths    []string // sockmesh speeds: pooled, l4, l7
	gogc     string
	// gomaxprocs is GOMAXPROCS for the proxies; empty keeps Go's default.
	gomaxprocs string
	curves     string
	profile    string
	command    string
	// accelerate turns on the datapath's sk_msg acceleration (--accelerate).
	accelerate bool
	// versus is the proxy target c runs: nginx, or haproxy, which unlike
	// nginx can keep HTTP/2 to the backend.
	versus string
	// backend is the server behind every target: go (the echo backend,
	// net/http) or nginx.
	backend string
	// backendPID is the backend's process, whose CPU each run reports.
	backendPID int
	capture    *capture
	// mcpSessionID is the MCP row's session ID as apps hold it through
	// sockmesh (mcpSessionID).
	mcpSessionID string
	// idle, when positive, measures memory per idle connection with that
	// many connections instead of the load scenarios (idle.go).
	idle int
}

// result is one load run.
type result struct {
	rps, p50, p99 float64 // requests/s, seconds
	cpuPerReq     float64 // proxy CPU seconds per request (0 for direct)
	// backendCPU and loadCPU are the backend's and the load generator's
	// CPU seconds per request: on shared cores, what a proxy makes them
	// spend is throughput it takes away.
	backendCPU, loadCPU float64
	// idle is the share of the machine's CPU time left idle during the
	// run: at equal CPU per request, what separates the requests/s of
	// two targets (requests waiting on wakeups rather than on CPU).
	idle float64
}

type scenario struct {
	name string
	h2   bool // h2load (h2c to the proxies, h2 over TLS direct) instead of wrk
	// streams is h2load's concurrent streams per connection (-m): 1 uses
	// HTTP/2 as HTTP/1.1 is used, one request at a time; more multiplexes,
	// as gRPC channels and browsers do.
	streams int
	path    string // request path
	cpr     bool   // one connection per request
	// conns is the client connections, when not -conns.
	conns int
	// upload, when set, is a file of bytes each request POSTs (the load
	// generator's script for wrk, its data file for h2load).
	upload string
	// mcp sends the requests to the Service whose backend the proxies
	// declare MCP, with the session's Mcp-Session-Id (mcpSession).
	mcp bool
}

// versusName is the name of target c, the proxy sockmesh is measured
// against.
func (c benchConfig) versusName() string { return "c " + c.versus }

// startVersus configures and starts the proxy of target c in dir: Debian's
// nginx or HAProxy, configured fairly (../shared/BENCH.md), each with a
// listener for HTTP/1.1 clients and one for h2c clients. nginx can only
// speak HTTP/1.1 to the backend; HAProxy speaks h2 there to h2c clients'
// requests (alpn h2, one backend connection multiplexing many clients).
func startVersus(versus, dir string, concurrency int, start func(*exec.Cmd) (*exec.Cmd, error)) (target, error) {
	var cmd *exec.Cmd
	switch versus {
	case "nginx":
		// Idle upstream connections kept per worker: at least as many as
		// requests in flight, or every request beyond them pays a new TLS
		// connection to the backend.
		keepalive := max(64, concurrency)
		if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), fmt.Appendf(nil, nginxConf, dir, backendAddr, versusH1, versusH2C, sni, keepalive), 0o600); err != nil {
			return target{}, err
		}
		cmd = exec.Command("/usr/sbin/nginx", "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-g", "daemon off;")
	case "haproxy":
		if err := os.WriteFile(filepath.Join(dir, "haproxy.cfg"), fmt.Appendf(nil, haproxyConf, dir, backendAddr, versusH1, versusH2C, sni), 0o600); err != nil {
			return target{}, err
		}
		cmd = exec.Command("/usr/sbin/haproxy", "-db", "-f", filepath.Join(dir, "haproxy.cfg"))
	default:
		return target{}, fmt.Errorf("-versus %q: want nginx or haproxy", versus)
	}
	p, err := start(cmd)
	if err != nil {
		return target{}, err
	}
	return target{name: "c " + versus, pid: p.Process.Pid, url: func(s scenario) string {
		if s.h2 {
			return "http://" + versusH2C + s.path
		}
		return "http://" + versusH1 + s.path
	}}, nil
}

// target is one way to reach the backend.
type target struct {
	name string
	url  func(s scenario) string
	pid  int // process whose CPU is the proxy's (with its children); 0 for direct
	// proxy is the sockmesh proxy's listener, to which the capture sends
	// the connections to the target's Service address; zero for the others.
	proxy netip.AddrPort
}

// The sockmesh proxies listen on 127.0.0.1:proxyPort+i behind Service
// addresses 10.96.0.(10+i):80, which exist only in the datapath's services
// map.
const proxyPort = 15001

func runBench(c benchConfig) error {
	if c.duration == 0 {
		c.duration = 5 * time.Second
	}
	r := benchrun.New("proxy bench")
	defer r.Close()
	dir := r.TempDir()
	if err := writePKI(dir); err != nil {
		return err
	}
	var services []netip.AddrPort
	for i := range c.paths {
		services = append(services, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)}), 80))
	}
	captured := slices.Clone(services)
	for _, svc := range services {
		captured = append(captured, mcpService(svc))
	}
	capture, err := newCapture(r, captured, c.accelerate)
	if err != nil {
		return err
	}
	c.capture = capture
	c.mcpSessionID = mcpSessionID()
	exe, _ := os.Executable()
	start := func(cmd *exec.Cmd) (*exec.Cmd, error) {
		cmd.Env = append(os.Environ(), cmd.Env...)
		if len(cmd.Args) < 3 || cmd.Args[2] != "backend" {
			// The backend logs every handshake a closing client cuts.
			cmd.Stderr = os.Stderr
		}
		if err := capture.start(cmd); err != nil {
			return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
		}
		r.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		})
		return cmd, nil
	}
	var backend *exec.Cmd
	switch c.backend {
	case "go":
		backend, err = start(exec.Command(exe, "-role", "backend", "-dir", dir))
	case "nginx":
		backend, err = startNginxBackend(dir, start)
	default:
		err = fmt.Errorf("-backend %q: want go or nginx", c.backend)
	}
	if err != nil {
		return err
	}
	c.backendPID = backend.Process.Pid
	targets := []target{{name: "a direct TLS", url: func(s scenario) string { return "https://" + backendAddr + s.path }}}
	// The proxies run with the runtime settings the agent runs with; a
	// speed's own GODEBUG replaces them ("pooled@GODEBUG=").
	env := []string{"GODEBUG=" + strings.Join(proxy.RuntimeSettings, ",")}
	if c.gogc != "" {
		env = append(env, "GOGC="+c.gogc)
	}
	if c.gomaxprocs != "" {
		env = append(env, "GOMAXPROCS="+c.gomaxprocs)
	}
	if c.profile != "" {
		if err := os.MkdirAll(c.profile, 0o755); err != nil {
			return fmt.Errorf("profile directory: %w", err)
		}
	}
	for i, spec := range c.paths {
		// A speed may carry its own environment, to compare settings in
		// one run: "pooled@GOGC=400@GOMAXPROCS=1".
		mode, extra, _ := strings.Cut(spec, "@")
		penv := env
		if extra != "" {
			penv = append(slices.Clone(env), strings.Split(extra, "@")...)
		}
		svc := services[i]
		listen := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(proxyPort+i))
		profile := ""
		if c.profile != "" {
			profile = filepath.Join(c.profile, fmt.Sprintf("%d-%s.pprof", i, mode))
		}
		cmd := capture.inCgroup(exec.Command(exe, "-role", "proxy", "-dir", dir, "-mode", mode, "-listen", listen.String(),
			"-vip", svc.Addr().String(), "-curves", c.curves, "-cpuprofile", profile))
		cmd.Env = penv
		p, err := start(cmd)
		if err != nil {
			return err
		}
		targets = append(targets, target{name: "b sockmesh " + strings.ReplaceAll(spec, "@", " "), pid: p.Process.Pid, proxy: listen,
			url: func(s scenario) string {
				if s.mcp {
					return "http://" + mcpService(svc).String() + s.path
				}
				return "http://" + svc.String() + s.path
			}})
	}
	versus, err := startVersus(c.versus, dir, max(c.conns*c.streams, 4*c.conns), start)
	if err != nil {
		return err
	}
	targets = append(targets, versus)
	time.Sleep(time.Second) // let the servers bind
	for _, t := range targets {
		// A proxy that could not start (a bad flag, an unwritable profile)
		// would otherwise show as connections the datapath never redirected.
		if t.proxy.IsValid() {
			if err := capture.listening(t.proxy); err != nil {
				return fmt.Errorf("%s is not listening on %s (its output above says why): %w", t.name, t.proxy, err)
			}
		}
	}
	if c.idle > 0 {
		return idleMemory(c, targets)
	}
	scenarios := []scenario{
		{name: "keep-alive 100 B", path: "/bytes/100"},
		{name: "keep-alive 64 KiB", path: "/bytes/65536"},
		{name: fmt.Sprintf("keep-alive 100 B, %d conns", 4*c.conns), path: "/bytes/100", conns: 4 * c.conns},
		{name: "conn-per-request 100 B", path: "/bytes/100", cpr: true},
		{name: "h2c client 100 B", path: "/bytes/100", h2: true, streams: 1},
		{name: "h2c client 64 KiB", path: "/bytes/65536", h2: true, streams: 1},
		{name: fmt.Sprintf("h2c client %d streams 100 B", c.streams), path: "/bytes/100", h2: true, streams: c.streams},
		{name: fmt.Sprintf("h2c client %d streams 64 KiB", c.streams), path: "/bytes/65536", h2: true, streams: c.streams},
	}
	if c.backend == "go" {
		// Uploads: the app POSTs 64 KiB and gets 100 B back (nginx as a
		// backend serves files, and refuses POSTs).
		wrkPost, h2Post, err := uploadFiles(dir, 64<<10)
		if err != nil {
			return err
		}
		// MCP: the app POSTs a JSON-RPC message of its session and gets
		// 100 B back, through sockmesh to a backend declared MCP (each
		// request parsed, its session ID's prefix cut and its endpoint
		// pinned); nginx forwards the same requests with the backend's own
		// ID, as it cannot keep a session on a replica by it.
		mcpPost := filepath.Join(dir, "mcp.lua")
		if err := os.WriteFile(mcpPost, []byte(mcpScript), 0o644); err != nil {
			return err
		}
		scenarios = append(scenarios,
			scenario{name: "upload 64 KiB", path: "/bytes/100", upload: wrkPost},
			scenario{name: "h2c client upload 64 KiB", path: "/bytes/100", h2: true, streams: 1, upload: h2Post},
			scenario{name: "MCP session POST 100 B", path: "/bytes/100", upload: mcpPost, mcp: true})
	}
	gogc, maxprocs := c.gogc, c.gomaxprocs
	if gogc == "" {
		gogc = "100 (default)"
	}
	if maxprocs == "" {
		maxprocs = "default"
	}
	fmt.Printf("# %s\n\n%d interleaved rounds of %s per target, %d connections; backend: %s, TLS 1.3, X25519, ECDSA P-256; "+
		"proxy curves: %s, GOGC %s, GOMAXPROCS %s; %d CPUs shared by load generator, backend and proxies. "+
		"Ratios are medians of per-round ratios (min–max); CPU is user+system of the proxy process (nginx: master and workers) per request.\n",
		c.command, c.rounds, c.duration, c.conns, c.backend, c.curves, gogc, maxprocs, runtimeCPUs())
	var summary []scenarioResult
	for _, s := range scenarios {
		if c.only != "" && !strings.Contains(s.name, c.only) {
			continue
		}
		res := make(map[string][]result)
		for round := range c.rounds {
			// Rotate the order each round so that no target always runs
			// after the same one (or first, on a cooler machine).
			for i := range targets {
				t := targets[(i+round)%len(targets)]
				r, err := load(s, t, c)
				if err != nil {
					return fmt.Errorf("%s / %s round %d: %w", s.name, t.name, round, err)
				}
				res[t.name] = append(res[t.name], r)
			}
		}
		report(s, c, targets, res)
		summary = append(summary, scenarioResult{s, res})
	}
	reportSummary(c, targets, summary)
	// A capture that did not work would have shown as connection errors;
	// this says the connections went the datapath's way, not another.
	if len(c.paths) > 0 {
		return c.capture.check(c.accelerate)
	}
	return nil
}

func runtimeCPUs() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}

func writePKI(dir string) error {
	ca, err := pki.NewCA("bench ca")
	if err != nil {
		return err
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "echo", DNSNames: []string{sni}})
	if err != nil {
		return err
	}
	if _, err := ca.WriteFile(dir, "ca"); err != nil {
		return err
	}
	_, _, err = leaf.WriteFiles(dir, "server")
	return err
}

// cpuSeconds is the user+system CPU time of pid and its direct children
// (nginx workers), from /proc/PID/stat fields 14 and 15.
func cpuSeconds(pid int) float64 {
	var ticks float64
	for _, p := range withChildren(pid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		u, _ := strconv.ParseFloat(fields[11], 64)
		st, _ := strconv.ParseFloat(fields[12], 64)
		ticks += u + st
	}
	return ticks / 100 // USER_HZ
}

// withChildren is pid and its direct children (nginx workers); none for 0.
func withChildren(pid int) []int {
	if pid == 0 {
		return nil
	}
	pids := []int{pid}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)); err == nil {
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids = append(pids, n)
			}
		}
	}
	return pids
}

var (
	wrkRPS = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkLat = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)`)
	wrkReq = regexp.MustCompile(`(\d+) requests in`)
	h2RPS  = regexp.MustCompile(`finished in [0-9.]+\w+, ([0-9.]+) req/s`)
	h2Done = regexp.MustCompile(`requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded`)
)

// loadCommand is the load generator invocation of scenario s (without the
// URL), as the report shows it.
func loadCommand(s scenario, c benchConfig) []string {
	conns := strconv.Itoa(cmp.Or(s.conns, c.conns))
	if s.h2 {
		args := []string{"h2load", "-c", conns, "-m", strconv.Itoa(s.streams), "-t", "1", "-D", strconv.Itoa(int(c.duration.Seconds()))}
		if s.upload != "" {
			args = append(args, "-d", s.upload)
		}
		return args
	}
	args := []string{"wrk", "-t", "1", "-c", conns, "-d", c.duration.String(), "--latency"}
	if s.cpr {
		args = append(args, "-H", "Connection: close")
	}
	if s.upload != "" {
		args = append(args, "-s", s.upload)
	}
	return args
}

// mcpScript is the wrk script of the MCP row: a JSON-RPC tool call of
// about 100 B, POSTed as MCP's streamable HTTP transport does (the session
// ID comes as -H: it differs by target).
const mcpScript = `wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}'
`

// uploadFiles writes, in dir, a wrk script that POSTs n bytes and a file
// of n bytes for h2load's -d.
func uploadFiles(dir string, n int) (wrkScript, data string, err error) {
	wrkScript = filepath.Join(dir, fmt.Sprintf("post-%d.lua", n))
	script := fmt.Sprintf("wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/octet-stream\"\nwrk.body = string.rep(\"x\", %d)\n", n)
	if err := os.WriteFile(wrkScript, []byte(script), 0o644); err != nil {
		return "", "", err
	}
	data = filepath.Join(dir, fmt.Sprintf("post-%d.bin", n))
	if err := os.WriteFile(data, bytes.Repeat([]byte("x"), n), 0o644); err != nil {
		return "", "", err
	}
	return wrkScript, data, nil
}

func load(s scenario, t target, c benchConfig) (result, error) {
	if t.proxy.IsValid() {
		if err := c.capture.to(t.proxy); err != nil {
			return result{}, err
		}
	}
	idle0, total0 := cpuIdle()
	cpu0, backend0 := cpuSeconds(t.pid), cpuSeconds(c.backendPID)
	var r result
	var requests, loadSeconds float64
	cmd := loadCommand(s, c)
	if s.mcp {
		id := mcpSession
		if t.proxy.IsValid() {
			id = c.mcpSessionID
		}
		cmd = append(cmd, "-H", "Mcp-Session-Id: "+id)
	}
	if s.h2 {
		logf := filepath.Join(os.TempDir(), fmt.Sprintf("smt-h2load-%d.log", os.Getpid()))
		defer os.Remove(logf)
		lg := c.capture.inCgroup(exec.Command(cmd[0], append(cmd[1:], "--log-file", logf, t.url(s))...))
		out, err := c.capture.output(lg)
		if err != nil {
			return r, fmt.Errorf("h2load: %v: %s", err, out)
		}
		loadSeconds = (lg.ProcessState.UserTime() + lg.ProcessState.SystemTime()).Seconds()
		m, d := h2RPS.FindSubmatch(out), h2Done.FindSubmatch(out)
		if m == nil || d == nil || string(d[1]) != string(d[2]) {
			return r, fmt.Errorf("h2load output (failed requests?): %s", out)
		}
		r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
		requests, _ = strconv.ParseFloat(string(d[1]), 64)
		r.p50, r.p99 = logPercentiles(logf)
	} else {
		lg := c.capture.inCgroup(exec.Command(cmd[0], append(cmd[1:], t.url(s))...))
		out, err := c.capture.output(lg)
		if err != nil {
			return r, fmt.Errorf("wrk: %v: %s", err, out)
		}
		loadSeconds = (lg.ProcessState.UserTime() + lg.ProcessState.SystemTime()).Seconds()
		if strings.Contains(string(out), "Non-2xx") || strings.Contains(string(out), "Socket errors: connect") {
			return r, fmt.Errorf("wrk saw errors: %s", out)
		}
		m := wrkRPS.FindSubmatch(out)
		n := wrkReq.FindSubmatch(out)
		if m == nil || n == nil {
			return r, fmt.Errorf("wrk output: %s", out)
		}
		r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
		requests, _ = strconv.ParseFloat(string(n[1]), 64)
		for _, l := range wrkLat.FindAllSubmatch(out, -1) {
			v, _ := strconv.ParseFloat(string(l[2]), 64)
			v *= map[string]float64{"us": 1e-6, "ms": 1e-3, "s": 1}[string(l[3])]
			if string(l[1]) == "50" {
				r.p50 = v
			} else {
				r.p99 = v
			}
		}
	}
	if requests == 0 {
		// A target that answered nothing (a proxy that did not start) is a
		// failed run, not a slow one.
		return r, fmt.Errorf("%s: no request succeeded", t.name)
	}
	if t.pid != 0 {
		r.cpuPerReq = (cpuSeconds(t.pid) - cpu0) / requests
	}
	r.backendCPU = (cpuSeconds(c.backendPID) - backend0) / requests
	r.loadCPU = loadSeconds / requests
	if idle1, total1 := cpuIdle(); total1 > total0 {
		r.idle = (idle1 - idle0) / (total1 - total0)
	}
	return r, nil
}

// cpuIdle returns the machine's idle and total CPU time so far, in ticks,
// from the first line of /proc/stat (idle and iowait count as idle).
func cpuIdle() (idle, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		total += v
		if i == 3 || i == 4 {
			idle += v
		}
	}
	return idle, total
}

// logPercentiles reads h2load's --log-file (start, status, duration in µs).
func logPercentiles(path string) (p50, p99 float64) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	var d []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 3 {
			v, _ := strconv.ParseFloat(fs[2], 64)
			d = append(d, v/1e6)
		}
	}
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[int(math.Min(float64(len(d)-1), float64(len(d))*0.99))]
}
