package retrybudget

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

func constraint(percent int, interval time.Duration, count int, per time.Duration) *snapshot.RetryConstraint {
	return &snapshot.RetryConstraint{BudgetPercent: percent, BudgetInterval: snapshot.Duration(interval),
		MinRetryCount: count, MinRetryInterval: snapshot.Duration(per)}
}

// retries counts how many retries in a row the budget allows at now.
func retries(b *Budget, now time.Time) int {
	n := 0
	for b.Retry(now) {
		n++
		if n > 10000 {
			break
		}
	}
	return n
}

// TestBudget: retries may make up BudgetPercent of the requests, the retry
// asked for counted among both (the API's percentage "of active requests
// that may be made up of retries"), or the minimum rate. Before, it
// counted among the retries only: at 20 %, 4 first tries allowed no retry
// by the percentage, though 1 of 5 is 20 %.
func TestBudget(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	s := time.Second
	for _, tc := range []struct {
		name     string
		c        *snapshot.RetryConstraint
		requests int           // first tries at t0
		at       time.Duration // when the retries are tried
		want     int
	}{
		{"percent of requests", constraint(20, 10*s, 1, 10*s), 50, 0, 12},               // retries count as requests: 12 ≤ 20% of 62
		{"the retry counts among the requests", constraint(20, 10*s, 1, 10*s), 8, 0, 2}, // 2 of 10; before, 1 (the minimum rate's)
		{"minimum rate when idle", constraint(20, 10*s, 1, 10*s), 0, 0, 1},
		{"minimum rate scaled to the interval", constraint(20, 10*s, 3, s), 0, 0, 30},
		{"minimum rate over a longer interval", constraint(0, 10*s, 5, time.Minute), 0, 0, 5},
		{"minimum rate over a longer interval, not scaled down", constraint(0, 10*s, 9, time.Minute), 0, 0, 9}, // 1.5 per 10 s
		{"percent beside a longer minimum interval", constraint(20, 10*s, 1, time.Minute), 50, 0, 12},
		{"zero percent", constraint(0, 10*s, 2, 10*s), 1000, 0, 2},
		{"within the window", constraint(50, 10*s, 1, 10*s), 10, 9 * s, 10}, // the 10th is 10 of 20, the 11th would be 11 of 21
		{"window rolled past the requests", constraint(50, 10*s, 1, 10*s), 10, 10 * s, 1},
		{"one-hour interval in 60 buckets", constraint(10, time.Hour, 1, time.Hour), 100, 59 * time.Minute, 11},
		{"one-hour interval rolled", constraint(10, time.Hour, 1, time.Hour), 100, time.Hour, 1},
	} {
		b := New(tc.c, t0)
		for range tc.requests {
			b.Request(t0)
		}
		if got := retries(b, t0.Add(tc.at)); got != tc.want {
			t.Errorf("%s: %d requests, then retries at +%v: %d allowed, want %d", tc.name, tc.requests, tc.at, got, tc.want)
		}
	}
}

// TestRetryAmongRequests: at 20 %, 4 first tries allow one retry by the
// percentage alone (the minimum rate spent): 1 of 5 requests. Before, it
// was refused, 1 retry weighed against 4 requests.
func TestRetryAmongRequests(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	b := New(constraint(20, 10*time.Second, 1, time.Minute), t0)
	if got := retries(b, t0); got != 1 {
		t.Fatalf("retries at t0 = %d, want the minimum rate's 1", got)
	}
	at := t0.Add(10 * time.Second) // the budget window rolled, the minute's retry is spent
	for range 4 {
		b.Request(at)
	}
	if got := retries(b, at); got != 1 {
		t.Errorf("4 first tries, then %d retries allowed; want 1 (1 of 5 requests is 20 %%)", got)
	}
}

// TestBudgetRecovers: once exhausted, the budget refuses retries until the
// window rolls past the retries it counted.
func TestBudgetRecovers(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	b := New(constraint(20, 10*time.Second, 2, 10*time.Second), t0)
	if got := retries(b, t0); got != 2 {
		t.Fatalf("retries at t0 = %d, want 2", got)
	}
	for _, at := range []time.Duration{time.Second, 9*time.Second + 999*time.Millisecond} {
		if b.Retry(t0.Add(at)) {
			t.Errorf("retry at +%v allowed; the two at t0 are still in the window", at)
		}
	}
	if got := retries(b, t0.Add(10*time.Second)); got != 2 {
		t.Errorf("retries once the window rolled = %d, want 2", got)
	}
}

