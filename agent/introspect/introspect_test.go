package introspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/explain"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/datapath"
)

func TestEventsKeepTheNewest(t *testing.T) {
	ev := NewEvents(3)
	for i := range 5 {
		ev.Add(Event{Message: fmt.Sprint(i)})
	}
	got, total := ev.Recent()
	var msgs []string
	for _, e := range got {
		msgs = append(msgs, e.Message)
	}
	if want := []string{"2", "3", "4"}; !slices.Equal(msgs, want) || total != 5 {
		t.Errorf("Recent() = %q, %d; want %q, 5", msgs, total, want)
	}
}

func TestHandlerKeepsWarningsAndErrors(t *testing.T) {
	var out strings.Builder
	ev := NewEvents(0)
	// The log itself shows errors only; the events still keep warnings.
	log := slog.New(ev.Handler(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelError})))
	dp := log.With("component", "datapath", "pin_dir", "/sys/fs/bpf/sockmesh")
	dp.Info("datapath ready")
	dp.Warn("other program attached", "hook", "connect4")
	dp.WithGroup("link").Error("update failed", "id", 7, slog.Group("why", "err", errors.New("EPERM")))

	got, total := ev.Recent()
	want := []Event{
		{Level: "WARN", Component: "datapath", Message: "other program attached",
			Attrs: map[string]string{"pin_dir": "/sys/fs/bpf/sockmesh", "hook": "connect4"}},
		{Level: "ERROR", Component: "datapath", Message: "update failed",
			Attrs: map[string]string{"pin_dir": "/sys/fs/bpf/sockmesh", "link.id": "7", "link.why.err": "EPERM"}},
	}
	if total != 2 || len(got) != 2 {
		t.Fatalf("Recent() = %+v (%d), want 2 events", got, total)
	}
	for i := range want {
		g := got[i]
		if g.Level != want[i].Level || g.Component != want[i].Component || g.Message != want[i].Message ||
			!maps.Equal(g.Attrs, want[i].Attrs) || g.Time.IsZero() {
			t.Errorf("event %d = %+v, want %+v", i, g, want[i])
		}
	}
	if s := out.String(); strings.Contains(s, "datapath ready") || strings.Contains(s, "other program") || !strings.Contains(s, "update failed") {
		t.Errorf("the log handler got %q; want only the error: the tee must not change what is logged", s)
	}
	if !log.Handler().Enabled(context.Background(), slog.LevelWarn) || log.Handler().Enabled(context.Background(), slog.LevelInfo) {
		t.Error("Enabled: want warnings on (for the events), info off (as the log says)")
	}
}

// fakeDatapath stands for a datapath whose maps fail to read on demand
// (a map iteration aborted by concurrent updates), which a real one does
// not do when asked. err fails Conflicts, servicesErr Services.
type fakeDatapath struct{ err, servicesErr error }

func (f fakeDatapath) Services() ([]datapath.Service, error) {
	if f.servicesErr != nil {
		return nil, f.servicesErr
	}
	return []datapath.Service{{Addr: netip.MustParseAddrPort("10.96.0.10:443")}}, nil
}
func (f fakeDatapath) Enrolments() (map[uint64]datapath.Proxy, error) {
	return map[uint64]datapath.Proxy{7: {NetNSCookie: 1, V4: netip.MustParseAddrPort("10.0.0.1:15001")}}, nil
}
func (f fakeDatapath) Counters() (map[datapath.Decision]uint64, error) {
	return map[datapath.Decision]uint64{datapath.Redirected: 3}, nil
}
func (f fakeDatapath) Conflicts() ([]datapath.Attached, error) { return nil, f.err }
func (f fakeDatapath) State() (datapath.State, error) {
	return datapath.State{PinDir: "/sys/fs/bpf/sockmesh", Hooks: []datapath.Hook{{Name: "connect4", ProgramID: 12, Attached: true}}}, nil
}
func (f fakeDatapath) PairCounter(netns uint64, addr netip.AddrPort) (map[datapath.Decision]uint64, error) {
	return map[datapath.Decision]uint64{datapath.Redirected: netns}, nil
}
func (f fakeDatapath) PairCounters() ([]datapath.PairCounters, error) {
	return []datapath.PairCounters{
		{NetNSCookie: 9, Service: netip.MustParseAddrPort("10.96.0.99:80"), Counts: map[datapath.Decision]uint64{datapath.DeniedNoProxy: 1}},
		{NetNSCookie: 1, Service: netip.MustParseAddrPort("10.96.0.11:80"), Counts: map[datapath.Decision]uint64{datapath.Redirected: 4}},
	}, nil
}

