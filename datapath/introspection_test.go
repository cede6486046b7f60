package datapath

import (
	"encoding/json"
	"net/netip"
	"testing"
)

// TestPairCounters checks that a pod's connects to a captured address are
// counted for that pair, by decision, and that connects the pair counters
// do not cover (an unenrolled netns, an uncaptured address) are not.
func TestPairCounters(t *testing.T) {
	tp := newTopology(t)
	d := tp.open(t)
	// No proxy listens and the heartbeat is fresh: vip4 (fail-closed) is
	// redirected and refused; server6 (fail-open) too.
	if err := d.SetServices([]Service{{Addr: vip4}, {Addr: tp.server6, FailOpen: true}}); err != nil {
		t.Fatal(err)
	}
	// Unenrolled: nothing is counted per pair.
	v, err := dialAndGreet(tp.pod, tp.server6, nil)
	wantDirect(t, v, err, tp.server6)
	if got, err := d.PairCounters(); err != nil || len(got) != 0 {
		t.Fatalf("PairCounters() before enrolment = %v, %v; want none", got, err)
	}

	if err := d.Enrol(tp.podCookie, tp.nodeProxy()); err != nil {
		t.Fatal(err)
	}
	if err := d.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := dialAndGreet(tp.pod, vip4, nil)
		wantRefused(t, err)
	}
	setHeartbeatAge(t, d, 2*DefaultHeartbeatMaxAge)
	v, err = dialAndGreet(tp.pod, tp.server6, nil) // fail-open, stale proxy: direct
	wantDirect(t, v, err, tp.server6)
	v, err = dialAndGreet(tp.pod, tp.server4, nil) // not captured
	wantDirect(t, v, err, tp.server4)

	got, err := d.PairCounter(tp.podCookie, vip4)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[Decision]uint64{Redirected: 2}; !equalMaps(nonZero(got), want) {
		t.Errorf("PairCounter(pod, %s) = %v, want %v", vip4, got, want)
	}
	got, err = d.PairCounter(tp.podCookie, tp.server6)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[Decision]uint64{SkippedProxyStale: 1}; !equalMaps(nonZero(got), want) {
		t.Errorf("PairCounter(pod, %s) = %v, want %v", tp.server6, got, want)
	}
	got, err = d.PairCounter(tp.podCookie, tp.server4)
	if err != nil || len(nonZero(got)) != 0 || len(got) != len(Decisions()) {
		t.Errorf("PairCounter of an uncaptured address = %v, %v; want every decision 0", got, err)
	}

	all, err := d.PairCounters()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].NetNSCookie != tp.podCookie || all[0].Service != vip4 || all[1].Service != tp.server6 {
		t.Errorf("PairCounters() = %+v, want the pod's pairs with %s and %s", all, vip4, tp.server6)
	}
	b, err := json.Marshal(all[0].Counts)
	if err != nil {
		t.Fatal(err)
	}
	var back map[Decision]uint64
	if err := json.Unmarshal(b, &back); err != nil || back[Redirected] != 2 {
		t.Errorf("counts round trip through %s = %v, %v", b, back, err)
	}
	if _, err := d.PairCounter(tp.podCookie, netip.AddrPort{}); err == nil {
		t.Error("PairCounter of an invalid address: no error")
	}
}

// TestState checks that State reports every hook attached with its program
// and link, and every pin in place.
func TestState(t *testing.T) {
	tp := newTopology(t)
	d := tp.open(t)
	s, err := d.State()
	if err != nil {
		t.Fatal(err)
	}
	if s.Cgroup != tp.cg.Path || s.PinDir != tp.cfg.pinDir() || len(s.Hooks) != len(hooks) {
		t.Fatalf("State() = %+v", s)
	}
	for _, h := range s.Hooks {
		if !h.Attached || !h.LinkPinned || !h.ProgramPinned || h.ProgramID == 0 || h.LinkID == 0 || h.ProgramName == "" {
			t.Errorf("hook %+v: want attached, pinned, with program and link IDs", h)
		}
	}
	names := map[string]bool{}
	for _, m := range s.Maps {
		names[m.Name] = true
		if !m.Pinned || m.ID == 0 {
			t.Errorf("map %+v: want pinned, with an ID", m)
		}
	}
	if !names["sm_pair_counters"] || !names["sm_services"] || !names["sm_accel"] || len(s.Maps) != 12 {
		t.Errorf("State() maps = %v, want all 12", names)
	}
	if s.Accelerated {
		t.Error("State().Accelerated without Config.Accelerate")
	}

	// Detached behind the agent's back: State says so.
	if err := d.links["connect4"].(interface{ Detach() error }).Detach(); err != nil {
		t.Fatal(err)
	}
	s, err = d.State()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range s.Hooks {
		if want := h.Name != "connect4"; h.Attached != want {
			t.Errorf("after detaching connect4: hook %s attached=%v, want %v", h.Name, h.Attached, want)
		}
	}
}

func nonZero(m map[Decision]uint64) map[Decision]uint64 {
	out := map[Decision]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}
