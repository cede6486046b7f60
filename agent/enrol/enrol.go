package enrol

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/datapath/podns"
	"github.com/sockmesh/sockmesh/datapath/takeover"
)

// Mode is where the proxy listens for enrolled pods.
type Mode string

const (
	// NodeIP: one listener in the agent's network namespace, on a node
	// address every pod can reach (Config.NodeProxy).
	NodeIP Mode = "node-ip"
	// InPod: listeners inside each pod's network namespace, on loopback.
	InPod Mode = "in-pod"
)

// DefaultPodPort is the in-pod listeners' port when Config.PodPort is 0.
const DefaultPodPort = 15001

// Config configures an Enroller.
type Config struct {
	// Mode is where the proxy listens; zero means NodeIP.
	Mode Mode
	// NodeProxy is where NodeIP mode sends every enrolled pod's
	// connections: the cookie of the namespace holding the node listeners
	// and their addresses. Required in NodeIP mode, ignored in InPod.
	NodeProxy datapath.Proxy
	// PodPort is the port of in-pod listeners (zero: DefaultPodPort).
	PodPort uint16
	// ListenConfig makes in-pod listeners (nil: a zero net.ListenConfig),
	// with SO_REUSEPORT added.
	ListenConfig *net.ListenConfig
	// Retry is how soon pods whose namespace was not found, or failed, are
	// looked at again, and a failed write of the enrolment map is tried
	// again (zero: 1 s). While some stay unfound the wait
	// doubles, up to 16 times Retry, since each look scans every namespace
	// on the node; a new Snapshot starts over.
	Retry time.Duration
	// Verify is how often the namespaces found are checked to still hold
	// their pod's address (zero: 30 s).
	Verify time.Duration
	// Handovers is the directory where Adopt records each pod it adopted,
	// a file a sandbox, until the Snapshot confirms the pod or no longer
	// holds it, and where the Enroller takes over those other agents
	// recorded (see restore): an agent that replaces another (a rolling
	// update, a restart) keeps the pods the other adopted enrolled while
	// the API server has no address for them. Empty: no records.
	Handovers string
}

// Enrolments receives the enrolment map (*datapath.Datapath).
type Enrolments interface {
	SetEnrolments(want map[uint64]datapath.Proxy) error
}

// Server serves the in-pod listeners (*proxy.Proxy).
type Server interface {
	// ServePod serves a listener every connection of which comes from pod
	// (or the node: hostNetworkClient).
	ServePod(l net.Listener, pod snapshot.ObjectRef) error
	// Serve serves a listener whose clients are found by their address: a
	// namespace several pods are enrolled in.
	Serve(l net.Listener) error
}

// State is where a pod's enrolment stands.
type State string

const (
	// Enrolled: its namespace was found and its enrolment written.
	Enrolled State = "Enrolled"
	// Pending: no namespace holds the pod's address (yet).
	Pending State = "Pending"
	// Failed: the namespace cannot be used (its address is held by several
	// namespaces, or the in-pod listener cannot be opened); retried.
	Failed State = "Failed"
)

// Pod is the Enroller's view of one workload the Snapshot enrols.
type Pod struct {
	Pod   snapshot.ObjectRef `json:"pod"`
	IPs   []netip.Addr       `json:"ips,omitempty"`
	State State              `json:"state"`
	// Reason says why a pod is Pending or Failed.
	Reason string `json:"reason,omitempty"`
	// Since is when State last changed.
	Since time.Time `json:"since"`
	// NetNS is the path the namespace was found at, NetNSCookie its cookie
	// (the datapath's key) and Proxy where its connections go.
	NetNS       string         `json:"netns,omitempty"`
	NetNSCookie uint64         `json:"netnsCookie,omitempty"`
	Proxy       datapath.Proxy `json:"proxy,omitzero"`
}

