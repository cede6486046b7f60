package controlplane

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestResyncWithoutSignal: the loop translates again Resync (10 minutes by
// default) after its last translation though nothing signals, and the
// writers get the translation of what the source holds then: the
// kubernetes source signals no change of status alone, so an entry of
// sockmesh's that another party removed is written back. A resync that
// changes nothing publishes nothing; a signal starts the wait anew.
// Before, nothing was translated without a signal (or a judgement by the
// time), and the status stayed as the other party left it until some
// unrelated change.
func TestResyncWithoutSignal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
		w := &flakyWriter{}
		c, err := New(Config{Writers: []Writer{w}}, src, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		check := func(when string, translations int, version uint64, frontends int) {
			t.Helper()
			w.mu.Lock()
			n, last := len(w.calls), len(w.last.Frontends)
			w.mu.Unlock()
			if v := c.Snapshot().Version; n != translations || v != version || last != frontends {
				t.Errorf("%s: %d translations written, the last with %d frontends, snapshot %d; want %d, %d, %d",
					when, n, last, v, translations, frontends, version)
			}
		}
		run(t, c)
		synctest.Wait()
		check("at start", 1, 1, 1)
		time.Sleep(10*time.Minute - time.Nanosecond)
		synctest.Wait()
		check("just before the resync", 1, 1, 1)
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		check("at the resync", 2, 1, 1)
		if got := count(t, c.m.rebuilds.WithLabelValues("unchanged")); got != 1 {
			t.Errorf("rebuilds_total{result=unchanged} = %v, want 1", got)
		}

		// What the source holds changes with no signal.
		src.mu.Lock()
		src.in = twoServices()
		src.mu.Unlock()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		check("at the next resync", 3, 2, 2)

		time.Sleep(5 * time.Minute)
		src.signal()
		synctest.Wait()
		check("at a signal", 4, 2, 2)
		time.Sleep(10*time.Minute - time.Nanosecond)
		synctest.Wait()
		check("just before the resync after the signal", 4, 2, 2)
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		check("at the resync after the signal", 5, 2, 2)
	})
}
