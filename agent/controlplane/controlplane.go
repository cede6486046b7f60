package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/source"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// Resolver keeps ExternalHostname answers current (agent/resolve).
type Resolver interface {
	Run(ctx context.Context) error
	SetHostnames(hosts []string)
	Answers() map[string][]netip.Addr
	Changed() <-chan struct{}
}

// NodeAddrs keeps the node's own addresses current (podns.AddrWatch).
type NodeAddrs interface {
	Run(ctx context.Context) error
	Addrs() []netip.Addr
	Changed() <-chan struct{}
}

// Leader runs work only while this agent holds the writer lease
// (agent/leader).
type Leader interface {
	Run(ctx context.Context, lead func(ctx context.Context)) error
}

// Writer applies one translation to the cluster: status (agent/status),
// generated Services (agent/selectorsvc). in is the Input translate judged;
// the writer must not modify it. It passes each object's write through g,
// which holds back the objects and resources it must not write now, writes
// every object it can and returns the errors of the others, joined, each
// keeping the API server's status: the loop logs and counts the objects
// the API server refused for good (Retryable) and retries the rest with
// backoff.
type Writer interface {
	Write(ctx context.Context, in translate.Input, res translate.Result, g *Gate) error
}

// WriterFunc adapts a function to Writer.
type WriterFunc func(ctx context.Context, in translate.Input, res translate.Result, g *Gate) error

// Write calls f.
func (f WriterFunc) Write(ctx context.Context, in translate.Input, res translate.Result, g *Gate) error {
	return f(ctx, in, res, g)
}

// Config configures a ControlPlane.
type Config struct {
	// Node is what the agent is configured with about its node and cluster
	// (service and pod CIDRs, egress allow-list, cluster domain). It is
	// merged with what the source observes (the Node object's addresses,
	// pod CIDRs and zone): lists are joined, and a source's node name and
	// zone are used only when Node's are empty.
	Node translate.Node
	// NodeAddrs are the node's addresses as they change, joined to
	// Node.IPs: ExternalHostname answers must not lead to them, including
	// an address the node gained after the agent started. Nil: Node.IPs
	// alone.
	NodeAddrs NodeAddrs
	// Resolver resolves ExternalHostname XBackends. Nil: no hostname is
	// ever resolved, so such XBackends fail closed.
	Resolver Resolver
	// Leader gates Writers to the terms this agent leads. Nil: the writers
	// run whenever there is something to write (a lone agent, tests).
	Leader Leader
	// Writers receive the translations while this agent leads; one that is
	// busy while several arrive gets only the latest. Nil: nothing is
	// written.
	Writers []Writer
	// RetryInterval is the first wait before retrying a write that failed
	// in a way that may clear (Retryable), the whole translation's or one
	// object's (Gate); it doubles up to a minute (zero: 1 s).
	RetryInterval time.Duration
	// Access tells a 403 of RBAC's, which holds back the writes of the
	// whole resource, from one about the object (SelfAccess). Nil: every
	// 403 is taken as about its object.
	Access AccessFunc
	// AccessRecheck is how often a resource RBAC refused is reviewed again
	// (zero: 5 minutes).
	AccessRecheck time.Duration
	// Resync is how long the loop waits for a signal before it translates
	// again all the same (zero: 10 minutes). The kubernetes source signals
	// the changes that may change the Snapshot, and of status alone the
	// removal of an entry of sockmesh's, not its rewrite in place: an entry
	// another party rewrote is written back at the latest then, as a new
	// leader term's first pass would. A translation that changes nothing
	// writes nothing.
	Resync time.Duration
}

