// Command agent measures sockmesh's control plane against a real
// kube-apiserver and etcd (test/apiserver):
//
//   - scale: with -services Services (each with an EndpointSlice of
//     -endpoints addresses), -policies BackendTLSPolicies and their CA
//     ConfigMaps in the API server, a fresh agent process's time to its
//     first Snapshot and its memory (VmRSS, peak VmHWM, Go heap) right
//     after;
//   - propagation: the time from an object change in the API server (a CA
//     rotation in a ConfigMap, an appProtocol toggled on a Service) to the
//     agent publishing the Snapshot that reflects it, p50/p99 over -changes
//     changes, measured in the same cluster.
//
// The agent runs in a child process (this binary re-executed) so that its
// memory is not mixed with the setup's clients. Run: go run ./test/bench/agent
// (the Kubernetes binaries must be built: make k8s-binaries).
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
	if err := run(p, *parallel, *rounds, prof); err != nil {
		fmt.Fprintln(os.Stderr, "agent bench:", err)
		os.Exit(1)
	}
}

func run(p params, parallel, rounds int, prof profiles) error {
	if p.Policies > p.Services || p.Namespaces < 1 || p.Services < 1 || rounds < 1 {
		return fmt.Errorf("need 1 <= policies <= services, namespaces >= 1 and rounds >= 1")
	}
	ctx := context.Background()
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

	var reports []report
	for n := 1; n <= rounds; n++ {
		waitGoFile() // AMEM-HACK
		r, err := runRound(env.Kubeconfig, p, prof.forRound(n, rounds))
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

// AMEM-HACK: dev-only, removed before hand-off.
func waitGoFile() {
	f := os.Getenv("AMEM_GO")
	if f == "" {
		return
	}
	for {
		if os.Remove(f) == nil {
			return
		}
		time.Sleep(time.Second)
	}
}
