package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/sockmesh/sockmesh/agent/apply"
	"github.com/sockmesh/sockmesh/agent/cnihandover"
	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/health"
	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
	kubesource "github.com/sockmesh/sockmesh/agent/source/kubernetes"
	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/datapath/podns"
	"github.com/sockmesh/sockmesh/datapath/takeover"
	"github.com/sockmesh/sockmesh/internal/gcfloor"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

const agentLong = `agent runs sockmesh on this node: it loads and attaches the eBPF socket
programs (or adopts the ones a previous agent pinned), runs the proxy they
redirect to, watches the config source, and keeps the datapath, the proxy
and the pods' enrolments in line with every Snapshot the control plane
publishes.

Logs (structured, on stderr): "listening" once per listener, with
listener=proxy|health|metrics|introspection and addr= the bound address
(useful with port 0); "agent ready" when /readyz first turns ready;
"snapshot applied" per Snapshot; "pod enrolled" per pod; "stopped" last,
or "stopped while starting" when the agent stopped before it served.

/readyz is ready when this agent's programs run on their hooks (not after
` + "`sockmesh uninstall`" + `, nor once a newer agent took the node over), the first
Snapshot is applied everywhere, the node-ip listeners serve, and the
datapath heartbeat is fresh.

Signals: SIGTERM or SIGINT stops accepting, stops the heartbeat (fail-open
Services go direct once it is stale), drains connections for up to
--drain-timeout and exits, leaving capture pinned for the next agent
(fail-closed Services refuse connections meanwhile, unless the next agent
already runs); a second one exits at once. With --handover-wait (the
DaemonSet's 10s), the agent first serves on, as before the signal, until a
newer agent answers ready on the health address (a deleted pod's
replacement starting), capture is removed from the node (` + "`sockmesh uninstall`" + `)
or the wait is over: where no agent follows (the DaemonSet deleted), its
pod takes that much longer to stop. Meanwhile the writer lease is
released (with --leader-elect): a hung API server holds that for at most
10 s, and the drain does not wait for it. A signal that comes while the
agent starts (before its first Snapshot is served: the datapath opening,
the API server's discovery, the first listing) stops it as cleanly, with
status 0.

Two agents may run on a node at once, as a rolling update with maxSurge
runs them: every TCP listener is shared (SO_REUSEPORT), the newer agent
takes the datapath over when it starts (the older one then leaves the maps
to it and logs so, and takes them back if the newer one exits first), and
takes each address over (an eBPF program steers
the address's new connections to it) once it can serve there: health,
metrics and introspection at once, the proxy's once its first Snapshot is
applied. Connections waiting in a closing listener's queue move to the
newer agent's instead of being reset. An agent that cannot take the health
address over fails its start (the kubelet restarts it; the older agent
serves on). Until the newer agent has taken the health address, the older
one answers there: the DaemonSet's startup probe
is therefore "sockmesh probe", run in the agent's container, which takes
only its own agent's answer (each names its container in a
Sockmesh-Container header).

SIGUSR1 logs an introspection report (snapshot, enrolments, datapath
counters and conflicts, recent warnings) as one "introspection report"
record. The read-only introspection API that sockmeshctl reads (status,
report, explain, snapshot, counters, metrics and their catalog: /v1/...)
is served on --introspection-socket
(root and the agent's user; --introspection-group adds a group) and, with
--introspection-listen, over TLS with a bearer token.

The proxy needs GODEBUG=http2xconnect=1 (WebSocket over HTTP/2, RFC 8441)
and schedtrace=2147483647 (keeps the runtime's sysmon from a deep sleep
whose wakeups cost the proxy 14 % of its CPU with a connection per request)
when the process starts; the agent re-executes itself with those whose key
GODEBUG does not mention.`

func newAgentCommand(getenv func(string) string) *cobra.Command {
	var o options
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "run the node agent: eBPF capture, the proxy and the control plane",
		Long:  agentLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := reexecWithRuntimeSettings(); err != nil {
				return err
			}
			// From here on SIGTERM and SIGINT stop the agent cleanly,
			// however far its start got (runAgent): left to their default
			// action, they ended it as killed.
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			go func() {
				<-ctx.Done()
				stop() // a second signal ends the process at once
			}()
			// The agent's network namespace is the node's (hostNetwork):
			// its addresses are the node's.
			self, err := podns.Open("/proc/self/ns/net")
			if err != nil {
				return err
			}
			defer self.Close()
			s, err := o.load(cmd.Flags(), getenv, self)
			if err != nil {
				return err
			}
			events := introspect.NewEvents(0)
			log := newLogger(os.Stderr, s, events)
			// client-go logs through klog; send it to the same place.
			klog.SetSlogLogger(log)
			logSettings(log, s)
			setMemoryLimit(s, getenv, log)
			defer gcfloor.Start(s.gcHeapFloor)()
			return runAgent(ctx, s, self, log, events)
		},
	}
	o.addFlags(cmd.Flags(), getenv)
	return cmd
}