// ControlPlane runs the loop. Create it with New and start Run.
type ControlPlane struct {
	cfg Config
	src source.Source
	log *slog.Logger
	m   metrics

	// mu guards current's replacement and updated.
	mu      sync.Mutex
	current atomic.Pointer[snapshot.Snapshot]
	updated chan struct{}

	// pending is the latest translation for the writers; wake tells the
	// writer loop that it changed.
	pending atomic.Pointer[pass]
	passes  uint64
	wake    chan struct{}
	// gate is the Gate of the leader term under way, nil between terms:
	// what Writes reports.
	gate atomic.Pointer[Gate]

	// translate is translate.Translate; tests hand in translations that
	// failed on an object.
	translate func(translate.Input) (translate.Result, error)
	// failing are the objects whose translation panicked at the last
	// translation (Result.Failures): reported when they start failing,
	// not at every translation. Only the loop's goroutine uses it.
	failing map[snapshot.ObjectRef]bool
	// failures are the last handed-over translation's, for Failures.
	failures atomic.Pointer[[]translate.Failure]
}

// pass is one translation: what translate saw and what it said. seq
// numbers it, so that the writer loop remembers what it wrote without
// keeping an old translation alive.
type pass struct {
	seq uint64
	in  translate.Input
	res translate.Result
}

type metrics struct {
	rebuilds        *prometheus.CounterVec
	rebuildDuration prometheus.Histogram
	version         prometheus.Gauge
	writeErrors     *prometheus.CounterVec
	writeRefusals   *prometheus.CounterVec
	objectFailures  *prometheus.CounterVec
}

// New returns a ControlPlane that starts from the empty Snapshot.
func New(cfg Config, src source.Source, log *slog.Logger, reg prometheus.Registerer) (*ControlPlane, error) {
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = time.Second
	}
	if cfg.AccessRecheck <= 0 {
		cfg.AccessRecheck = 5 * time.Minute
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Minute
	}
	c := &ControlPlane{
		cfg:       cfg,
		src:       src,
		translate: translate.Translate,
		log:       log.With("component", "controlplane"),
		updated:   make(chan struct{}),
		wake:      make(chan struct{}, 1),
		m: metrics{
			rebuilds: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "sockmesh_controlplane_rebuilds_total",
				Help: "Translations run, by result (published, unchanged, error).",
			}, []string{"result"}),
			rebuildDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
				Name:    "sockmesh_controlplane_rebuild_duration_seconds",
				Help:    "Time from reading the source to publishing (or discarding) a Snapshot.",
				Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
			}),
			version: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "sockmesh_controlplane_snapshot_version",
				Help: "Version of the Snapshot currently published.",
			}),
			writeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "sockmesh_controlplane_write_errors_total",
				Help: "Failed attempts to write status or generated Services, retried with backoff, by scope: object (that object alone), all (every write waits).",
			}, []string{"scope"}),
			writeRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "sockmesh_controlplane_write_refusals_total",
				Help: "Writes the API server refused in a way a retry cannot change, by reason; rbac holds the resource back until allowed, others are tried again at the next translation.",
			}, []string{"reason"}),
			objectFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "sockmesh_controlplane_translate_object_failures_total",
				Help: "Objects whose translation panicked (a bug their data reached), judged invalid and closed for what they govern, by kind; counted when an object starts failing.",
			}, []string{"kind"}),
		},
	}
	for _, scope := range []string{"object", "all"} {
		c.m.writeErrors.WithLabelValues(scope)
	}
	c.current.Store(snapshot.Empty())
	if reg != nil {
		for _, col := range []prometheus.Collector{c.m.rebuilds, c.m.rebuildDuration, c.m.version, c.m.writeErrors, c.m.writeRefusals, c.m.objectFailures} {
			if err := reg.Register(col); err != nil {
				return nil, fmt.Errorf("register controlplane metrics: %w", err)
			}
		}
	}
	return c, nil
}

// Current returns the published Snapshot and a channel that is closed
// when a newer one replaces it. A subscriber applies the Snapshot, waits on
// the channel and calls Current again.
func (c *ControlPlane) Current() (*snapshot.Snapshot, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current.Load(), c.updated
}

// Snapshot returns the published Snapshot; version 0 until the first
// translation.
func (c *ControlPlane) Snapshot() *snapshot.Snapshot { return c.current.Load() }

