package logthrottle

import (
	"testing"
	"time"
)

func TestAllow(t *testing.T) {
	th := New[string](10 * time.Second)
	t0 := time.Unix(1000, 0)
	step := func(k string, at time.Duration, wantOK bool, wantHeld uint64) {
		t.Helper()
		if ok, held := th.Allow(k, t0.Add(at)); ok != wantOK || held != wantHeld {
			t.Errorf("Allow(%s, +%v) = %v, %d; want %v, %d", k, at, ok, held, wantOK, wantHeld)
		}
	}
	step("a", 0, true, 0)
	step("a", time.Second, false, 0)
	step("b", time.Second, true, 0) // keys are independent
	step("a", 9*time.Second, false, 0)
	step("a", 10*time.Second, true, 2) // a period after the first line, with the two held back
	step("a", 15*time.Second, false, 0)
	step("a", 25*time.Second, true, 1)
	step("a", 60*time.Second, true, 0)
}

// TestForget: past maxKeys, keys whose period passed are dropped, and the
// others (still holding lines back) stay.
func TestForget(t *testing.T) {
	th := New[int](time.Second)
	t0 := time.Unix(1000, 0)
	th.Allow(-1, t0.Add(time.Second)) // recent: stays
	for i := range maxKeys - 1 {
		th.Allow(i, t0)
	}
	th.Allow(maxKeys, t0.Add(1500*time.Millisecond))
	if len(th.keys) != 2 {
		t.Errorf("%d keys after forgetting, want 2 (the recent one and the new one)", len(th.keys))
	}
	if ok, _ := th.Allow(-1, t0.Add(1600*time.Millisecond)); ok {
		t.Error("a key within its period was forgotten")
	}
}
