// Command datapath compares, on this machine, three ways for a pod's
// connection to reach a server: direct; captured by iptables REDIRECT into
// a minimal forwarding proxy; captured by sockmesh's eBPF redirect into the
// same proxy. It measures connections per second (a new connection per
// request) and request round trip on one kept connection (1 KiB and
// 64 KiB), in interleaved rounds, and prints the medians of per-round
// ratios.
//
// Run as root: go run ./test/bench/datapath (or make bench).
//
// Each path has its own node netns, pod netns, veth pair, server and proxy
// processes, so no path pays for another's machinery: iptables' conntrack is
// only active in its own node netns, and only the eBPF path's processes sit
// in the cgroup the programs are attached to. The proxy is the same code
// (test/bench/internal/fwdproxy) on both captured paths, in node-IP mode.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/test/bench/internal/benchrun"
)

func main() {
	sandbox.RunHelper(map[string]func([]string) error{
		"server": serverRole,
		"proxy":  proxyRole,
		"client": clientRole,
	})
	rounds := flag.Int("rounds", 7, "interleaved rounds")
	duration := flag.Duration("duration", time.Second, "length of one measurement")
	parallel := flag.Int("parallel", 2, "concurrent connections for connections/s")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "datapath bench: run as root (netns, cgroups, eBPF, iptables)")
		os.Exit(1)
	}

	r := benchrun.New("datapath bench")

	paths := setUp(r)
	scenarios := []scenario{
		{name: "connections/s, 64 B", kind: "conn", size: 64, higherIsBetter: true},
		{name: "round trip p50, 1 KiB", kind: "rtt", size: 1 << 10},
		{name: "round trip p50, 64 KiB", kind: "rtt", size: 64 << 10},
	}
	fmt.Fprintf(os.Stderr, "datapath bench: %d rounds of %v per path and scenario\n", *rounds, *duration)
	results := make(map[string]map[string][]sample) // scenario -> path -> per round
	for round := range *rounds {
		for _, sc := range scenarios {
			if results[sc.name] == nil {
				results[sc.name] = make(map[string][]sample)
			}
			// Rotate the order each round so no path always runs first.
			for i := range paths {
				p := paths[(i+round)%len(paths)]
				s := p.measure(r, job{Kind: sc.kind, Target: p.target.String(), Size: sc.size,
					Duration: *duration, Parallel: *parallel})
				results[sc.name][p.name] = append(results[sc.name][p.name], s)
			}
		}
		fmt.Fprintf(os.Stderr, "datapath bench: round %d/%d done\n", round+1, *rounds)
	}
	report(os.Stdout, scenarios, results, *rounds)
	r.Close()
}

// path is one way from a client to a server.
type path struct {
	name   string
	target netip.AddrPort // what the client dials
	client *child
	proxy  *sandbox.Process // nil on the direct path
}

type child struct {
	in  *json.Encoder
	out *json.Decoder
}

// The Service address every captured path dials, and the ports.
var vip = netip.MustParseAddrPort("10.96.0.10:80")

const (
	serverPort = 8080
	proxyPort  = 15001
)

// setUp builds the three paths. Subnets 10.210-212.0.0/24 exist only in the
// netns made here.
func setUp(r *benchrun.Runner) []*path {
	direct := newTopology(r, 210)
	ebpf := newTopology(r, 211)
	ipt := newTopology(r, 212)

	// eBPF: programs on a throwaway cgroup holding this path's processes.
	cg := sandbox.NewCgroup(r)
	dp, err := datapath.Open(datapath.Config{BPFFS: sandbox.TempBPFFS(r), Cgroup: cg.Path}, nil, nil)
	if err != nil {
		r.Fatalf("open datapath: %v", err)
	}
	r.Cleanup(func() { dp.Uninstall() })
	podCookie, err := ebpf.pod.Cookie()
	if err != nil {
		r.Fatal(err)
	}
	nodeCookie, err := ebpf.node.Cookie()
	if err != nil {
		r.Fatal(err)
	}
	if err := dp.SetServices([]datapath.Service{{Addr: vip}}); err != nil {
		r.Fatal(err)
	}
	if err := dp.Enrol(podCookie, datapath.Proxy{NetNSCookie: nodeCookie, V4: netip.AddrPortFrom(ebpf.nodeIP, proxyPort)}); err != nil {
		r.Fatal(err)
	}

	// iptables: REDIRECT in the node netns's PREROUTING, where the pod's
	// packets arrive; the proxy reads the original destination from
	// conntrack.
	var out strings.Builder
	cmd := exec.Command("iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "-d", vip.Addr().String(),
		"--dport", strconv.Itoa(int(vip.Port())), "-j", "REDIRECT", "--to-ports", strconv.Itoa(proxyPort))
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := sandbox.Start(r, cmd, ipt.node, nil).Wait(); err != nil {
		r.Fatalf("%s: %v\n%s", cmd, err, out.String())
	}

	paths := []*path{
		{name: "direct", target: direct.server()},
		{name: "iptables", target: vip},
		{name: "ebpf", target: vip},
	}
	for _, p := range []struct {
		t  *topology
		cg *sandbox.Cgroup
		p  *path
	}{{direct, nil, paths[0]}, {ipt, nil, paths[1]}, {ebpf, cg, paths[2]}} {
		startChild(r, "server", p.t.node, p.cg, p.t.server().String())
		if p.p.name != "direct" {
			p.p.proxy, _ = startChild(r, "proxy", p.t.node, p.cg,
				netip.AddrPortFrom(p.t.nodeIP, proxyPort).String(), vip.String(), p.t.server().String())
		}
		_, p.p.client = startChild(r, "client", p.t.pod, p.cg)
	}
	// Check every path before measuring: a capture that does not work
	// shows up as errors here, not as a fast number.
	for _, p := range paths {
		s := p.measure(r, job{Kind: "rtt", Target: p.target.String(), Size: 64, Duration: 10 * time.Millisecond})
		if s.res.Ops == 0 {
			r.Fatalf("%s path does not work", p.name)
		}
	}
	if n, err := dp.Counters(); err != nil || n[datapath.Redirected] == 0 {
		r.Fatalf("eBPF path was not redirected: counters %v, %v", n, err)
	}
	return paths
}

