package controlplane

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// withFailure is translate.Translate as it answers when judging the Service
// named broken panicked: the real translation, with that Service in
// Failures (translate's TestObjectPanicContained shows how it gets there
// and what the Service's ports become).
func withFailure(in translate.Input) (translate.Result, error) {
	res, err := translate.Translate(in)
	for _, s := range in.Services {
		if s.Name == "broken" {
			res.Failures = append(res.Failures, translate.Failure{
				Object: snapshot.ObjectRef{Kind: "Service", Namespace: s.Namespace, Name: s.Name},
				Panic:  "assignment to entry in nil map", Stack: "goroutine 1 [running]:\nbroken.go:1",
			})
		}
	}
	return res, err
}

// TestObjectFailureReportedOnce: an object whose translation panicked is
// logged as an error with its stack and counted when it starts failing,
// not again while it keeps failing at each translation, and again should
// it fail anew after a translation without; meanwhile the other objects'
// changes publish. Failures lists it while it fails.
func TestObjectFailureReportedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		broken := h2cService("broken", "10.96.0.20")
		events := &logged{}
		src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10"), broken}})
		c, err := New(Config{}, src, slog.New(events), nil)
		if err != nil {
			t.Fatal(err)
		}
		c.translate = withFailure
		run(t, c)
		reported := func() int {
			n := 0
			for _, r := range events.recent() {
				if r.Level == "ERROR" && r.Attrs["name"] == "broken" && r.Attrs["stack"] != "" {
					n++
				}
			}
			return n
		}
		for i, step := range []struct {
			services []*corev1.Service
			reported int
		}{
			{[]*corev1.Service{h2cService("a", "10.96.0.10"), broken}, 1},
			{[]*corev1.Service{h2cService("a", "10.96.0.10"), h2cService("b", "10.96.0.11"), broken}, 1},
			{[]*corev1.Service{h2cService("a", "10.96.0.10"), h2cService("b", "10.96.0.11")}, 1},
			{[]*corev1.Service{h2cService("a", "10.96.0.10"), h2cService("b", "10.96.0.11"), broken}, 2},
		} {
			if i > 0 {
				src.set(translate.Input{Services: step.services})
			}
			synctest.Wait()
			if s := c.Snapshot(); s.Version != uint64(i+1) || len(s.Frontends) != len(step.services) {
				t.Errorf("step %d: snapshot version %d with %d frontends, want %d with %d", i, s.Version, len(s.Frontends), i+1, len(step.services))
			}
			if got := reported(); got != step.reported {
				t.Errorf("step %d: the failure logged with its stack %d times, want %d", i, got, step.reported)
			}
			if got := count(t, c.m.objectFailures.WithLabelValues("Service")); got != float64(step.reported) {
				t.Errorf("step %d: translate_object_failures_total{kind=Service} = %v, want %d", i, got, step.reported)
			}
			// Failures (what sockmeshctl shows) is the last translation's.
			var failing []string
			for _, f := range c.Failures() {
				failing = append(failing, f.Object.Name)
			}
			if want := slices.Contains(step.services, broken); want != slices.Equal(failing, []string{"broken"}) || !want && failing != nil {
				t.Errorf("step %d: Failures() names %v, want broken only while it fails", i, failing)
			}
		}
	})
}

// TestUnpublishedNotWritten: a translation whose Snapshot cannot be built
// (an inconsistency translate's own check should have caught: a bug) is
// not handed to the writers, whose status would describe a Snapshot no
// data plane serves; the current Snapshot, what was written for it and
// Failures, which describes it, stay. Before, its status was written all
// the same, and before that its failures replaced Failures.
func TestUnpublishedNotWritten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var written [][]string // the frontends' Services of each translation handed
		w := WriterFunc(func(_ context.Context, _ translate.Input, res translate.Result, _ *Gate) error {
			mu.Lock()
			defer mu.Unlock()
			var names []string
			for _, f := range res.Frontends {
				names = append(names, f.Service.Name)
			}
			written = append(written, names)
			return nil
		})
		src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
		c, err := New(Config{Writers: []Writer{w}}, src, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		c.translate = func(in translate.Input) (translate.Result, error) {
			res, err := translate.Translate(in)
			if len(in.Services) > 1 {
				// A frontend whose backend is missing: snapshot.New
				// refuses it.
				res.Backends = nil
				res.Failures = []translate.Failure{{Object: snapshot.ObjectRef{Kind: "Service", Namespace: "default", Name: "b"}, Panic: "unpublished"}}
			}
			return res, err
		}
		run(t, c)
		synctest.Wait()
		src.set(twoServices())
		synctest.Wait()
		if s := c.Snapshot(); s.Version != 1 {
			t.Errorf("snapshot version %d after an inconsistent translation, want 1", s.Version)
		}
		if f := c.Failures(); f != nil {
			t.Errorf("Failures() = %+v after an inconsistent translation, want the published one's (none)", f)
		}
		mu.Lock()
		defer mu.Unlock()
		if want := [][]string{{"a"}}; !slices.EqualFunc(written, want, slices.Equal) {
			t.Errorf("writers handed translations of %v, want %v: the inconsistent one not", written, want)
		}
	})
}
