package proxy_test

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestRetryBudgetGivenBack: a retry its backend's budget allowed, whose
// app leaves during the backoff, is never sent and takes nothing from the
// budget: the next request's retry, the one the budget allows in 10 s,
// goes and serves. Before, the retry nobody sent spent the budget, and
// the next request got 503 retry_budget_exhausted: in a retry storm, apps
// with short timeouts spent the retries of those that wait.
func TestRetryBudgetGivenBack(t *testing.T) {
	inBubbles(t, testRetryBudgetGivenBack)
}

func testRetryBudgetGivenBack(t *testing.T, k clientKind) {
	var pn pipenet.Net
	backendAddr := netip.MustParseAddrPort("10.0.0.1:8080")
	tc := &tryCounter{tries: map[string]int{}}
	servePipe(t, &pn, backendAddr, tc)
	p, reg := pipeProxy(t, &pn, proxy.Config{HTTP1TLS: k.path})
	m := &mesh{t: t}
	be := m.backend("flaky", snapshot.Backend{Endpoints: endpoints(backendAddr), RetryConstraint: oneRetryIn10s()})
	retry := func(backoff time.Duration) *snapshot.Retry {
		return &snapshot.Retry{Attempts: 1, Codes: []int{500}, Backoff: dur(backoff)}
	}
	m.frontend("flaky", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		// The first wait is 5 to 10 s; the app leaves after 2.
		rule{[]snapshot.RouteMatch{prefixMatch("/slow")}, snapshot.RouteRule{Backends: to(be), Retry: retry(10 * time.Second)}},
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be), Retry: retry(0)}},
	)))
	p.Update(m.snapshot(1))
	client := pipeClient(t, p, k.h2c)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://flaky.b.svc/slow?id=left&fail=1", nil)
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d before the app left", resp.StatusCode)
	}
	synctest.Wait() // the proxy saw the app leave
	if n := tc.count("left"); n != 1 {
		t.Fatalf("the backend saw %d tries of the request whose app left, want 1", n)
	}
	if got := counterValue(t, reg, "sockmesh_proxy_request_failures_total", "reason", "canceled"); got != 1 {
		t.Fatalf("failures{canceled} = %v, want 1: the app's leaving ended the backoff", got)
	}

	resp, err := client.Get("http://flaky.b.svc/?id=next&fail=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || tc.count("next") != 2 {
		t.Errorf("the next request, its retry the budget's one in 10 s: %d %q after %d tries, want 200 after 2", resp.StatusCode, body, tc.count("next"))
	}
	if got := counterValue(t, reg, "sockmesh_proxy_retry_budget_exhausted_total", "reason", "status"); got != 0 {
		t.Errorf("retry_budget_exhausted{status} = %v, want 0", got)
	}
}

// oneRetryIn10s is an XBackendTrafficPolicy's retry budget that allows one
// retry in 10 s, whatever the requests.
func oneRetryIn10s() *snapshot.RetryConstraint {
	return &snapshot.RetryConstraint{
		MinRetryCount: 1, MinRetryInterval: snapshot.Duration(10 * time.Second), BudgetInterval: snapshot.Duration(10 * time.Second),
		Policy: snapshot.ObjectRef{Kind: "XBackendTrafficPolicy", Namespace: "b", Name: "budget"},
	}
}
