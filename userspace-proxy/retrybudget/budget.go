package retrybudget

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// buckets is how many slices a ring counts its window in: the window it
// sums then spans 59/60 of its length to all of it, whatever the length
// (1 s to the API's 1 h), for 60 × 24 bytes. Counted per second, a 1 s
// window was one bucket, emptied as each second began.
const buckets = 60

// Budget is one backend's retry budget. A nil *Budget allows every retry
// and counts nothing.
type Budget struct {
	c snapshot.RetryConstraint
	// start anchors bucket numbers to the monotonic clock.
	start time.Time
	// budget counts requests and retries over BudgetInterval.
	budget ring
	// floor counts retries over MinRetryInterval when that is the longer
	// interval; nil otherwise, when budget's retries serve. Scaled down to
	// a shorter BudgetInterval, a rate such as 5 per minute allowed under
	// one retry per 10 s: none at all.
	floor *ring
	// minRetries is the minimum rate's allowance over the longer of the
	// two intervals: MinRetryCount per MinRetryInterval, scaled.
	minRetries float64
	// mu makes a retry's check and count one step, so that concurrent
	// retries never pass the budget, and empties buckets (ring.roll), so
	// that no retry counted is lost to an emptying. A first try's count
	// takes it only when its bucket must be emptied, once per slice: it
	// is an atomic add otherwise. Retries are the rare path, a lock there
	// costs little.
	mu sync.Mutex
}

// ring counts over a sliding window: the current slice of width and the
// len(buckets)-1 before it.
type ring struct {
	width   time.Duration
	buckets []bucket
}

// bucket counts one slice of a window; epoch is the slice's number since
// the budget's start, plus one (0: never used).
type bucket struct {
	epoch    atomic.Int64
	requests atomic.Int64
	retries  atomic.Int64
}

// New returns the budget c describes, starting empty at now; nil when c is
// nil. c's values are those translate checked (interval 1 s to 1 h,
// minimum rate interval above 0, at most 1 h).
func New(c *snapshot.RetryConstraint, now time.Time) *Budget {
	if c == nil {
		return nil
	}
	interval := max(time.Duration(c.BudgetInterval), time.Second)
	b := &Budget{c: *c, start: now, budget: newRing(interval)}
	if per := time.Duration(c.MinRetryInterval); per > 0 {
		window := interval
		if per > interval {
			window = per
			floor := newRing(per)
			b.floor = &floor
		}
		b.minRetries = float64(c.MinRetryCount) * float64(window) / float64(per)
	}
	return b
}

func newRing(window time.Duration) ring {
	return ring{width: window / buckets, buckets: make([]bucket, buckets)}
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
	at := now.Sub(b.start)
	s := b.budget.current(at)
	if s == nil {
		b.mu.Lock()
		s = b.budget.roll(at)
		b.mu.Unlock()
	}
	s.requests.Add(1)
}

// Retry reports whether a retry at now fits the budget, and counts it
// (as a retry and as a request) when it does: the retries of the budget
// interval must not exceed BudgetPercent of its requests, this one counted
// in both (the API's percentage "of active requests that may be made up of
// retries": once sent, it is one of them), or those of the minimum rate's
// window (the longer of BudgetInterval and MinRetryInterval) its
// allowance. Concurrent retries are checked and counted one at a time:
// the budget holds exactly.
func (b *Budget) Retry(now time.Time) bool {
	if b == nil {
		return true
	}
	at := now.Sub(b.start)
	b.mu.Lock()
	defer b.mu.Unlock()
	requests, retries := b.budget.sum(at)
	floorRetries := retries
	if b.floor != nil {
		_, floorRetries = b.floor.sum(at)
	}
	if 100*(retries+1) > int64(b.c.BudgetPercent)*(requests+1) && float64(floorRetries+1) > b.minRetries {
		return false
	}
	s := b.budget.roll(at)
	s.retries.Add(1)
	s.requests.Add(1)
	if b.floor != nil {
		b.floor.roll(at).retries.Add(1)
	}
	return true
}

// GiveBack uncounts a retry Retry allowed at at that was never sent: the
// app left, or the request timeout passed, during its backoff. Asked
// before the backoff, as Envoy asks its retry budget before it arms the
// backoff timer, the retry holds its place in the budget while it waits,
// and gives it back as Envoy's ends an active retry whose request goes
// away; kept, it was a retry nobody sent, and in a retry storm clients
// with short timeouts spent the budget of the retries that would go. A
// retry counted in a slice the window has left since counts no more:
// there is nothing to give back. Give back only what Retry allowed, once.
func (b *Budget) GiveBack(at time.Time) {
	if b == nil {
		return
	}
	d := at.Sub(b.start)
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.budget.counted(d); s != nil {
		s.retries.Add(-1)
		s.requests.Add(-1)
	}
	if b.floor != nil {
		if s := b.floor.counted(d); s != nil {
			s.retries.Add(-1)
		}
	}
}

// epoch is the number of the slice at (since the budget's start), from 1.
func (r *ring) epoch(at time.Duration) int64 {
	return int64(max(at, 0)/r.width) + 1
}

// current returns the bucket of at when it counts at's slice (or a later
// one: a caller's now a whole window late counts there); nil when it
// must be emptied first (roll).
func (r *ring) current(at time.Duration) *bucket {
	e := r.epoch(at)
	if s := &r.buckets[e%int64(len(r.buckets))]; s.epoch.Load() >= e {
		return s
	}
	return nil
}

// roll returns the bucket of at, emptied first when it last counted an
// older slice of time; Budget.mu is held. The epoch is stored last, so
// that a first try that finds it (current) adds to the emptied counts,
// never to counts about to be emptied.
func (r *ring) roll(at time.Duration) *bucket {
	e := r.epoch(at)
	s := &r.buckets[e%int64(len(r.buckets))]
	if s.epoch.Load() < e {
		s.requests.Store(0)
		s.retries.Store(0)
		s.epoch.Store(e)
	}
	return s
}

// counted returns the bucket that counted a retry at at while it counts
// at's slice still, and holds a retry; nil once emptied for a later slice
// (Budget.mu is held).
func (r *ring) counted(at time.Duration) *bucket {
	s := &r.buckets[r.epoch(at)%int64(len(r.buckets))]
	if s.epoch.Load() != r.epoch(at) || s.retries.Load() == 0 {
		return nil
	}
	return s
}

// sum adds up the buckets of the window ending at at: its slice and the
// len(buckets)-1 before it.
func (r *ring) sum(at time.Duration) (requests, retries int64) {
	e := r.epoch(at)
	n := int64(len(r.buckets))
	for i := range r.buckets {
		s := &r.buckets[i]
		if se := s.epoch.Load(); se > e-n && se <= e {
			requests += s.requests.Load()
			retries += s.retries.Load()
		}
	}
	return requests, retries
}
