package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
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
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/pki"
)

// report is what the child measured.
type report struct {
	FirstSnapshot time.Duration `json:"firstSnapshot"`
	Frontends     int           `json:"frontends"`
	Backends      int           `json:"backends"`
	Workloads     int           `json:"workloads"`
	// Memory right after the first Snapshot, and after propagation.
	AtFirst memory `json:"atFirst"`
	AtEnd   memory `json:"atEnd"`
	// Propagation latencies by kind of change.
	Propagation map[string][]time.Duration `json:"propagation"`
}

type memory struct {
	RSS, HWM  uint64 // bytes, from /proc/self/status
	HeapInuse uint64
}

// The client rate limits of the agent under test; cmd/ should use the same.
const (
	agentQPS   = 100
	agentBurst = 200
)

func runChild(kubeconfig string, p params, prof profiles) error {
	// client-go's leader election and reflectors log through klog.
	klog.SetSlogLogger(slog.New(slog.DiscardHandler))
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
			controlplane.WriterFunc(func(ctx context.Context, in translate.Input, r translate.Result) error {
				return sw.Write(ctx, in, r.Status)
			}),
			controlplane.WriterFunc(func(ctx context.Context, in translate.Input, r translate.Result) error {
				return svcs.Apply(ctx, in, r.EndpointSelectorServices)
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
		AtFirst:     readMemory(),
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
type profiles struct{ cpu, heap string }

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

func (r report) print(p params) {
	const mib = 1 << 20
	fmt.Printf("\nscale: %d Services, %d endpoints, %d policies\n", p.Services, p.Services*p.Endpoints, p.Policies)
	fmt.Printf("  time to first snapshot  %s  (target < 5 s)  [%d frontends, %d backends, %d workloads]\n",
		r.FirstSnapshot.Round(time.Millisecond), r.Frontends, r.Backends, r.Workloads)
	fmt.Printf("  agent RSS at first snapshot  %.1f MiB (peak %.1f MiB, Go heap in use %.1f MiB)  (target < 150 MiB)\n",
		float64(r.AtFirst.RSS)/mib, float64(r.AtFirst.HWM)/mib, float64(r.AtFirst.HeapInuse)/mib)
	fmt.Printf("  agent RSS after propagation  %.1f MiB (peak %.1f MiB, Go heap in use %.1f MiB)\n",
		float64(r.AtEnd.RSS)/mib, float64(r.AtEnd.HWM)/mib, float64(r.AtEnd.HeapInuse)/mib)
	fmt.Printf("\npropagation: API write -> Snapshot published, with the cluster above\n")
	for _, kind := range slices.Sorted(maps.Keys(r.Propagation)) {
		d := slices.Clone(r.Propagation[kind])
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
