package apply

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath"
)

// planes fakes the control plane and the three data planes, recording
// every call in order. At every call it checks the invariant the order
// keeps: the proxy's current Snapshot has a frontend for every address
// the datapath may redirect and names the pod of every client that may be
// enrolled, as the proxy's lookups (Frontend, Workload) find them.
type planes struct {
	mu       sync.Mutex
	current  *snapshot.Snapshot
	updated  chan struct{}
	calls    []string
	beats    int
	dpErrors int   // Apply fails this many more times
	leftOut  bool  // Apply leaves the last frontend out (a full map)
	beatErr  error // what Heartbeat returns

	proxied  []*snapshot.Snapshot // every Snapshot the proxy got, in order
	captured map[netip.AddrPort]snapshot.ObjectRef
	enrolled map[netip.Addr]snapshot.ObjectRef
	gaps     []string // what the proxy lacked, and when
}

func newPlanes() *planes {
	return &planes{current: snapshot.Empty(), updated: make(chan struct{}),
		captured: map[netip.AddrPort]snapshot.ObjectRef{}, enrolled: map[netip.Addr]snapshot.ObjectRef{}}
}

func (p *planes) publish(version uint64) {
	s, err := snapshot.New(version, nil, nil, nil)
	if err != nil {
		panic(err)
	}
	p.publishSnapshot(s)
}

func (p *planes) publishSnapshot(s *snapshot.Snapshot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.current = s
	close(p.updated)
	p.updated = make(chan struct{})
}

func (p *planes) Current() (*snapshot.Snapshot, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.current, p.updated
}

// record notes a call and checks the invariant as it stands after it.
func (p *planes) record(what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, what)
	if len(p.proxied) == 0 {
		return
	}
	s := p.proxied[len(p.proxied)-1]
	for ap, svc := range p.captured {
		if _, ok := s.Frontend(ap); !ok {
			p.gaps = append(p.gaps, fmt.Sprintf("after %q: the datapath redirects %s (%s), the proxy's snapshot %d has no frontend for it",
				what, ap, svc, s.Version))
		}
	}
	for ip, pod := range p.enrolled {
		if w, ok := s.Workload(ip); !ok || w.Pod != pod {
			p.gaps = append(p.gaps, fmt.Sprintf("after %q: %s (%s) is enrolled, the proxy's snapshot %d does not name it",
				what, ip, pod, s.Version))
		}
	}
}

type proxyFake struct{ *planes }

func (f proxyFake) Update(s *snapshot.Snapshot) {
	f.mu.Lock()
	f.proxied = append(f.proxied, s)
	f.mu.Unlock()
	f.record(fmt.Sprintf("proxy %d", s.Version))
}

type datapathFake struct{ *planes }

func (f datapathFake) Apply(s *snapshot.Snapshot) error {
	f.mu.Lock()
	fail := f.dpErrors > 0
	if fail {
		f.dpErrors--
	} else {
		clear(f.captured)
	}
	// A failed apply may have added s's services before it stopped.
	fes, leftOut := s.Frontends, f.leftOut && len(s.Frontends) > 0
	if leftOut {
		fes = fes[:len(fes)-1]
	}
	for _, fe := range fes {
		for _, a := range fe.Addresses {
			f.captured[netip.AddrPortFrom(a, fe.Port)] = fe.Service
		}
	}
	f.mu.Unlock()
	if fail {
		f.record(fmt.Sprintf("datapath %d failed", s.Version))
		return errors.New("map full")
	}
	if leftOut {
		f.record(fmt.Sprintf("datapath %d left out", s.Version))
		return fmt.Errorf("services map full: %w", datapath.ErrServicesLeftOut)
	}
	f.record(fmt.Sprintf("datapath %d", s.Version))
	return nil
}

func (f datapathFake) Heartbeat() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.beats++
	return f.beatErr
}

type enrolFake struct{ *planes }

func (f enrolFake) Update(s *snapshot.Snapshot) error {
	f.mu.Lock()
	clear(f.enrolled)
	for _, w := range s.Workloads {
		for _, ip := range w.IPs {
			// Addresses shared by enrolled pods name none (snapshot.New).
			if named, ok := s.Workload(ip); ok && w.Enrolled {
				f.enrolled[ip] = named.Pod
			}
		}
	}
	f.mu.Unlock()
	f.record(fmt.Sprintf("enrol %d", s.Version))
	return nil
}

func (p *planes) snapshot() ([]string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls), p.beats
}