// logSettings logs the effective configuration once, at start: what the
// flags, the --config file and the environment made of it, so that a
// platform team reads from the log which node, mode and addresses an agent
// runs with (the listeners' bound addresses follow, one "listening" each).
// Durations as strings: the JSON handler would write nanoseconds.
func logSettings(log *slog.Logger, s settings) {
	attrs := []any{"version", buildVersion(), "source", s.source, "node", s.nodeName,
		"proxy_mode", string(s.mode), "bpffs", s.bpffs, "cgroup", s.cgroup, "accelerate", s.accelerate,
		"drain_timeout", s.drainTimeout.String(), "handover_wait", s.handoverWait.String(), "stall_timeout", s.stallTimeout.String(), "max_conns_per_pod", s.maxConnsPerPod,
		"pool_pod_share", strconv.FormatFloat(s.poolPodShare*100, 'g', -1, 64) + "%",
		"service_cidrs", s.node.ServiceCIDRs, "pod_cidrs", s.node.PodCIDRs, "node_cidrs", s.node.NodeCIDRs,
		"egress_allow", s.node.EgressAllow}
	if s.mode == enrol.NodeIP {
		attrs = append(attrs, "proxy_listen", s.proxyListen)
	} else {
		attrs = append(attrs, "in_pod_port", s.inPodPort)
	}
	switch s.source {
	case "file":
		attrs = append(attrs, "manifests", s.manifests)
	case "kubernetes":
		attrs = append(attrs, "leader_elect", s.leaderElect)
		if s.leaderElect {
			attrs = append(attrs, "leader_election_namespace", s.leaderNS)
		}
	}
	log.Info("starting", attrs...)
}

// setMemoryLimit applies --memory-limit unless $GOMEMLIMIT chose a limit
// already. The runtime then collects more often only as its memory nears
// the limit: below it, garbage collection runs as without one. It is a
// guard against the OOM killer, not a way to make the agent smaller: a
// limit below what the agent keeps alive makes it collect continuously.
func setMemoryLimit(s settings, getenv func(string) string, log *slog.Logger) {
	if s.softMemoryLimit <= 0 {
		return
	}
	if getenv("GOMEMLIMIT") != "" {
		log.Info("memory limit left to GOMEMLIMIT", "gomemlimit", getenv("GOMEMLIMIT"))
		return
	}
	debug.SetMemoryLimit(s.softMemoryLimit)
	log.Info("memory limit set", "soft_limit_bytes", s.softMemoryLimit)
}

func newLogger(w io.Writer, s settings, events *introspect.Events) *slog.Logger {
	opts := &slog.HandlerOptions{Level: s.logLevel}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if s.logJSON {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(events.Handler(h))
}

// agent is one run of the agent: its parts and what shutdown must undo.
type agent struct {
	s      settings
	log    *slog.Logger
	self   *podns.NS           // the agent's network namespace, the node's (hostNetwork)
	reg    *introspect.Catalog // the metrics registry, which remembers what is registered
	checks *health.Checks
	cp     *controlplane.ControlPlane
	dp     *datapath.Datapath
	px     *proxy.Proxy
	en     *enrol.Enroller
	ap     *apply.Applier
	cni    *cnihandover.Server
	cniLn  *net.UnixListener
	// cniChained is the last outcome of chaining sockmesh-cni (cni.go).
	cniChained error
	nodeLns    []net.Listener
	started    atomic.Bool // start built every part
	serving    atomic.Bool // the first Snapshot is applied and the node listeners served
	stopping   atomic.Bool // shutdown began
	report     *introspect.Sources
	intro      *httpapi.Server
	container  string // this agent's container (containerID)
	health     string // host:port of this node's agents' /readyz (healthAddr)
}

// runAgent runs the agent until ctx ends (a signal) or a part fails, then
// shuts down as the command's help describes.
func runAgent(ctx context.Context, s settings, self *podns.NS, log *slog.Logger, events *introspect.Events) error {
	a := &agent{s: s, self: self, log: log, reg: introspect.NewCatalog()}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "sockmesh_build_info",
		Help:        "Always 1; the labels name the agent's build.",
		ConstLabels: prometheus.Labels{"version": buildVersion(), "goversion": runtime.Version()},
	})
	buildInfo.Set(1)
	for _, c := range []prometheus.Collector{buildInfo, collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := a.reg.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	var err error
	if a.checks, err = health.New(a.reg); err != nil {
		return err
	}
	a.addChecks()
	// The health answers name this agent's container, which the startup
	// probe (sockmesh probe) checks: the agent a rolling update replaces
	// answers on the same port until this one has taken it.
	if a.container, err = containerID(); err != nil {
		return err
	}
	// Health and metrics first: liveness answers while the programs load.
	servers, err := startHTTP(s, namingContainer(a.container, a.checks.Handler()), a.reg, log)
	if err != nil {
		return err
	}
	defer servers.close()
	a.health = servers.healthAddr()

	err = a.start(ctx, events)
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		// The signal came while the agent started: a stop asked for, not a
		// failure, whichever step it cut short. What start opened closes
		// as on any stop (capture stays pinned).
		a.close()
		log.Info(msgStoppedStarting, "reason", context.Cause(ctx).Error(), "note", captureNote)
		return nil
	}
	if err != nil {
		a.close()
		return err
	}
	return a.run(ctx)
}

