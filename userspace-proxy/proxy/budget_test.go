package proxy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestRetryBudget: a backend's retry budget (XBackendTrafficPolicy
// retryConstraint) stops a route rule's retries once the retries of the
// interval reach the budget; the client then gets 503 instead of another
// try, first tries still go through, the budget grows with the traffic
// the backend gets, survives a snapshot that keeps the constraint, starts
// afresh with a changed one, and allows retries again once the interval
// has rolled past the spent ones. Time is the synctest bubble's, so the
// window rolls exactly when the test says.
//
// Kinds: an h2c client (net/http's server), an HTTP/1.1 client through
// net/http's server (HTTP1TLSL7), an HTTP/1.1 client on the fast path to
// an h2c backend (net/http's Transport), and the HTTP/1.1 fast path to an
// HTTP/1.1 backend (pooled connections).
func TestRetryBudget(t *testing.T) {
	for _, k := range []struct {
		name  string
		h2c   bool
		path  proxy.HTTP1TLSPath
		proto snapshot.Protocol
	}{
		{"h2c", true, proxy.HTTP1TLSAuto, snapshot.ProtocolAuto},
		{"http1-nethttp", false, proxy.HTTP1TLSL7, snapshot.ProtocolAuto},
		{"http1-to-h2c-backend", false, proxy.HTTP1TLSAuto, snapshot.ProtocolH2C},
		{"http1-fast", false, proxy.HTTP1TLSAuto, snapshot.ProtocolAuto},
	} {
		t.Run(k.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testRetryBudget(t, k.h2c, k.path, k.proto) })
		})
	}
}

// tryCounter is a backend whose answer to ?id=I&fail=F is 500 for the
// first F tries of I, then 200; it counts the tries of each id.
type tryCounter struct {
	mu    sync.Mutex
	tries map[string]int
}

func (c *tryCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	id := r.URL.Query().Get("id")
	c.mu.Lock()
	c.tries[id]++
	n := c.tries[id]
	c.mu.Unlock()
	fail, _ := strconv.Atoi(r.URL.Query().Get("fail"))
	if n <= fail {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	io.WriteString(w, "ok")
}

func (c *tryCounter) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tries[id]
}

// servePipe serves h over HTTP/1.1 and h2c at addr on pn until the test
// ends: a backend for tests in a synctest bubble, which has no sockets.
func servePipe(t *testing.T, pn *pipenet.Net, addr netip.AddrPort, h http.Handler) {
	srv := &http.Server{Protocols: new(http.Protocols), Handler: h}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(pn.Listen(addr))
	t.Cleanup(func() { srv.Close() })
}

// pipeProxy is a proxy of cfg that dials through pn until the test ends,
// and the registry of its metrics.
func pipeProxy(t *testing.T, pn *pipenet.Net, cfg proxy.Config) (*proxy.Proxy, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	cfg.Dialer = pn
	p, err := proxy.New(cfg, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Shutdown(context.Background()) })
	return p, reg
}

func testRetryBudget(t *testing.T, h2c bool, path proxy.HTTP1TLSPath, proto snapshot.Protocol) {
	var pn pipenet.Net
	backendAddr := netip.MustParseAddrPort("10.0.0.1:8080")
	tc := &tryCounter{tries: map[string]int{}}
	servePipe(t, &pn, backendAddr, tc)
	p, reg := pipeProxy(t, &pn, proxy.Config{HTTP1TLS: path})

	// snap builds the world with the backend's retry constraint: a
	// percent budget over 10 s, and at least minRetries per 10 s.
	snap := func(version uint64, percent, minRetries int) *snapshot.Snapshot {
		m := &mesh{t: t}
		be := m.backend("flaky", snapshot.Backend{Protocol: proto, Endpoints: endpoints(backendAddr),
			RetryConstraint: &snapshot.RetryConstraint{
				BudgetPercent: percent, BudgetInterval: snapshot.Duration(10 * time.Second),
				MinRetryCount: minRetries, MinRetryInterval: snapshot.Duration(10 * time.Second),
				Policy: snapshot.ObjectRef{Kind: "XBackendTrafficPolicy", Namespace: "b", Name: "budget"},
			}})
		m.frontend("flaky", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
			rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be),
				Retry: &snapshot.Retry{Attempts: 3, Codes: []int{500}, Backoff: dur(0)}}},
		)))
		return m.snapshot(version)
	}
	p.Update(snap(1, 0, 2))

	client := pipeClient(t, p, h2c)

	id := 0
	// expect sends a request failing its first fail tries and checks the
	// status the client gets and the tries the backend saw.
	expect := func(step string, fail, status, tries int, body string) {
		t.Helper()
		id++
		url := fmt.Sprintf("http://flaky.b.svc/?id=%d&fail=%d", id, fail)
		resp, err := client.Get(url)
		if err != nil {
			t.Fatalf("%s: GET %s: %v", step, url, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != status || body != "" && string(b) != body {
			t.Errorf("%s: GET %s: %d %q, want %d %q", step, url, resp.StatusCode, b, status, body)
		}
		if n := tc.count(strconv.Itoa(id)); n != tries {
			t.Errorf("%s: GET %s: the backend saw %d tries, want %d", step, url, n, tries)
		}
	}
	const spent = "sockmesh: retry_budget_exhausted\n"

	// 0 % of the traffic, at least 2 retries per 10 s.
	expect("within the minimum rate", 1, 200, 2, "ok")      // 1 retry
	expect("budget runs out mid-request", 3, 503, 2, spent) // 1 more retry, the next refused
	expect("budget spent", 1, 503, 1, spent)                // no retry at all
	expect("first tries still go", 0, 200, 1, "ok")

	// A snapshot keeping the constraint keeps the spent budget.
	p.Update(snap(2, 0, 2))
	expect("after an unchanged snapshot", 1, 503, 1, spent)

	// The window rolls: 10 s after the retries, they no longer count.
	time.Sleep(10 * time.Second)
	expect("window rolled", 2, 200, 3, "ok")
	expect("spent again", 1, 503, 1, spent)

	// A changed constraint starts afresh. 20 % of the traffic (retries
	// count as requests): after 20 first tries, a failing request gets all
	// 3 retries (3 of 24 requests) and the backend's own 500; the next gets
	// 2 (5 of 27), the third would be 6 of 28.
	p.Update(snap(3, 20, 1))
	for range 20 {
		expect("traffic", 0, 200, 1, "ok")
	}
	expect("budget grows with traffic", 4, 500, 4, "")
	expect("until it is spent", 4, 503, 3, spent)

	if got := counterValue(t, reg, "sockmesh_proxy_retry_budget_exhausted_total", "reason", "status"); got != 5 {
		t.Errorf("retry_budget_exhausted{status} = %v, want 5", got)
	}
	if got := counterValue(t, reg, "sockmesh_proxy_request_failures_total", "reason", "retry_budget_exhausted"); got != 5 {
		t.Errorf("request_failures{retry_budget_exhausted} = %v, want 5", got)
	}
}
