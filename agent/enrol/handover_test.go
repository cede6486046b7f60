package enrol

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/datapath/podns"
	"github.com/sockmesh/sockmesh/internal/sandbox"
)

// unaddressed is pod name as the Snapshot lists it while the API server has
// no address for it: not enrolled (yet).
func unaddressed(name string) snapshot.Workload {
	w := workload(name, false)
	w.NotEnrolled = "the pod has no IP address yet"
	return w
}

// handedOver is the workload the CNI handover adopts: the Snapshot's, with
// the addresses the CNI plugins gave the pod.
func handedOver(w snapshot.Workload, ips ...netip.Addr) snapshot.Workload {
	w.IPs = ips
	return w
}

// TestAdoptBeforeAddress: a pod whose namespace the CNI plugin hands over is
// enrolled at once, stays enrolled while the API server has no address for
// it, and is the Snapshot's pod once it has (no second enrolment, no scan,
// no change of state); it goes with the pod.
func TestAdoptBeforeAddress(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	ns, cookie := podNS(t, ipA)
	rec := &recorder{}
	e := newEnroller(t, Config{NodeProxy: nodeProxy, Retry: time.Hour, Verify: time.Hour}, rec, nil)
	if err := e.Update(snap(t, unaddressed("a"))); err != nil {
		t.Fatal(err)
	}
	scans := counter(t, e.m.scans)
	if err := e.Adopt(handedOver(unaddressed("a"), ipA), open(t, ns.Path()), "sandbox-a"); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	want := map[uint64]datapath.Proxy{cookie: nodeProxy}
	if got, _ := rec.get(); !maps.Equal(got, want) {
		t.Fatalf("enrolments after Adopt = %v, want %v", got, want)
	}
	enrolled := e.Pods()
	if len(enrolled) != 1 || enrolled[0].State != Enrolled || enrolled[0].NetNSCookie != cookie {
		t.Fatalf("pods after Adopt = %+v, want a Enrolled in netns %d", enrolled, cookie)
	}

	addressed := workload("a", true, ipA)
	addressed.SandboxReady = bubbleStart
	for _, step := range []struct {
		name string
		s    *snapshot.Snapshot
	}{
		{"a Snapshot still without the pod's address", snap(t, unaddressed("a"))},
		{"the pod's address published, its sandbox not ready yet", snap(t, workload("a", true, ipA))},
		{"its sandbox ready", snap(t, addressed)},
		{"its sandbox ready, again", snap(t, addressed)},
	} {
		if err := e.Update(step.s); err != nil {
			t.Fatal(err)
		}
		if got, _ := rec.get(); !maps.Equal(got, want) {
			t.Errorf("%s: enrolments = %v, want %v", step.name, got, want)
		}
		if got := e.Pods(); len(got) != 1 || got[0].State != Enrolled || got[0].NetNSCookie != cookie || !got[0].Since.Equal(enrolled[0].Since) {
			t.Errorf("%s: pods = %+v, want a Enrolled in netns %d since the handover", step.name, got, cookie)
		}
	}
	if got := counter(t, e.m.scans); got != scans {
		t.Errorf("namespace scans = %v, want %v: the handed-over namespace is the pod's", got, scans)
	}

	// Now the Snapshot's pod: a replaced sandbox is looked for, as ever.
	replaced := addressed
	replaced.SandboxReady = bubbleStart.Add(time.Minute)
	if err := e.Update(snap(t, replaced)); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, e.m.scans); got != scans+1 {
		t.Errorf("namespace scans after the sandbox was replaced = %v, want %v", got, scans+1)
	}

	if err := e.Update(snap(t)); err != nil {
		t.Fatal(err)
	}
	if got, _ := rec.get(); len(got) != 0 {
		t.Errorf("enrolments after the pod went = %v, want none", got)
	}
}

// TestAdoptedPodReleased: a handed-over pod goes when the Snapshot no longer
// lists it, or lists it with an address and not enrolled (an opt-out that
// came meanwhile); it stays while the API server names an older sandbox's
// address.
func TestAdoptedPodReleased(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	ns, cookie := podNS(t, ipA)
	optedOut := workload("a", false, ipA)
	optedOut.NotEnrolled = "the pod has the label sockmesh.io/capture=disabled"
	for _, tc := range []struct {
		name string
		s    snapshot.Workload
		kept bool
	}{
		{"the pod is gone", workload("other", false), false},
		{"the pod of that name is another", snapshot.Workload{Pod: snapshot.ObjectRef{Namespace: "app", Name: "a"}, UID: "new"}, false},
		{"opted out", optedOut, false},
		{"an older sandbox's address", workload("a", true, ipB), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			e := newEnroller(t, Config{NodeProxy: nodeProxy, Retry: time.Hour, Verify: time.Hour}, rec, nil)
			if err := e.Update(snap(t, unaddressed("a"))); err != nil {
				t.Fatal(err)
			}
			if err := e.Adopt(handedOver(unaddressed("a"), ipA), open(t, ns.Path()), "sandbox-a"); err != nil {
				t.Fatalf("Adopt: %v", err)
			}
			if err := e.Update(snap(t, tc.s)); err != nil {
				t.Fatal(err)
			}
			got, _ := rec.get()
			if _, kept := got[cookie]; kept != tc.kept {
				t.Errorf("enrolments = %v, want the handed-over namespace kept: %v", got, tc.kept)
			}
		})
	}
}

