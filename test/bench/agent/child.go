package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/leader"
	"github.com/sockmesh/sockmesh/agent/selectorsvc"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	kubesource "github.com/sockmesh/sockmesh/agent/source/kubernetes"
	"github.com/sockmesh/sockmesh/agent/status"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/internal/gcfloor"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/pki"
)

// report is what the child measured.
type report struct {
	FirstSnapshot time.Duration `json:"firstSnapshot"`
	Frontends     int           `json:"frontends"`
	Backends      int           `json:"backends"`
	Workloads     int           `json:"workloads"`
	// MemoryLimit is the Go runtime's soft memory limit the agent ran
	// with (math.MaxInt64: none).
	MemoryLimit int64 `json:"memoryLimit"`
	// Memory right after the first Snapshot, right after the last change
	// propagated, and after the agent then sat idle for -settle (steady).
	AtFirst memory `json:"atFirst"`
	AtEnd   memory `json:"atEnd"`
	Steady  memory `json:"steady"`
	// PeakStartup and PeakPropagation are the largest RSS sampled in each
	// phase (every 10 ms; VmHWM bounds both from above).
	PeakStartup, PeakPropagation uint64
	// Propagation latencies by kind of change.
	Propagation map[string][]time.Duration `json:"propagation"`
}

// memory is the process's state at one moment; the CPU and GC figures
// count from the process's start.
type memory struct {
	RSS, HWM  uint64 // bytes, from /proc/self/status
	HeapInuse uint64
	HeapLive  uint64        // live heap marked by the last GC
	CPU       time.Duration // user + system
	GCCPU     time.Duration // estimated by the runtime (runtime/metrics)
	GCCycles  uint64
	// What the Go runtime holds (runtime/metrics /memory/classes): live
	// and dead heap objects, free heap pages not yet returned to the
	// system, goroutine stacks, and everything else (GC metadata, buffers
	// of the runtime).
	HeapObjects, HeapFree, Stacks, RuntimeOther uint64
}

// The client rate limits of the agent under test; cmd/ should use the same.
const (
	agentQPS   = 100
	agentBurst = 200
)

func runChild(kubeconfig string, p params, prof profiles) error {
	// client-go's leader election and reflectors log through klog.
	klog.SetSlogLogger(slog.New(slog.DiscardHandler))
	defer gcfloor.Start(gcfloor.Default)() // as cmd/sockmesh's default
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = agentQPS, agentBurst
	kube, gw, err := kubesource.NewClients(cfg)
	if err != nil {
		return err
	}
	log := slog.New(slog.DiscardHandler)
	src, err := kubesource.New(kubesource.Config{NodeName: nodeName}, kube, gw, log, nil)
	if err != nil {
		return err
	}
	el, err := leader.New(leader.Config{Namespace: namespace(p, 0), Identity: "bench-agent"}, kube, log, nil)
	if err != nil {
		return err
	}
	sw, err := status.New(status.Config{}, gw, log, nil)
	if err != nil {
		return err
	}
	svcs, err := selectorsvc.New(selectorsvc.Config{}, kube, log, nil)
	if err != nil {
		return err
	}
	cp, err := controlplane.New(controlplane.Config{
		Node:   translate.Node{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix(apiserver.ServiceCIDR)}},
		Leader: el,
		Writers: []controlplane.Writer{
			controlplane.WriterFunc(func(ctx context.Context, in translate.Input, r translate.Result, g *controlplane.Gate) error {
				return sw.Write(ctx, in, r.Status, g)
			}),
			controlplane.WriterFunc(func(ctx context.Context, in translate.Input, r translate.Result, g *controlplane.Gate) error {
				return svcs.Apply(ctx, in, r.EndpointSelectorServices, g)
			}),
		},
	}, src, log, nil)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if prof.heap != "" {
		// Sample finely enough to attribute the cache's many small objects.
		runtime.MemProfileRate = 4096
	}
	if prof.cpu != "" {
		f, err := os.Create(prof.cpu)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	smp, err := startSampler(prof.timeline)
	if err != nil {
		return err
	}
	defer smp.stop()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- cp.Run(ctx) }()
	first, err := waitFor(ctx, cp, done, func(s *snapshot.Snapshot) bool { return s.Version > 0 })
	if err != nil {
		return err
	}
	r := report{
		FirstSnapshot: time.Since(start),
		Frontends:     len(first.Frontends), Backends: len(first.Backends), Workloads: len(first.Workloads),
		MemoryLimit: debug.SetMemoryLimit(-1),
		AtFirst:     readMemory(),
		PeakStartup: smp.phase("propagation"),
		Propagation: map[string][]time.Duration{},
	}
	if prof.heap != "" {
		if err := writeHeapProfile(prof.heap); err != nil {
			return err
		}
	}

	for k := range p.Changes {
		kind, d, err := change(ctx, kube, cp, done, p, k)
		if err != nil {
			return err
		}
		r.Propagation[kind] = append(r.Propagation[kind], d)
	}
	r.AtEnd = readMemory()
	// Steady state: what the agent holds once the changes (and the status
	// writes they caused) are done and the runtime has had time to return
	// freed pages to the system.
	select {
	case <-time.After(p.Settle):
	case err := <-done:
		return fmt.Errorf("control plane stopped: %v", err)
	}
	r.PeakPropagation = smp.phase("settled")
	r.Steady = readMemory()
	if prof.heap != "" {
		// A heap profile shows the heap as of the last GC, which may have
		// run in the middle of a rebuild; this one shows what stays.
		runtime.GC()
		if err := writeHeapProfile(prof.heap + ".end"); err != nil {
			return err
		}
	}
	cancel()
	if err := <-done; err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

