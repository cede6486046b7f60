package health

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Check returns nil when its part of the agent is ready, otherwise why not.
type Check func() error

// Checks is an ordered set of named readiness checks. Its methods are safe
// for concurrent use.
type Checks struct {
	mu     sync.Mutex
	names  []string
	checks []Check
}

// New returns an empty set: ready until a check is added. reg may be nil;
// otherwise sockmesh_agent_ready is registered on it.
func New(reg prometheus.Registerer) (*Checks, error) {
	c := &Checks{}
	if reg != nil {
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sockmesh_agent_ready",
			Help: "1 when every readiness check of the agent passes (what /readyz answers 200 for), else 0.",
		}, func() float64 {
			if c.Ready() == nil {
				return 1
			}
			return 0
		})
		if err := reg.Register(g); err != nil {
			return nil, fmt.Errorf("register readiness metric: %w", err)
		}
	}
	return c, nil
}

// Add registers a check under name (a short lowercase word: datapath,
// snapshot, proxy, heartbeat).
func (c *Checks) Add(name string, check Check) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.names = append(c.names, name)
	c.checks = append(c.checks, check)
}

// Result is one check's outcome.
type Result struct {
	Name string
	Err  error
}

// Run runs every check, in the order they were added.
func (c *Checks) Run() []Result {
	c.mu.Lock()
	names, checks := c.names, c.checks
	c.mu.Unlock()
	out := make([]Result, len(checks))
	for i, check := range checks {
		out[i] = Result{Name: names[i], Err: check()}
	}
	return out
}

// Ready returns nil when every check passes, otherwise the failures, each
// prefixed with its check's name.
func (c *Checks) Ready() error {
	var errs []error
	for _, r := range c.Run() {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Name, r.Err))
		}
	}
	return errors.Join(errs...)
}

// Handler serves /healthz and /readyz.
func (c *Checks) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", c.serveReadyz)
	return mux
}

// serveReadyz writes one line per check, "[+]name ok" or "[-]name failed:
// reason", then "ok" or "not ready"; the status is 200 or 503.
func (c *Checks) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	var b strings.Builder
	ready := true
	for _, r := range c.Run() {
		if r.Err != nil {
			ready = false
			fmt.Fprintf(&b, "[-]%s failed: %v\n", r.Name, r.Err)
		} else {
			fmt.Fprintf(&b, "[+]%s ok\n", r.Name)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
		b.WriteString("not ready\n")
	} else {
		b.WriteString("ok\n")
	}
	w.Write([]byte(b.String()))
}
