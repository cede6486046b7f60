// Command agent measures sockmesh's control plane against a real
// kube-apiserver and etcd (test/apiserver):
//
//   - scale: with -services Services (each with an EndpointSlice of
//     -endpoints addresses), -policies BackendTLSPolicies and their CA
//     ConfigMaps in the API server, a fresh agent process's time to its
//     first Snapshot, and its memory: RSS at the first Snapshot, the peak
//     (VmHWM over the whole run, and the largest RSS sampled every 10 ms in
//     each phase), and the steady RSS once the changes are done and the
//     agent sat idle for -settle; with the Go runtime's breakdown (live heap,
//     free heap not yet returned, stacks) and the CPU the process and its
//     GC used;
//   - propagation: the time from an object change in the API server (a CA
//     rotation in a ConfigMap, an appProtocol toggled on a Service) to the
//     agent publishing the Snapshot that reflects it, p50/p99 over -changes
//     changes, measured in the same cluster.
//
// The objects are created once; each of -rounds rounds then runs a fresh
// agent process (this binary re-executed, so that its memory is not mixed
// with the setup's clients), after emptying the policies' status so that
// every round's agent writes all of it, as the first leader in a cluster
// does. -kubeconfig runs the rounds against an API server that already
// holds the objects. Run: go run ./test/bench/agent (the Kubernetes
// binaries must be built: make k8s-binaries). The agent runs as
// cmd/sockmesh runs it without a container limit: no Go soft memory limit
// unless GOMEMLIMIT is set in the environment, which the agent inherits.
//
// Measured on the shared 2-core development VM (provisional: load average
// 4-15 from other work during the runs), 10,000 Services, 50,000
// endpoints, 1,000 policies, 100 changes; each entry one round:
//
//	                          original       translate only   all changes
//	time to first snapshot    1.7, 2.6 s     2.4, 2.6 s       1.9, 3.4, 4.9 s
//	RSS at first snapshot     111, 115 MiB   100, 101 MiB     90, 90, 93 MiB
//	peak RSS (target < 150)   165, 167 MiB   151, 154 MiB     127, 128, 130 MiB
//	steady RSS                153 MiB        135, 145 MiB     114, 115, 115 MiB
//	steady live heap          62 MiB         53, 57 MiB       38, 42, 43 MiB
//	CPU to first snapshot     1.1 s          0.9, 1.4 s       1.0, 1.0, 1.4 s
//
// (all changes: go run ./test/bench/agent, its median peak 127.7 MiB; the
// time to first snapshot varied with the machine's load, its CPU did not.
// The runtime's GC CPU estimate counts idle mark workers, so it overstates
// what the GC takes from other work on an idle core.)
// "translate only": translate skips the endpoints of Services it does not
// capture, parses each CA bundle once per translation and sorts without a
// stable merge (79 -> 65 ms and 36 -> 14 MB allocated per translation at
// this scale in BenchmarkTranslateScale, 158 ms before on a busier
// machine). "all changes" adds: the caches drop what translate does not
// read (Service status and foreign annotations, EndpointSlice annotations,
// hints, targetRef UIDs and spare capacity, Pod and Node fields enrolment
// does not read); referenced ConfigMaps and Secrets are watched by plain
// informers without gzip (each gzip stream kept a 40 KiB decompressor);
// the control plane keeps one copy of the published Snapshot's parts.
// An earlier measurement of the original agent with GOMEMLIMIT=100MiB
// peaked at 120 MiB but took 6 s to its first snapshot on a loaded
// machine: a limit below twice the live heap trades memory for GC CPU.
// The rest of the live heap is the informer caches (about 31 MiB of
// Services and EndpointSlices); the Go runtime lets RSS grow to about
// twice the live heap before it collects (GOGC=100).
//
// With the 64 MiB GC heap floor the agent runs with since (internal/gcfloor;
// the child applies it as cmd/sockmesh does), -rounds 2 on a quiet machine:
// time to first snapshot 1.17, 2.03 s; RSS at first snapshot 101.7, 101.8
// MiB (the floor lets the starting heap reach 64 MiB before collecting);
// peak 126.3, 131.7 MiB; steady 117.6, 125.7 MiB; steady live heap 39.5,
// 43.0 MiB. Above the floor GOGC governs, so the peak did not move.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/sockmesh/sockmesh/test/apiserver"
)

// params are the benchmark's shape, shared by parent and child.
type params struct {
	Services   int `json:"services"`
	Endpoints  int `json:"endpointsPerService"`
	Policies   int `json:"policies"`
	Namespaces int `json:"namespaces"`
	Pods       int `json:"podsOnNode"`
	Changes    int `json:"changes"`
	// Settle is how long the agent sits idle after the changes before its
	// steady memory is read.
	Settle time.Duration `json:"settle"`
}

const nodeName = "bench-node"