func TestAdoptErrors(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	ns, _ := podNS(t, ipA)
	rec := &recorder{}
	e := newEnroller(t, Config{NodeProxy: nodeProxy, Retry: time.Hour}, rec, nil)
	if err := e.Update(snap(t, unaddressed("a"))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		ips  []netip.Addr
		want string
	}{
		{"no address handed over", nil, "no pod address"},
		{"another pod's namespace", []netip.Addr{ipB}, "holds none of the pod's addresses"},
	} {
		err := e.Adopt(handedOver(unaddressed("a"), tc.ips...), open(t, ns.Path()), "sandbox-a")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Adopt = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if got, _ := rec.get(); len(got) != 0 {
		t.Errorf("enrolments after failed adoptions = %v, want none", got)
	}
	if got := e.Pods(); len(got) != 0 {
		t.Errorf("pods after failed adoptions = %+v, want none", got)
	}
}

// open opens the namespace at path as the CNI handover passes it.
func open(t *testing.T, path string) *podns.NS {
	t.Helper()
	ns, err := podns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestWorkloadWaits: Workload waits for a Snapshot listing the pod with the
// UID asked for, and gives up when ctx ends or the Enroller closes.
func TestWorkloadWaits(t *testing.T) {
	e := newEnroller(t, Config{NodeProxy: nodeProxy}, &recorder{}, nil)
	type result struct {
		w   snapshot.Workload
		err error
	}
	got := make(chan result, 1)
	go func() {
		w, err := e.Workload(t.Context(), snapshot.ObjectRef{Namespace: "app", Name: "a"}, "a-uid")
		got <- result{w, err}
	}()
	// An older pod of the same name is not it.
	if err := e.Update(snap(t, snapshot.Workload{Pod: snapshot.ObjectRef{Namespace: "app", Name: "a"}, UID: "old"})); err != nil {
		t.Fatal(err)
	}
	if err := e.Update(snap(t, unaddressed("a"))); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.err != nil || r.w.UID != "a-uid" {
		t.Errorf("Workload = %+v, %v; want the pod of uid a-uid", r.w, r.err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := e.Workload(ctx, snapshot.ObjectRef{Namespace: "app", Name: "b"}, ""); !errors.Is(err, context.Canceled) {
		t.Errorf("Workload of an unlisted pod, ctx ended = %v, want context.Canceled", err)
	}
	go func() {
		_, err := e.Workload(t.Context(), snapshot.ObjectRef{Namespace: "app", Name: "b"}, "")
		got <- result{err: err}
	}()
	e.Close()
	if r := <-got; !errors.Is(r.err, ErrClosed) {
		t.Errorf("Workload while the Enroller closes = %v, want ErrClosed", r.err)
	}
}

// TestHandoverCarriedOver: an agent that replaces the one a pod was handed
// over to (a rolling update, a restart) keeps the pod enrolled from its
// first write of the enrolment map, though the API server has no address
// for it yet: the record the first agent wrote carries it over. The record
// goes once the Snapshot confirms the pod.
func TestHandoverCarriedOver(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	ns, cookie := podNS(t, ipA)
	dir := t.TempDir()
	cfg := Config{NodeProxy: nodeProxy, Retry: time.Hour, Verify: time.Hour, Handovers: dir}
	old := newEnroller(t, cfg, &recorder{}, nil)
	if err := old.Update(snap(t, unaddressed("a"))); err != nil {
		t.Fatal(err)
	}
	if err := old.Adopt(handedOver(unaddressed("a"), ipA), open(t, ns.Path()), "sandbox-a"); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	record := filepath.Join(dir, "sandbox-a.json")
	if _, err := os.Stat(record); err != nil {
		t.Fatalf("the handover's record: %v", err)
	}

	rec := &recorder{}
	next := newEnroller(t, cfg, rec, nil)
	if err := next.Update(snap(t, unaddressed("a"))); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]datapath.Proxy{cookie: nodeProxy}
	if got, writes := rec.get(); !maps.Equal(got, want) || writes != 1 {
		t.Fatalf("the next agent's first enrolments = %v (write %d), want %v", got, writes, want)
	}
	if got := next.Pods(); len(got) != 1 || got[0].State != Enrolled || got[0].NetNSCookie != cookie {
		t.Errorf("the next agent's pods = %+v, want a Enrolled in netns %d", got, cookie)
	}

	addressed := workload("a", true, ipA)
	addressed.SandboxReady = bubbleStart
	for _, e := range []*Enroller{old, next} {
		if err := e.Update(snap(t, addressed)); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := rec.get(); !maps.Equal(got, want) {
		t.Errorf("enrolments once the Snapshot has the pod = %v, want %v", got, want)
	}
	if _, err := os.Stat(record); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the record once the Snapshot confirmed the pod: %v, want it removed", err)
	}
}

// TestHandoverRecordUnfound: a recorded pod whose namespace the scan does
// not find (yet: a sandbox whose first process has not started) keeps its
// recorded enrolment, Pending; its record goes with the pod, and one no
// agent could have written goes at once.
func TestHandoverRecordUnfound(t *testing.T) {
	dir := t.TempDir()
	carried := record{Workload: handedOver(unaddressed("a"), ipA), Enrolment: enrolment{NetNSCookie: 1 << 40, Proxy: nodeProxy}}
	data, err := json.Marshal(carried)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"sandbox-a.json": data, "torn.json": []byte(`{"workload":`)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rec := &recorder{}
	e := newEnroller(t, Config{NodeProxy: nodeProxy, Retry: time.Hour, Verify: time.Hour, Handovers: dir}, rec, nil)
	if err := e.Update(snap(t, unaddressed("a"))); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]datapath.Proxy{1 << 40: nodeProxy}
	if got, _ := rec.get(); !maps.Equal(got, want) {
		t.Errorf("enrolments = %v, want the recorded %v", got, want)
	}
	if got := states(e); !maps.Equal(got, map[string]State{"a": Pending}) {
		t.Errorf("pods = %v, want a Pending", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "torn.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an unusable record: %v, want it removed", err)
	}

	if err := e.Update(snap(t)); err != nil {
		t.Fatal(err)
	}
	if got, _ := rec.get(); len(got) != 0 {
		t.Errorf("enrolments once the pod went = %v, want none", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "sandbox-a.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the record once the pod went: %v, want it removed", err)
	}
}

// TestHandoverNewerSandbox: a pod whose sandbox the kubelet made again
// during a rolling update (the API server still lists the older one's
// address) and handed over to the other agent is enrolled in the new
// sandbox by the next agent, from the record, whether it knows the pod
// already (from the Snapshot, looked for in vain by the older address) or
// not; the record stays until the Snapshot has the new address. A record
// older than the sandbox the API server lists (a DEL that never came) is
// no handover of the pod's sandbox now: it goes.
func TestHandoverNewerSandbox(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	ns, cookie := podNS(t, ipA)
	older := workload("a", true, ipB) // the sandbox before, gone
	older.SandboxReady = time.Now().Add(-time.Hour)
	later := older // ready after the record was written
	later.SandboxReady = time.Now().Add(time.Hour)
	want := map[uint64]datapath.Proxy{cookie: nodeProxy}
	for _, tc := range []struct {
		name   string
		listed snapshot.Workload // the pod as the API server lists it
		// known: the next agent has the Snapshot's pod before the
		// handover; else it starts after it.
		known bool
		want  map[uint64]datapath.Proxy
	}{
		{"the next agent's first write", older, false, want},
		{"the pod known by its older address", older, true, want},
		{"a record older than the listed sandbox", later, false, map[uint64]datapath.Proxy{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{NodeProxy: nodeProxy, Retry: time.Hour, Verify: time.Hour, Handovers: dir}
			rec := &recorder{}
			var next *Enroller
			if tc.known {
				next = newEnroller(t, cfg, rec, nil)
				if err := next.Update(snap(t, tc.listed)); err != nil {
					t.Fatal(err)
				}
			}
			old := newEnroller(t, cfg, &recorder{}, nil)
			if err := old.Update(snap(t, tc.listed)); err != nil {
				t.Fatal(err)
			}
			if err := old.Adopt(handedOver(tc.listed, ipA), open(t, ns.Path()), "sandbox-new"); err != nil {
				t.Fatalf("Adopt: %v", err)
			}
			if next == nil {
				next = newEnroller(t, cfg, rec, nil)
			}
			if err := next.Update(snap(t, tc.listed)); err != nil {
				t.Fatal(err)
			}
			if got, _ := rec.get(); !maps.Equal(got, tc.want) {
				t.Errorf("the next agent's enrolments = %v, want %v", got, tc.want)
			}
			_, err := os.Stat(filepath.Join(dir, "sandbox-new.json"))
			if kept := len(tc.want) > 0; kept != (err == nil) {
				t.Errorf("the record: %v, want it kept: %v", err, kept)
			}
		})
	}
}
