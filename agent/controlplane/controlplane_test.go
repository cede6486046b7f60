package controlplane

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// noResync is a Resync longer than any test's fake clock runs, for the
// tests that count the translations signals and judgements by the time
// bring: their writers, unlike status's, write every translation handed.
const noResync = 1000 * time.Hour

// memSource is a config source held in memory: the smallest thing that
// satisfies source.Source, so that the loop's own behaviour can be tested
// on a fake clock.
type memSource struct {
	mu      sync.Mutex
	in      translate.Input
	changed chan struct{}
}

func newMemSource(in translate.Input) *memSource {
	return &memSource{in: in, changed: make(chan struct{}, 1)}
}

func (s *memSource) Run(ctx context.Context) error {
	s.signal()
	<-ctx.Done()
	return nil
}

func (s *memSource) Changed() <-chan struct{} { return s.changed }

func (s *memSource) Input() translate.Input {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.in
}

func (s *memSource) set(in translate.Input) {
	s.mu.Lock()
	s.in = in
	s.mu.Unlock()
	s.signal()
}

func (s *memSource) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// h2cService is a Service that translate captures on its own (appProtocol
// kubernetes.io/h2c), so the tests need no policy.
func h2cService(name, ip string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.ServiceSpec{
			ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "grpc", Port: 8080, Protocol: corev1.ProtocolTCP, AppProtocol: ptr("kubernetes.io/h2c")}},
		},
	}
}

func ptr[T any](v T) *T { return &v }

func run(t *testing.T, c *ControlPlane) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// TestVersions: the first translation is version 1; an unchanged result
// publishes nothing; a change publishes the next version and wakes
// subscribers.
func TestVersions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
		c, err := New(Config{}, src, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		s0, updated := c.Current()
		if s0.Version != 0 {
			t.Fatalf("before Run: version %d, want 0", s0.Version)
		}
		run(t, c)
		<-updated
		s1, updated := c.Current()
		if s1.Version != 1 {
			t.Fatalf("first snapshot version %d, want 1", s1.Version)
		}
		if _, ok := s1.Frontend(netip.MustParseAddrPort("10.96.0.10:8080")); !ok {
			t.Errorf("first snapshot lacks the h2c Service: %+v", s1.Frontends)
		}

		src.set(src.Input()) // same objects
		synctest.Wait()
		if s, _ := c.Current(); s != s1 {
			t.Errorf("an unchanged translation published version %d", s.Version)
		}
		select {
		case <-updated:
			t.Error("subscribers woken for an unchanged translation")
		default:
		}

		in := src.Input()
		in.Services = append(in.Services, h2cService("b", "10.96.0.11"))
		src.set(in)
		<-updated
		if s, _ := c.Current(); s.Version != 2 || len(s.Frontends) != 2 {
			t.Errorf("after a change: version %d with %d frontends, want 2 and 2", s.Version, len(s.Frontends))
		}
	})
}

// TestFirstSnapshotEmpty: a source with nothing to capture still gets a
// first Snapshot (version 1): the data planes never apply version 0, so an
// agent on a node without pods would otherwise never become ready.
func TestFirstSnapshotEmpty(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := New(Config{}, newMemSource(translate.Input{}), slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, updated := c.Current()
		run(t, c)
		<-updated
		if s, _ := c.Current(); s.Version != 1 || len(s.Frontends) != 0 {
			t.Errorf("first snapshot of an empty source: version %d with %d frontends, want 1 and 0", s.Version, len(s.Frontends))
		}
	})
}

// flakyWriter writes one object through the Gate; it fails its first n
// writes with err (nil: the API server unavailable) and records when each
// came.
type flakyWriter struct {
	mu    sync.Mutex
	fail  int
	err   error
	calls []time.Time
	last  translate.Result // the last translation it was given
}

func (w *flakyWriter) Write(ctx context.Context, _ translate.Input, res translate.Result, g *Gate) error {
	return g.Do(ctx, Object{Verb: "patch", Resource: "things", Namespace: "ns", Name: "a"}, func(context.Context) error {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.calls = append(w.calls, time.Now())
		w.last = res
		if len(w.calls) <= w.fail {
			return cmp.Or(w.err, errors.New("api server unavailable"))
		}
		return nil
	})
}

func (w *flakyWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.calls)
}