// The agent's last record: msgStoppedStarting when it stopped before it
// served (its first Snapshot applied, its node listeners serving), as a
// signal during its start makes it; msgStopped otherwise.
const (
	msgStopped         = "stopped"
	msgStoppedStarting = "stopped while starting"
	captureNote        = "capture stays pinned for the next agent; `sockmesh uninstall` removes it"
)

// start opens the datapath, the proxy and its node listeners, and builds the
// control plane, the enroller and the applier. It opens nothing once ctx
// has ended (a signal came).
func (a *agent) start(ctx context.Context, events *introspect.Events) error {
	s, log := a.s, a.log
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	var err error
	a.dp, err = datapath.Open(datapath.Config{BPFFS: s.bpffs, Cgroup: s.cgroup, Accelerate: s.accelerate}, log, a.reg)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return fmt.Errorf("%w\n(pinned by an incompatible build: run `sockmesh uninstall --bpffs=%s` first)", err, s.bpffs)
	}
	if err != nil {
		return err
	}
	pxCfg := proxy.Config{MaxConnsPerClient: s.maxConnsPerPod, StallTimeout: s.stallTimeout, OrigDst: a.dp.OrigDst}
	pxCfg.Upstream.ClientShare = s.poolPodShare
	if a.px, err = proxy.New(pxCfg, log, a.reg); err != nil {
		return err
	}
	var nodeProxy datapath.Proxy
	if s.mode == enrol.NodeIP {
		if nodeProxy, err = a.listenNode(ctx); err != nil {
			return err
		}
	}
	var kinds func() []kubesource.KindStatus
	if a.cp, kinds, err = newControlPlane(ctx, s, a.self, log, a.reg); err != nil {
		return err
	}
	a.en, err = enrol.New(enrol.Config{Mode: s.mode, NodeProxy: nodeProxy, PodPort: s.inPodPort, Handovers: s.cni.records(),
		ListenConfig: proxy.ListenConfig()}, a.dp, a.px, log, a.reg)
	if err != nil {
		return err
	}
	if a.ap, err = apply.New(apply.Config{}, a.cp, a.px, a.dp, a.en, log, a.reg); err != nil {
		return err
	}
	if err := a.startCNI(); err != nil {
		return err
	}

	a.report = &introspect.Sources{
		Node: s.nodeName, Mode: string(s.mode), Version: buildVersion(),
		Applied: a.ap.Applied, Pods: a.en.Pods, Ready: a.checks.Ready, Datapath: a.dp, Events: events,
		Metrics: a.reg, Kinds: kinds, Writes: a.cp.Writes, Failures: a.cp.Failures,
	}
	if a.intro, err = httpapi.NewServer(s.introspection, a.report, log, a.reg); err != nil {
		return err
	}
	a.started.Store(true)
	return nil
}

// errStarting is every check's answer until start has built the parts.
var errStarting = errors.New("starting")

