// Package benchrun gives a benchmark program what internal/sandbox needs
// from a test (sandbox.TB): a stack of cleanups, run newest first when the
// benchmark ends or fails, so its netns, cgroups and bpffs mounts never
// outlive it.
package benchrun

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Runner is a benchmark's sandbox.TB. Fatal ends the program after the
// cleanups.
type Runner struct {
	name     string
	mu       sync.Mutex
	cleanups []func()
	// closing is held while cleanups run: a signal's Close and the
	// program's own may overlap, and the second must not return (and the
	// program exit) before the first is done.
	closing sync.Mutex
}

// New returns a Runner whose messages start with name. An interrupt or
// SIGTERM fails it, so cleanups run then too.
func New(name string) *Runner {
	r := &Runner{name: name}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		r.Fail("interrupted")
	}()
	return r
}

func (r *Runner) Helper() {}

func (r *Runner) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

func (r *Runner) Fatal(args ...any)                 { r.Fail(fmt.Sprint(args...)) }
func (r *Runner) Fatalf(format string, args ...any) { r.Fail(fmt.Sprintf(format, args...)) }
func (r *Runner) Skipf(format string, args ...any)  { r.Fail(fmt.Sprintf(format, args...)) }
func (r *Runner) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, r.name+": "+format+"\n", args...)
}

func (r *Runner) TempDir() string {
	dir, err := os.MkdirTemp("", "sockmesh-bench-")
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Close runs the cleanups, newest first, and returns when they are done,
// also when another Close runs them.
func (r *Runner) Close() {
	r.closing.Lock()
	defer r.closing.Unlock()
	r.mu.Lock()
	cleanups := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
}

// Fail prints msg, runs the cleanups and exits with status 1.
func (r *Runner) Fail(msg string) {
	fmt.Fprintln(os.Stderr, r.name+":", msg)
	r.Close()
	os.Exit(1)
}