// Run runs the source, the resolver, the writers and the loop until ctx
// ends. It returns the source's error if the source cannot start.
func (c *ControlPlane) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	defer wg.Wait()

	wg.Go(func() {
		if err := c.src.Run(ctx); err != nil {
			cancel(fmt.Errorf("config source: %w", err))
		}
	})
	var resolved, readdressed <-chan struct{}
	if a := c.cfg.NodeAddrs; a != nil {
		wg.Go(func() {
			if err := a.Run(ctx); err != nil {
				cancel(fmt.Errorf("node addresses: %w", err))
			}
		})
	}
	if r := c.cfg.Resolver; r != nil {
		resolved = r.Changed()
		wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				cancel(fmt.Errorf("resolver: %w", err))
			}
		})
	}
	if len(c.cfg.Writers) > 0 {
		wg.Go(func() {
			if c.cfg.Leader == nil {
				c.writeLoop(ctx)
				return
			}
			if err := c.cfg.Leader.Run(ctx, c.writeLoop); err != nil {
				cancel(fmt.Errorf("leader election: %w", err))
			}
		})
	}

	// retranslate fires when a judgement translate made by the time flips
	// (Result.ChangesAt: a client or CA certificate expires or becomes valid),
	// which no object's change would signal, or Resync after the last
	// translation. It starts stopped, so that nothing is translated before
	// the source's first signal; each translation resets it.
	retranslate := time.NewTimer(c.cfg.Resync)
	retranslate.Stop()
	defer retranslate.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		case <-c.src.Changed():
			// The node's addresses count once the source has objects to
			// translate: a change before then must not publish a first,
			// empty Snapshot that makes the agent ready with nothing.
			if a := c.cfg.NodeAddrs; a != nil {
				readdressed = a.Changed()
			}
		case <-resolved:
		case <-readdressed:
		case <-retranslate.C:
			c.log.Debug("translating again without a signal: resync, or a judgement made by the time changes")
		}
		retranslate.Reset(c.rebuild())
	}
}

// retranslateWait is how long after a translation judged at now the loop
// must translate again though nothing signals: until changesAt
// (Result.ChangesAt; zero: none) if that comes first, else resync. A
// certificate valid for centuries (a wait no Duration holds) or a wall
// clock that jumps costs one translation per resync, never a timer that
// waits for ever or fires in a loop.
func retranslateWait(now, changesAt time.Time, resync time.Duration) time.Duration {
	if !changesAt.After(now) {
		return resync
	}
	// Both are compared by wall clock, as translate compared them with the
	// certificates' dates; Sub saturates instead of overflowing.
	return min(changesAt.Sub(now), resync)
}

