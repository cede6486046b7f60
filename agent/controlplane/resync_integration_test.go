package controlplane_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/dnsserver"
)

// TestStatusRemovedByAnotherPartyWrittenBack: another party (a controller
// that rewrites the whole list, kubectl edit --subresource=status) removes
// sockmesh's ancestor entry from a policy. The source signals no change of
// status alone, and nothing else changes: the resync translates again and
// the entry is written back; the resyncs after it, with nothing to change,
// send no patch. Before, the entry stayed away until some unrelated change
// (for ever on a quiet cluster).
func TestStatusRemovedByAnotherPartyWrittenBack(t *testing.T) {
	env := apiserver.Start(t)
	dns := dnsserver.Start(t).Addr
	ctx := t.Context()
	createPolicies(t, env, ns, nil, 1)
	var patches atomic.Int64
	var passes atomic.Int64
	a := startAgent(t, env, "agent-1", dns, func(ac *agentConfig) {
		ac.cp.Resync = 2 * time.Second
		ac.passes = &passes
		ac.rest.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.Method == http.MethodPatch {
					patches.Add(1)
				}
				return rt.RoundTrip(r)
			})
		})
	})
	defer a.stop(t)
	written := func() error {
		if g, err := ourGeneration(t, env, ns, "tls-0"); err != nil || g != 1 {
			return fmt.Errorf("observed generation %d (err %v), want 1", g, err)
		}
		return nil
	}
	eventually(t, "the policy's status", written)

	p := must.Value[*gwv1.BackendTLSPolicy](t)(env.Gateway.GatewayV1().BackendTLSPolicies(ns).Get(ctx, "tls-0", metav1.GetOptions{}))
	p.Status.Ancestors = []gwv1.PolicyAncestorStatus{}
	must.Succeed(t)(env.Gateway.GatewayV1().BackendTLSPolicies(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}))
	eventually(t, "the removed entry written back", written)

	// Three resyncs more: each translation is handed to the writers, which
	// find nothing to change.
	sent, handed := patches.Load(), passes.Load()
	eventually(t, "three more resyncs", func() error {
		if n := passes.Load() - handed; n < 3 {
			return fmt.Errorf("%d translations handed to the writers", n)
		}
		return nil
	})
	if n := patches.Load() - sent; n != 0 {
		t.Errorf("%d patches sent by resyncs that changed nothing, want 0", n)
	}
}
