// Package gcfloor keeps the Go garbage collector from collecting while the
// heap is small. With GOGC=100 the runtime collects each time the heap
// doubles, which for a proxy with a few MiB alive means many collections a
// second under load, each taking a share of the CPU and adding to the tail
// latency of the requests it overlaps. After each collection gcfloor sets
// the GC percent so that the next one starts no earlier than at the floor
// (and, above the floor, as the configured GOGC would): memory for fewer
// collections, up to the floor and no further. A soft memory limit
// (debug.SetMemoryLimit) still wins over it.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// Default is the agent's floor: the heap an agent with a small
// configuration may grow to before collecting. At 10,000 Services the agent
// keeps about 42 MiB alive, so GOGC=100 already lets it grow past the
// floor and it changes nothing there.
const Default = 64 << 20

// minHeap is the runtime's smallest heap goal at GOGC=100; it scales with
// the GC percent (4 MiB × percent/100), so a percent that would let a
// nearly empty heap reach the floor overshoots it: the percent is capped
// where this minimum reaches the floor.
const minHeap = 4 << 20

// Percent is the GC percent that lets a heap grow to floor bytes before the
// next collection, or base when base already lets it grow that far. live
// is the heap the last collection left alive and roots the stacks and
// globals it scanned: the runtime's goal is live + (live+roots)×percent/100,
// and at least minHeap×percent/100. base < 0 (GC off) is returned
// unchanged.
func Percent(base int, live, roots, floor uint64) int {
	scan := live + roots
	if base < 0 || live == 0 || live >= floor {
		return base
	}
	if live+scan*uint64(base)/100 >= floor {
		return base
	}
	// Never below base: a high GOGC's minimum heap may reach the floor
	// where its proportional goal does not.
	return max(base, int(min((floor-live)*100/scan, floor*100/minHeap)))
}

// Start keeps the heap goal at or above floor bytes until the returned
// function is called, which restores the GC percent found at Start. A floor
// of 0 changes nothing.
func Start(floor uint64) (stop func()) {
	if floor == 0 {
		return func() {}
	}
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	t := &tuner{floor: floor, base: base, current: base}
	t.tune()
	t.arm()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.stopped = true
		debug.SetGCPercent(t.base)
	}
}

type tuner struct {
	floor uint64
	base  int

	mu      sync.Mutex
	current int
	stopped bool
}

// sentinel is garbage whose finalizer runs after each collection. It holds
// a pointer so that the tiny allocator, whose objects may never be
// finalized, does not take it.
type sentinel struct{ t *tuner }

// arm drops a sentinel whose finalizer re-tunes after the next collection
// and arms again.
func (t *tuner) arm() {
	runtime.SetFinalizer(&sentinel{t: t}, func(s *sentinel) {
		if s.t.tune() {
			s.t.arm()
		}
	})
}

// tune sets the GC percent for the heap the last collection left alive;
// false once stopped.
func (t *tuner) tune() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}
	metrics.Read(s)
	for _, v := range s {
		if v.Value.Kind() != metrics.KindUint64 {
			return false
		}
	}
	if p := Percent(t.base, s[0].Value.Uint64(), s[1].Value.Uint64()+s[2].Value.Uint64(), t.floor); p != t.current {
		debug.SetGCPercent(p)
		t.current = p
	}
	return true
}
