package main

import (
	"fmt"
	"os"
)

// runner gives the benchmark's setup what sandbox needs from a test: a stack
// of cleanups, run in reverse when the benchmark ends or fails.
type runner struct {
	cleanups []func()
}

func (r *runner) Helper()           {}
func (r *runner) Cleanup(f func())  { r.cleanups = append(r.cleanups, f) }
func (r *runner) Fatal(args ...any) { r.fail(fmt.Sprint(args...)) }
func (r *runner) Fatalf(format string, args ...any) {
	r.fail(fmt.Sprintf(format, args...))
}
func (r *runner) Skipf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }
func (r *runner) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "datapath bench: "+format+"\n", args...)
}

func (r *runner) TempDir() string {
	dir, err := os.MkdirTemp("", "sockmesh-bench-")
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// close runs the cleanups, newest first.
func (r *runner) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

func (r *runner) fail(msg string) {
	fmt.Fprintln(os.Stderr, "datapath bench:", msg)
	r.close()
	os.Exit(1)
}
