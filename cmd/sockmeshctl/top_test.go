package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
	"github.com/sockmesh/sockmesh/ctl/top"
)

// topAgent serves a small agent's introspection API whose metrics hold
// one Service's requests, and returns its socket.
func topAgent(t *testing.T) string {
	t.Helper()
	cat := introspect.NewCatalog()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sockmesh_proxy_requests_total", Help: "requests"},
		[]string{"namespace", "service", "code", "protocol"})
	requests.WithLabelValues("app", "secure", "200", "HTTP11").Add(3)
	cat.MustRegister(requests)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	srv, err := httpapi.NewServer(httpapi.Config{Socket: sock}, &introspect.Sources{Node: "node-a", Metrics: cat}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	return sock
}

// runCtl runs sockmeshctl's command in process and returns its output.
func runCtl(args ...string) (string, error) {
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
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
