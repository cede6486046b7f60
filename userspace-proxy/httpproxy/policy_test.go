package httpproxy

import (
	"math"
	"testing"
	"time"
)

// TestRetryDelay: retry n waits between half and all of backoff·2ⁿ⁻¹,
// capped at max(10·backoff, 1 s), however many retries a rule allows
// (attempts has no maximum). Before, the doubling wrapped past
// time.Duration for a long backoff and a late retry: 2⁴⁰ ns (18m19.5s),
// retry 25, waited at most 3m27s, under half its cap of 3h3m.
func TestRetryDelay(t *testing.T) {
	for _, backoff := range []time.Duration{time.Millisecond, 25 * time.Millisecond, 3 * time.Second, time.Hour, 1<<40 + 12345} {
		ceiling := max(10*backoff, time.Second)
		for n := 1; n <= 64; n++ {
			want := time.Duration(min(float64(backoff)*math.Pow(2, float64(n-1)), float64(ceiling)))
			p := policy{backoff: backoff}
			if got := p.delay(n); got < want/2 || got > want {
				t.Errorf("backoff %v: delay(%d) = %v, want from %v to %v", backoff, n, got, want/2, want)
			}
		}
	}
	if got := (&policy{}).delay(1); got != 0 {
		t.Errorf("backoff 0s: delay(1) = %v, want none", got)
	}
}