// change makes the k-th change and times its propagation. Even changes
// rotate a CA ConfigMap that ten policies reference; odd ones toggle
// appProtocol kubernetes.io/h2c on a Service without a policy, which
// captures or releases it.
func change(ctx context.Context, kube k8s.Interface, cp *controlplane.ControlPlane, done <-chan error, p params, k int) (string, time.Duration, error) {
	if k%2 == 0 {
		ns := namespace(p, k/2)
		ca, err := pki.NewCA(fmt.Sprintf("bench-ca-%d", k))
		if err != nil {
			return "", 0, err
		}
		want := string(ca.CertPEM)
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "ca", metav1.GetOptions{})
		if err != nil {
			return "", 0, err
		}
		cm.Data["ca.crt"] = want
		// svc-<i> with i < policies lives in namespace i mod namespaces.
		svc := fmt.Sprintf("svc-%d", (k/2)%p.Namespaces)
		t0 := time.Now()
		if _, err := kube.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return "", 0, err
		}
		_, err = waitFor(ctx, cp, done, func(s *snapshot.Snapshot) bool {
			b := backendOf(s, ns, svc)
			return b != nil && b.TLS != nil && b.TLS.RootsPEM == want
		})
		return "ConfigMap CA rotation", time.Since(t0), err
	}
	i := p.Policies + (k/2)%(p.Services-p.Policies)
	ns, name := namespace(p, i), fmt.Sprintf("svc-%d", i)
	svc, err := kube.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", 0, err
	}
	capture := svc.Spec.Ports[0].AppProtocol == nil
	if capture {
		svc.Spec.Ports[0].AppProtocol = ptr("kubernetes.io/h2c")
	} else {
		svc.Spec.Ports[0].AppProtocol = nil
	}
	t0 := time.Now()
	if _, err := kube.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		return "", 0, err
	}
	_, err = waitFor(ctx, cp, done, func(s *snapshot.Snapshot) bool { return (backendOf(s, ns, name) != nil) == capture })
	return "Service appProtocol toggle", time.Since(t0), err
}

func backendOf(s *snapshot.Snapshot, ns, svc string) *snapshot.Backend {
	b, _ := s.Backend(snapshot.BackendRef{Kind: snapshot.KindService, Namespace: ns, Name: svc, Port: 443})
	return b
}

