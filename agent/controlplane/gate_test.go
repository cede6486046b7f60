package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// objectsWriter writes its objects one after another through the Gate, each
// failing with what fail says, and records each object's attempts and the
// size of the translation its last success wrote.
type objectsWriter struct {
	objects []Object
	mu      sync.Mutex
	fail    func(Object) error
	tried   map[Object]int
	wrote   map[Object]int // frontends of the translation last written
}

func newObjectsWriter(objects []Object, fail func(Object) error) *objectsWriter {
	return &objectsWriter{objects: objects, fail: fail, tried: map[Object]int{}, wrote: map[Object]int{}}
}

func (w *objectsWriter) Write(ctx context.Context, _ translate.Input, res translate.Result, g *Gate) error {
	var errs []error
	for _, o := range w.objects {
		errs = append(errs, g.Do(ctx, o, func(context.Context) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.tried[o]++
			if err := w.fail(o); err != nil {
				return fmt.Errorf("write %s %s/%s: %w", o.Resource, o.Namespace, o.Name, err)
			}
			w.wrote[o] = len(res.Frontends)
			return nil
		}))
	}
	return errors.Join(errs...)
}

// attempts returns how often each of os was tried.
func (w *objectsWriter) attempts(os ...Object) []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	var n []int
	for _, o := range os {
		n = append(n, w.tried[o])
	}
	return n
}

func policyStatus(namespace, name string) Object {
	return Object{Verb: "patch", Group: "gateway.networking.k8s.io", Resource: "backendtlspolicies", Subresource: "status",
		Namespace: namespace, Name: name}
}

func twoServices() translate.Input {
	return translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10"), h2cService("b", "10.96.0.11")}}
}

// TestObjectFailureRetriedAlone: an object whose write fails in a way that
// is about it alone (a validating webhook the API server cannot call, 500)
// holds no other write back: newer translations reach the other objects at
// once, while it is retried by itself after 1 s, 2 s, 4 s with no new
// translation, and gets the latest translation once the webhook is back.
// Before, the whole loop backed off, doubling to a minute, and nothing
// newer was written meanwhile.
func TestObjectFailureRetriedAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hooked, free := policyStatus("hooked", "p"), policyStatus("free", "p")
		var mu sync.Mutex
		down := true
		w := newObjectsWriter([]Object{hooked, free}, func(o Object) error {
			mu.Lock()
			defer mu.Unlock()
			if o == hooked && down {
				return webhookDown(o.Name)
			}
			return nil
		})
		src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
		c, err := New(Config{Writers: []Writer{w}, RetryInterval: time.Second, Resync: noResync}, src, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		run(t, c)
		synctest.Wait()
		src.set(twoServices())
		synctest.Wait() // no time passes
		if got := w.attempts(hooked, free); got[0] != 1 || got[1] != 2 || w.wrote[free] != 2 {
			t.Fatalf("at once after a new translation: attempts hooked, free = %v, free wrote %d frontends; want [1 2], 2",
				got, w.wrote[free])
		}
		for i, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
			time.Sleep(wait - time.Nanosecond)
			synctest.Wait()
			if n := w.attempts(hooked)[0]; n != i+1 {
				t.Fatalf("hooked tried %d times %v after its failure %d, want %d", n, wait-time.Nanosecond, i+1, i+1)
			}
			time.Sleep(time.Nanosecond)
			synctest.Wait()
			if n := w.attempts(hooked)[0]; n != i+2 {
				t.Fatalf("hooked tried %d times %v after its failure %d, want %d", n, wait, i+1, i+2)
			}
		}
		mu.Lock()
		down = false
		mu.Unlock()
		time.Sleep(8 * time.Second)
		synctest.Wait()
		if n := w.attempts(hooked)[0]; n != 5 || w.wrote[hooked] != 2 {
			t.Fatalf("once the webhook is back: hooked tried %d times, wrote %d frontends; want 5, the latest translation's 2", n, w.wrote[hooked])
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if n := w.attempts(hooked)[0]; n != 5 {
			t.Errorf("hooked tried %d times 10 min after it was written, want still 5", n)
		}
		if got := count(t, c.m.writeErrors.WithLabelValues("object")); got != 4 {
			t.Errorf("write_errors_total{scope=object} = %v, want 4", got)
		}
		if got := count(t, c.m.writeErrors.WithLabelValues("all")); got != 0 {
			t.Errorf("write_errors_total{scope=all} = %v, want 0", got)
		}
	})
}

