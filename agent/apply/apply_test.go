package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// planes fakes the control plane and the three data planes, recording
// every call in order.
type planes struct {
	mu       sync.Mutex
	current  *snapshot.Snapshot
	updated  chan struct{}
	calls    []string
	beats    int
	dpErrors int // Apply fails this many more times
}

func newPlanes() *planes { return &planes{current: snapshot.Empty(), updated: make(chan struct{})} }

func (p *planes) publish(version uint64) {
	s, err := snapshot.New(version, nil, nil, nil)
	if err != nil {
		panic(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.current = s
	close(p.updated)
	p.updated = make(chan struct{})
}

func (p *planes) Current() (*snapshot.Snapshot, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.current, p.updated
}

func (p *planes) record(what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, what)
}

type proxyFake struct{ *planes }

func (f proxyFake) Update(s *snapshot.Snapshot) { f.record(fmt.Sprintf("proxy %d", s.Version)) }

type datapathFake struct{ *planes }

func (f datapathFake) Apply(s *snapshot.Snapshot) error {
	f.mu.Lock()
	fail := f.dpErrors > 0
	if fail {
		f.dpErrors--
	}
	f.mu.Unlock()
	if fail {
		f.record(fmt.Sprintf("datapath %d failed", s.Version))
		return errors.New("map full")
	}
	f.record(fmt.Sprintf("datapath %d", s.Version))
	return nil
}

func (f datapathFake) Heartbeat() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.beats++
	return nil
}

type enrolFake struct{ *planes }

func (f enrolFake) Update(s *snapshot.Snapshot) error {
	f.record(fmt.Sprintf("enrol %d", s.Version))
	return nil
}

func (p *planes) snapshot() ([]string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls), p.beats
}

// start runs an Applier over p until the test's bubble ends.
func start(t *testing.T, p *planes, reg prometheus.Registerer) (*Applier, context.CancelFunc) {
	t.Helper()
	a, err := New(Config{HeartbeatInterval: time.Second, RetryInterval: 2 * time.Second},
		p, proxyFake{p}, datapathFake{p}, enrolFake{p}, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return a, cancel
}

func TestEmptySnapshotIsNeverApplied(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlanes()
		a, _ := start(t, p, nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		calls, beats := p.snapshot()
		if len(calls) != 0 || beats != 0 {
			t.Errorf("before the first snapshot: calls %q, %d heartbeats; want none (pinned capture stays as it is)", calls, beats)
		}
		if s, _ := a.Applied(); s != nil {
			t.Errorf("Applied() = version %d before any snapshot", s.Version)
		}
		select {
		case <-a.First():
			t.Error("First() closed before any snapshot")
		default:
		}
	})
}

func TestOrderAndHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlanes()
		a, cancel := start(t, p, nil)
		p.publish(1)
		synctest.Wait()
		<-a.First()
		p.publish(2)
		synctest.Wait()
		calls, beats := p.snapshot()
		want := []string{"proxy 1", "datapath 1", "enrol 1", "proxy 2", "datapath 2", "enrol 2"}
		if !slices.Equal(calls, want) {
			t.Errorf("calls = %q, want %q: proxy first, then datapath, then enrolments", calls, want)
		}
		if beats != 1 {
			t.Errorf("%d heartbeats right after the first apply, want 1", beats)
		}
		if s, at := a.Applied(); s == nil || s.Version != 2 || !at.Equal(time.Now()) {
			t.Errorf("Applied() = %v at %v, want version 2 now", s, at)
		}
		time.Sleep(3*time.Second + time.Millisecond)
		synctest.Wait()
		if _, beats = p.snapshot(); beats != 4 {
			t.Errorf("%d heartbeats after 3 intervals, want 4", beats)
		}
		if !a.LastHeartbeat().Equal(time.Now().Add(-time.Millisecond)) {
			t.Errorf("LastHeartbeat() = %v, want the last tick", a.LastHeartbeat())
		}
		// Run returns: the heartbeat stops, so fail-open services go direct.
		cancel()
		time.Sleep(time.Minute)
		synctest.Wait()
		if _, after := p.snapshot(); after != 4 {
			t.Errorf("%d heartbeats after Run returned, want still 4", after)
		}
	})
}

func TestRetryAfterFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlanes()
		p.dpErrors = 2
		reg := prometheus.NewRegistry()
		a, _ := start(t, p, reg)
		p.publish(1)
		synctest.Wait()
		if s, _ := a.Applied(); s != nil {
			t.Fatalf("Applied() = version %d after a failed apply", s.Version)
		}
		// A newer snapshot is applied at once, without waiting for the retry.
		p.publish(2)
		synctest.Wait()
		time.Sleep(2*time.Second - time.Millisecond)
		synctest.Wait()
		calls, beats := p.snapshot()
		want := []string{"proxy 1", "datapath 1 failed", "enrol 1", "proxy 2", "datapath 2 failed", "enrol 2"}
		if !slices.Equal(calls, want) || beats != 0 {
			t.Errorf("before the retry: calls %q, %d heartbeats; want %q and none", calls, beats, want)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		calls, _ = p.snapshot()
		want = append(want, "proxy 2", "datapath 2", "enrol 2")
		if !slices.Equal(calls, want) {
			t.Errorf("after the retry: calls %q, want %q", calls, want)
		}
		if s, _ := a.Applied(); s == nil || s.Version != 2 {
			t.Errorf("Applied() = %v, want version 2", s)
		}
		if got := value(t, a.m.failures.WithLabelValues("datapath")); got != 2 {
			t.Errorf("sockmesh_apply_failures_total{target=datapath} = %v, want 2", got)
		}
		if got := value(t, a.m.version); got != 2 {
			t.Errorf("sockmesh_apply_snapshot_version = %v, want 2", got)
		}
	})
}

// value reads a counter's or gauge's current value.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	if c := out.GetCounter(); c != nil {
		return c.GetValue()
	}
	return out.GetGauge().GetValue()
}
