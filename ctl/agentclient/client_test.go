package agentclient

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/explain"
	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/pki"
)

// serve runs a real introspection server for a small agent (no datapath)
// on a socket and, with TLS and a token, on a loopback port.
func serve(t *testing.T) (socket string, addr string, caFile, tokenFile string) {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA("agentclient test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "agent", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := leaf.WriteFiles(dir, "agent")
	if err != nil {
		t.Fatal(err)
	}
	if caFile, err = ca.WriteFile(dir, "ca"); err != nil {
		t.Fatal(err)
	}
	tokenFile = filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	snap, err := snapshot.New(5, nil, nil, []snapshot.Workload{{Pod: snapshot.ObjectRef{Namespace: "app", Name: "c"}, NotEnrolled: "the pod has the label sockmesh.io/capture=disabled"}})
	if err != nil {
		t.Fatal(err)
	}
	cat := introspect.NewCatalog()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sockmesh_test_value", Help: "a test gauge"})
	g.Set(42)
	cat.MustRegister(g)
	src := &introspect.Sources{Node: "n1", Metrics: cat, Applied: func() (*snapshot.Snapshot, time.Time) { return snap, time.Unix(1, 0) }}
	s, err := httpapi.NewServer(httpapi.Config{Socket: filepath.Join(dir, "agent.sock"), Listen: "127.0.0.1:0",
		TLSCertFile: certFile, TLSKeyFile: keyFile, TokenFile: tokenFile}, src, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	socket, tcp := s.Addrs()
	return socket, tcp.String(), caFile, tokenFile
}

func TestClient(t *testing.T) {
	socket, addr, caFile, tokenFile := serve(t)
	ctx := context.Background()
	local, err := New(Config{Socket: socket})
	if err != nil {
		t.Fatal(err)
	}
	remote, err := New(Config{Address: addr, CAFile: caFile, TokenFile: tokenFile})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*Client{"socket": local, "tls": remote} {
		t.Run(name, func(t *testing.T) {
			st, err := c.Status(ctx)
			if err != nil || st.Node != "n1" || st.Snapshot.Version != 5 {
				t.Errorf("Status() = %+v, %v", st, err)
			}
			e, err := c.Explain(ctx, explain.Query{Pod: snapshot.ObjectRef{Namespace: "app", Name: "c"}, Port: 80,
				Addrs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}})
			if err != nil || e.Verdict != explain.NotEnrolled || !strings.Contains(e.Summary, "capture=disabled") {
				t.Errorf("Explain() = %+v, %v", e, err)
			}
			mfs, err := c.Metrics(ctx)
			if err != nil || mfs["sockmesh_test_value"].GetMetric()[0].GetGauge().GetValue() != 42 {
				t.Errorf("Metrics() = %v, %v", mfs, err)
			}
			cat, err := c.Catalog(ctx)
			if err != nil || len(cat) == 0 {
				t.Errorf("Catalog() = %v, %v", cat, err)
			}
			snap, err := c.Snapshot(ctx)
			if err != nil || snap.Snapshot == nil || snap.Snapshot.Version != 5 {
				t.Errorf("Snapshot() = %+v, %v", snap, err)
			}
			// The agent has no datapath: the error carries its message and
			// code.
			_, err = c.Counters(ctx)
			var se *StatusError
			if !errors.As(err, &se) || se.Code != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "no datapath") {
				t.Errorf("Counters() error = %v, want the agent's 503", err)
			}
		})
	}
	t.Run("bad request", func(t *testing.T) {
		_, err := local.Explain(ctx, explain.Query{Pod: snapshot.ObjectRef{Namespace: "app", Name: "c"}, Port: 80})
		var se *StatusError
		if !errors.As(err, &se) || se.Code != http.StatusBadRequest || !strings.Contains(se.Message, "name the destination") {
			t.Errorf("Explain() without a destination: %v, want the agent's 400", err)
		}
	})
	t.Run("wrong token", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "token")
		os.WriteFile(bad, []byte("guess"), 0o600)
		c, err := New(Config{Address: addr, CAFile: caFile, TokenFile: bad})
		if err != nil {
			t.Fatal(err)
		}
		var se *StatusError
		if _, err := c.Status(ctx); !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
			t.Errorf("Status() with a wrong token: %v, want 401", err)
		}
	})
	t.Run("no agent", func(t *testing.T) {
		c, err := New(Config{Socket: filepath.Join(t.TempDir(), "none.sock")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Status(ctx); err == nil || !strings.Contains(err.Error(), "no agent listening") {
			t.Errorf("Status() with no agent: %v", err)
		}
	})
	t.Run("path not served", func(t *testing.T) {
		// As an agent older than the client answers a newer endpoint.
		_, err := local.get(ctx, "/v1/newer", nil, "application/json")
		var se *StatusError
		if !errors.As(err, &se) || se.Code != http.StatusNotFound || !strings.Contains(se.Message, "/v1/newer is not served here") {
			t.Errorf("get(/v1/newer) = %v, want a 404 naming the path", err)
		}
	})
	t.Run("no agent at the address", func(t *testing.T) {
		// A port nothing listens on: listened on, then closed.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		refused := ln.Addr().String()
		ln.Close()
		c, err := New(Config{Address: refused, CAFile: caFile, TokenFile: tokenFile})
		if err != nil {
			t.Fatal(err)
		}
		// The socket's advice (--agent-socket, this node) misleads here.
		_, err = c.Status(ctx)
		if err == nil || !strings.Contains(err.Error(), "no agent listening") || !strings.Contains(err.Error(), "--agent-address") ||
			strings.Contains(err.Error(), "--agent-socket") || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("Status() at %s, where nothing listens: %v; want no agent listening, the advice naming --agent-address, ECONNREFUSED wrapped", refused, err)
		}
	})
	t.Run("config errors", func(t *testing.T) {
		if _, err := New(Config{Address: addr}); err == nil {
			t.Error("an address without a token: no error")
		}
		if _, err := New(Config{Address: addr, TokenFile: tokenFile, CAFile: tokenFile}); err == nil {
			t.Error("a CA file without a certificate: no error")
		}
	})
}
