// Command demo is `make demo`: sockmesh on its embedded default, explained
// in one screen. As root, on this machine, it builds a tiny node out of
// network namespaces — a "node" running the agent, a client "pod", a
// backend "pod" running sockmesh-echo servers — writes the shipped example
// manifests (examples/demo) with the real addresses and a freshly made CA
// into a temporary directory, starts `sockmesh agent --source=file` on
// them, sends plaintext HTTP/1.1 from the client to four Service
// addresses, and prints what the client sent next to what each backend
// saw: TLS with the policy's SNI, mutual TLS to an external hostname, h2c,
// WebSocket. It exits non-zero when a backend did not see what its owner
// declared, and removes everything it made, also on Ctrl-C.
//
//	go build -o bin/ ./cmd/... && go run ./test/demo -bin bin
//
// The programs attach to a throwaway cgroup (a real node attaches at the
// cgroup v2 root) and pin to a private BPF filesystem, so the demo never
// touches capture another agent on this machine may run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.binDir, "bin", "bin", "directory holding the sockmesh and sockmesh-echo binaries (make build)")
	flag.StringVar(&cfg.manifests, "manifests", "examples/demo", "the example manifests to run with")
	flag.BoolVar(&cfg.verbose, "v", false, "also print the agent's log")
	flag.Parse()
	cfg.out = os.Stdout

	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root for network namespaces, cgroups and eBPF: sudo make demo")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	r := &runner{}
	err := r.do(func() error { return run(ctx, r, cfg) })
	// Cleanups run with the signals still caught: a second Ctrl-C must not
	// leave half of the demo behind.
	r.close()
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "demo: interrupted; cleaned up")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	case r.failed:
		fmt.Fprintln(os.Stderr, "demo: cleanup failed (see above)")
		os.Exit(1)
	}
	fmt.Printf("cleaned up; the demo took %s\n", time.Since(start).Round(100*time.Millisecond))
}

// runner gives the demo what internal/sandbox needs from a test: a stack of
// cleanups run in reverse, and Fatal that ends the step in progress.
type runner struct {
	cleanups []func()
	failed   bool
}

// fatal carries a Fatal's message from the panic to do.
type fatal struct{ msg string }

func (r *runner) Helper()                        {}
func (r *runner) Cleanup(f func())               { r.cleanups = append(r.cleanups, f) }
func (r *runner) Fatal(args ...any)              { panic(fatal{fmt.Sprint(args...)}) }
func (r *runner) Fatalf(format string, a ...any) { panic(fatal{fmt.Sprintf(format, a...)}) }
func (r *runner) Skipf(format string, a ...any)  { panic(fatal{fmt.Sprintf(format, a...)}) }
func (r *runner) Errorf(format string, a ...any) {
	r.failed = true
	fmt.Fprintf(os.Stderr, "demo: "+format+"\n", a...)
}

func (r *runner) TempDir() string {
	dir, err := os.MkdirTemp("", "sockmesh-demo-")
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// do runs fn, turning a Fatal inside it into an error.
func (r *runner) do(fn func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			f, ok := v.(fatal)
			if !ok {
				panic(v)
			}
			err = errors.New(f.msg)
		}
	}()
	return fn()
}

// close runs the cleanups, newest first.
func (r *runner) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}