// Enroller keeps the datapath's enrolments in line with the Snapshot's
// workloads. Its methods are safe for concurrent use.
type Enroller struct {
	cfg Config
	log *slog.Logger
	dp  Enrolments
	srv Server
	m   metrics

	mu      sync.Mutex
	updated bool // Update ran at least once
	closed  bool
	want    []snapshot.Workload
	// listed is the last Snapshot's workloads, enrolled or not, by pod;
	// listedChanged is closed, and replaced, when it changes (Workload).
	listed        map[snapshot.ObjectRef]snapshot.Workload
	listedChanged chan struct{}
	pods          map[podKey]*pod
	netns         map[uint64]*netnsState // by namespace inode
	// lastVerify is when the found namespaces were last checked.
	lastVerify time.Time
	// retryWait is the current wait between retries, nextRetry when the
	// next is due.
	retryWait time.Duration
	nextRetry time.Time
	// unwritten is set while the last write of the enrolment map failed:
	// the pods it enrols are Enrolled here, not in the datapath.
	unwritten bool
	// records are when each sandbox's record in Config.Handovers was
	// written, as the last reconcile read them (restore).
	records map[string]time.Time
}

type podKey struct {
	ref snapshot.ObjectRef
	uid string
}

type pod struct {
	w      snapshot.Workload
	ino    uint64 // namespace inode while Enrolled
	state  State
	reason string
	since  time.Time
	// handedOver is set while the pod is enrolled in the namespace the CNI
	// plugin handed over (Adopt), or looked for by the addresses it was
	// handed over with (restore), and the Snapshot has not confirmed it yet
	// (see keepHandedOver).
	handedOver bool
	// sandbox is the ID of the sandbox it was handed over from, and
	// recorded set while Config.Handovers holds a record of it.
	sandbox  string
	recorded bool
	// carried is the enrolment another agent recorded for the pod, written
	// until find enrolled the pod here (see restore).
	carried *enrolment
}

// netnsState is one namespace in use, shared by the pods in it.
type netnsState struct {
	ns     *podns.NS
	cookie uint64
	proxy  datapath.Proxy
	lns    []net.Listener
	// pod is the pod the listeners name as every connection's client (nil:
	// the proxy finds the client by its address); see listenerPod.
	pod *snapshot.ObjectRef
	// broken is set when an in-pod listener stopped serving on its own.
	broken bool
}

type metrics struct {
	pods  *prometheus.GaugeVec
	scans prometheus.Counter
}

// New returns an Enroller; nothing is written until the first Update. reg
// may be nil.
func New(cfg Config, dp Enrolments, srv Server, log *slog.Logger, reg prometheus.Registerer) (*Enroller, error) {
	if cfg.Mode == "" {
		cfg.Mode = NodeIP
	}
	switch cfg.Mode {
	case NodeIP:
		if cfg.NodeProxy.NetNSCookie == 0 || (!cfg.NodeProxy.V4.IsValid() && !cfg.NodeProxy.V6.IsValid()) {
			return nil, errors.New("enrol: node-ip mode needs the node proxy's netns cookie and address")
		}
	case InPod:
		if srv == nil {
			return nil, errors.New("enrol: in-pod mode needs a server for its listeners")
		}
	default:
		return nil, fmt.Errorf("enrol: unknown proxy mode %q", cfg.Mode)
	}
	if cfg.PodPort == 0 {
		cfg.PodPort = DefaultPodPort
	}
	// Shared with the agent that may still run beside this one (a rolling
	// update), which open takes over.
	cfg.ListenConfig = takeover.ListenConfig(cfg.ListenConfig)
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if cfg.Verify <= 0 {
		cfg.Verify = 30 * time.Second
	}
	e := &Enroller{
		cfg: cfg, log: log.With("component", "enrol"), dp: dp, srv: srv,
		pods:          make(map[podKey]*pod),
		netns:         make(map[uint64]*netnsState),
		listedChanged: make(chan struct{}),
		m: metrics{
			pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: "sockmesh_enrol_pods",
				Help: "Pods the Snapshot enrols on this node, by state (Enrolled, Pending: no network namespace found yet, Failed).",
			}, []string{"state"}),
			scans: prometheus.NewCounter(prometheus.CounterOpts{
				Name: "sockmesh_enrol_netns_scans_total",
				Help: "Scans of the node's network namespaces for pods not enrolled yet.",
			}),
		},
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{e.m.pods, e.m.scans} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register enrol metrics: %w", err)
			}
		}
	}
	return e, nil
}