// start runs an Applier over p until the test's bubble ends.
func start(t *testing.T, p *planes, reg prometheus.Registerer) (*Applier, context.CancelFunc) {
	t.Helper()
	a, err := New(Config{HeartbeatInterval: time.Second, RetryInterval: 2 * time.Second},
		p, proxyFake{p}, datapathFake{p}, enrolFake{p}, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return a, cancel
}

func TestEmptySnapshotIsNeverApplied(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlanes()
		a, _ := start(t, p, nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		calls, beats := p.snapshot()
		if len(calls) != 0 || beats != 0 {
			t.Errorf("before the first snapshot: calls %q, %d heartbeats; want none (pinned capture stays as it is)", calls, beats)
		}
		if s, _ := a.Applied(); s != nil {
			t.Errorf("Applied() = version %d before any snapshot", s.Version)
		}
		select {
		case <-a.First():
			t.Error("First() closed before any snapshot")
		default:
		}
	})
}

func TestOrderAndHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlanes()
		a, cancel := start(t, p, nil)
		p.publish(1)
		synctest.Wait()
		<-a.First()
		p.publish(2)
		synctest.Wait()
		calls, beats := p.snapshot()
		want := []string{"proxy 1", "datapath 1", "enrol 1", "proxy 2", "datapath 2", "enrol 2"}
		if !slices.Equal(calls, want) {
			t.Errorf("calls = %q, want %q: proxy first, then datapath, then enrolments", calls, want)
		}
		if beats != 1 {
			t.Errorf("%d heartbeats right after the first apply, want 1", beats)
		}
		if s, at := a.Applied(); s == nil || s.Version != 2 || !at.Equal(time.Now()) {
			t.Errorf("Applied() = %v at %v, want version 2 now", s, at)
		}
		time.Sleep(3*time.Second + time.Millisecond)
		synctest.Wait()
		if _, beats = p.snapshot(); beats != 4 {
			t.Errorf("%d heartbeats after 3 intervals, want 4", beats)
		}
		if !a.LastHeartbeat().Equal(time.Now().Add(-time.Millisecond)) {
			t.Errorf("LastHeartbeat() = %v, want the last tick", a.LastHeartbeat())
		}
		// Run returns: the heartbeat stops, so fail-open services go direct.
		cancel()
		time.Sleep(time.Minute)
		synctest.Wait()
		if _, after := p.snapshot(); after != 4 {
			t.Errorf("%d heartbeats after Run returned, want still 4", after)
		}
	})
}

// TestHeartbeatErrors: a heartbeat the datapath wrote before its owner
// check failed (ErrOwnerCheck) is a heartbeat: LastHeartbeat moves and no
// failure is counted; any other error is a failed heartbeat.
func TestHeartbeatErrors(t *testing.T) {
	for _, c := range []struct {
		name       string
		err        error
		wantBeat   bool
		wantFailed float64
	}{
		{"owner check failed", fmt.Errorf("heartbeat written: %w: take the datapath back: open cgroup: no such file or directory", datapath.ErrOwnerCheck), true, 0},
		{"write failed", errors.New("heartbeat: bad file descriptor"), false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := newPlanes()
				p.beatErr = c.err
				a, _ := start(t, p, nil)
				p.publish(1)
				synctest.Wait()
				if got := !a.LastHeartbeat().IsZero(); got != c.wantBeat {
					t.Errorf("LastHeartbeat() = %v after Heartbeat returned %q; want it set: %v", a.LastHeartbeat(), c.err, c.wantBeat)
				}
				if got := value(t, a.m.heartbeatFails); got != c.wantFailed {
					t.Errorf("sockmesh_apply_heartbeat_failures_total = %v, want %v", got, c.wantFailed)
				}
			})
		})
	}
}

func TestRetryAfterFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlanes()
		p.dpErrors = 2
		reg := prometheus.NewRegistry()
		a, _ := start(t, p, reg)
		p.publish(1)
		synctest.Wait()
		if s, _ := a.Applied(); s != nil {
			t.Fatalf("Applied() = version %d after a failed apply", s.Version)
		}
		// A newer snapshot is applied at once, without waiting for the retry.
		p.publish(2)
		synctest.Wait()
		time.Sleep(2*time.Second - time.Millisecond)
		synctest.Wait()
		calls, beats := p.snapshot()
		want := []string{"proxy 1", "datapath 1 failed", "enrol 1", "proxy 2", "datapath 2 failed", "enrol 2"}
		if !slices.Equal(calls, want) || beats != 0 {
			t.Errorf("before the retry: calls %q, %d heartbeats; want %q and none", calls, beats, want)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		calls, _ = p.snapshot()
		want = append(want, "proxy 2", "datapath 2", "enrol 2")
		if !slices.Equal(calls, want) {
			t.Errorf("after the retry: calls %q, want %q", calls, want)
		}
		if s, _ := a.Applied(); s == nil || s.Version != 2 {
			t.Errorf("Applied() = %v, want version 2", s)
		}
		if got := value(t, a.m.failures.WithLabelValues("datapath")); got != 2 {
			t.Errorf("sockmesh_apply_failures_total{target=datapath} = %v, want 2", got)
		}
		if got := value(t, a.m.version); got != 2 {
			t.Errorf("sockmesh_apply_snapshot_version = %v, want 2", got)
		}
	})
}

