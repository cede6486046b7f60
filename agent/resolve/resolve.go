package resolve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Resolver. The zero value asks the nameservers of
// /etc/resolv.conf and refreshes each hostname between 5 s and 1 min.
type Config struct {
	// Servers are the DNS servers ("host:port") to ask, in order. Empty: the
	// nameservers of /etc/resolv.conf.
	Servers []string
	// MinInterval is the shortest time between two lookups of one hostname,
	// whatever its TTL (zero: 5 s). Retries after errors start there and
	// double up to MaxInterval.
	MinInterval time.Duration
	// MaxInterval is the longest time between two lookups of one hostname,
	// however long its TTL (zero: 1 min).
	MaxInterval time.Duration
	// Timeout bounds one query to one server (zero: 5 s).
	Timeout time.Duration
	// Dial opens the connection for a query (zero: net.Dialer). Tests use
	// it to serve DNS in memory.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// Resolver keeps the answers for a set of hostnames current. Its methods are
// safe for concurrent use.
type Resolver struct {
	cfg     Config
	log     *slog.Logger
	client  *client
	lookups *prometheus.CounterVec
	changed chan struct{}

	mu      sync.Mutex
	runCtx  context.Context // nil until Run starts
	wg      sync.WaitGroup
	watches map[string]*watch
	answers map[string][]netip.Addr
}

// watch is the goroutine that keeps one hostname resolved.
type watch struct {
	cancel context.CancelFunc
}

// New returns a Resolver; it looks nothing up until Run.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Resolver, error) {
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = 5 * time.Second
	}
	if cfg.MaxInterval <= 0 {
		cfg.MaxInterval = time.Minute
	}
	if cfg.MaxInterval < cfg.MinInterval {
		return nil, fmt.Errorf("resolver max interval %s below min interval %s", cfg.MaxInterval, cfg.MinInterval)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	servers := cfg.Servers
	if len(servers) == 0 {
		var err error
		if servers, err = systemServers("/etc/resolv.conf"); err != nil {
			return nil, fmt.Errorf("find dns servers: %w", err)
		}
	}
	r := &Resolver{
		cfg:     cfg,
		log:     log.With("component", "resolve"),
		client:  &client{servers: servers, timeout: cfg.Timeout, dial: cfg.Dial},
		changed: make(chan struct{}, 1),
		watches: make(map[string]*watch),
		answers: make(map[string][]netip.Addr),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_resolve_lookups_total",
			Help: "DNS lookups of ExternalHostname XBackend hostnames, by result (ok, nxdomain, error).",
		}, []string{"result"}),
	}
	if reg != nil {
		if err := reg.Register(r.lookups); err != nil {
			return nil, fmt.Errorf("register resolver metrics: %w", err)
		}
	}
	return r, nil
}

// Run looks up the hostnames until ctx ends, then waits for lookups in
// flight to stop.
func (r *Resolver) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.runCtx != nil {
		r.mu.Unlock()
		return errors.New("resolver already running")
	}
	r.runCtx = ctx
	for host := range r.watches {
		r.startLocked(host)
	}
	r.mu.Unlock()
	<-ctx.Done()
	r.wg.Wait()
	return nil
}

// SetHostnames replaces the set of hostnames to keep resolved. New ones are
// looked up at once; answers for dropped ones are forgotten.
func (r *Resolver) SetHostnames(hosts []string) {
	want := make(map[string]bool, len(hosts))
	for _, h := range hosts {
		want[h] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	dropped := false
	for host, w := range r.watches {
		if !want[host] {
			if w.cancel != nil {
				w.cancel()
			}
			delete(r.watches, host)
			if _, ok := r.answers[host]; ok {
				delete(r.answers, host)
				dropped = true
			}
		}
	}
	for host := range want {
		if _, ok := r.watches[host]; !ok {
			r.watches[host] = &watch{}
			if r.runCtx != nil {
				r.startLocked(host)
			}
		}
	}
	if dropped {
		r.signal()
	}
}

// Answers returns the current answers by hostname: a hostname that is
// missing has not been looked up yet; one with no addresses did not resolve.
// The caller must not modify the slices.
func (r *Resolver) Answers() map[string][]netip.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.answers)
}

// Changed receives a value after the answers changed; several changes may
// coalesce into one.
func (r *Resolver) Changed() <-chan struct{} { return r.changed }

func (r *Resolver) signal() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *Resolver) startLocked(host string) {
	ctx, cancel := context.WithCancel(r.runCtx)
	w := r.watches[host]
	w.cancel = cancel
	r.wg.Go(func() { r.keepResolved(ctx, host, w) })
}

// keepResolved looks host up whenever its answer expires.
func (r *Resolver) keepResolved(ctx context.Context, host string, w *watch) {
	log := r.log.With("hostname", host)
	failures := 0
	for {
		a, err := r.client.lookup(ctx, host)
		if ctx.Err() != nil {
			return
		}
		var wait time.Duration
		switch {
		case err == nil:
			r.lookups.WithLabelValues("ok").Inc()
			failures = 0
			r.publish(host, w, a.addrs, true)
			wait = clamp(a.ttl, r.cfg.MinInterval, r.cfg.MaxInterval)
		case errors.Is(err, ErrNXDomain):
			r.lookups.WithLabelValues("nxdomain").Inc()
			failures = 0
			r.publish(host, w, nil, true)
			wait = clamp(a.ttl, r.cfg.MinInterval, r.cfg.MaxInterval)
		default:
			// Keep serving the last good answer through a server outage:
			// dropping it would cut traffic the backend still accepts.
			r.lookups.WithLabelValues("error").Inc()
			failures++
			log.Warn("dns lookup failed", "err", err, "failures", failures)
			r.publish(host, w, nil, false)
			wait = backoff(failures, r.cfg.MinInterval, r.cfg.MaxInterval)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// publish stores addrs for host if w still watches it. Unless replace is
// set, it only records that the lookup finished without an answer, keeping
// an earlier one.
func (r *Resolver) publish(host string, w *watch, addrs []netip.Addr, replace bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watches[host] != w {
		return
	}
	old, had := r.answers[host]
	if had && (!replace || slices.Equal(old, addrs)) {
		return
	}
	if addrs == nil {
		addrs = []netip.Addr{}
	}
	r.answers[host] = addrs
	r.log.Info("dns answer changed", "hostname", host, "addresses", len(addrs))
	r.signal()
}

// clamp bounds a TTL by the refresh limits.
func clamp(ttl, lo, hi time.Duration) time.Duration {
	return min(max(ttl, lo), hi)
}

// backoff is the wait before retry n (1-based) after failures: lo, 2·lo,
// 4·lo, ... up to hi.
func backoff(n int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}