// rebuild translates the source's current objects and publishes the result
// if it differs from the current Snapshot. It returns how long until the
// loop must translate again though nothing signals (retranslateWait).
func (c *ControlPlane) rebuild() time.Duration {
	start := time.Now()
	defer func() { c.m.rebuildDuration.Observe(time.Since(start).Seconds()) }()

	in := c.src.Input()
	in.Now = time.Now()
	in.Node = mergeNode(c.cfg.Node, in.Node)
	if a := c.cfg.NodeAddrs; a != nil {
		in.Node.IPs = union(in.Node.IPs, a.Addrs())
	}
	if r := c.cfg.Resolver; r != nil {
		r.SetHostnames(externalHostnames(in.XBackends))
		in.Resolved = r.Answers()
	}
	res, err := c.translateSafely(in)
	if err != nil {
		// Translate fails only on an internal inconsistency (or a bug that
		// panicked): keep the current Snapshot, which was consistent.
		c.m.rebuilds.WithLabelValues("error").Inc()
		c.log.Error("translate failed; keeping the current snapshot", append([]any{"err", err,
			"snapshot_version", c.current.Load().Version}, stackAttrs(err)...)...)
		return c.cfg.Resync
	}
	c.reportFailures(res.Failures)
	wait := retranslateWait(in.Now, res.ChangesAt, c.cfg.Resync)
	cur := c.current.Load()
	// The first translation is published even when it is empty: version 0
	// is never applied, and a node with nothing to capture (no pods yet)
	// must still get a first Snapshot to become ready.
	if cur.Version > 0 && reflect.DeepEqual(cur.Frontends, res.Frontends) && reflect.DeepEqual(cur.Backends, res.Backends) &&
		reflect.DeepEqual(cur.Workloads, res.Workloads) {
		// The writers get the published parts, which are equal: one copy
		// stays alive instead of two (at 10,000 Services, megabytes).
		res.Frontends, res.Backends, res.Workloads = cur.Frontends, cur.Backends, cur.Workloads
		c.handOver(in, res)
		c.m.rebuilds.WithLabelValues("unchanged").Inc()
		return wait
	}
	next, err := snapshot.New(cur.Version+1, res.Frontends, res.Backends, res.Workloads)
	if err != nil {
		// Translate checked the same parts, so this is a bug. Its status
		// is not handed over: it would describe a Snapshot no data plane
		// serves, and the writers keep the one that describes the
		// current Snapshot.
		c.m.rebuilds.WithLabelValues("error").Inc()
		c.log.Error("build snapshot failed; keeping the current one", "err", err, "snapshot_version", cur.Version)
		return wait
	}
	// The Snapshot shares the Result's slices, so handing the Result to the
	// writers costs no copy.
	c.handOver(in, res)
	c.mu.Lock()
	c.current.Store(next)
	close(c.updated)
	c.updated = make(chan struct{})
	c.mu.Unlock()
	c.m.rebuilds.WithLabelValues("published").Inc()
	c.m.version.Set(float64(next.Version))
	c.log.Info("snapshot published", "snapshot_version", next.Version, "frontends", len(next.Frontends),
		"backends", len(next.Backends), "workloads", len(next.Workloads), "duration", time.Since(start).Round(time.Microsecond))
	return wait
}

