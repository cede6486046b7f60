package contain

import (
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/internal/metricsum"
	"github.com/sockmesh/sockmesh/internal/syncbuf"
)

// run runs f in a goroutine that recovers with r, as the proxy's
// goroutines do, and returns what Recover left in err and whether cleanup
// ran.
func run(r *Reporter, what string, f func()) (err error, cleaned bool) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer r.Recover(what, &err, func() { cleaned = true })
		f()
	}()
	<-done
	return err, cleaned
}

func TestRecover(t *testing.T) {
	logs := &syncbuf.Buffer{}
	reg := prometheus.NewRegistry()
	r, err := New(slog.New(slog.NewJSONHandler(logs, nil)), reg, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err, cleaned := run(r, "relay", func() {}); err != nil || cleaned {
		t.Errorf("no panic: err %v, cleanup ran %v; want neither", err, cleaned)
	}
	for range 3 {
		err, cleaned := run(r, "relay", func() { panic("a bug") })
		var p *Panic
		if !errors.As(err, &p) || p.Value != "a bug" || !strings.Contains(string(p.Stack), "contain_test.go") || !cleaned {
			t.Fatalf("panic: err %v, cleanup ran %v; want a *Panic with the panicking stack, and cleanup", err, cleaned)
		}
	}
	run(r, "mirror", func() { panic("another") })
	if got := metricsum.Sum(t, reg, "sockmesh_proxy_panics_total", nil); got != 4 {
		t.Errorf("counted %v panics, want 4", got)
	}
	// One line per place and period: the relay's first, the mirror's.
	l := logs.String()
	if n := strings.Count(l, `"msg":"panic recovered`); n != 2 || !strings.Contains(l, `"in":"relay"`) || !strings.Contains(l, `"in":"mirror"`) {
		t.Errorf("want one line for the relay and one for the mirror, got %d:\n%s", n, l)
	}
	if _, err := New(slog.Default(), reg, time.Hour); err == nil {
		t.Error("a second Reporter on one registry registered its counter twice")
	}
}

// A nil Reporter (parts used without a proxy) still recovers.
func TestNilReporterRecovers(t *testing.T) {
	var r *Reporter
	if err, cleaned := run(r, "relay", func() { panic("a bug") }); err == nil || !cleaned {
		t.Errorf("err %v, cleanup ran %v; want the panic as an error, and cleanup", err, cleaned)
	}
}

// panicConn panics on Read and Write, and remembers being closed.
type panicConn struct {
	net.Conn
	closed bool
}

func (c *panicConn) Read([]byte) (int, error)  { panic("a bug reading") }
func (c *panicConn) Write([]byte) (int, error) { panic("a bug writing") }
func (c *panicConn) Close() error              { c.closed = true; return nil }

// TestConn: a panic beneath a Conn's Read or Write comes back as the
// call's error, counted, with the connection closed for the goroutines
// that wait on it.
func TestConn(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := New(slog.New(slog.DiscardHandler), reg, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, op := range map[string]func(net.Conn) error{
		"read":  func(c net.Conn) error { _, err := c.Read(make([]byte, 1)); return err },
		"write": func(c net.Conn) error { _, err := c.Write([]byte("x")); return err },
	} {
		under := &panicConn{}
		var p *Panic
		if err := op(r.Conn(under, "upstream connection")); !errors.As(err, &p) || !under.closed {
			t.Errorf("%s: err %v, closed %v; want the panic as the error, and the connection closed", name, err, under.closed)
		}
	}
	if got := metricsum.Sum(t, reg, "sockmesh_proxy_panics_total", nil); got != 2 {
		t.Errorf("counted %v panics, want 2", got)
	}
}