// TestRBACRefusalHeldPerResource: a 403 that an access review confirms
// (RBAC) costs one attempt, review and warning per resource and namespace:
// the other objects there are not sent at the next translations, the
// review is asked again every AccessRecheck (and no write while it still
// refuses), the objects are written once it allows, and a new leader term
// tries at once. A 403 the review allows (a quota) stays the object's
// alone, tried at each translation. Before, every object was sent and
// warned about at every translation.
func TestRBACRefusalHeldPerResource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var objects []Object
		for _, ns := range []string{"a", "b"} {
			for i := range 10 {
				objects = append(objects, policyStatus(ns, fmt.Sprint("p", i)))
			}
		}
		quota := Object{Verb: "create", Resource: "services", Namespace: "c", Name: "pods-"}
		objects = append(objects, quota)
		var mu sync.Mutex
		granted := map[string]bool{"c": true} // namespaces RBAC allows
		reviews := 0
		w := newObjectsWriter(objects, func(o Object) error {
			mu.Lock()
			defer mu.Unlock()
			if !granted[o.Namespace] {
				return apierrors.NewForbidden(httpRoutes, o.Name, errors.New(`cannot patch resource "backendtlspolicies/status"`))
			}
			if o == quota {
				return quotaFull("c")
			}
			return nil
		})
		access := func(_ context.Context, o Object) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			reviews++
			return granted[o.Namespace], nil
		}
		src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
		events := &logged{}
		l := &termLeader{terms: make(chan context.Context)}
		c, err := New(Config{Writers: []Writer{w}, Leader: l, Access: access, RetryInterval: time.Second, Resync: noResync}, src,
			slog.New(events), nil)
		if err != nil {
			t.Fatal(err)
		}
		run(t, c)
		term, end := context.WithCancel(t.Context())
		l.terms <- term
		synctest.Wait()
		a0, b0 := objects[0], objects[10]
		tried := func() int {
			w.mu.Lock()
			defer w.mu.Unlock()
			n := 0
			for o, k := range w.tried {
				if o != quota {
					n += k
				}
			}
			return n
		}
		check := func(step string, policies, quotas, nReviews int) {
			t.Helper()
			mu.Lock()
			r := reviews
			mu.Unlock()
			if p, q := tried(), w.attempts(quota)[0]; p != policies || q != quotas || r != nReviews {
				t.Errorf("%s: %d policy writes, %d quota writes, %d access reviews; want %d, %d, %d", step, p, q, r, policies, quotas, nReviews)
			}
		}
		check("first translation", 2, 1, 3)

		for i := range 5 {
			src.set(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10"), h2cService("b", fmt.Sprint("10.96.0.", 20+i))}})
			synctest.Wait()
		}
		check("five more translations", 2, 6, 3)
		warned := map[string]int{}
		got := events.recent()
		for _, e := range got {
			if e.Level == slog.LevelWarn.String() {
				warned[e.Message+" "+e.Attrs["namespace"]]++
			}
		}
		if warned["write refused by rbac; the resource is held back until allowed a"] != 1 ||
			warned["write refused by rbac; the resource is held back until allowed b"] != 1 || len(warned) != 3 {
			t.Errorf("warnings = %v, want one rbac warning per namespace beside the quota's", warned)
		}
		for reason, want := range map[string]float64{"rbac": 2, "forbidden": 6} {
			if got := count(t, c.m.writeRefusals.WithLabelValues(reason)); got != want {
				t.Errorf("write_refusals_total{reason=%q} = %v, want %v", reason, got, want)
			}
		}

		time.Sleep(5 * time.Minute)
		synctest.Wait()
		check("the re-check, still refused", 2, 7, 6)

		mu.Lock()
		granted["a"] = true
		mu.Unlock()
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		check("the re-check once a is allowed", 12, 8, 9)
		if n := w.attempts(a0, b0); n[0] != 2 || n[1] != 1 {
			t.Errorf("attempts of a/p0, b/p0 = %v, want [2 1]", n)
		}

		end()
		synctest.Wait()
		term, end = context.WithCancel(t.Context())
		defer end()
		l.terms <- term
		synctest.Wait()
		// a's ten again: the new term trusts nothing the last one wrote
		// (the status writer diffs them against the objects: nothing sent).
		check("a new term", 23, 9, 11)
	})
}