// Update makes s's enrolled workloads the ones to enrol and reconciles at
// once. The error is about writing the enrolment map; pods that cannot be
// enrolled yet are in Pods, and retried.
func (e *Enroller) Update(s *snapshot.Snapshot) error {
	var want []snapshot.Workload
	for _, w := range s.Workloads {
		if w.Enrolled && len(w.IPs) > 0 {
			want = append(want, w)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	e.want, e.updated = want, true
	e.list(s.Workloads)
	e.retryWait, e.nextRetry = 0, time.Time{}
	err := e.reconcile(false)
	e.scheduleRetry()
	return err
}

// scheduleRetry sets when unsettled pods are looked at next. Called with
// e.mu held, after a reconcile.
func (e *Enroller) scheduleRetry() {
	if !e.unsettled() {
		e.retryWait = 0
		return
	}
	e.retryWait = min(max(2*e.retryWait, e.cfg.Retry), 16*e.cfg.Retry)
	e.nextRetry = time.Now().Add(e.retryWait)
}

// Run retries pods not enrolled and verifies enrolled ones until ctx ends.
func (e *Enroller) Run(ctx context.Context) error {
	t := time.NewTicker(e.cfg.Retry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		e.mu.Lock()
		if e.updated && !e.closed {
			verify := time.Since(e.lastVerify) >= e.cfg.Verify
			if verify || e.unsettled() && !time.Now().Before(e.nextRetry) {
				if err := e.reconcile(verify); err != nil {
					e.log.Warn("write enrolments failed", "err", err)
				}
				e.scheduleRetry()
			}
		}
		e.mu.Unlock()
	}
}

// Close closes the in-pod listeners and releases the namespaces it holds.
// The enrolments stay in the datapath for the next agent.
func (e *Enroller) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	close(e.listedChanged) // Workload's waiters return ErrClosed
	e.listedChanged = make(chan struct{})
	var errs []error
	for ino, n := range e.netns {
		errs = append(errs, n.close())
		delete(e.netns, ino)
	}
	return errors.Join(errs...)
}

// Pods lists the workloads the Snapshot enrols and where each stands,
// sorted by namespace and name.
func (e *Enroller) Pods() []Pod {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Pod, 0, len(e.pods))
	for _, p := range e.pods {
		v := Pod{Pod: p.w.Pod, IPs: p.w.IPs, State: p.state, Reason: p.reason, Since: p.since}
		if n, ok := e.netns[p.ino]; ok && p.state == Enrolled {
			v.NetNS, v.NetNSCookie, v.Proxy = n.ns.Path(), n.cookie, n.proxy
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b Pod) int {
		return cmp.Or(cmp.Compare(a.Pod.Namespace, b.Pod.Namespace), cmp.Compare(a.Pod.Name, b.Pod.Name))
	})
	return out
}

// unsettled reports whether some pod or namespace, or the enrolment map,
// waits for a retry.
func (e *Enroller) unsettled() bool {
	if e.unwritten || e.unfound() {
		return true
	}
	for _, n := range e.netns {
		if n.broken {
			return true
		}
	}
	return false
}

// unfound reports whether some pod waits for its namespace: what a scan
// of the node's namespaces is for.
func (e *Enroller) unfound() bool {
	for _, p := range e.pods {
		if p.state != Enrolled {
			return true
		}
	}
	return false
}

