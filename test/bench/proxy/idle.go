package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/httpproxy"
)

// The -idle mode: what each proxy keeps per connection that waits — apps
// hold pools of keep-alive connections and gRPC channels that are idle most
// of the time, and a node's one proxy keeps them for every pod. n clients'
// connections go through a target, each after one request of scenario s,
// and stay open; the target's resident memory (nginx: master and workers)
// before and after, divided by n, is the memory per idle connection. Each
// process is measured fresh, once: memory a process freed stays resident
// (Go's heap, malloc's arenas), and would hide what a second set of
// connections costs. Run one scenario per invocation (-only).

// idleScenarios are the connections -idle measures.
// After a 64 KiB answer, buffers the connection kept were written, and are
// resident.
var idleScenarios = []scenario{
	{name: "keep-alive 100 B", path: "/bytes/100"},
	{name: "keep-alive 64 KiB", path: "/bytes/65536"},
	{name: "h2c client 100 B", path: "/bytes/100", h2: true, streams: 1},
	{name: "h2c client 64 KiB", path: "/bytes/65536", h2: true, streams: 1},
}

func idleMemory(c benchConfig, targets []target) error {
	var chosen []scenario
	for _, s := range idleScenarios {
		if strings.Contains(s.name, c.only) {
			chosen = append(chosen, s)
		}
	}
	if len(chosen) != 1 {
		return fmt.Errorf("-idle measures one scenario a run (each process fresh): -only \"keep-alive 100\", \"keep-alive 64\", \"h2c client 100\" or \"h2c client 64\"")
	}
	s := chosen[0]
	fmt.Printf("# %s\n\n%d idle connections per target, each after one request (%s); resident memory of the proxy process (nginx: master and workers) before and after.\n\n",
		c.command, c.idle, s.name)
	fmt.Println("| target | RSS before | RSS with the connections | KiB per idle connection |")
	fmt.Println("|---|---|---|---|")
	for _, t := range targets {
		if t.pid == 0 {
			continue // direct: no proxy
		}
		before, with, err := idleRun(c, t, s)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		fmt.Printf("| %s | %.1f MiB | %.1f MiB | %.1f |\n", t.name, before/(1<<20), with/(1<<20), (with-before)/float64(c.idle)/1024)
	}
	return nil
}

// settle is how long idle connections wait before the proxies' memory is
// read: long enough for sockmesh's to park (httpproxy.DefaultParkAfter)
// and for the workers that served them to retire (10 s idle), as on a
// node whose connections idle for long.
const settle = httpproxy.DefaultParkAfter + 12*time.Second

// idleRun opens c.idle connections through t and returns t's resident
// memory before and while they are open.
func idleRun(c benchConfig, t target, s scenario) (before, with float64, err error) {
	if t.proxy.IsValid() {
		if err := c.capture.to(t.proxy); err != nil {
			return 0, 0, err
		}
	}
	before = settledRSS(t)
	exe, err := os.Executable()
	if err != nil {
		return 0, 0, err
	}
	cmd := c.capture.inCgroup(exec.Command(exe, "-role", "idle", "-url", t.url(s), "-n", strconv.Itoa(c.idle), "-h2c="+strconv.FormatBool(s.h2)))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	if err := c.capture.start(cmd); err != nil {
		return 0, 0, err
	}
	defer func() {
		stdin.Close() // the client closes its connections and exits
		if werr := cmd.Wait(); err == nil && werr != nil {
			err = fmt.Errorf("idle client: %w", werr)
		}
		time.Sleep(2 * time.Second) // the proxy sees the connections end
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		return 0, 0, fmt.Errorf("idle client did not get ready: %q, %v", line, err)
	}
	time.Sleep(settle)
	return before, settledRSS(t), nil
}

// settledRSS is t's resident memory once sockmesh's proxy has collected
// its garbage and returned free memory to the system (SIGUSR1, see
// runProxy): with the agent's GC heap floor, garbage of up to 64 MiB
// would otherwise count as what the connections keep. nginx frees each
// request's memory as it ends.
func settledRSS(t target) float64 {
	if t.proxy.IsValid() {
		syscall.Kill(t.pid, syscall.SIGUSR1)
		time.Sleep(time.Second)
	}
	return rssBytes(t.pid)
}

// rssBytes is the resident memory of pid and its direct children (nginx
// workers), from /proc/PID/status.
func rssBytes(pid int) float64 {
	var total float64
	for _, p := range withChildren(pid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kib, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				total += kib * 1024
			}
		}
	}
	return total
}

// runIdleClient opens n connections to url, each with a transport of its
// own, makes one request on each and keeps them open until stdin ends.
func runIdleClient(url string, n int, h2c bool) error {
	var transports []*http.Transport
	defer func() {
		for _, tr := range transports {
			tr.CloseIdleConnections()
		}
	}()
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	for range n {
		tr := &http.Transport{DisableCompression: true, Protocols: new(http.Protocols), IdleConnTimeout: time.Hour}
		if h2c {
			tr.Protocols.SetUnencryptedHTTP2(true)
		} else {
			tr.Protocols.SetHTTP1(true)
		}
		transports = append(transports, tr)
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := getOnce(tr, url); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%d of %d requests failed: %w", len(errs), n, errs[0])
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return nil
}

func getOnce(tr *http.Transport, url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}
