package retrybudget

import (
	"testing"
	"time"
)

// TestGiveBack: a retry given back (never sent) is counted neither among
// the retries nor among the requests, so the next one goes as if it had
// never been asked for, under the percentage, the minimum rate, and the
// minimum rate's own longer window; one given back after the window left
// its slice changes nothing. Before, such a retry stayed counted and the
// next was refused.
func TestGiveBack(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	s := time.Second
	for _, tc := range []struct {
		name     string
		percent  int
		count    int
		per      time.Duration
		requests int
		want     int // retries allowed at t0, and again once they are given back
	}{
		{"minimum rate", 0, 2, 10 * s, 0, 2},
		{"minimum rate over a longer window", 0, 2, time.Minute, 0, 2},
		{"percent, the retry among the requests", 50, 0, 0, 3, 3}, // 3 of 6; had the requests stayed, 6 of 12
	} {
		b := New(constraint(tc.percent, 10*s, tc.count, tc.per), t0)
		for range tc.requests {
			b.Request(t0)
		}
		if got := retries(b, t0); got != tc.want {
			t.Fatalf("%s: %d retries allowed, want %d", tc.name, got, tc.want)
		}
		for range tc.want {
			b.GiveBack(t0)
		}
		if got := retries(b, t0.Add(s)); got != tc.want {
			t.Errorf("%s: once the %d retries are given back, %d allowed, want %d", tc.name, tc.want, got, tc.want)
		}
	}
}

// TestGiveBackAfterWindow: a retry given back once the window left the
// slice that counted it takes nothing from the retries counted since.
func TestGiveBackAfterWindow(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	b := New(constraint(0, 10*time.Second, 1, 10*time.Second), t0)
	if !b.Retry(t0) {
		t.Fatal("first retry refused")
	}
	later := t0.Add(10 * time.Second) // t0's slice left the window: a new one counts
	if !b.Retry(later) {
		t.Fatal("retry in the next window refused")
	}
	b.GiveBack(t0)
	if b.Retry(later) {
		t.Error("a retry given back from a past window made room in this one")
	}
	var none *Budget
	none.GiveBack(t0) // no budget: nothing to give back
}
