package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures an Elector.
type Config struct {
	// Namespace holds the Lease. Required (the agent's own namespace).
	Namespace string
	// Name is the Lease's name (zero: "sockmesh-writer").
	Name string
	// Identity names this agent in the Lease; it must differ between
	// agents (e.g. node name and pod UID). Required.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's
	// (zero: 15 s, 10 s, 2 s). A new leader takes over at most
	// LeaseDuration after the old one stopped renewing; one that shut down
	// cleanly releases the lease at once.
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// Elector campaigns for the Lease.
type Elector struct {
	cfg     Config
	kube    k8s.Interface
	log     *slog.Logger
	leading atomic.Bool
	isLead  prometheus.Gauge
	terms   prometheus.Counter
}

// New returns an Elector for the Lease cfg names.
func New(cfg Config, kube k8s.Interface, log *slog.Logger, reg prometheus.Registerer) (*Elector, error) {
	if cfg.Namespace == "" || cfg.Identity == "" {
		return nil, errors.New("leader election: namespace and identity are required")
	}
	if cfg.Name == "" {
		cfg.Name = "sockmesh-writer"
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = 15 * time.Second
	}
	if cfg.RenewDeadline <= 0 {
		cfg.RenewDeadline = 10 * time.Second
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = 2 * time.Second
	}
	e := &Elector{
		cfg:  cfg,
		kube: kube,
		log:  log.With("component", "leader", "lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity),
		isLead: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sockmesh_leader_is_leader",
			Help: "1 while this agent holds the writer lease, else 0.",
		}),
		terms: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sockmesh_leader_terms_total",
			Help: "Times this agent won the writer lease.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{e.isLead, e.terms} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register leader metrics: %w", err)
			}
		}
	}
	return e, nil
}

// Leading reports whether this agent holds the lease now.
func (e *Elector) Leading() bool { return e.leading.Load() }

// Run campaigns until ctx ends. Each time it wins it calls lead with a
// context that ends when the lease is lost or ctx ends, and waits for lead
// to return before campaigning again. When ctx ends it releases the lease,
// so a standby takes over without waiting for it to expire; with the API
// server down or hung the release gives up after RenewDeadline (client-go's
// bound), or sooner when kube's requests time out sooner (the agent's do:
// cmd/sockmesh leaseClient), and Run returns.
func (e *Elector) Run(ctx context.Context, lead func(context.Context)) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.cfg.Namespace, Name: e.cfg.Name},
		Client:     e.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.cfg.Identity},
	}
	for ctx.Err() == nil {
		// client-go starts OnStartedLeading in a goroutine of its own;
		// handing the term's context over lets lead run here, so that
		// two terms' work never overlaps.
		terms := make(chan context.Context, 1)
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   e.cfg.LeaseDuration,
			RenewDeadline:   e.cfg.RenewDeadline,
			RetryPeriod:     e.cfg.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            e.cfg.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(term context.Context) { terms <- term },
				OnStoppedLeading: func() {},
				OnNewLeader: func(identity string) {
					e.log.Info("leader observed", "leader", identity)
				},
			},
		})
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			le.Run(ctx)
		}()
		select {
		case term := <-terms:
			e.terms.Inc()
			e.setLeading(true)
			e.log.Info("leading")
			lead(term)
			<-term.Done()
			e.setLeading(false)
			e.log.Info("stopped leading")
		case <-done:
		}
		<-done
	}
	return nil
}

func (e *Elector) setLeading(v bool) {
	e.leading.Store(v)
	if v {
		e.isLead.Set(1)
	} else {
		e.isLead.Set(0)
	}
}