// TestServicesLeftOutApply: a Snapshot whose Services do not all fit in
// the datapath's map is applied with the others (the map holds them whole
// and nothing else): counted as a datapath failure, but the agent serves
// it and beats, and retries only with the next Snapshot. Failing it kept
// an agent that started on such a cluster from ever serving (First) or
// writing the heartbeat, and retried it every RetryInterval in vain.
func TestServicesLeftOutApply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlanes()
		p.leftOut = true
		reg := prometheus.NewRegistry()
		a, _ := start(t, p, reg)
		p.publishSnapshot(build(t, 1, []svc{web, db}, nil))
		synctest.Wait()
		select {
		case <-a.First():
		default:
			t.Fatal("First() not closed after a snapshot applied with Services left out")
		}
		time.Sleep(5 * time.Second) // past two RetryIntervals
		synctest.Wait()
		calls, beats := p.snapshot()
		if want := []string{"proxy 1", "datapath 1 left out", "enrol 1"}; !slices.Equal(calls, want) || beats == 0 {
			t.Errorf("calls %q, %d heartbeats; want %q once and heartbeats", calls, beats, want)
		}
		if s, _ := a.Applied(); s == nil || s.Version != 1 {
			t.Errorf("Applied() = %v, want version 1", s)
		}
		if got := value(t, a.m.failures.WithLabelValues("datapath")); got != 1 {
			t.Errorf("sockmesh_apply_failures_total{target=datapath} = %v, want 1", got)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, g := range p.gaps {
			t.Error(g)
		}
	})
}

// svc is a captured Service port 80 of namespace app.
type svc struct {
	name, vip string
	tls       bool // its backend's wire is TLS (a BackendTLSPolicy)
}

// pod is a pod of namespace app on the node.
type pod struct {
	name, ip string
	enrolled bool
	uid      string // zero: name + "-uid"
}

func build(t *testing.T, version uint64, svcs []svc, pods []pod) *snapshot.Snapshot {
	t.Helper()
	var (
		fes []snapshot.Frontend
		bes []snapshot.Backend
		ws  []snapshot.Workload
	)
	for _, sv := range svcs {
		ref := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "app", Name: sv.name, Port: 80}
		fes = append(fes, snapshot.Frontend{Service: snapshot.ObjectRef{Namespace: "app", Name: sv.name}, Port: 80,
			Addresses: []netip.Addr{netip.MustParseAddr(sv.vip)}, FailurePolicy: snapshot.FailClosed, Backend: ref})
		b := snapshot.Backend{Ref: ref}
		if sv.tls {
			b.TLS = &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: sv.name + ".example", SystemRoots: true}
		}
		bes = append(bes, b)
	}
	for _, pd := range pods {
		uid := cmp.Or(pd.uid, pd.name+"-uid")
		ws = append(ws, snapshot.Workload{Pod: snapshot.ObjectRef{Namespace: "app", Name: pd.name}, UID: uid,
			IPs: []netip.Addr{netip.MustParseAddr(pd.ip)}, Enrolled: pd.enrolled})
	}
	s, err := snapshot.New(version, fes, bes, ws)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var (
	web    = svc{name: "web", vip: "10.96.0.1"}
	webTLS = svc{name: "web", vip: "10.96.0.1", tls: true}
	db     = svc{name: "db", vip: "10.96.0.2"}
	api    = svc{name: "api", vip: "10.96.0.3"}
	client = pod{name: "client", ip: "10.0.0.5", enrolled: true}
	batch  = pod{name: "batch", ip: "10.0.0.6", enrolled: true}
)

