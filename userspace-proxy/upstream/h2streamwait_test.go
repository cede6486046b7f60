package upstream

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestStreamWaitsEachBounded: waits for a stream listed on one
// connection at different times each end exactly when their own bound
// passes, with the one timer, and one removed before (its HEADERS
// written) never does.
func TestStreamWaitsEachBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s streamWaits
		start := time.Now()
		var mu sync.Mutex
		ended := make(map[string]time.Duration)
		wait := func(name string, after time.Duration) *connTry {
			time.Sleep(after - time.Since(start))
			cancel := func(cause error) {
				mu.Lock()
				defer mu.Unlock()
				if cause == errNoStream {
					ended[name] = time.Since(start)
				}
			}
			try := &connTry{cancel: cancel, streamWait: 10 * time.Second}
			try.mu.Lock()
			try.waiting = &s
			s.add(try, time.Now().Add(try.streamWait))
			try.mu.Unlock()
			return try
		}
		wait("a", 0)
		wait("b", 3*time.Second)
		c := wait("c", 5*time.Second)
		time.Sleep(time.Second)
		c.mu.Lock()
		c.streamed()
		c.mu.Unlock()
		wait("d", 20*time.Second) // after the list emptied
		time.Sleep(time.Minute)
		synctest.Wait()
		want := map[string]time.Duration{"a": 10 * time.Second, "b": 13 * time.Second, "d": 30 * time.Second}
		for name, at := range want {
			if ended[name] != at {
				t.Errorf("wait %s ended at %v, want %v", name, ended[name], at)
			}
		}
		if at, ok := ended["c"]; ok {
			t.Errorf("wait c, removed at 6s, ended at %v", at)
		}
	})
}