// handOver makes a translation the writers' latest, and its failures
// Failures', and wakes the writers.
func (c *ControlPlane) handOver(in translate.Input, res translate.Result) {
	// Failures describes the published Snapshot, as the status does: a
	// translation whose Snapshot cannot be built replaces neither.
	c.failures.Store(&res.Failures)
	c.passes++ // only the loop's goroutine hands over
	c.pending.Store(&pass{seq: c.passes, in: in, res: res})
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// writeLoop hands the latest translation to the writers until ctx ends (the
// end of a leader term), retrying failures with backoff. A new term starts
// by writing the latest translation, whatever an earlier term wrote, with a
// new Gate. While it backs off nothing is written, not even a newer
// translation: errors that may clear and are no object's alone (429, 503,
// timeouts, the network) say the API server is in trouble, and the retry
// writes the latest one. An object the API server refused for good fails
// alone: it is not retried (and holds nothing back) until the next
// translation, whose pass the writers diff anew; else one namespace's full
// quota would hold every status write in the cluster to one a minute. The
// Gate holds back the objects whose failure was theirs alone and the
// resources RBAC refused; when one of its holds ends the loop writes the
// latest translation again, which the writers diff, so that what was held
// back is written though nothing changed.
func (c *ControlPlane) writeLoop(ctx context.Context) {
	g := c.newGate()
	c.gate.Store(g)
	defer c.gate.Store(nil)
	var written uint64 // the seq of the last pass written; passes start at 1
	wait := c.cfg.RetryInterval
	var retry <-chan time.Time // set while backing off
	var held <-chan time.Time  // when the Gate's first hold ends
	for {
		if p := c.pending.Load(); retry == nil && p != nil && p.seq != written {
			start := time.Now()
			var errs []error
			for _, w := range c.cfg.Writers {
				// Each object's write is contained by the Gate; this
				// contains the writer's own code around them.
				if err := contain(func() error { return w.Write(ctx, p.in, p.res, g) }); err != nil {
					errs = append(errs, err)
				}
			}
			if ctx.Err() != nil {
				return
			}
			g.endPass(start)
			if err := c.dropRefusals(errors.Join(errs...)); err != nil {
				c.m.writeErrors.WithLabelValues("all").Inc()
				c.log.Warn("write failed; will retry", append([]any{"err", err, "retry_in", wait}, stackAttrs(err)...)...)
				retry = time.After(wait)
				wait = min(wait*2, time.Minute)
			} else {
				written, wait = p.seq, c.cfg.RetryInterval
			}
			held = nil
			if next := g.next(); !next.IsZero() {
				held = time.After(time.Until(next))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-retry:
			retry = nil
		case <-held:
			held, written = nil, 0
		}
	}
}

// dropRefusals logs and counts the errors err joins that are refusals of
// one object, and returns the others joined: what the pass must retry.
func (c *ControlPlane) dropRefusals(err error) error {
	var retry []error
	for _, e := range leaves(err) {
		reason := refusal(e)
		if reason == "" {
			retry = append(retry, e)
			continue
		}
		c.m.writeRefusals.WithLabelValues(reason).Inc()
		c.log.Warn("write refused; tried again at the next translation", "reason", reason, "err", e)
	}
	return errors.Join(retry...)
}

// mergeNode joins the configured node facts with the observed ones.
func mergeNode(cfg, seen translate.Node) translate.Node {
	n := cfg
	if n.Name == "" {
		n.Name = seen.Name
	}
	if n.Zone == "" {
		n.Zone = seen.Zone
	}
	n.IPs = union(cfg.IPs, seen.IPs)
	n.PodCIDRs = union(cfg.PodCIDRs, seen.PodCIDRs)
	n.ServiceCIDRs = union(cfg.ServiceCIDRs, seen.ServiceCIDRs)
	return n
}

func union[T comparable](a, b []T) []T {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// externalHostnames lists the hostnames of ExternalHostname XBackends.
func externalHostnames(xbs []*gwxv1alpha1.XBackend) []string {
	var hosts []string
	for _, xb := range xbs {
		if xb.Spec.Type == gwxv1alpha1.BackendTypeExternalHostname && xb.Spec.ExternalHostname != nil &&
			xb.Spec.ExternalHostname.Hostname != "" {
			hosts = append(hosts, string(xb.Spec.ExternalHostname.Hostname))
		}
	}
	slices.Sort(hosts)
	return slices.Compact(hosts)
}

// translateSafely runs translate and turns a panic into an error:
// translate contains a panic while judging one object to that object
// (Result.Failures), but one outside any object's judgement must cost one
// rebuild, not the node's agent.
func (c *ControlPlane) translateSafely(in translate.Input) (res translate.Result, err error) {
	err = contain(func() error {
		var terr error
		res, terr = c.translate(in)
		return terr
	})
	if err != nil {
		return translate.Result{}, fmt.Errorf("translate: %w", err)
	}
	return res, nil
}

// reportFailures logs and counts the objects whose translation panicked
// that did not at the last translation: an object that stays malformed
// fails at every translation (one per endpoint change on a busy
// cluster), and its stack says nothing new. Failures lists them only once
// their Snapshot is published (handOver).
func (c *ControlPlane) reportFailures(failures []translate.Failure) {
	failing := make(map[snapshot.ObjectRef]bool, len(failures))
	for _, f := range failures {
		failing[f.Object] = true
		if c.failing[f.Object] {
			continue
		}
		c.m.objectFailures.WithLabelValues(f.Object.Kind).Inc()
		c.log.Error("translation of an object panicked; it is judged invalid, closed for what it governs",
			"kind", f.Object.Kind, "namespace", f.Object.Namespace, "name", f.Object.Name, "err", f.Panic, "stack", f.Stack)
	}
	c.failing = failing
}

// Failures returns the objects whose translation panicked at the last
// translation that succeeded (Result.Failures): those the published
// Snapshot judges invalid for a bug, not for their data.
func (c *ControlPlane) Failures() []translate.Failure {
	if f := c.failures.Load(); f != nil {
		return *f
	}
	return nil
}
