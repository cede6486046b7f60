package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// testMeshRetryBudget: an XBackendTrafficPolicy's retryConstraint bounds
// a route rule's retries to its Service. The budget is 0 % of the traffic
// with a minimum of 2 retries per hour, so exactly two retries fit in the
// test's lifetime, whatever the machine's speed: the policy's status says
// Accepted for the Service, the first retries reach the backend, and once
// they are spent the client gets 503 and the backend sees no further
// try, while first tries still go through.
//
// The steps alternate between an HTTP/1.1 client (the proxy's fast path)
// and an h2c client (net/http's server in the proxy): both consult the
// same budget.
func testMeshRetryBudget(s *scenario) {
	sim := s.simBackend("budget")
	svc := s.service("budget", serviceSpec{Backend: sim.backend, Ports: meshPorts()})
	s.apply(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: budget}
spec:
  parentRefs: [{group: "", kind: Service, name: budget, port: 80}]
  rules:
  - retry: {codes: [500], attempts: 3, backoff: 1ms}
    backendRefs: [{name: budget, port: 8080}]
---
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackendTrafficPolicy
metadata: {name: budget}
spec:
  targetRefs: [{group: "", kind: Service, name: budget}]
  retryConstraint:
    budget: {percent: 0, interval: 1h}
    minRetryRate: {count: 2, interval: 1h}
`)
	s.waitRouted(svc.v4(80), "budget")
	s.waitRouteStatus("HTTPRoute", s.ns, "budget", "budget", routeAccepted...)
	s.waitTrafficPolicyStatus("budget", "budget", accepted, resolvedRefs)
	ref := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: s.ns, Name: "budget", Port: 8080}
	s.n.agent.waitSnapshot(s.t, "the retry budget of "+ref.String(), func(snap *snapshot.Snapshot) error {
		// The report's Snapshot is decoded JSON, without New's index.
		i := slices.IndexFunc(snap.Backends, func(b snapshot.Backend) bool { return b.Ref == ref })
		if i < 0 || snap.Backends[i].RetryConstraint == nil {
			return fmt.Errorf("backend %s has no retry constraint", ref)
		}
		b := &snap.Backends[i]
		if rc := b.RetryConstraint; rc.MinRetryCount != 2 || rc.BudgetInterval != snapshot.Duration(time.Hour) {
			return fmt.Errorf("backend %s retry constraint %+v", ref, *rc)
		}
		return nil
	})

	h2c := &http.Client{Timeout: waitFor, Transport: &http.Transport{Protocols: new(http.Protocols), DialContext: s.n.client.dialer.DialContext}}
	h2c.Transport.(*http.Transport).Protocols.SetUnencryptedHTTP2(true)
	defer h2c.CloseIdleConnections()
	h1 := &http.Client{Timeout: waitFor, Transport: &http.Transport{DialContext: s.n.client.dialer.DialContext}}
	defer h1.CloseIdleConnections()
	id := 0
	const spent = "sockmesh: retry_budget_exhausted\n"
	for _, c := range []struct {
		step     string
		client   *http.Client
		failures int // the backend answers 500 to this many tries first
		status   int
		body     string // "" is not checked
		tries    int    // what the backend saw
	}{
		{"HTTP/1.1: one retry within the budget", h1, 1, 200, "", 2},
		{"HTTP/1.1: the second retry spends the budget, the third is refused", h1, 3, 503, spent, 2},
		{"h2c: budget spent, no retry", h2c, 1, 503, spent, 1},
		{"HTTP/1.1: budget spent, no retry", h1, 1, 503, spent, 1},
		{"h2c: first tries still go through", h2c, 0, 200, "", 1},
		{"HTTP/1.1: first tries still go through", h1, 0, 200, "", 1},
	} {
		id++
		url := httpURL(svc.v4(80), fmt.Sprintf("/?responseCode=500&succeedAfter=%d&uuid=budget-%d", c.failures, id))
		resp, err := c.client.Get(url)
		if err != nil {
			s.t.Errorf("%s: GET %s: %v", c.step, url, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || c.body != "" && string(body) != c.body {
			s.t.Errorf("%s: GET %s: %d %q, want %d %q", c.step, url, resp.StatusCode, truncate(body), c.status, c.body)
		}
		if n := sim.count("budget-" + strconv.Itoa(id)); n != c.tries {
			s.t.Errorf("%s: GET %s: the backend saw %d tries, want %d", c.step, url, n, c.tries)
		}
	}
}

// waitTrafficPolicyStatus is waitPolicyStatus for an
// XBackendTrafficPolicy targeting a Service.
func (s *scenario) waitTrafficPolicyStatus(policy, service string, want ...condition) {
	s.t.Helper()
	eventually(s.t, "status of XBackendTrafficPolicy "+policy, func() error {
		p, err := s.n.c.api.Gateway.ExperimentalV1alpha1().XBackendTrafficPolicies(s.ns).Get(context.Background(), policy, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, a := range p.Status.Ancestors {
			if a.ControllerName == translate.ControllerName && a.AncestorRef.Kind != nil && *a.AncestorRef.Kind == "Service" &&
				string(a.AncestorRef.Name) == service {
				return hasConditions(a.Conditions, p.Generation, want)
			}
		}
		return fmt.Errorf("no ancestor Service %s under %s: %+v", service, translate.ControllerName, p.Status.Ancestors)
	})
}
