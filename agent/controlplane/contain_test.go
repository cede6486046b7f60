package controlplane

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestObjectWritePanicRetriedAlone: a write that panics on one object (a
// bug its data reached, here a nil map) costs that object's write, not the
// agent: the loop goes on translating and publishing, every other object
// is written at once, and the object is retried alone with backoff, listed
// by Writes and logged as an error with its stack. Before, the panic ended
// the agent (the node's proxy with it), and on the next leader's node
// likewise.
func TestObjectWritePanicRetriedAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		broken, fine := policyStatus("ns", "broken"), policyStatus("ns", "fine")
		w := newObjectsWriter([]Object{broken, fine}, func(o Object) error {
			if o == broken {
				// A classic bug: the inner map was never made.
				seen := map[string]map[string]int{}
				seen[o.Namespace][o.Name]++
			}
			return nil
		})
		events := &logged{}
		src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
		c, err := New(Config{Writers: []Writer{w}, RetryInterval: time.Second}, src, slog.New(events), nil)
		if err != nil {
			t.Fatal(err)
		}
		run(t, c)
		synctest.Wait()
		src.set(twoServices())
		synctest.Wait() // no time passes
		if s := c.Snapshot(); s.Version != 2 {
			t.Errorf("after a panicking write and a change: snapshot version %d, want 2", s.Version)
		}
		if got := w.attempts(broken, fine); got[0] != 1 || got[1] != 2 || w.wrote[fine] != 2 {
			t.Fatalf("at once after a new translation: attempts broken, fine = %v, fine wrote %d frontends; want [1 2], 2",
				got, w.wrote[fine])
		}
		held := c.Writes()
		if len(held.Backoff) != 1 || held.Backoff[0].Object != broken || !strings.Contains(held.Backoff[0].Error, "panicked") {
			t.Errorf("Writes().Backoff = %+v, want broken alone, its error saying it panicked", held.Backoff)
		}
		var stack string
		for _, r := range events.recent() {
			if r.Level == "ERROR" && r.Attrs["name"] == "broken" {
				stack = r.Attrs["stack"]
			}
		}
		if !strings.Contains(stack, "contain_test.go") {
			t.Errorf("no error logged for broken with the stack of its panic; logged %+v", events.recent())
		}
		for i, wait := range []time.Duration{time.Second, 2 * time.Second} {
			time.Sleep(wait)
			synctest.Wait()
			if n := w.attempts(broken)[0]; n != i+2 {
				t.Fatalf("broken tried %d times %v after its failure %d, want %d", n, wait, i+1, i+2)
			}
		}
		if got := count(t, c.m.writeErrors.WithLabelValues("object")); got != 3 {
			t.Errorf("write_errors_total{scope=object} = %v, want 3", got)
		}
		if got := count(t, c.m.writeErrors.WithLabelValues("all")); got != 0 {
			t.Errorf("write_errors_total{scope=all} = %v, want 0", got)
		}
	})
}

// TestWriterPanicRetried: a panic in a writer's own code, outside any
// object's write, fails that pass, which is retried with backoff as an
// error of no API status is; the loop goes on translating meanwhile.
// Before, it ended the agent.
func TestWriterPanicRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var calls []int // the frontends of each translation handed
		w := WriterFunc(func(_ context.Context, _ translate.Input, res translate.Result, _ *Gate) error {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, len(res.Frontends))
			if len(calls) == 1 {
				var index []int
				_ = index[len(calls)]
			}
			return nil
		})
		src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
		c, err := New(Config{Writers: []Writer{w}, RetryInterval: time.Second}, src, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		run(t, c)
		synctest.Wait()
		src.set(twoServices())
		synctest.Wait()
		if s := c.Snapshot(); s.Version != 2 {
			t.Errorf("after a panicking writer and a change: snapshot version %d, want 2", s.Version)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(calls) != 2 || calls[1] != 2 {
			t.Errorf("writer handed translations of %v frontends, want [1 2]: the retry after 1 s, with the latest", calls)
		}
		if got := count(t, c.m.writeErrors.WithLabelValues("all")); got != 1 {
			t.Errorf("write_errors_total{scope=all} = %v, want 1", got)
		}
	})
}