// waitFor waits for a published Snapshot that satisfies ok.
func waitFor(ctx context.Context, cp *controlplane.ControlPlane, done <-chan error, ok func(*snapshot.Snapshot) bool) (*snapshot.Snapshot, error) {
	timeout := time.After(5 * time.Minute)
	for {
		s, updated := cp.Current()
		if ok(s) {
			return s, nil
		}
		select {
		case <-updated:
		case err := <-done:
			return nil, fmt.Errorf("control plane stopped: %v", err)
		case <-timeout:
			return nil, fmt.Errorf("no matching snapshot within 5 minutes (last version %d)", s.Version)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// profiles name the files the child writes profiles to; empty: none.
type profiles struct{ cpu, heap, timeline string }

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("heap").WriteTo(f, 0)
}

func readMemory() memory {
	var m memory
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.HeapInuse = ms.HeapInuse
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/free:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"},
		{Name: "/memory/classes/os-stacks:bytes"}, {Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(samples)
	u := func(i int) uint64 { return samples[i].Value.Uint64() }
	m.HeapLive = u(0)
	m.GCCPU = time.Duration(samples[1].Value.Float64() * float64(time.Second))
	m.GCCycles = u(2)
	m.HeapObjects, m.HeapFree, m.Stacks = u(3), u(4), u(5)+u(6)
	// total counts released pages too, which take no RSS.
	m.RuntimeOther = u(7) - u(8) - m.HeapObjects - m.HeapFree - m.Stacks
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		m.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(v)
		if len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		n, _ := strconv.ParseUint(fields[0], 10, 64)
		switch k {
		case "VmRSS":
			m.RSS = n << 10
		case "VmHWM":
			m.HWM = n << 10
		}
	}
	return m
}

// sampler reads the RSS every 10 ms and keeps the largest of the current
// phase; with a timeline file it also writes every sample there (CSV: ms
// since start, phase, RSS, live heap, heap goal, GC cycles).
type sampler struct {
	mu      sync.Mutex
	name    string
	peak    uint64
	stopped chan struct{}
	quit    chan struct{}
}

func startSampler(timeline string) (*sampler, error) {
	s := &sampler{name: "startup", quit: make(chan struct{}), stopped: make(chan struct{})}
	statm, err := os.Open("/proc/self/statm")
	if err != nil {
		return nil, fmt.Errorf("open statm: %w", err)
	}
	var out *bufio.Writer
	var file *os.File
	if timeline != "" {
		if file, err = os.Create(timeline); err != nil {
			statm.Close()
			return nil, err
		}
		out = bufio.NewWriter(file)
		fmt.Fprintln(out, "ms,phase,rss_bytes,heap_live_bytes,heap_goal_bytes,gc_cycles")
	}
	page := uint64(os.Getpagesize())
	go func() {
		defer close(s.stopped)
		defer statm.Close()
		if file != nil {
			defer file.Close()
			defer out.Flush()
		}
		start := time.Now()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		buf := make([]byte, 128)
		ms := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/goal:bytes"}, {Name: "/gc/cycles/total:gc-cycles"}}
		for {
			select {
			case <-s.quit:
				return
			case <-tick.C:
			}
			n, _ := statm.ReadAt(buf, 0)
			fields := strings.Fields(string(buf[:n]))
			if len(fields) < 2 {
				continue
			}
			pages, _ := strconv.ParseUint(fields[1], 10, 64)
			rss := pages * page
			s.mu.Lock()
			s.peak = max(s.peak, rss)
			name := s.name
			s.mu.Unlock()
			if out != nil {
				metrics.Read(ms)
				fmt.Fprintf(out, "%d,%s,%d,%d,%d,%d\n", time.Since(start).Milliseconds(), name, rss,
					ms[0].Value.Uint64(), ms[1].Value.Uint64(), ms[2].Value.Uint64())
			}
		}
	}()
	return s, nil
}

// phase starts the next phase and returns the peak of the one that ended.
func (s *sampler) phase(next string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	peak := s.peak
	s.name, s.peak = next, 0
	return peak
}

func (s *sampler) stop() {
	close(s.quit)
	<-s.stopped
}

const mib = 1 << 20

func (r report) printRound(n int) {
	fmt.Printf("round %d: first snapshot %s [%d frontends, %d backends, %d workloads], memory limit %s\n",
		n, r.FirstSnapshot.Round(time.Millisecond), r.Frontends, r.Backends, r.Workloads, limitString(r.MemoryLimit))
	fmt.Printf("  RSS MiB: at first snapshot %.1f, peak %.1f (startup %.1f, propagation %.1f), after propagation %.1f, steady %.1f\n",
		float64(r.AtFirst.RSS)/mib, float64(r.Steady.HWM)/mib, float64(r.PeakStartup)/mib, float64(r.PeakPropagation)/mib,
		float64(r.AtEnd.RSS)/mib, float64(r.Steady.RSS)/mib)
	fmt.Printf("  Go heap MiB: live at first snapshot %.1f, steady %.1f\n", float64(r.AtFirst.HeapLive)/mib, float64(r.Steady.HeapLive)/mib)
	fmt.Printf("  steady Go runtime MiB: heap objects %.1f, free heap not yet returned %.1f, stacks %.1f, other %.1f\n",
		float64(r.Steady.HeapObjects)/mib, float64(r.Steady.HeapFree)/mib, float64(r.Steady.Stacks)/mib, float64(r.Steady.RuntimeOther)/mib)
	fmt.Printf("  CPU: to first snapshot %s (GC %.0f%%, %d cycles); whole run %s (GC %.0f%%, %d cycles)\n",
		r.AtFirst.CPU.Round(time.Millisecond), pctOf(r.AtFirst.GCCPU, r.AtFirst.CPU), r.AtFirst.GCCycles,
		r.Steady.CPU.Round(time.Millisecond), pctOf(r.Steady.GCCPU, r.Steady.CPU), r.Steady.GCCycles)
}

func limitString(l int64) string {
	if l == math.MaxInt64 {
		return "none"
	}
	return fmt.Sprintf("%.0f MiB", float64(l)/mib)
}

func pctOf(part, whole time.Duration) float64 {
	if whole <= 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// summarize prints each figure's median and range over the rounds, and the
// propagation latencies of every round together.
func summarize(p params, rounds []report) {
	fmt.Printf("\nscale: %d Services, %d endpoints, %d policies; %d rounds, each a fresh agent process (median, min-max)\n",
		p.Services, p.Services*p.Endpoints, p.Policies, len(rounds))
	dur := func(name, target string, f func(report) time.Duration) {
		d := make([]time.Duration, len(rounds))
		for i, r := range rounds {
			d[i] = f(r)
		}
		slices.Sort(d)
		fmt.Printf("  %-34s %-9s (%s-%s)  %s\n", name, pct(d, 0.5).Round(10*time.Millisecond),
			d[0].Round(10*time.Millisecond), d[len(d)-1].Round(10*time.Millisecond), target)
	}
	mem := func(name, target string, f func(report) uint64) {
		v := make([]float64, len(rounds))
		for i, r := range rounds {
			v[i] = float64(f(r)) / mib
		}
		slices.Sort(v)
		fmt.Printf("  %-34s %-9s (%.1f-%.1f)  %s\n", name, fmt.Sprintf("%.1f MiB", v[(len(v)-1)/2]), v[0], v[len(v)-1], target)
	}
	dur("time to first snapshot", "target < 5 s", func(r report) time.Duration { return r.FirstSnapshot })
	mem("RSS at first snapshot", "", func(r report) uint64 { return r.AtFirst.RSS })
	mem("peak RSS (VmHWM, whole run)", "target < 150 MiB", func(r report) uint64 { return r.Steady.HWM })
	mem("steady RSS (after -settle idle)", "", func(r report) uint64 { return r.Steady.RSS })
	mem("steady live heap", "", func(r report) uint64 { return r.Steady.HeapLive })
	dur("CPU to first snapshot", "", func(r report) time.Duration { return r.AtFirst.CPU })
	dur("  of which GC (runtime estimate)", "", func(r report) time.Duration { return r.AtFirst.GCCPU })
	dur("CPU whole run", "", func(r report) time.Duration { return r.Steady.CPU })
	dur("  of which GC (runtime estimate)", "", func(r report) time.Duration { return r.Steady.GCCPU })

	all := map[string][]time.Duration{}
	for _, r := range rounds {
		for kind, d := range r.Propagation {
			all[kind] = append(all[kind], d...)
		}
	}
	fmt.Printf("\npropagation: API write -> Snapshot published, with the cluster above\n")
	for _, kind := range slices.Sorted(maps.Keys(all)) {
		d := all[kind]
		slices.Sort(d)
		fmt.Printf("  %-28s n=%-4d p50 %-10s p99 %-10s max %s\n", kind, len(d),
			pct(d, 0.50).Round(10*time.Microsecond), pct(d, 0.99).Round(10*time.Microsecond), d[len(d)-1].Round(10*time.Microsecond))
	}
}

// pct returns the q-quantile of sorted d (nearest rank).
func pct(d []time.Duration, q float64) time.Duration {
	i := int(float64(len(d))*q+0.5) - 1
	return d[min(max(i, 0), len(d)-1)]
}
