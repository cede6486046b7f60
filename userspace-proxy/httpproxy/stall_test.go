package httpproxy

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/internal/metricsum"
	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
)

// TestStallTickPanicContained: a panic in a stall watch's tick, which runs
// in its timer's goroutine, is reported to the Handler's Reporter rather
// than ending the node's proxy (docs/design.md: a panic ends only the
// connection or request, in every goroutine the proxy starts for it).
// progress reads the owner's connection through its wrappers: the owner
// here panics there, as a bug beneath it would.
func TestStallTickPanicContained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		panics, err := contain.New(slog.New(slog.DiscardHandler), reg, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var w stallWatch
		w.init(time.Second, panickyOwner{}, panics)
		w.watch()
		time.Sleep(time.Second) // past the first tick
		synctest.Wait()
		w.end()
		if n := metricsum.Sum(t, reg, "sockmesh_proxy_panics_total", nil); n != 1 {
			t.Errorf("%v panics reported, want the tick's", n)
		}
	})
}

// panickyOwner is an exchange whose progress panics.
type panickyOwner struct{}

func (panickyOwner) stallStop()       {}
func (panickyOwner) exchanging() bool { return true }
func (panickyOwner) progress() uint64 { panic("progress") }