// reconcile brings pods and namespaces in line with e.want and writes the
// enrolment map. Called with e.mu held.
func (e *Enroller) reconcile(verify bool) error {
	now := time.Now()
	e.restore(now)
	want := make(map[podKey]snapshot.Workload, len(e.want))
	for _, w := range e.want {
		want[podKey{w.Pod, w.UID}] = w
	}
	for k, p := range e.pods {
		w, ok := want[k]
		keep := ok && slices.Equal(w.IPs, p.w.IPs)
		if p.handedOver {
			keep = e.keepHandedOver(k, p, w, ok)
		}
		if !keep {
			if p.state == Enrolled {
				e.log.Info("pod unenrolled", "pod", p.w.Pod.String())
			}
			delete(e.pods, k)
		}
		if !keep || !p.handedOver {
			e.forget(p) // the Snapshot confirmed the pod, or it went
		}
	}
	for k, w := range want {
		if p, ok := e.pods[k]; ok {
			if p.handedOver {
				continue // keepHandedOver took w, or kept the pod's own
			}
			if p.state == Enrolled && !w.SandboxReady.Equal(p.w.SandboxReady) {
				// A new sandbox is a new namespace holding the pod's
				// address: look for it now, not at the next verify.
				e.setState(p, Pending, "its sandbox was replaced", now)
				p.ino = 0
			}
			p.w = w
			continue
		}
		e.pods[k] = &pod{w: w, state: Pending, reason: "not looked for yet", since: now}
	}

	if verify {
		e.lastVerify = now
		e.verify(now)
	}
	for ino, n := range e.netns {
		if n.broken {
			// Open it afresh: the pods go back to Pending and find it again.
			e.release(ino, Pending, "in-pod listener stopped", now)
			n.close()
			delete(e.netns, ino)
		}
	}
	// Only pods not enrolled need a scan: a retry after a failed write of
	// the enrolment map, or of a namespace released above (its pods are
	// Pending now), scans only if one does.
	if e.unfound() {
		e.find(now)
	}
	// Namespaces no pod uses any more: close listeners, release the
	// namespace (holding it would keep a deleted pod's namespace alive).
	used := make(map[uint64]bool)
	for _, p := range e.pods {
		if p.state == Enrolled {
			used[p.ino] = true
		}
	}
	for ino, n := range e.netns {
		if !used[ino] {
			if err := n.close(); err != nil {
				e.log.Warn("close pod network namespace failed", "netns", n.ns.Path(), "err", err)
			}
			delete(e.netns, ino)
		}
	}
	if e.cfg.Mode == InPod {
		e.relisten(now)
	}

	enrolments := make(map[uint64]datapath.Proxy)
	counts := map[State]int{Enrolled: 0, Pending: 0, Failed: 0}
	for _, p := range e.pods {
		counts[p.state]++
		switch {
		case p.state == Enrolled:
			n := e.netns[p.ino]
			enrolments[n.cookie] = n.proxy
		case p.carried != nil:
			enrolments[p.carried.NetNSCookie] = p.carried.Proxy
		}
	}
	for s, c := range counts {
		e.m.pods.WithLabelValues(string(s)).Set(float64(c))
	}
	err := e.dp.SetEnrolments(enrolments)
	e.unwritten = err != nil
	if err != nil {
		return fmt.Errorf("write %d enrolments: %w", len(enrolments), err)
	}
	return nil
}

// verify moves pods whose namespace no longer holds their address back to
// Pending: the pod's sandbox was replaced (its old namespace lingers only
// because we hold it).
func (e *Enroller) verify(now time.Time) {
	for ino, n := range e.netns {
		addrs, err := n.ns.Addrs()
		for _, p := range e.pods {
			if p.ino != ino || p.state != Enrolled {
				continue
			}
			if err != nil || !slices.ContainsFunc(p.w.IPs, func(ip netip.Addr) bool { return slices.Contains(addrs, ip) }) {
				e.setState(p, Pending, "its network namespace no longer holds the pod's address", now)
				p.ino = 0
			}
		}
	}
}

// release moves the pods of namespace ino to state s (Pending or Failed).
func (e *Enroller) release(ino uint64, s State, reason string, now time.Time) {
	for _, p := range e.pods {
		if p.ino == ino && p.state == Enrolled {
			e.setState(p, s, reason, now)
			p.ino = 0
		}
	}
}