// addChecks registers the readiness checks. They exist before the health
// server starts, so that /readyz lists (and fails) them while the programs
// load.
func (a *agent) addChecks() {
	check := func(name string, fn func() error) {
		a.checks.Add(name, func() error {
			if !a.started.Load() {
				return errStarting
			}
			return fn()
		})
	}
	a.checks.Add("running", func() error {
		if a.stopping.Load() {
			return errors.New("shutting down")
		}
		return nil
	})
	check("datapath", func() error {
		// Open attached every program, but they may stop running on their
		// hooks: `sockmesh uninstall` detaches the links, a newer agent
		// that took the node over runs its own. This agent then captures
		// nothing.
		st, err := a.dp.State()
		if err != nil {
			return err
		}
		var detached []string
		for _, h := range st.Hooks {
			if !h.Attached {
				detached = append(detached, h.Name)
			}
		}
		if len(detached) > 0 {
			return fmt.Errorf("our programs do not run on %s at %s", strings.Join(detached, ", "), st.Cgroup)
		}
		return nil
	})
	check("snapshot", func() error {
		if snap, _ := a.ap.Applied(); snap == nil {
			return errors.New("no snapshot applied yet")
		}
		return nil
	})
	check("proxy", func() error {
		if a.s.mode == enrol.NodeIP && !a.serving.Load() {
			return errors.New("node listeners not serving yet")
		}
		return nil
	})
	check("heartbeat", func() error {
		last := a.ap.LastHeartbeat()
		switch age := time.Since(last); {
		case last.IsZero():
			return errors.New("datapath heartbeat not written yet")
		case age > datapath.DefaultHeartbeatMaxAge:
			return fmt.Errorf("datapath heartbeat stale for %s", age.Round(time.Millisecond))
		}
		return nil
	})
}

// listenNode binds the node-ip listeners (served only once the first
// Snapshot is applied: until then connections wait in the listen queue
// rather than meet an empty routing table) and returns the enrolments'
// proxy address.
func (a *agent) listenNode(ctx context.Context) (datapath.Proxy, error) {
	cookie, err := a.self.Cookie()
	if err != nil {
		return datapath.Proxy{}, err
	}
	p := datapath.Proxy{NetNSCookie: cookie}
	for _, addr := range a.s.proxyListen {
		// SO_REUSEPORT: the next agent binds here while this one serves.
		ln, err := takeover.Listen(ctx, proxy.ListenConfig(), addr.String())
		if err != nil {
			return datapath.Proxy{}, fmt.Errorf("proxy listener: %w", err)
		}
		a.nodeLns = append(a.nodeLns, ln)
		bound := ln.Addr().(*net.TCPAddr).AddrPort()
		bound = netip.AddrPortFrom(bound.Addr().Unmap(), bound.Port())
		if bound.Addr().Is4() {
			p.V4 = bound
		} else {
			p.V6 = bound
		}
		a.log.Info("listening", "listener", "proxy", "addr", bound.String())
	}
	return p, nil
}

// run runs the parts until ctx ends (a signal: then, with --handover-wait,
// until a newer agent is ready; handOver) or one fails, then shuts down.
func (a *agent) run(ctx context.Context) error {
	runCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	var (
		wg      sync.WaitGroup // the loops, stopped by runCtx
		cpWG    sync.WaitGroup // the control plane, stopped by runCtx
		serveWG sync.WaitGroup // the node listeners, stopped by the proxy's Shutdown
	)
	cpWG.Go(func() {
		if err := a.cp.Run(runCtx); err != nil {
			cancel(err)
		}
	})
	wg.Go(func() { a.en.Run(runCtx) })
	wg.Go(func() { a.ap.Run(runCtx) })
	wg.Go(func() {
		select {
		case <-runCtx.Done():
			return
		case <-a.ap.First():
		}
		for _, ln := range a.nodeLns {
			// New connections come here from now on, not to an agent
			// still draining; its queue moves here when it closes.
			if err := takeover.Take(ln); err != nil {
				a.log.Warn("cannot take the proxy's address over: while agents overlap, connections may wait for the older one's drain",
					"err", err)
			}
			serveWG.Go(func() {
				if err := a.px.Serve(ln); err != nil {
					cancel(err)
				}
			})
		}
		a.serving.Store(true)
		a.waitReady(runCtx)
	})
	wg.Go(func() { a.reportOnSignal(runCtx) })
	serveWG.Go(func() {
		if err := a.serveCNI(); err != nil {
			cancel(err)
		}
	})
	wg.Go(func() { a.keepCNIChained(runCtx) })
	wg.Go(func() {
		if err := a.intro.Serve(runCtx); err != nil {
			cancel(err)
		}
	})

	select {
	case <-ctx.Done():
		a.stopping.Store(true)
		a.handOver(runCtx)
		cancel(context.Cause(ctx))
	case <-runCtx.Done():
	}
	reason := context.Cause(runCtx) // the signal's, or a part's failure
	failure := reason
	if ctx.Err() != nil {
		failure = nil // a signal: a clean stop
	}
	a.stopping.Store(true)
	a.log.Info("shutting down", "drain_timeout", a.s.drainTimeout, "err", failure)
	cancel(nil)
	wg.Wait() // the heartbeat has stopped

	// The drain does not wait for the control plane: while leading, it
	// releases the writer lease as it stops, so that a standby takes over
	// at once, and with the API server down or hung (an outage, a partition:
	// when nodes get drained) that waits for its requests' timeout
	// (leaseRequestTimeout). Waited for before the drain, those seconds
	// would come out of the drain's share of the pod's termination grace
	// period (docs/design.md).
	drainCtx, stop := context.WithTimeout(context.Background(), a.s.drainTimeout)
	defer stop()
	start := time.Now()
	a.log.Info("draining")
	if err := a.px.Shutdown(drainCtx); err != nil {
		a.log.Warn("connections still open after the drain timeout were closed", "err", err)
	}
	drained := time.Since(start)
	cpWG.Wait()
	a.close()
	serveWG.Wait()
	msg := msgStopped
	if !a.serving.Load() {
		msg = msgStoppedStarting
	}
	a.log.Info(msg, "reason", reason.Error(), "drain", drained.Round(time.Millisecond), "note", captureNote)
	return failure
}

