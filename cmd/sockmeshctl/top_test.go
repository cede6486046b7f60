package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
	"github.com/sockmesh/sockmesh/ctl/top"
)

// topAgent serves a small agent's introspection API whose metrics hold
// app/secure's requests, on a socket of its own, until the test ends.
func topAgent(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	startTopAgent(t, sock, 3)
	return sock
}

// startTopAgent serves, on sock, an agent whose proxy answered requests
// HTTP requests to app/secure; stop (or the test's end) stops it.
func startTopAgent(t *testing.T, sock string, requests float64) (stop func()) {
	t.Helper()
	cat := introspect.NewCatalog()
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sockmesh_proxy_requests_total", Help: "requests"},
		[]string{"namespace", "service", "code", "protocol"})
	counter.WithLabelValues("app", "secure", "200", "HTTP11").Add(requests)
	cat.MustRegister(counter)
	srv, err := httpapi.NewServer(httpapi.Config{Socket: sock}, &introspect.Sources{Node: "node-a", Metrics: cat}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	t.Cleanup(stop)
	return stop
}

// syncBuffer is a bytes.Buffer that a running command writes while the
// test reads it; wrote signals each write.
type syncBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	wrote chan struct{}
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{wrote: make(chan struct{}, 1)} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case b.wrote <- struct{}{}:
	default: // a signal is pending already
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runCtl runs sockmeshctl's command in process and returns its output.
func runCtl(args ...string) (string, error) {
	stdout, _, err := runCtlStderr(args...)
	return stdout, err
}

// runCtlStderr runs sockmeshctl in the test process and returns what it
// printed on stdout and on stderr.
func runCtlStderr(args ...string) (stdout, stderr string, err error) {
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

// TestTopYAMLDocuments: each refresh of top -o yaml is a YAML document of
// its own. Printed back to back without ---, two refreshes were one
// document with every key twice, which no YAML reader takes.
func TestTopYAMLDocuments(t *testing.T) {
	sock := topAgent(t)
	out, err := runCtl("top", "--agent-socket="+sock, "--count=2", "--interval=1ms", "-o", "yaml")
	if err != nil {
		t.Fatalf("top -o yaml: %v\n%s", err, out)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(out)))
	var views []top.View
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var v top.View
		if err := yaml.UnmarshalStrict(doc, &v); err != nil {
			t.Fatalf("top -o yaml, document %d: %v\n%s", len(views), err, out)
		}
		views = append(views, v)
	}
	if len(views) != 2 || views[1].Node != "node-a" || len(views[1].Services) != 1 || views[1].Services[0].Total != 3 {
		t.Errorf("top --count=2 -o yaml = %+v, want 2 documents, each with app/secure's 3 requests\n%s", views, out)
	}
}

// TestTopFlags: an interval of zero scraped the agent as fast as it
// answered, a negative count exited at once with status 0 and no output.
func TestTopFlags(t *testing.T) {
	sock := topAgent(t)
	for _, c := range []struct{ flag, want string }{
		{"--interval=0s", "--interval 0s: want a positive duration"},
		{"--interval=-1s", "--interval -1s: want a positive duration"},
		{"--count=-1", "--count -1: want 0 (until interrupted) or more"},
	} {
		out, err := runCtl("top", "--agent-socket="+sock, "--count=1", c.flag)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("top %s: error %v, want %q; output:\n%s", c.flag, err, c.want, out)
		}
	}
}

// TestTopThroughRestart: without --count, top ended (exit 1) at the first
// scrape an agent's restart failed. It warns and goes on, and shows the
// next agent's traffic.
func TestTopThroughRestart(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	stopFirst := startTopAgent(t, sock, 3)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out, errOut := newSyncBuffer(), newSyncBuffer()
	cmd := newRootCommand()
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	cmd.SetArgs([]string{"top", "--agent-socket=" + sock, "--interval=1ms", "-o", "json"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	// waitFor only keeps a broken top from hanging the test.
	deadline := time.After(waitFor)
	wait := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			select {
			case <-out.wrote:
			case <-errOut.wrote:
			case err := <-done:
				t.Fatalf("top ended (%v) before it %s; stdout:\n%s\nstderr:\n%s", err, what, out.String(), errOut.String())
			case <-deadline:
				t.Fatalf("top never %s; stdout:\n%s\nstderr:\n%s", what, out.String(), errOut.String())
			}
		}
	}
	wait("showed the first agent's requests", func() bool { return strings.Contains(out.String(), `"total": 3`) })
	stopFirst()
	wait("warned of the failed scrape", func() bool { return strings.Contains(errOut.String(), "no agent listening") })
	startTopAgent(t, sock, 7)
	wait("showed the next agent's requests", func() bool { return strings.Contains(out.String(), `"total": 7`) })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("top interrupted: %v, want nil", err)
	}

}