// TestMinimumRateLongerInterval: a minimum rate over an interval longer
// than the budget's allows its count over its own interval, however quiet
// the backend. Before, it was scaled down to the budget interval: 5 per
// minute over 10 s allowed under one retry, so none at all.
func TestMinimumRateLongerInterval(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	b := New(constraint(0, 10*time.Second, 5, time.Minute), t0)
	for _, step := range []struct {
		at   time.Duration
		want int
	}{
		{0, 5},
		{10 * time.Second, 0}, // the budget window rolled, the minute's five are spent
		{59 * time.Second, 0},
		{time.Minute, 5},
	} {
		if got := retries(b, t0.Add(step.at)); got != step.want {
			t.Errorf("retries at +%v = %d, want %d", step.at, got, step.want)
		}
	}
}

// TestBudgetSlides: the window slides with time, a short one too: a
// retry counts the requests of the whole interval before it. Before, a
// 1 s interval was one bucket, emptied as each second began: the percent
// allowed nothing beyond the minimum rate then, however busy the backend.
func TestBudgetSlides(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		interval, requests, retries time.Duration // requests and retries at t0 plus these
		want                        int
	}{
		{time.Second, 900 * time.Millisecond, 1100 * time.Millisecond, 10},
		{2 * time.Second, 1900 * time.Millisecond, 3 * time.Second, 10},
		{10 * time.Second, 9500 * time.Millisecond, 18 * time.Second, 10},
		{time.Second, 0, 1100 * time.Millisecond, 1}, // rolled past: the minimum rate alone
	} {
		b := New(constraint(50, tc.interval, 1, tc.interval), t0)
		for range 10 {
			b.Request(t0.Add(tc.requests))
		}
		if got := retries(b, t0.Add(tc.retries)); got != tc.want {
			t.Errorf("%v interval, 10 requests at +%v: retries at +%v = %d, want %d", tc.interval, tc.requests, tc.retries, got, tc.want)
		}
	}
}

// TestRetryLimitUnderConcurrency: retries asked for at once by many
// goroutines are allowed exactly as many times as asked one by one — at
// 20 % of 1000 first tries, the 250th retry is 250 of 1250 and the 251st
// would be over. Before, the check and the count were apart: two retries
// could both find the 250th free, and one more went out past the budget.
func TestRetryLimitUnderConcurrency(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	const rounds, goroutines, want = 50, 16, 250
	for round := range rounds {
		b := New(constraint(20, 10*time.Second, 0, 10*time.Second), t0)
		for range 1000 {
			b.Request(t0)
		}
		var allowed atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range goroutines {
			wg.Go(func() {
				<-start
				for range 2 * want / goroutines {
					if b.Retry(t0) {
						allowed.Add(1)
					}
				}
			})
		}
		close(start)
		wg.Wait()
		if got := allowed.Load(); got != want {
			t.Fatalf("round %d: %d goroutines asked for retries at once: %d allowed, want %d", round, goroutines, got, want)
		}
	}
}

func TestNilAndCarry(t *testing.T) {
	t0 := time.Now()
	var none *Budget
	none.Request(t0)
	if !none.Retry(t0) {
		t.Error("a nil budget refused a retry")
	}
	if New(nil, t0) != nil || Carry(nil, nil, t0) != nil {
		t.Error("no constraint must give no budget")
	}
	c := constraint(20, 10*time.Second, 1, time.Second)
	b := New(c, t0)
	same := *c
	same.Policy = snapshot.ObjectRef{Kind: "XBackendTrafficPolicy", Namespace: "ns", Name: "renamed"}
	if Carry(b, &same, t0) != b {
		t.Error("an unchanged constraint must keep its budget and counts")
	}
	changed := *c
	changed.BudgetPercent = 30
	if got := Carry(b, &changed, t0); got == b || got == nil {
		t.Error("a changed constraint must get a new budget")
	}
	if Carry(b, nil, t0) != nil {
		t.Error("a removed constraint must drop the budget")
	}
}

func BenchmarkRequest(b *testing.B) {
	bu := New(constraint(20, 10*time.Second, 10, time.Second), time.Now())
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		bu.Request(now)
	}
}

func BenchmarkRetry(b *testing.B) {
	bu := New(constraint(50, 10*time.Second, 10, time.Second), time.Now())
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		bu.Request(now)
		bu.Retry(now)
	}
}
