package retrybudget

import (
	"sync/atomic"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// maxBuckets bounds the ring: an interval of up to 60 s is counted per
// second; a longer one (up to the API's 1 h) in 60 buckets of
// interval/60, so a budget costs at most 60 × 24 bytes.
const maxBuckets = 60

// Budget is one backend's retry budget. A nil *Budget allows every retry
// and counts nothing.
type Budget struct {
	c snapshot.RetryConstraint
	// start anchors bucket numbers to the monotonic clock.
	start time.Time
	width time.Duration
	// minRetries is MinRetryCount per MinRetryInterval scaled to the
	// budget interval.
	minRetries float64
	ring       []bucket
}

// bucket counts one slice of the interval; epoch is the slice's number
// since start, plus one (0: never used).
type bucket struct {
	epoch    atomic.Int64
	requests atomic.Int64
	retries  atomic.Int64
}

// New returns the budget c describes, starting empty at now; nil when c is
// nil. c's values are those translate checked (interval 1 s to 1 h,
// minimum rate interval above 0).
func New(c *snapshot.RetryConstraint, now time.Time) *Budget {
	if c == nil {
		return nil
	}
	interval := max(time.Duration(c.BudgetInterval), time.Second)
	n := min(int((interval+time.Second-1)/time.Second), maxBuckets)
	b := &Budget{c: *c, start: now, width: interval / time.Duration(n), ring: make([]bucket, n)}
	if per := time.Duration(c.MinRetryInterval); per > 0 {
		b.minRetries = float64(c.MinRetryCount) * float64(interval) / float64(per)
	}
	return b
}

// Carry returns prev when it already keeps constraint c (same values,
// whichever policy they came from), so its counts carry over to the next
// snapshot; otherwise a new budget for c.
func Carry(prev *Budget, c *snapshot.RetryConstraint, now time.Time) *Budget {
	if prev != nil && c != nil && sameValues(&prev.c, c) {
		return prev
	}
	return New(c, now)
}

func sameValues(a, b *snapshot.RetryConstraint) bool {
	return a.BudgetPercent == b.BudgetPercent && a.BudgetInterval == b.BudgetInterval &&
		a.MinRetryCount == b.MinRetryCount && a.MinRetryInterval == b.MinRetryInterval
}

// Request counts a first try sent to the backend at now.
func (b *Budget) Request(now time.Time) {
	if b == nil {
		return
	}
	b.slot(now).requests.Add(1)
}

// Retry reports whether a retry at now fits the budget, and counts it
// (as a retry and as a request) when it does: the retries of the window,
// this one included, must not exceed the larger of BudgetPercent of the
// window's requests and the minimum retry rate.
func (b *Budget) Retry(now time.Time) bool {
	if b == nil {
		return true
	}
	requests, retries := b.window(now)
	allowed := max(float64(requests)*float64(b.c.BudgetPercent)/100, b.minRetries)
	if float64(retries+1) > allowed {
		return false
	}
	s := b.slot(now)
	s.retries.Add(1)
	s.requests.Add(1)
	return true
}

// epoch is now's bucket number (from 1).
func (b *Budget) epoch(now time.Time) int64 {
	return int64(max(now.Sub(b.start), 0)/b.width) + 1
}

// slot returns now's bucket, emptied first when it last counted an older
// slice of time.
func (b *Budget) slot(now time.Time) *bucket {
	e := b.epoch(now)
	s := &b.ring[e%int64(len(b.ring))]
	if old := s.epoch.Load(); old != e && s.epoch.CompareAndSwap(old, e) {
		s.requests.Store(0)
		s.retries.Store(0)
	}
	return s
}

// window sums the buckets of the interval ending at now: the current
// slice and the len(ring)-1 before it.
func (b *Budget) window(now time.Time) (requests, retries int64) {
	e := b.epoch(now)
	n := int64(len(b.ring))
	for i := range b.ring {
		s := &b.ring[i]
		if se := s.epoch.Load(); se > e-n && se <= e {
			requests += s.requests.Load()
			retries += s.retries.Load()
		}
	}
	return requests, retries
}