// find scans the node's namespaces once for every pod not enrolled.
func (e *Enroller) find(now time.Time) {
	e.m.scans.Inc()
	all, err := podns.List()
	if err != nil {
		for _, p := range e.pods {
			if p.state != Enrolled {
				e.setState(p, Failed, err.Error(), now)
			}
		}
		return
	}
	// Which namespaces hold each address. Loopback and link-local
	// addresses are in every namespace and name no pod.
	holders := make(map[netip.Addr][]*podns.NS)
	for _, ns := range all {
		addrs, err := ns.Addrs()
		if err != nil {
			continue // the namespace went away during the scan
		}
		for _, a := range addrs {
			if !a.IsLoopback() && !a.IsLinkLocalUnicast() {
				holders[a] = append(holders[a], ns)
			}
		}
	}
	kept := make(map[*podns.NS]bool)
	for _, p := range e.pods {
		if p.state == Enrolled {
			continue
		}
		ns, state, reason := pick(holders, p.w.IPs)
		if ns == nil {
			e.setState(p, state, reason, now)
			continue
		}
		ino, err := ns.Inode()
		if err != nil {
			e.setState(p, Failed, err.Error(), now)
			continue
		}
		if _, ok := e.netns[ino]; !ok {
			n, err := e.open(ns, listenerPodOf(p))
			if err != nil {
				e.setState(p, Failed, err.Error(), now)
				continue
			}
			e.netns[ino] = n
			kept[ns] = true
		}
		p.ino, p.carried = ino, nil
		e.setState(p, Enrolled, "", now)
		n := e.netns[ino]
		e.log.Info("pod enrolled", "pod", p.w.Pod.String(), "netns", n.ns.Path(), "netns_cookie", n.cookie,
			"proxy_v4", addrString(n.proxy.V4), "proxy_v6", addrString(n.proxy.V6))
	}
	for _, ns := range all {
		if !kept[ns] {
			ns.Close()
		}
	}
}

// pick returns the one namespace holding one of ips (tried in order), or
// why there is none.
func pick(holders map[netip.Addr][]*podns.NS, ips []netip.Addr) (*podns.NS, State, string) {
	var ambiguous []string
	for _, ip := range ips {
		switch hs := holders[ip.Unmap()]; len(hs) {
		case 0:
		case 1:
			return hs[0], Enrolled, ""
		default:
			paths := make([]string, len(hs))
			for i, ns := range hs {
				paths[i] = ns.Path()
			}
			ambiguous = append(ambiguous, fmt.Sprintf("%s is held by %d network namespaces (%v)", ip, len(hs), paths))
		}
	}
	if len(ambiguous) > 0 {
		return nil, Failed, strings.Join(ambiguous, "; ")
	}
	return nil, Pending, "no network namespace holds the pod's address"
}

// open prepares a namespace for enrolment: its cookie and, in in-pod mode,
// its listeners naming pod (see listenerPod). It takes ownership of ns
// only when it succeeds.
func (e *Enroller) open(ns *podns.NS, pod *snapshot.ObjectRef) (*netnsState, error) {
	cookie, err := ns.Cookie()
	if err != nil {
		return nil, err
	}
	n := &netnsState{ns: ns, cookie: cookie, proxy: e.cfg.NodeProxy}
	if e.cfg.Mode != InPod {
		return n, nil
	}
	if err := e.listen(n, pod); err != nil {
		return nil, err
	}
	return n, nil
}

// listen opens n's in-pod listeners, serving their connections as pod's
// (nil: by the client's address; see listenerPod), then closes those n had: the new ones
// took the address over first, so the kernel hands them the connections
// still queued on the old (takeover), and none is refused.
func (e *Enroller) listen(n *netnsState, pod *snapshot.ObjectRef) error {
	addrs, err := n.ns.Addrs()
	if err != nil {
		return err
	}
	var lns []net.Listener
	proxy := datapath.Proxy{NetNSCookie: n.cookie}
	for _, lo := range []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()} {
		if !slices.Contains(addrs, lo) {
			continue
		}
		addr := netip.AddrPortFrom(lo, e.cfg.PodPort)
		ln, err := n.ns.Listen(context.Background(), e.cfg.ListenConfig, "tcp", addr.String())
		if err != nil {
			closeListeners(lns)
			return fmt.Errorf("open in-pod listener: %w", err)
		}
		lns = append(lns, ln)
		// An agent still running (a rolling update) listens here too:
		// new connections come to this one, which serves at once.
		if err := takeover.Take(ln); err != nil {
			e.log.Warn("cannot take the in-pod listener's address over: while agents overlap, the older one keeps its share",
				"netns", n.ns.Path(), "err", err)
		}
		bound := ln.Addr().(*net.TCPAddr).AddrPort()
		if lo.Is4() {
			proxy.V4 = bound
		} else {
			proxy.V6 = bound
		}
	}
	if len(lns) == 0 {
		return errors.New("the pod's network namespace has no loopback address to listen on")
	}
	old := n.lns
	n.lns, n.pod, n.proxy = lns, pod, proxy
	for _, ln := range lns {
		go e.serve(n, ln, pod)
	}
	if err := closeListeners(old); err != nil {
		e.log.Warn("close replaced in-pod listener failed", "netns", n.ns.Path(), "err", err)
	}
	return nil
}