func main() {
	child := flag.String("child", "", "internal: run the agent against this kubeconfig and report as JSON")
	var p params
	flag.IntVar(&p.Services, "services", 10000, "Services in the API server")
	flag.IntVar(&p.Endpoints, "endpoints", 5, "endpoints per Service (one EndpointSlice each)")
	flag.IntVar(&p.Policies, "policies", 1000, "BackendTLSPolicies, each on its own Service")
	flag.IntVar(&p.Namespaces, "namespaces", 100, "namespaces the objects are spread over (one CA ConfigMap each)")
	flag.IntVar(&p.Pods, "pods", 50, "pods on the agent's node")
	flag.IntVar(&p.Changes, "changes", 100, "changes timed for propagation")
	flag.DurationVar(&p.Settle, "settle", 15*time.Second, "idle time after the changes before the steady memory is read")
	parallel := flag.Int("parallel", 16, "concurrent requests while creating objects")
	rounds := flag.Int("rounds", 3, "agent runs against the same API server, each a fresh process")
	kubeconfig := flag.String("kubeconfig", "", "run against this API server, which already holds the objects of the same shape (an earlier run's), instead of starting one and creating them")
	var prof profiles
	flag.StringVar(&prof.cpu, "cpuprofile", "", "write the agent's CPU profile (startup and propagation) to this file")
	flag.StringVar(&prof.heap, "memprofile", "", "write the agent's heap profile at its first snapshot to this file, and at the end to this file.end")
	flag.StringVar(&prof.timeline, "timeline", "", "write the agent's RSS and Go heap every 10 ms to this CSV file")
	flag.Parse()
	if *child != "" {
		if err := runChild(*child, p, prof); err != nil {
			fmt.Fprintln(os.Stderr, "agent bench child:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(p, *parallel, *rounds, *kubeconfig, prof); err != nil {
		fmt.Fprintln(os.Stderr, "agent bench:", err)
		os.Exit(1)
	}
}

func run(p params, parallel, rounds int, kubeconfig string, prof profiles) error {
	if p.Policies > p.Services || p.Namespaces < 1 || p.Services < 1 || rounds < 1 {
		return fmt.Errorf("need 1 <= policies <= services, namespaces >= 1 and rounds >= 1")
	}
	ctx := context.Background()
	var gw gwclient.Interface
	if kubeconfig == "" {
		start := time.Now()
		env, err := apiserver.Run(ctx, apiserver.Options{})
		if err != nil {
			return err
		}
		defer env.Stop()
		fmt.Printf("api server up with CRDs in %s\n", time.Since(start).Round(time.Millisecond))

		setup, err := createObjects(ctx, env, p, parallel)
		if err != nil {
			return err
		}
		fmt.Printf("created %d objects (%d Services, %d endpoints, %d policies, %d namespaces, %d pods) in %s with %d parallel requests (%.0f objects/s)\n",
			setup.objects, p.Services, p.Services*p.Endpoints, p.Policies, p.Namespaces, p.Pods,
			setup.duration.Round(time.Millisecond), parallel, float64(setup.objects)/setup.duration.Seconds())
		kubeconfig, gw = env.Kubeconfig, env.Gateway
	} else {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return fmt.Errorf("load kubeconfig: %w", err)
		}
		cfg.QPS, cfg.Burst = 1000, 2000 // as apiserver.Env's clients
		if gw, err = gwclient.NewForConfig(cfg); err != nil {
			return err
		}
	}

	var reports []report
	for n := 1; n <= rounds; n++ {
		if err := clearStatus(ctx, gw, p, parallel); err != nil {
			return fmt.Errorf("round %d: clear status: %w", n, err)
		}
		r, err := runRound(kubeconfig, p, prof.forRound(n, rounds))
		if err != nil {
			return fmt.Errorf("round %d: %w", n, err)
		}
		r.printRound(n)
		reports = append(reports, r)
	}
	summarize(p, reports)
	return nil
}

// runRound runs one agent child process to the end and returns its report.
func runRound(kubeconfig string, p params, prof profiles) (report, error) {
	self, err := os.Executable()
	if err != nil {
		return report{}, fmt.Errorf("find own executable: %w", err)
	}
	args := []string{"-child", kubeconfig, "-settle=" + p.Settle.String()}
	for _, kv := range [][2]any{{"services", p.Services}, {"endpoints", p.Endpoints}, {"policies", p.Policies},
		{"namespaces", p.Namespaces}, {"pods", p.Pods}, {"changes", p.Changes}} {
		args = append(args, fmt.Sprintf("-%s=%d", kv[0], kv[1]))
	}
	for flag, path := range map[string]string{"cpuprofile": prof.cpu, "memprofile": prof.heap, "timeline": prof.timeline} {
		if path != "" {
			abs, err := filepath.Abs(path)
			if err != nil {
				return report{}, err
			}
			args = append(args, "-"+flag+"="+abs)
		}
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return report{}, fmt.Errorf("agent child: %w", err)
	}
	var r report
	if err := json.Unmarshal(out, &r); err != nil {
		return report{}, fmt.Errorf("decode child report: %w (%s)", err, out)
	}
	return r, nil
}

// forRound numbers the profile files when there is more than one round.
func (p profiles) forRound(n, rounds int) profiles {
	if rounds == 1 {
		return p
	}
	suffix := func(path string) string {
		if path == "" {
			return ""
		}
		return fmt.Sprintf("%s.%d", path, n)
	}
	return profiles{cpu: suffix(p.cpu), heap: suffix(p.heap), timeline: suffix(p.timeline)}
}
