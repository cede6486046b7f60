package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestWrites: what the write loop holds back, as sockmeshctl status shows
// it: nothing written before and after a leader term; during one, the
// resources RBAC refuses (since the first refusal, through re-checks that
// still refuse, until the next re-check) and the objects in backoff (their
// last write's error and attempts in a row, until the next retry), each
// list cut to HeldListed with a count of the rest; an object written at
// last leaves the list. An agent with no writers has no report.
func TestWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var objects []Object
		for i := range HeldListed + 1 {
			objects = append(objects, policyStatus(fmt.Sprintf("denied-%02d", i), "p"))
		}
		for i := range HeldListed + 2 {
			objects = append(objects, policyStatus("hooked", fmt.Sprintf("p%02d", i)))
		}
		var mu sync.Mutex
		down := true
		w := newObjectsWriter(objects, func(o Object) error {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case strings.HasPrefix(o.Namespace, "denied-"):
				return apierrors.NewForbidden(httpRoutes, o.Name, errors.New(`cannot patch resource "backendtlspolicies/status"`))
			case down:
				return webhookDown(o.Name)
			}
			return nil
		})
		access := func(_ context.Context, o Object) (bool, error) { return o.Namespace == "hooked", nil }
		l := &termLeader{terms: make(chan context.Context)}
		src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
		c, err := New(Config{Writers: []Writer{w}, Leader: l, Access: access, RetryInterval: time.Second}, src,
			slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		run(t, c)
		synctest.Wait()
		if got := c.Writes(); got == nil || got.Writing || got.RBAC != nil || got.Backoff != nil {
			t.Fatalf("Writes before leading = %+v, want writing nothing", got)
		}

		term, end := context.WithCancel(t.Context())
		l.terms <- term
		synctest.Wait()
		t0 := time.Now()
		denied := func(i int) Object { return policyStatus(fmt.Sprintf("denied-%02d", i), "") }
		check := func(step string, recheck time.Time, attempts int, retry time.Time) {
			t.Helper()
			got := c.Writes()
			if got == nil || !got.Writing || len(got.RBAC) != HeldListed || got.RBACMore != 1 || len(got.Backoff) != HeldListed || got.BackoffMore != 2 {
				t.Fatalf("%s: Writes = %+v; want writing, %d resources and 1 more, %d objects and 2 more", step, got, HeldListed, HeldListed)
			}
			if r := got.RBAC[0]; r != (HeldResource{Object: denied(0), Since: t0, Recheck: recheck}) {
				t.Errorf("%s: first resource = %+v, want %v since %v, re-checked at %v", step, r, denied(0), t0, recheck)
			}
			if r := got.RBAC[HeldListed-1]; r.Namespace != fmt.Sprintf("denied-%02d", HeldListed-1) {
				t.Errorf("%s: last resource listed = %+v, want namespace denied-%02d", step, r, HeldListed-1)
			}
			b := got.Backoff[0]
			if b.Object != policyStatus("hooked", "p00") || b.Attempts != attempts || !b.Retry.Equal(retry) ||
				!strings.Contains(b.Error, `failed calling webhook "check.example.com"`) {
				t.Errorf("%s: first object = %+v; want hooked/p00, %d attempts, retried at %v, the webhook's error", step, b, attempts, retry)
			}
		}
		check("first pass", t0.Add(5*time.Minute), 1, t0.Add(time.Second))
		time.Sleep(time.Second)
		synctest.Wait()
		check("a retry", t0.Add(5*time.Minute), 2, t0.Add(3*time.Second))
		time.Sleep(5*time.Minute - time.Second)
		synctest.Wait()
		// The objects failed at 0, 1, 3, 7, 15, 31 and 63 s, then each minute.
		check("a re-check still refused", t0.Add(10*time.Minute), 10, t0.Add(5*time.Minute+3*time.Second))

		mu.Lock()
		down = false
		mu.Unlock()
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := c.Writes(); len(got.Backoff) != 0 || got.BackoffMore != 0 || len(got.RBAC) != HeldListed {
			t.Errorf("Writes once the webhook is back = %+v, want no object in backoff, the resources still held", got)
		}

		end()
		synctest.Wait()
		if got := c.Writes(); got == nil || got.Writing || got.RBAC != nil {
			t.Errorf("Writes after the term = %+v, want writing nothing", got)
		}
		none, err := New(Config{}, src, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := none.Writes(); got != nil {
			t.Errorf("Writes with no writers = %+v, want nil", got)
		}
	})
}

func TestErrorText(t *testing.T) {
	long := strings.Repeat("x", maxErrorText-1) + "é and more"
	for _, c := range []struct{ in, want string }{
		{"short", "short"},
		{"webhook said:\n\tno", "webhook said:  no"}, // one line for the table
		{strings.Repeat("y", maxErrorText), strings.Repeat("y", maxErrorText)},
		{long, strings.Repeat("x", maxErrorText-1) + "…"}, // not half of é
	} {
		if got := errorText(errors.New(c.in)); got != c.want {
			t.Errorf("errorText(%d bytes) = %q, want %q", len(c.in), got, c.want)
		}
	}
}

// TestWritesWhileWriting: Writes is called from the introspection server's
// goroutines while the write loop changes what it reports (go test -race
// checks it), and each report is whole: the object, its error, attempts
// that only grow. Real time: retries 1 ms apart.
func TestWritesWhileWriting(t *testing.T) {
	hooked := policyStatus("hooked", "p")
	w := newObjectsWriter([]Object{hooked}, func(o Object) error { return webhookDown(o.Name) })
	src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
	c, err := New(Config{Writers: []Writer{w}, RetryInterval: time.Millisecond}, src, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	deadline := time.Now().Add(30 * time.Second) // a hang guard
	for seen := 0; seen < 4; {
		if time.Now().After(deadline) {
			t.Fatalf("Writes reported %d attempts after 30 s, want 4", seen)
		}
		wr := c.Writes()
		if wr == nil || len(wr.Backoff) == 0 {
			continue
		}
		b := wr.Backoff[0]
		if len(wr.Backoff) != 1 || b.Object != hooked || b.Attempts < seen || !strings.Contains(b.Error, `failed calling webhook "check.example.com"`) {
			t.Fatalf("Writes = %+v after %d attempts; want hooked/p alone, its attempts growing, the webhook's error", wr, seen)
		}
		seen = b.Attempts
	}
}
