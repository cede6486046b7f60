package contain

import (
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/internal/logthrottle"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// Panic is a recovered panic as an error, with the stack of the goroutine
// that panicked.
type Panic struct {
	Value any
	Stack []byte
}

func (p *Panic) Error() string { return fmt.Sprintf("panic: %v", p.Value) }

// Reporter counts and logs recovered panics: every one is counted, and an
// error line with its stack is written per place (what) and period at most,
// since a bug that panics on every request must not flood the node's log.
// A nil Reporter logs every panic to slog's default logger and counts
// none (parts used without a proxy, as in their own tests).
type Reporter struct {
	log      *slog.Logger
	count    prometheus.Counter
	throttle *logthrottle.Throttle[string]
}

// New returns a Reporter logging to log at most once per every for each
// place, registering its counter with reg.
func New(log *slog.Logger, reg prometheus.Registerer, every time.Duration) (*Reporter, error) {
	r := &Reporter{
		log: log,
		count: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sockmesh_proxy_panics_total",
			Help: "Panics recovered while serving connections; each ended only its connection or request, and the proxy went on (a bug: the log has the stack).",
		}),
		throttle: logthrottle.New[string](every),
	}
	if err := reg.Register(r.count); err != nil {
		return nil, fmt.Errorf("register panics counter: %w", err)
	}
	return r, nil
}

// Report counts and logs v, the value recover returned in a goroutine
// serving what ("connection", "request body", ...), with attrs for
// context, and returns it as an error. Call it from the deferred function
// that recovered, so that the stack is the panic's.
func (r *Reporter) Report(v any, what string, attrs ...any) *Panic {
	p := &Panic{Value: v, Stack: debug.Stack()}
	if r == nil {
		slog.Error("panic recovered", append(attrs, "in", what, "panic", fmt.Sprint(v), "stack", string(p.Stack))...)
		return p
	}
	r.count.Inc()
	if ok, held := r.throttle.Allow(what, time.Now()); ok {
		r.log.Error("panic recovered; only the connection or request it served ended",
			append(attrs, "in", what, "panic", fmt.Sprint(v), "stack", string(p.Stack), "suppressed", held)...)
	}
	return p
}

// Recover is deferred first in a goroutine that serves part of a
// connection: it recovers the goroutine's panic, reports it, sets *err to
// it, and runs cleanup, which must unblock the connection's other
// goroutines (close or reset the sockets they wait on). It does nothing
// when the goroutine did not panic.
func (r *Reporter) Recover(what string, err *error, cleanup func()) {
	v := recover()
	if v == nil {
		return
	}
	*err = r.Report(v, what)
	if cleanup != nil {
		cleanup()
	}
}

// Conn is a connection read and written on goroutines the proxy does not
// start — net/http's server and HTTP/2 Transport run their own for each
// connection. Its Read and Write recover a panic in the code beneath (the
// proxy's socket layer and its wrappers): it is reported as in, the
// connection is closed, so that the other goroutines on it end too, and
// the call returns it as an error. What is above — crypto/tls, net/http —
// is not the proxy's code.
type Conn struct {
	net.Conn
	r  *Reporter
	in string
}

// Conn wraps c; in names the connection in reports.
func (r *Reporter) Conn(c net.Conn, in string) *Conn { return &Conn{Conn: c, r: r, in: in} }

func (c *Conn) Read(p []byte) (n int, err error) {
	defer c.r.Recover(c.in, &err, func() { c.Conn.Close() })
	return c.Conn.Read(p)
}

func (c *Conn) Write(p []byte) (n int, err error) {
	defer c.r.Recover(c.in, &err, func() { c.Conn.Close() })
	return c.Conn.Write(p)
}

// NetConn returns the connection underneath, as crypto/tls's does.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// ReadPooled passes a relay's read (sockio.Pooled) through: relays recover
// their own goroutines' panics.
func (c *Conn) ReadPooled(bufs sockio.Buffers) (*[]byte, int, error) {
	return c.Conn.(sockio.PooledReader).ReadPooled(bufs)
}
