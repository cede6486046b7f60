package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// TestRetryWithoutConnection: a retry that waits for a connection it
// never gets — its endpoint has its one connection (MaxConnsPerEndpoint)
// in use, and the app leaves meanwhile — is never sent: it is not
// counted in sockmesh_proxy_request_retries_total and takes nothing from
// the backend's retry budget, on every path (the fast path's pool wait,
// net/http's HTTP/1.1 Transport over the same pool, from HTTP/1.1 and
// h2c apps). The next request's retry, the one the budget allows in
// 10 s, goes and serves. Before, the retry counted as sent and kept its
// charge: the next request got 503 retry_budget_exhausted.
func TestRetryWithoutConnection(t *testing.T) {
	inBubbles(t, testRetryWithoutConnection)
}

func testRetryWithoutConnection(t *testing.T, k clientKind) {
	var pn pipenet.Net
	backendAddr := netip.MustParseAddrPort("10.0.0.1:8080")
	tc := &tryCounter{tries: map[string]int{}}
	release := make(chan struct{})
	unhold := sync.OnceFunc(func() { close(release) })
	defer unhold() // a failure's too: the bubble ends once ?id=hold does
	servePipe(t, &pn, backendAddr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("id") == "hold" {
			<-release
		}
		tc.ServeHTTP(w, r)
	}))
	p, reg := flakyRetryProxy(t, &pn, backendAddr, k)
	left := leaveDuringRetry(t, p, k)
	synctest.Wait() // its first try answered 500, its connection back in the pool: the backoff
	held := make(chan string, 1)
	go func() {
		a, err := getFlaky(pipeClient(t, p, k.h2c), context.Background(), "id=hold")
		if err != nil {
			a = err.Error()
		}
		held <- a
	}()
	synctest.Wait() // the endpoint's one connection carries ?id=hold
	if err := <-left; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the request whose retry waited: %v, want its app's deadline", err)
	}
	synctest.Wait() // the proxy saw the app leave
	if n := tc.count("left"); n != 1 {
		t.Fatalf("the backend saw %d tries of the request whose app left, want 1", n)
	}
	if got := counterValue(t, reg, "sockmesh_proxy_request_retries_total", "reason", "status"); got != 0 {
		t.Errorf("retries{status} = %v, want 0: the retry got no connection", got)
	}
	unhold()
	if a := <-held; a != "200 ok" {
		t.Fatalf("the request holding the connection: %q, want 200 ok", a)
	}

	if a, err := getFlaky(pipeClient(t, p, k.h2c), context.Background(), "id=next&fail=1"); err != nil || a != "200 ok" || tc.count("next") != 2 {
		t.Errorf("the next request, its retry the budget's one in 10 s: %q %v after %d tries, want 200 ok after 2", a, err, tc.count("next"))
	}
	if got := counterValue(t, reg, "sockmesh_proxy_retry_budget_exhausted_total", "reason", "status"); got != 0 {
		t.Errorf("retry_budget_exhausted{status} = %v, want 0", got)
	}
	if got := counterValue(t, reg, "sockmesh_proxy_request_retries_total", "reason", "status"); got != 1 {
		t.Errorf("retries{status} = %v, want 1: the next request's", got)
	}
}

// TestRetrySentOnStaleConnection: a retry whose try went out on a pooled
// connection the backend then closed without an answer, and whose send
// again waited for a connection it never got — the endpoint's one
// (MaxConnsPerEndpoint) went meanwhile to a request queued for it, and
// the app left — was sent: it is counted in
// sockmesh_proxy_request_retries_total and keeps its charge of the
// backend's retry budget, on every path; the next request's retry is
// refused (503). Before, net/http's HTTP/1.1 Transport failed the request
// with its last wait's error, and the retry counted as never sent and was
// given back, though the backend had read it.
func TestRetrySentOnStaleConnection(t *testing.T) {
	inBubbles(t, testRetrySentOnStaleConnection)
}