// runFlaky runs a control plane on one captured Service whose writer fails
// its first fail writes, retrying after a second.
func runFlaky(t *testing.T, fail int) (*memSource, *flakyWriter) {
	src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
	w := &flakyWriter{fail: fail}
	c, err := New(Config{Writers: []Writer{w}, RetryInterval: time.Second}, src, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	return src, w
}

// TestWriteRetries: a failed write is retried after RetryInterval, then
// twice that; once it succeeds the same translation is not written again.
func TestWriteRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		_, w := runFlaky(t, 2)
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := w.count(); n != 3 {
			t.Fatalf("writes = %d, want 3 (two failures, one success)", n)
		}
		if d1, d2 := w.calls[1].Sub(w.calls[0]), w.calls[2].Sub(w.calls[1]); !w.calls[0].Equal(start) || d1 != time.Second || d2 != 2*time.Second {
			t.Errorf("write times %v after start, then +%v, +%v; want 0, +1s, +2s", w.calls[0].Sub(start), d1, d2)
		}
	})
}

// TestNoWriteWhileBackingOff: a translation that arrives while a failed
// write backs off waits for the retry, which writes it.
func TestNoWriteWhileBackingOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src, w := runFlaky(t, 1)
		synctest.Wait()
		src.set(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10"), h2cService("b", "10.96.0.11")}})
		synctest.Wait()
		if n := w.count(); n != 1 {
			t.Fatalf("writes before the retry = %d, want 1 (the failed one)", n)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := w.count(); n != 2 {
			t.Fatalf("writes = %d, want 2 (the retry writes the newer translation once)", n)
		}
		if got := len(w.last.Frontends); got != 2 {
			t.Errorf("the retry wrote %d frontends, want the newer translation's 2", got)
		}
	})
}

// termLeader leads only while a test holds a term open.
type termLeader struct {
	terms chan context.Context
}

func (l *termLeader) Run(ctx context.Context, lead func(context.Context)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case term := <-l.terms:
			lead(term)
		}
	}
}

// TestWritersOnlyWhileLeading: nothing is written before this agent leads;
// a new term writes the latest translation; after the term ends, changes
// are not written.
func TestWritersOnlyWhileLeading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
		w := &flakyWriter{}
		l := &termLeader{terms: make(chan context.Context)}
		c, err := New(Config{Writers: []Writer{w}, Leader: l}, src, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		run(t, c)
		synctest.Wait()
		if n := w.count(); n != 0 {
			t.Fatalf("%d writes before leading", n)
		}
		term, end := context.WithCancel(t.Context())
		l.terms <- term
		synctest.Wait()
		if n := w.count(); n != 1 {
			t.Fatalf("%d writes at the start of a term, want 1", n)
		}
		end()
		synctest.Wait()
		in := src.Input()
		in.Services = append(in.Services, h2cService("b", "10.96.0.11"))
		src.set(in)
		synctest.Wait()
		if n := w.count(); n != 1 {
			t.Errorf("%d writes after the term ended, want still 1", n)
		}
	})
}

func TestMergeNode(t *testing.T) {
	cfg := translate.Node{
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		PodCIDRs:     []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		EgressAllow:  []string{"*.example.com"},
	}
	seen := translate.Node{
		Name:     "node-1",
		Zone:     "zone-a",
		IPs:      []netip.Addr{netip.MustParseAddr("192.0.2.7")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00::/64")},
	}
	n := mergeNode(cfg, seen)
	if n.Name != "node-1" || n.Zone != "zone-a" || len(n.IPs) != 1 || len(n.PodCIDRs) != 2 || len(n.ServiceCIDRs) != 1 || len(n.EgressAllow) != 1 {
		t.Errorf("mergeNode = %+v", n)
	}
}

// logged keeps the warnings and errors a test's ControlPlane logs, as
// introspect.Events does for the agent; this package's tests cannot import
// introspect, which reports the ControlPlane's Writes.
type logged struct {
	mu      sync.Mutex
	records []loggedRecord
}

type loggedRecord struct {
	Level, Message string
	Attrs          map[string]string
}

func (l *logged) Enabled(_ context.Context, level slog.Level) bool { return level >= slog.LevelWarn }

func (l *logged) Handle(_ context.Context, r slog.Record) error {
	e := loggedRecord{Level: r.Level.String(), Message: r.Message, Attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		e.Attrs[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, e)
	return nil
}

// WithAttrs drops the logger's own attributes (its component): the tests
// look at each record's.
func (l *logged) WithAttrs([]slog.Attr) slog.Handler { return l }

func (l *logged) WithGroup(string) slog.Handler { return l }

func (l *logged) recent() []loggedRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.records)
}