// hostNetworkClient is the client the in-pod listeners of the node's
// network namespace name. Enrolled host-network pods of any namespace
// connect from there beside every host process, and no connection tells
// which made it: as kube-proxy and Istio do, the proxy takes them all for
// the node. One client, whichever family, against --max-conns-per-pod (by
// address, 127.0.0.1 and ::1 counted apart), and of no namespace: only
// the Service's producer routes apply, as to every client GAMMA knows no
// namespace of, never a namespace's consumer routes (GEP-1294). Pods all
// have a namespace, so it is no pod's name.
func hostNetworkClient() snapshot.ObjectRef { return snapshot.ObjectRef{Name: "host-network"} }

// listenerPodOf is the client an in-pod listener opened for p alone names.
func listenerPodOf(p *pod) *snapshot.ObjectRef {
	ref := p.w.Pod
	if p.w.HostNetwork {
		ref = hostNetworkClient()
	}
	return &ref
}

// listenerPod is the client the in-pod listeners of namespace ino must
// name for every connection: hostNetworkClient in the node's namespace
// (a host-network pod is enrolled in it), else its one enrolled pod, or
// nil, for the proxy to find the client by address, when several pods are
// in it. The proxy applies the consumer routes of the named pod's
// namespace, which must never reach another's requests (GEP-1294).
func (e *Enroller) listenerPod(ino uint64) *snapshot.ObjectRef {
	var (
		one     *snapshot.ObjectRef
		several bool
	)
	for _, p := range e.pods {
		if p.state != Enrolled || p.ino != ino {
			continue
		}
		if p.w.HostNetwork {
			return listenerPodOf(p)
		}
		several = several || one != nil && *one != p.w.Pod
		one = listenerPodOf(p)
	}
	if several {
		return nil
	}
	return one
}

// relisten reopens the in-pod listeners of every namespace whose pods
// changed since they were opened: a namespace the Snapshot had enrolled
// for a deleted pod (while a new one took its address) stays open for the
// pod now in it, and must no longer name the old one.
func (e *Enroller) relisten(now time.Time) {
	for ino, n := range e.netns {
		pod := e.listenerPod(ino)
		if pod == n.pod || pod != nil && n.pod != nil && *pod == *n.pod {
			continue
		}
		if err := e.listen(n, pod); err != nil {
			e.release(ino, Failed, err.Error(), now)
			if err := n.close(); err != nil {
				e.log.Warn("close pod network namespace failed", "netns", n.ns.Path(), "err", err)
			}
			delete(e.netns, ino)
		}
	}
}

// serve runs the proxy on an in-pod listener; if the listener fails on its
// own, the namespace is marked broken and the next retry opens it again.
func (e *Enroller) serve(n *netnsState, ln net.Listener, pod *snapshot.ObjectRef) {
	var err error
	if pod == nil {
		err = e.srv.Serve(ln)
	} else {
		err = e.srv.ServePod(ln, *pod)
	}
	if err == nil || errors.Is(err, net.ErrClosed) {
		return
	}
	e.log.Error("in-pod listener failed", "netns", n.ns.Path(), "addr", ln.Addr().String(), "err", err)
	e.mu.Lock()
	n.broken = true
	e.mu.Unlock()
}

func (e *Enroller) setState(p *pod, s State, reason string, now time.Time) {
	if p.state == s && p.reason == reason {
		return
	}
	if s == Failed || (s == Pending && p.state == Enrolled) {
		e.log.Warn("pod not enrolled", "pod", p.w.Pod.String(), "state", string(s), "reason", reason)
	} else if s == Pending {
		e.log.Debug("pod not enrolled yet", "pod", p.w.Pod.String(), "reason", reason)
	}
	p.state, p.reason, p.since = s, reason, now
}

func closeListeners(lns []net.Listener) error {
	var errs []error
	for _, ln := range lns {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (n *netnsState) close() error {
	lns := n.lns
	n.lns = nil
	return errors.Join(closeListeners(lns), n.ns.Close())
}

func addrString(ap netip.AddrPort) string {
	if !ap.IsValid() {
		return ""
	}
	return ap.String()
}