func testRetrySentOnStaleConnection(t *testing.T, k clientKind) {
	var pn pipenet.Net
	backendAddr := netip.MustParseAddrPort("10.0.0.1:8080")
	tc := &tryCounter{tries: map[string]int{}}
	retried, cut, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	unhold := sync.OnceFunc(func() { close(release) })
	defer unhold() // a failure's too: the bubble ends once ?id=hold does
	servePipe(t, &pn, backendAddr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch id := r.URL.Query().Get("id"); {
		case id == "hold":
			<-release
		case id == "left" && tc.count("left") == 1:
			// The retry: its connection closes under it, unanswered.
			tc.ServeHTTP(httptest.NewRecorder(), r)
			close(retried)
			<-cut
			c, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			c.Close()
			return
		}
		tc.ServeHTTP(w, r)
	}))
	p, reg := flakyRetryProxy(t, &pn, backendAddr, k)
	left := leaveDuringRetry(t, p, k)
	<-retried // on the connection its first try's 500 came over
	held := make(chan string, 1)
	go func() {
		a, err := getFlaky(pipeClient(t, p, k.h2c), context.Background(), "id=hold")
		if err != nil {
			a = err.Error()
		}
		held <- a
	}()
	synctest.Wait() // ?id=hold waits for the endpoint's one connection
	close(cut)      // which goes to it once the retry's is closed
	if err := <-left; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the request whose retry's connection closed: %v, want its app's deadline", err)
	}
	synctest.Wait() // the proxy saw the app leave
	if got := counterValue(t, reg, "sockmesh_proxy_request_retries_total", "reason", "status"); got != 1 {
		t.Errorf("retries{status} = %v, want 1: the backend read the retry", got)
	}
	unhold()
	if a := <-held; a != "200 ok" {
		t.Fatalf("the request holding the connection: %q, want 200 ok", a)
	}

	if a, err := getFlaky(pipeClient(t, p, k.h2c), context.Background(), "id=next&fail=1"); err != nil || a[:3] != "503" {
		t.Errorf("the next request, the budget's one retry in 10 s spent: %q %v, want 503", a, err)
	}
	if got := counterValue(t, reg, "sockmesh_proxy_retry_budget_exhausted_total", "reason", "status"); got != 1 {
		t.Errorf("retry_budget_exhausted{status} = %v, want 1", got)
	}
}

// flakyRetryProxy is a proxy for k whose Service flaky has one HTTP/1.1
// endpoint at backendAddr, one connection to it at most
// (MaxConnsPerEndpoint), a retry budget of one retry in 10 s, and a route
// that retries a 500 once, after a backoff of 0.5 to 1 s. HTTP11: an h2c
// app's requests go over the HTTP/1.1 pool too.
func flakyRetryProxy(t *testing.T, pn *pipenet.Net, backendAddr netip.AddrPort, k clientKind) (*proxy.Proxy, *prometheus.Registry) {
	p, reg := pipeProxy(t, pn, proxy.Config{HTTP1TLS: k.path, Upstream: upstream.Config{MaxConnsPerEndpoint: 1}})
	m := &mesh{t: t}
	be := m.backend("flaky", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(backendAddr), RetryConstraint: oneRetryIn10s()})
	m.frontend("flaky", routedVIP, be, producer(routeSet(snapshot.KindHTTPRoute,
		rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(be),
			Retry: &snapshot.Retry{Attempts: 1, Codes: []int{500}, Backoff: dur(time.Second)}}},
	)))
	p.Update(m.snapshot(1))
	return p, reg
}

// leaveDuringRetry sends ?id=left&fail=1, whose first try the backend
// fails, from an app that leaves after 5 s, while its retry waits; the
// channel gets the request's error, or one saying it was answered.
func leaveDuringRetry(t *testing.T, p *proxy.Proxy, k clientKind) <-chan error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	left := make(chan error, 1)
	go func() {
		a, err := getFlaky(pipeClient(t, p, k.h2c), ctx, "id=left&fail=1")
		if err == nil {
			err = fmt.Errorf("answered %q before the app left", a)
		}
		left <- err
	}()
	return left
}

// getFlaky sends GET /?query to the flaky Service through c with ctx and
// returns the answer's status and body.
func getFlaky(c *http.Client, ctx context.Context, query string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://flaky.b.svc/?"+query, nil)
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return fmt.Sprintf("%d %s", resp.StatusCode, body), nil
}
