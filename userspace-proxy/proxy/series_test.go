package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestSeriesOfGoneBackends: the metric series of a Service or backend go
// with it from the snapshot — requests, upstream connections, ejections,
// GOAWAYs. Each stayed for the agent's life: a node proxy that saw a
// thousand Services come and go (a namespace per CI run, per preview
// environment) exported, and held in memory, a thousand Services' series.
func TestSeriesOfGoneBackends(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	be := startEcho(t, "web-0", serverTLS(e.pki.server))
	// Trust withdrawn (another CA only): a trust that only widens would
	// keep the relayed connection (upstreamtls.Keeper), and no GOAWAY
	// series would be made.
	rotated := tlsPolicy(e)
	rotated.RootsPEM = string(e.pki.other.CertPEM)
	svc := func(name string, pol *snapshot.TLS) service {
		return service{name: name, vip: vip, backend: snapshot.Backend{TLS: pol, Endpoints: endpoints(be.addr)}}
	}
	for v := range 3 {
		name := fmt.Sprint("web-", v)
		e.p.Update(buildSnapshot(t, uint64(2*v+1), svc(name, tlsPolicy(e))))
		h1, h2 := e.client(vip, false), e.client(vip, true)
		for _, c := range []*http.Client{h1, h2} {
			if code, _ := get(t, c, "http://web.b.svc/"); code != http.StatusOK {
				t.Fatalf("%s: status %d", name, code)
			}
		}
		// New TLS settings ask the relayed HTTP/2 connection to go away.
		e.p.Update(buildSnapshot(t, uint64(2*v+2), svc(name, rotated)))
		if got := e.counterReaches("sockmesh_proxy_goaways_total", map[string]string{"backend": name}, 1); got != 1 {
			t.Fatalf("%s: goaways = %v, want 1", name, got)
		}
		for _, c := range []*http.Client{h1, h2} {
			c.Transport.(*http.Transport).CloseIdleConnections()
		}
	}
	eventually(t, func() bool { return e.counter("sockmesh_proxy_active_connections", nil) == 0 }, "the apps' connections to end")
	e.p.Update(buildSnapshot(t, 7, svc("web-2", rotated)))
	names := seriesNames(t, e)
	for _, gone := range []string{"web-0", "web-1"} {
		if metrics, ok := names[gone]; ok {
			t.Errorf("%s, gone from the snapshot, still has series of %v", gone, metrics)
		}
	}
	if len(names["web-2"]) == 0 {
		t.Errorf("web-2, in the snapshot, has no series: %v", names)
	}
}

// TestSeriesOfGoneServiceStragglers: a request still under way on the
// snapshot its Service left makes no series for it when it ends. Before,
// it made its requests series again, which stayed until the next snapshot.
func TestSeriesOfGoneServiceStragglers(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	release := make(chan struct{})
	rec := startRecorder(t, serverTLS(e.pki.server), func(http.ResponseWriter, *http.Request, int) bool {
		<-release
		return false
	})
	svc := func(name string) service {
		return service{name: name, vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(rec.addr)}}
	}
	e.p.Update(buildSnapshot(t, 1, svc("web-0")))
	code := make(chan int, 1)
	go func() {
		resp, err := e.client(vip, false).Get("http://web.b.svc/")
		if err != nil {
			code <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		code <- resp.StatusCode
	}()
	<-rec.seen
	e.p.Update(buildSnapshot(t, 2, svc("web-1")))
	close(release)
	if c := <-code; c != http.StatusOK {
		t.Fatalf("request under way at the swap: status %d", c)
	}
	if metrics := seriesNames(t, e)["web-0"]; slices.Contains(metrics, "sockmesh_proxy_requests_total") {
		t.Errorf("web-0, gone from the snapshot, has its requests series again after a request under way ended")
	}
}

// seriesNames returns the Services and backends e's metrics name (their
// "service" and "backend" labels), each with the metrics naming it.
func seriesNames(t *testing.T, e *env) map[string][]string {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string][]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if n := l.GetName(); (n == "service" || n == "backend") && l.GetValue() != "" && !slices.Contains(names[l.GetValue()], mf.GetName()) {
					names[l.GetValue()] = append(names[l.GetValue()], mf.GetName())
				}
			}
		}
	}
	return names
}
