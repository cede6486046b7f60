package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath"
)

// Config configures an Applier.
type Config struct {
	// HeartbeatInterval is how often the datapath heartbeat is written once
	// the first Snapshot is applied (zero: 1 s, a fifth of the datapath's
	// default HeartbeatMaxAge).
	HeartbeatInterval time.Duration
	// RetryInterval is how long after a failed apply the same Snapshot is
	// tried again (zero: 1 s).
	RetryInterval time.Duration
}

// Publisher is the control plane (*controlplane.ControlPlane).
type Publisher interface {
	// Current returns the published Snapshot and a channel closed when a
	// newer one replaces it.
	Current() (*snapshot.Snapshot, <-chan struct{})
}

// Proxy is the userspace proxy (*proxy.Proxy).
type Proxy interface {
	Update(s *snapshot.Snapshot)
}

// Datapath is the eBPF datapath (*datapath.Datapath).
type Datapath interface {
	Apply(s *snapshot.Snapshot) error
	Heartbeat() error
}

// Enroller maps workloads to enrolments (*enrol.Enroller).
type Enroller interface {
	Update(s *snapshot.Snapshot) error
}

// Applier feeds Snapshots to the data planes. Create it with New and start
// Run.
type Applier struct {
	cfg   Config
	pub   Publisher
	proxy Proxy
	dp    Datapath
	en    Enroller
	log   *slog.Logger
	m     metrics

	// first is closed once the first Snapshot is applied.
	first chan struct{}
	// served is the Snapshot the proxy holds: it covers every frontend the
	// datapath may capture and every pod that may be enrolled. Only Run
	// touches it.
	served *snapshot.Snapshot

	mu        sync.Mutex
	applied   *snapshot.Snapshot
	appliedAt time.Time
	beat      time.Time // last successful heartbeat
}

type metrics struct {
	version        prometheus.Gauge
	failures       *prometheus.CounterVec
	heartbeatFails prometheus.Counter
}

// New returns an Applier. reg may be nil.
func New(cfg Config, pub Publisher, proxy Proxy, dp Datapath, en Enroller, log *slog.Logger, reg prometheus.Registerer) (*Applier, error) {
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = time.Second
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = time.Second
	}
	a := &Applier{
		cfg: cfg, pub: pub, proxy: proxy, dp: dp, en: en, log: log.With("component", "apply"),
		first: make(chan struct{}), served: snapshot.Empty(),
		m: metrics{
			version: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "sockmesh_apply_snapshot_version",
				Help: "Version of the Snapshot the proxy, datapath and enrolments all serve (0 before the first).",
			}),
			failures: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "sockmesh_apply_failures_total",
				Help: "Failed attempts to apply a Snapshot, by data plane (datapath, enrol); each is retried (Services the datapath's full map left out: with the next Snapshot).",
			}, []string{"target"}),
			heartbeatFails: prometheus.NewCounter(prometheus.CounterOpts{
				Name: "sockmesh_apply_heartbeat_failures_total",
				Help: "Failed writes of the datapath heartbeat.",
			}),
		},
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{a.m.version, a.m.failures, a.m.heartbeatFails} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register apply metrics: %w", err)
			}
		}
	}
	return a, nil
}

// Run applies each new Snapshot until ctx ends, and writes the heartbeat
// from the first successful apply until it returns.
func (a *Applier) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { a.heartbeat(ctx) })

	var (
		applied, failed *snapshot.Snapshot
		retry           <-chan time.Time
	)
	for {
		s, updated := a.pub.Current()
		if s.Version > 0 && s != applied && s != failed {
			if err := a.apply(s); err != nil {
				a.log.Warn("apply snapshot failed; will retry", "snapshot_version", s.Version, "err", err,
					"retry_in", a.cfg.RetryInterval)
				failed, retry = s, time.After(a.cfg.RetryInterval)
			} else {
				if applied == nil {
					close(a.first)
				}
				applied, failed, retry = s, nil, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-updated:
		case <-retry:
			failed = nil
		}
	}
}

// apply hands s to every data plane; see the package documentation for
// the order.
func (a *Applier) apply(s *snapshot.Snapshot) error {
	c, err := cover(a.served, s)
	if err != nil {
		return err
	}
	a.proxy.Update(c)
	a.served = c
	var errs []error
	switch err := a.dp.Apply(s); {
	case errors.Is(err, datapath.ErrServicesLeftOut):
		// The map holds what fits of s, each Service whole, and nothing
		// else: s is applied short of those, which the next Snapshot tries
		// again. Retrying s would fail as surely, and failing would keep
		// an agent that starts on such a cluster from ever serving.
		a.m.failures.WithLabelValues("datapath").Inc()
		a.log.Warn("services left out of the datapath", "snapshot_version", s.Version, "err", err)
	case err != nil:
		a.m.failures.WithLabelValues("datapath").Inc()
		errs = append(errs, fmt.Errorf("datapath: %w", err))
	}
	if err := a.en.Update(s); err != nil {
		a.m.failures.WithLabelValues("enrol").Inc()
		errs = append(errs, fmt.Errorf("enrol: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		// The proxy keeps the cover: a failed step may have left some of
		// what s drops in place.
		return err
	}
	if c != s {
		a.proxy.Update(s)
		a.served = s
	}
	a.mu.Lock()
	a.applied, a.appliedAt = s, time.Now()
	a.mu.Unlock()
	a.m.version.Set(float64(s.Version))
	a.log.Info("snapshot applied", "snapshot_version", s.Version, "frontends", len(s.Frontends),
		"workloads", len(s.Workloads))
	return nil
}

// heartbeat writes the heartbeat every HeartbeatInterval from the first
// apply until ctx ends.
func (a *Applier) heartbeat(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-a.first:
	}
	t := time.NewTicker(a.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		err := a.dp.Heartbeat()
		// A failed owner check comes after the write: fail-open services
		// still see a live proxy, and the next beat checks again.
		written := err == nil || errors.Is(err, datapath.ErrOwnerCheck)
		if written {
			a.mu.Lock()
			a.beat = time.Now()
			a.mu.Unlock()
		}
		switch {
		case !written:
			a.m.heartbeatFails.Inc()
			a.log.Warn("datapath heartbeat failed", "err", err)
		case err != nil:
			a.log.Warn("datapath owner check failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// First is closed once the first Snapshot is applied everywhere.
func (a *Applier) First() <-chan struct{} { return a.first }

// Applied returns the Snapshot every data plane serves and when it was
// applied; nil before the first.
func (a *Applier) Applied() (*snapshot.Snapshot, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.applied, a.appliedAt
}

// LastHeartbeat returns when the heartbeat was last written (zero before
// the first).
func (a *Applier) LastHeartbeat() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.beat
}