type topology struct {
	node, pod     *sandbox.NetNS
	nodeIP, podIP netip.Addr
}

func (t *topology) server() netip.AddrPort { return netip.AddrPortFrom(t.nodeIP, serverPort) }

func newTopology(r *benchrun.Runner, subnet byte) *topology {
	t := &topology{
		node:   sandbox.NewNetNS(r),
		pod:    sandbox.NewNetNS(r),
		nodeIP: netip.AddrFrom4([4]byte{10, subnet, 0, 1}),
		podIP:  netip.AddrFrom4([4]byte{10, subnet, 0, 2}),
	}
	sandbox.NewVeth(r, t.node, t.pod, []netip.Prefix{netip.PrefixFrom(t.nodeIP, 24)}, []netip.Prefix{netip.PrefixFrom(t.podIP, 24)})
	t.pod.AddRoute(r, netip.MustParsePrefix("0.0.0.0/0"), t.nodeIP)
	for _, ns := range []*sandbox.NetNS{t.node, t.pod} {
		// Connections per second open tens of thousands of connections to
		// one address: widen the port range and reuse TIME_WAIT ports.
		err := ns.Do(func() error {
			if err := os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("1024 65000"), 0); err != nil {
				return err
			}
			return os.WriteFile("/proc/sys/net/ipv4/tcp_tw_reuse", []byte("1"), 0)
		})
		if err != nil {
			r.Fatalf("sysctl in %s: %v", ns.Name, err)
		}
	}
	return t
}

// startChild re-executes this program as role inside ns and cg, and waits
// for its "ready".
func startChild(r *benchrun.Runner, role string, ns *sandbox.NetNS, cg *sandbox.Cgroup, args ...string) (*sandbox.Process, *child) {
	cmd := sandbox.HelperCommand(r, role, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		r.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		r.Fatal(err)
	}
	p := sandbox.Start(r, cmd, ns, cg)
	br := bufio.NewReader(stdout)
	if line, err := br.ReadString('\n'); err != nil || line != "ready\n" {
		r.Fatalf("%s in %s: not ready: %q, %v", role, ns.Name, line, err)
	}
	return p, &child{in: json.NewEncoder(stdin), out: json.NewDecoder(br)}
}

// sample is one measurement of one path.
type sample struct {
	res       result
	proxyCPUs float64 // seconds of proxy CPU during the measurement
}

func (p *path) measure(r *benchrun.Runner, j job) sample {
	cpu0 := cpuSeconds(p.proxy)
	if err := p.client.in.Encode(j); err != nil {
		r.Fatalf("%s client: %v", p.name, err)
	}
	var s sample
	if err := p.client.out.Decode(&s.res); err != nil {
		r.Fatalf("%s client: %v", p.name, err)
	}
	s.proxyCPUs = cpuSeconds(p.proxy) - cpu0
	if s.res.Errors > 0 {
		r.Fatalf("%s path: %d errors, first: %s", p.name, s.res.Errors, s.res.FirstError)
	}
	return s
}

// cpuSeconds is the user+system CPU time of a process (/proc/PID/stat), 0
// for none.
func cpuSeconds(p *sandbox.Process) float64 {
	if p == nil {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime and stime are
	// fields 14 and 15, in clock ticks (USER_HZ, 100 on Linux).
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100
}
