package resolve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Resolver. The zero value asks the nameservers of
// /etc/resolv.conf, refreshes each hostname between 5 s and 1 min, keeps
// addresses through 5 min of failed lookups and runs 64 lookups at once.
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
	// MaxStale is how long a hostname keeps the last addresses of a family
	// (A or AAAA) while lookups fail to learn them (SERVFAIL, timeouts, no
	// server reachable), counted from when they were due for refresh
	// (zero: 5 min). A short outage of the DNS servers then does not cut
	// traffic to a backend that still answers; a long one drops the
	// addresses, and the backend fails closed rather than send to
	// addresses that may have passed to someone else. An NXDOMAIN or
	// NODATA answer is no failure: it empties the family at once.
	MaxStale time.Duration
	// Parallel bounds the lookups under way at once (zero: 64), so that
	// many hostnames, at start or when their TTLs run out together, do not
	// flood the DNS servers; the others wait their turn. It is no lower:
	// a lookup may wait on a dead server's timeout (Timeout per server and
	// record type), and the turns of hundreds of names would add up.
	Parallel int
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
	slots   chan struct{} // one per lookup under way, Config.Parallel in all

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
	if cfg.MaxStale <= 0 {
		cfg.MaxStale = 5 * time.Minute
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 64
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
		slots:   make(chan struct{}, cfg.Parallel),
		watches: make(map[string]*watch),
		answers: make(map[string][]netip.Addr),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_resolve_lookups_total",
			Help: "DNS lookups of ExternalHostname XBackend hostnames, by result (ok, nxdomain, servfail, timeout, error).",
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

// keepResolved looks host up whenever one of its families' answers
// expires, and retries failed ones.
func (r *Resolver) keepResolved(ctx context.Context, host string, w *watch) {
	log := r.log.With("hostname", host)
	var fams [len(families)]family
	failures := 0
	for {
		select {
		case r.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		res, err := r.client.lookup(ctx, host)
		<-r.slots
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// Not a DNS name: no lookup can change that. translate
			// refuses such a hostname before it reaches here.
			r.lookups.WithLabelValues("error").Inc()
			log.Warn("dns lookup failed", "err", err)
			r.publish(host, w, nil)
			return
		}
		outcome, failure := classify(res)
		r.lookups.WithLabelValues(outcome).Inc()
		if failure != nil {
			failures++
			log.Warn("dns lookup failed", "err", failure, "failures", failures)
		} else {
			failures = 0
		}
		now := time.Now()
		wait := r.cfg.MaxInterval
		var addrs []netip.Addr
		for i := range fams {
			d, dropped := fams[i].update(res[i], now, failures, r.cfg)
			if dropped {
				log.Warn("dns answer dropped after failed lookups: failing closed",
					"type", families[i].String(), "max_stale", r.cfg.MaxStale)
			}
			wait = min(wait, d)
			addrs = append(addrs, fams[i].addrs...)
		}
		r.publish(host, w, addrs)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// family is what a watch holds of one record type of its hostname.
type family struct {
	addrs []netip.Addr
	// staleAt is when addrs have been due for refresh for MaxStale.
	staleAt time.Time
}

// update applies a lookup's result for the family at now, the lookup
// having failed failures times in a row, and returns when to ask again and
// whether it dropped addresses that outlived MaxStale.
func (f *family) update(res result, now time.Time, failures int, cfg Config) (time.Duration, bool) {
	if res.err == nil || errors.Is(res.err, ErrNXDomain) {
		wait := clamp(res.ttl, cfg.MinInterval, cfg.MaxInterval)
		f.addrs, f.staleAt = res.addrs, now.Add(wait+cfg.MaxStale)
		return wait, false
	}
	wait := backoff(failures, cfg.MinInterval, cfg.MaxInterval)
	switch {
	case len(f.addrs) == 0:
		return wait, false
	case !now.Before(f.staleAt):
		f.addrs = nil
		return wait, true
	default:
		// Ask once more when they go stale, not up to a retry later.
		return min(wait, f.staleAt.Sub(now)), false
	}
}

// classify names a lookup's outcome for sockmesh_resolve_lookups_total and
// returns its first failure, if any: ok when every type was answered (with
// records or NODATA), nxdomain when the name does not exist, servfail when
// a server answered an error code, timeout when none answered in time,
// error otherwise.
func classify(res [len(families)]result) (string, error) {
	nx := 0
	for _, q := range res {
		switch {
		case q.err == nil:
		case errors.Is(q.err, ErrNXDomain):
			nx++
		default:
			var rc *rcodeError
			if errors.As(q.err, &rc) {
				return "servfail", q.err
			}
			if errors.Is(q.err, os.ErrDeadlineExceeded) || errors.Is(q.err, context.DeadlineExceeded) {
				return "timeout", q.err
			}
			return "error", q.err
		}
	}
	if nx == len(res) {
		return "nxdomain", nil
	}
	return "ok", nil
}

// publish stores addrs (nil: none) as host's answer if w still watches it
// and they differ from the answer stored.
func (r *Resolver) publish(host string, w *watch, addrs []netip.Addr) {
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watches[host] != w {
		return
	}
	if old, had := r.answers[host]; had && slices.Equal(old, addrs) {
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
