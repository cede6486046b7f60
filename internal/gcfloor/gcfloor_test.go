package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
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
		{"GC off stays off", -1, mib, 0, 64 * mib, -1},
		{"before the first collection", 100, 0, mib, 64 * mib, 100},
	} {
		if got := Percent(c.base, c.live, c.roots, c.floor); got != c.want {
			t.Errorf("%s: Percent(%d, %d, %d, %d) = %d, want %d", c.name, c.base, c.live, c.roots, c.floor, got, c.want)
		}
	}
}

// TestFloorCutsCollections churns the same garbage with and without a
// floor and counts the runtime's collections: with a 64 MiB floor a heap
// of a few MiB must be collected about every 64 MiB, not every few MiB,
// and not much more rarely either (the floor is a goal, not a ceiling to
// overshoot).
func TestFloorCutsCollections(t *testing.T) {
	without := collections(0)
	with := collections(64 << 20)
	t.Logf("collections for 512 MiB of garbage: %d without a floor, %d with 64 MiB", without, with)
	if with*4 > without {
		t.Errorf("with a 64 MiB floor %d collections, without %d: want at most a quarter", with, without)
	}
	if with < 6 || with > 10 {
		t.Errorf("with a 64 MiB floor %d collections for 512 MiB of garbage, want about 8", with)
	}
}

var sink []byte

// collections allocates 512 MiB of short-lived garbage under a floor and
// returns how many collections ran meanwhile.
func collections(floor uint64) uint64 {
	runtime.GC()
	stop := Start(floor)
	defer stop()
	runtime.GC() // let the tuner see the live heap
	n0 := cycles()
	for range 512 << 10 {
		sink = make([]byte, 1<<10)
	}
	return cycles() - n0
}

func cycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func TestStopRestoresPercent(t *testing.T) {
	prev := debug.SetGCPercent(150)
	defer debug.SetGCPercent(prev)
	stop := Start(64 << 20)
	runtime.GC()
	runtime.GC()
	if p := debug.SetGCPercent(150); p == 150 {
		t.Errorf("GC percent %d under a 64 MiB floor with a small heap: want it raised", p)
	}
	stop()
	runtime.GC()
	if p := debug.SetGCPercent(prev); p != 150 {
		t.Errorf("GC percent after stop = %d, want 150 restored", p)
	}
}