// TestDroppedStaysServedUntilUncaptured: a Service deleted (db) and a pod
// no longer enrolled (batch) stay in the proxy's snapshot until the
// datapath and the enrolments have dropped them, so a connection
// redirected in between finds its frontend and its client's pod; a
// Service that changed (web gains TLS) or is new (api) is served as the
// new snapshot says from the first step.
func TestDroppedStaysServedUntilUncaptured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlanes()
		reg := prometheus.NewRegistry()
		a, _ := start(t, p, reg)
		p.publishSnapshot(build(t, 1, []svc{web, db}, []pod{client, batch}))
		synctest.Wait()
		s2 := build(t, 2, []svc{webTLS, api}, []pod{client, {name: "batch", ip: "10.0.0.6"}})
		p.publishSnapshot(s2)
		synctest.Wait()

		p.mu.Lock()
		defer p.mu.Unlock()
		for _, g := range p.gaps {
			t.Error(g)
		}
		want := []string{"proxy 1", "datapath 1", "enrol 1", "proxy 1", "datapath 2", "enrol 2", "proxy 2"}
		if !slices.Equal(p.calls, want) {
			t.Fatalf("calls = %q, want %q: the proxy gets a cover first and snapshot 2 last", p.calls, want)
		}
		cover := p.proxied[1]
		if fe, ok := cover.Frontend(netip.MustParseAddrPort("10.96.0.2:80")); !ok || fe.Service.Name != "db" {
			t.Errorf("cover: Frontend(db) = %v, %v; want app/db, as snapshot 1 had it", fe, ok)
		}
		if fe, ok := cover.Frontend(netip.MustParseAddrPort("10.96.0.1:80")); !ok {
			t.Error("cover: no frontend for web")
		} else if b, _ := cover.Backend(fe.Backend); b == nil || b.TLS == nil {
			t.Errorf("cover: web's backend %v, want snapshot 2's, with TLS", b)
		}
		if _, ok := cover.Frontend(netip.MustParseAddrPort("10.96.0.3:80")); !ok {
			t.Error("cover: no frontend for api, new in snapshot 2")
		}
		if w, ok := cover.Workload(netip.MustParseAddr("10.0.0.6")); !ok || w.Pod.Name != "batch" {
			t.Errorf("cover: Workload(10.0.0.6) = %v, %v; want app/batch, still enrolled", w, ok)
		}
		if p.proxied[2] != s2 {
			t.Errorf("the proxy ends with snapshot %d, want snapshot 2 itself", p.proxied[2].Version)
		}
		if s, _ := a.Applied(); s != s2 {
			t.Errorf("Applied() = %v, want snapshot 2", s)
		}
		if got := value(t, a.m.version); got != 2 {
			t.Errorf("sockmesh_apply_snapshot_version = %v, want 2", got)
		}
	})
}

// TestCoverAfterFailedDatapath: after a failed datapath step the proxy
// keeps the cover, since the datapath may still capture what the snapshot
// drops, and the next snapshot's cover keeps that too.
func TestCoverAfterFailedDatapath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlanes()
		a, _ := start(t, p, nil)
		p.publishSnapshot(build(t, 1, []svc{web, db}, []pod{client}))
		synctest.Wait()
		p.mu.Lock()
		p.dpErrors = 1
		p.mu.Unlock()
		p.publishSnapshot(build(t, 2, []svc{web}, []pod{client}))
		synctest.Wait()
		s3 := build(t, 3, []svc{api}, []pod{client})
		p.publishSnapshot(s3)
		synctest.Wait()

		p.mu.Lock()
		defer p.mu.Unlock()
		for _, g := range p.gaps {
			t.Error(g)
		}
		want := []string{"proxy 1", "datapath 1", "enrol 1", "proxy 1", "datapath 2 failed", "enrol 2",
			"proxy 1", "datapath 3", "enrol 3", "proxy 3"}
		if !slices.Equal(p.calls, want) {
			t.Fatalf("calls = %q, want %q", p.calls, want)
		}
		for _, ap := range []string{"10.96.0.1:80", "10.96.0.2:80", "10.96.0.3:80"} {
			if _, ok := p.proxied[2].Frontend(netip.MustParseAddrPort(ap)); !ok {
				t.Errorf("cover for snapshot 3 after a failed datapath step: no frontend for %s", ap)
			}
		}
		if s, _ := a.Applied(); s != s3 || p.proxied[3] != s3 {
			t.Errorf("Applied() = %v, proxy ends with %v; want snapshot 3 for both", s, p.proxied[3])
		}
	})
}

// value reads a counter's or gauge's current value.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	if c := out.GetCounter(); c != nil {
		return c.GetValue()
	}
	return out.GetGauge().GetValue()
}
