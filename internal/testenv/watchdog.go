package testenv

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"
)

// Watchdog arms a report of the tests still running shortly before the
// test binary's -test.timeout would end it (a tenth of the timeout
// before, at most 30 s), then exits 2. The testing package's own timeout
// report names the running tests first and then dumps every goroutine —
// thousands of lines in a package that runs servers — so a CI log kept by
// its tail loses the names: this report dumps the goroutines first and
// ends with the tests' goroutines, each with its wait and how long it has
// waited. Call it from TestMain before m.Run.
func Watchdog() {
	if !flag.Parsed() {
		flag.Parse()
	}
	f := flag.Lookup("test.timeout")
	if f == nil {
		return
	}
	d, _ := f.Value.(flag.Getter).Get().(time.Duration)
	if d <= 0 {
		return
	}
	time.AfterFunc(d-min(d/10, 30*time.Second), func() {
		fmt.Fprintf(os.Stderr, "testenv: -test.timeout %v nearly over\n", d)
		reportRunning(os.Stderr, allStacks())
		os.Exit(2)
	})
}

// allStacks is every goroutine's stack, as runtime.Stack writes them.
func allStacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// reportRunning writes stacks, then a line for each goroutine that runs a
// test function: its header (number, wait and how long) and the test's
// frame, the innermost one that testing.tRunner called.
func reportRunning(w io.Writer, stacks string) {
	io.WriteString(w, stacks)
	fmt.Fprintln(w, "\ntestenv: tests still running (their goroutines' stacks above):")
	for _, g := range strings.Split(stacks, "\n\n") {
		lines := strings.Split(g, "\n")
		for i, l := range lines {
			if strings.HasPrefix(l, "testing.tRunner(") && i >= 2 {
				if name := funcName(lines[i-2]); !strings.HasPrefix(name, "testing.") { // not the runner's own
					fmt.Fprintf(w, "  %s %s\n", name, strings.TrimSuffix(lines[0], ":"))
				}
				break
			}
		}
	}
}

// funcName is a stack frame's function without its package path and
// arguments: "proxy_test.TestX.func1".
func funcName(frame string) string {
	frame = frame[strings.LastIndexByte(frame, '/')+1:]
	if i := strings.LastIndexByte(frame, '('); i > 0 {
		frame = frame[:i]
	}
	return frame
}
