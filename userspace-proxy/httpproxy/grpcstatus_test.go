package httpproxy

import (
	"math"
	"testing"
	"time"
)

func TestParseGRPCTimeout(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"100m": 100 * time.Millisecond, "1S": time.Second, "2M": 2 * time.Minute, "3H": 3 * time.Hour,
		"5u": 5 * time.Microsecond, "7n": 7, "99999999S": 99999999 * time.Second,
	} {
		if got, ok := parseGRPCTimeout(v); !ok || got != want {
			t.Errorf("parseGRPCTimeout(%q) = %v, %v; want %v", v, got, ok, want)
		}
	}
	// Malformed, too many digits, an unknown unit, and a value beyond
	// time.Duration (99999999 hours) are no deadline.
	for _, v := range []string{"", "S", "10", "-1S", "123456789S", "1x", "99999999H"} {
		if got, ok := parseGRPCTimeout(v); ok {
			t.Errorf("parseGRPCTimeout(%q) = %v, want none", v, got)
		}
	}
}

// TestEncodeGRPCTimeout: the finest unit whose eight digits hold d, never
// less than d (the backend must not give up before the proxy), and read
// back as such.
func TestEncodeGRPCTimeout(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0n", -time.Second: "0n", 7: "7n", 99999999: "99999999n", 100000000: "100000u",
		2*time.Second - 1: "2000000u", 99999999 * time.Microsecond: "99999999u", 100 * time.Second: "100000m",
		time.Hour: "3600000m", 99999999*time.Second + 1: "1666667M", math.MaxInt64: "2562048H",
	} {
		got := encodeGRPCTimeout(d)
		if got != want {
			t.Errorf("encodeGRPCTimeout(%v) = %q, want %q", d, got, want)
		}
		if back, ok := parseGRPCTimeout(got); d > 0 && d < math.MaxInt64 && (!ok || back < d) {
			t.Errorf("parseGRPCTimeout(%q) = %v, %v; want at least %v", got, back, ok, d)
		}
	}
}
