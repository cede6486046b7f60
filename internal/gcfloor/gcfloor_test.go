package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name               string
		base               int
		live, roots, floor uint64
		want               int
	}{
		{"small heap grows to the floor", 100, 8 * mib, 0, 64 * mib, 700},
		{"stacks and globals count toward the goal", 100, 6 * mib, 2 * mib, 64 * mib, 725},
		{"heap past half the floor keeps GOGC", 100, 40 * mib, 0, 64 * mib, 100},
		{"heap past the floor keeps GOGC", 100, 80 * mib, 0, 64 * mib, 100},
		{"a higher GOGC already reaching the floor is kept", 400, 16 * mib, 0, 64 * mib, 400},
		{"nearly empty heap: the runtime's minimum heap reaches the floor", 100, 1, 0, 64 * mib, 1600},
		{"a GOGC whose minimum heap reaches the floor is kept", 2000, 1, 0, 64 * mib, 2000},
		{"GC off stays off", -1, mib, 0, 64 * mib, -1},
		{"before the first collection", 100, 0, mib, 64 * mib, 100},
	} {
		if got := Percent(c.base, c.live, c.roots, c.floor); got != c.want {
			t.Errorf("%s: Percent(%d, %d, %d, %d) = %d, want %d", c.name, c.base, c.live, c.roots, c.floor, got, c.want)
		}
	}
}

// TestHeapGoal checks the runtime's own heap goal under a 64 MiB floor as
// the live heap changes: at the floor while the heap is small, GOGC's once
// twice the live heap passes the floor, and GOGC's percent back after stop.
// (Counting collections instead depends on how fast the GC's marking gets
// CPU on a busy machine.)
func TestHeapGoal(t *testing.T) {
	const mib = 1 << 20
	const floor = 64 * mib
	base := debug.SetGCPercent(100)
	defer debug.SetGCPercent(base)

	runtime.GC()
	stop := Start(floor)
	defer stop()
	if g := goal(); g < floor*9/10 || g > floor*11/10 {
		t.Errorf("heap goal with a small heap = %d MiB, want about the 64 MiB floor", g/mib)
	}

	// Re-tuned after a collection (a finalizer, run asynchronously): a
	// larger live heap, still under half the floor, keeps the goal there.
	p0 := percent()
	keep(16 * mib)
	waitPercent(t, func(p uint64) bool { return p != p0 })
	if g := goal(); g < floor*9/10 || g > floor*11/10 {
		t.Errorf("heap goal with 16 MiB alive = %d MiB, want about the 64 MiB floor", g/mib)
	}

	// Past half the floor GOGC=100 alone lets the heap grow past it.
	keep(48 * mib)
	waitPercent(t, func(p uint64) bool { return p == 100 })

	keep(0)
	runtime.GC()
	stop()
	if p := percent(); p != 100 {
		t.Errorf("GC percent after stop = %d, want GOGC's 100 back", p)
	}
}

var sink [][]byte

// keep makes n bytes stay alive (in 1 MiB pieces) and collects.
func keep(n int) {
	sink = nil
	for range n >> 20 {
		sink = append(sink, make([]byte, 1<<20))
	}
	runtime.GC()
}

// waitPercent collects until the GC percent satisfies ok: gcfloor re-tunes
// from a finalizer, which runs after the collection.
func waitPercent(t *testing.T, ok func(uint64) bool) {
	t.Helper()
	for range 1000 {
		if ok(percent()) {
			return
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("GC percent stayed %d", percent())
}

func goal() uint64    { return read("/gc/heap/goal:bytes") }
func percent() uint64 { return read("/gc/gogc:percent") }

func read(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