func TestReport(t *testing.T) {
	key := "-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n"
	be := snapshot.BackendRef{Kind: snapshot.KindXBackend, Namespace: "a", Name: "partner", Port: 443}
	snap, err := snapshot.New(4, []snapshot.Frontend{{
		Service: snapshot.ObjectRef{Namespace: "a", Name: "partner"}, Port: 80,
		Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.11")}, Backend: be,
	}}, []snapshot.Backend{{Ref: be, TLS: &snapshot.TLS{Mode: snapshot.TLSMutual, ClientCertificatePEM: "cert", ClientKeyPEM: key}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	ev := NewEvents(0)
	ev.Add(Event{Level: "WARN", Message: "x"})
	src := &Sources{
		Node: "n1", Mode: "node-ip", Version: "v1",
		Applied: func() (*snapshot.Snapshot, time.Time) { return snap, at },
		Pods: func() []enrol.Pod {
			return []enrol.Pod{{Pod: snapshot.ObjectRef{Namespace: "a", Name: "c"}, State: enrol.Enrolled}}
		},
		Ready:    func() error { return errors.New("heartbeat: stale") },
		Datapath: fakeDatapath{err: errors.New("query connect4: EPERM")},
		Events:   ev,
	}
	r := src.Report()
	if r.Node != "n1" || r.Ready || r.NotReady != "heartbeat: stale" || !r.AppliedAt.Equal(at) || len(r.Pods) != 1 ||
		len(r.Events) != 1 || r.EventsTotal != 1 {
		t.Errorf("Report() = %+v", r)
	}
	if got := r.Snapshot.Backends[0].TLS; got.ClientKeyPEM != redacted || got.ClientCertificatePEM != "cert" {
		t.Errorf("report TLS = %+v, want the key redacted and the certificate kept", got)
	}
	if snap.Backends[0].TLS.ClientKeyPEM != key {
		t.Error("Report() changed the served snapshot's key")
	}
	if r.Datapath.Counters["redirected"] != 3 || len(r.Datapath.Services) != 1 || len(r.Datapath.Enrolments) != 1 ||
		!slices.Equal(r.Datapath.Errors, []string{"query connect4: EPERM"}) {
		t.Errorf("report datapath = %+v, want the parts read and the failing one named", r.Datapath)
	}
	if empty := (&Sources{}).Report(); empty.Snapshot != nil || empty.Ready || empty.Datapath.Counters != nil {
		t.Errorf("Report() of no sources = %+v, want empty parts", empty)
	}
}

// TestExplainUnreadableDatapath: when the datapath's services map cannot be
// read, explain said the map lacked the Service's address ("this snapshot
// is not applied there yet"), sending the operator after the wrong cause.
func TestExplainUnreadableDatapath(t *testing.T) {
	svc := snapshot.ObjectRef{Namespace: "a", Name: "web"}
	be := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "a", Name: "web", Port: 443}
	snap, err := snapshot.New(2, []snapshot.Frontend{{Service: svc, Port: 443, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Backend: be}},
		[]snapshot.Backend{{Ref: be}}, []snapshot.Workload{{Pod: snapshot.ObjectRef{Namespace: "a", Name: "c"}, Enrolled: true}})
	if err != nil {
		t.Fatal(err)
	}
	src := &Sources{Node: "n1",
		Applied: func() (*snapshot.Snapshot, time.Time) { return snap, time.Time{} },
		Pods: func() []enrol.Pod {
			return []enrol.Pod{{Pod: snapshot.ObjectRef{Namespace: "a", Name: "c"}, State: enrol.Enrolled, NetNSCookie: 7}}
		},
		Datapath: fakeDatapath{servicesErr: errors.New("list services: iteration aborted")},
	}
	e := src.Explain(explain.Query{Pod: snapshot.ObjectRef{Namespace: "a", Name: "c"}, Service: &svc, Port: 443})
	notes := strings.Join(e.Notes, "\n")
	if !strings.Contains(notes, "services map cannot be read (list services: iteration aborted)") || strings.Contains(notes, "lacks") ||
		len(e.Capture.Addrs) != 1 || !e.Capture.Addrs[0].Unread {
		t.Errorf("Explain() with the services map unreadable: capture %+v, notes %q; want the read error, not that the map lacks the address", e.Capture, e.Notes)
	}
}

// TestStatusListsNeverNull: a Status's hooks and maps are JSON lists, empty
// where there is no datapath or it read none, never null, which jq's
// .datapath.state.hooks[] fails on.
func TestStatusListsNeverNull(t *testing.T) {
	for _, c := range []struct {
		name                string
		src                 *Sources
		wantHooks, wantMaps int
	}{
		{"no datapath", &Sources{Node: "n1"}, 0, 0},
		{"no maps read", &Sources{Node: "n1", Datapath: fakeDatapath{}}, 1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := json.Marshal(c.src.Status())
			if err != nil {
				t.Fatal(err)
			}
			var st struct {
				Datapath struct {
					State map[string]json.RawMessage
				}
			}
			if err := json.Unmarshal(b, &st); err != nil {
				t.Fatal(err)
			}
			for key, want := range map[string]int{"hooks": c.wantHooks, "maps": c.wantMaps} {
				var list []json.RawMessage
				raw := st.Datapath.State[key]
				if err := json.Unmarshal(raw, &list); err != nil || list == nil || len(list) != want {
					t.Errorf("status datapath.state.%s = %s, want a list of %d", key, raw, want)
				}
			}
		})
	}
}

// TestTranslateFailuresShown: the objects whose translation panicked were
// in the agent's log and a metric only. Status lists them, and Explain
// names the one whose Services include the destination (a failed route
// is missing from the Snapshot, so the explanation alone could not say
// why it does not apply), not the others.
func TestTranslateFailuresShown(t *testing.T) {
	web, other := snapshot.ObjectRef{Namespace: "a", Name: "web"}, snapshot.ObjectRef{Namespace: "a", Name: "other"}
	failures := []translate.Failure{
		{Object: snapshot.ObjectRef{Kind: "HTTPRoute", Namespace: "a", Name: "split"}, Panic: "assignment to entry in nil map", Stack: "goroutine 1", Services: []snapshot.ObjectRef{web}},
		{Object: snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: "a", Name: "tls"}, Panic: "index out of range", Stack: "goroutine 1", Services: []snapshot.ObjectRef{other}},
	}
	pod := snapshot.ObjectRef{Namespace: "a", Name: "c"}
	snap, err := snapshot.New(1, nil, nil, []snapshot.Workload{{Pod: pod, Enrolled: true}})
	if err != nil {
		t.Fatal(err)
	}
	src := &Sources{Node: "n1", Failures: func() []translate.Failure { return failures },
		Applied: func() (*snapshot.Snapshot, time.Time) { return snap, time.Time{} }}
	if got := src.Status().TranslateFailures; !reflect.DeepEqual(got, failures) {
		t.Errorf("Status().TranslateFailures = %+v, want %+v", got, failures)
	}
	e := src.Explain(explain.Query{Pod: pod, Service: &web, Port: 80})
	notes := strings.Join(e.Notes, "\n")
	if !strings.Contains(notes, "HTTPRoute a/split panicked (internal error: assignment to entry in nil map)") || strings.Contains(notes, "a/tls") {
		t.Errorf("Explain(a/web) notes %q, want HTTPRoute a/split's failure named, not BackendTLSPolicy a/tls's", e.Notes)
	}
	if none := (&Sources{Node: "n1"}).Status(); none.TranslateFailures != nil {
		t.Errorf("Status() without a control plane lists failures %+v", none.TranslateFailures)
	}
}