// waitReady logs "agent ready" the first time every readiness check passes.
func (a *agent) waitReady(ctx context.Context) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if err := a.checks.Ready(); err == nil {
			snap, _ := a.ap.Applied()
			a.log.Info("agent ready", "snapshot_version", snap.Version, "mode", string(a.s.mode))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reportOnSignal logs the introspection report on each SIGUSR1 until ctx
// ends.
func (a *agent) reportOnSignal(ctx context.Context) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	defer signal.Stop(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			// As JSON, which the text handler would otherwise print with %+v
			// (pointers as addresses): the JSON handler nests it.
			b, err := json.Marshal(a.report.Report())
			if err != nil {
				a.log.Error("introspection report", "err", err)
				continue
			}
			a.log.Info("introspection report", "report", json.RawMessage(b))
		}
	}
}

// close releases what start opened; pinned capture stays.
func (a *agent) close() {
	if a.intro != nil {
		a.intro.Close()
	}
	a.closeCNI()
	for _, ln := range a.nodeLns {
		ln.Close()
	}
	if a.en != nil {
		if err := a.en.Close(); err != nil {
			a.log.Warn("close in-pod listeners failed", "err", err)
		}
	}
	if a.dp != nil {
		if err := a.dp.Close(); err != nil {
			a.log.Warn("close datapath failed", "err", err)
		}
	}
}

// reexecWithRuntimeSettings re-executes the process with the GODEBUG
// settings the proxy needs (proxy.RuntimeSettings) added to those of its
// environment, when some are missing: the runtime and net/http read
// GODEBUG once, at start. It returns only when no re-exec is needed, or
// with the error of a failed one.
func reexecWithRuntimeSettings() error {
	env, changed := withGODEBUG(os.Environ(), proxy.RuntimeSettings)
	if !changed {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("re-exec with GODEBUG settings: %w", err)
	}
	return fmt.Errorf("re-exec with GODEBUG settings: %w", syscall.Exec(exe, os.Args, env))
}

// withGODEBUG returns env with each of settings (key=value) in GODEBUG
// whose key GODEBUG does not mention, and whether it added any: a setting
// the environment gives either way is kept.
func withGODEBUG(env, settings []string) ([]string, bool) {
	out := make([]string, 0, len(env)+1)
	var add []string
	found := false
	for _, kv := range env {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			out = append(out, kv)
			continue
		}
		found = true
		add = missingSettings(v, settings)
		if len(add) == 0 {
			return env, false
		}
		if v != "" {
			v += ","
		}
		out = append(out, "GODEBUG="+v+strings.Join(add, ","))
	}
	if !found {
		out = append(out, "GODEBUG="+strings.Join(settings, ","))
	}
	return out, true
}

// missingSettings returns those of settings whose key godebug (a GODEBUG
// value) does not set.
func missingSettings(godebug string, settings []string) []string {
	set := map[string]bool{}
	for s := range strings.SplitSeq(godebug, ",") {
		k, _, _ := strings.Cut(strings.TrimSpace(s), "=")
		set[k] = true
	}
	var missing []string
	for _, s := range settings {
		if k, _, _ := strings.Cut(s, "="); !set[k] {
			missing = append(missing, s)
		}
	}
	return missing
}
