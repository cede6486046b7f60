package leader

import (
	"context"
	"log/slog"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/sockmesh/sockmesh/test/apiserver"
)

const ns = "leader-test"

// candidate runs an Elector whose lead function reports each term on
// terms and the term's end on ended.
type candidate struct {
	e      *Elector
	cancel context.CancelFunc
	done   chan struct{}
	terms  chan struct{}
	ended  chan struct{}
}

func campaign(t *testing.T, env *apiserver.Env, identity string) *candidate {
	t.Helper()
	e, err := New(Config{
		Namespace: ns, Identity: identity,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
	}, env.Kube, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{e: e, cancel: cancel, done: make(chan struct{}), terms: make(chan struct{}, 10), ended: make(chan struct{}, 10)}
	go func() {
		defer close(c.done)
		if err := e.Run(ctx, func(term context.Context) {
			c.terms <- struct{}{}
			<-term.Done()
			c.ended <- struct{}{}
		}); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

func within(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestElection: one of two agents leads; when it shuts down it releases the
// lease and the other takes over; when a lease is taken from the leader,
// its term's context ends (so its writes stop).
func TestElection(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	if _, err := env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	a := campaign(t, env, "agent-a")
	within(t, a.terms, "agent-a to lead")
	if !a.e.Leading() {
		t.Error("agent-a leads but Leading() is false")
	}
	b := campaign(t, env, "agent-b")
	// b cannot lead while a renews; a's lease holder proves who leads.
	lease, err := env.Kube.CoordinationV1().Leases(ns).Get(ctx, "sockmesh-writer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := *lease.Spec.HolderIdentity; h != "agent-a" {
		t.Fatalf("lease holder = %q, want agent-a", h)
	}
	if b.e.Leading() {
		t.Error("agent-b leads while agent-a holds the lease")
	}

	// a shuts down: its term ends, it releases, b takes over.
	a.cancel()
	within(t, a.ended, "agent-a's term to end")
	<-a.done
	within(t, b.terms, "agent-b to take over")

	// Someone else takes the lease from b (as a partitioned agent's
	// successor would): b's term must end.
	thief := "agent-c"
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := env.Kube.CoordinationV1().Leases(ns).Get(ctx, "sockmesh-writer", metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.NewMicroTime(time.Now())
		lease.Spec = coordinationv1.LeaseSpec{HolderIdentity: &thief, LeaseDurationSeconds: ptr(int32(3600)), AcquireTime: &now, RenewTime: &now}
		_, err = env.Kube.CoordinationV1().Leases(ns).Update(ctx, lease, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	within(t, b.ended, "agent-b's term to end after losing the lease")
	for deadline := time.Now().Add(10 * time.Second); b.e.Leading(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("agent-b still reports leading after losing the lease")
		}
	}
}

func ptr[T any](v T) *T { return &v }
