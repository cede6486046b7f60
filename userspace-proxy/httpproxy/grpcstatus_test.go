package httpproxy

import (
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
