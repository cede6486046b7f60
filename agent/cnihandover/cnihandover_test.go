package cnihandover

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/agent/cniwire"
)

// enroller answers handovers as told and records them, with the inode of
// the namespace that came with each.
type enroller struct {
	mu     sync.Mutex
	got    []cniwire.Pod
	inodes []uint64
	answer cniwire.Answer
	err    error
	// block makes Enrol wait for its ctx to end.
	block bool
}

func (e *enroller) Enrol(ctx context.Context, p cniwire.Pod, netns *os.File) (cniwire.Answer, error) {
	ino := inode(netns)
	netns.Close()
	e.mu.Lock()
	e.got, e.inodes = append(e.got, p), append(e.inodes, ino)
	e.mu.Unlock()
	if e.block {
		<-ctx.Done()
		return cniwire.Answer{}, context.Cause(ctx)
	}
	return e.answer, e.err
}

// serve serves en on a socket in a new directory until t ends, its
// metrics registered on reg (nil: none).
func serve(t *testing.T, cfg Config, en Enroller, reg prometheus.Registerer) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "run", "cni.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(cfg, en, slog.New(slog.NewTextHandler(t.Output(), nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return path
}

func inode(f *os.File) uint64 {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return 0
	}
	return st.Ino
}

// netns opens this process's network namespace, as the plugin opens the
// pod's.
func netns(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

var pod = cniwire.Pod{Namespace: "app", Name: "a", UID: "a-uid", ContainerID: "c0ffee", NetNS: "/var/run/netns/cni-1",
	IPs: []netip.Addr{netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("fd00::5")}}

func TestAdd(t *testing.T) {
	for _, tc := range []struct {
		name   string
		en     *enroller
		pod    cniwire.Pod
		want   cniwire.Answer
		errHas string
	}{
		{name: "captured", en: &enroller{answer: cniwire.Answer{Captured: true}}, pod: pod, want: cniwire.Answer{Captured: true}},
		{name: "not captured", en: &enroller{answer: cniwire.Answer{Reason: "opted out"}}, pod: pod, want: cniwire.Answer{Reason: "opted out"}},
		{name: "enrolment failed", en: &enroller{err: errors.New("the enrolment map's last write failed")}, pod: pod,
			errHas: "the enrolment map's last write failed"},
		{name: "the agent's time is up", en: &enroller{block: true}, pod: pod, errHas: "deadline exceeded"},
		{name: "no pod name", en: &enroller{}, pod: cniwire.Pod{Namespace: "app", NetNS: "/x"}, errHas: "K8S_POD_NAME"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socket := serve(t, Config{Timeout: 100 * time.Millisecond}, tc.en, nil)
			ns := netns(t)
			got, err := cniwire.Add(t.Context(), socket, tc.pod, ns)
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) || errors.Is(err, cniwire.ErrUnreachable) {
					t.Fatalf("Add = %+v, %v; want an error from the agent containing %q", got, err, tc.errHas)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Add = %+v, %v; want %+v", got, err, tc.want)
			}
			if len(tc.en.got) != 1 || !reflect.DeepEqual(tc.en.got[0], tc.pod) {
				t.Errorf("the agent got %+v, want %+v", tc.en.got, tc.pod)
			}
			if want := inode(ns); len(tc.en.inodes) != 1 || tc.en.inodes[0] != want || want == 0 {
				t.Errorf("the agent got namespaces of inodes %v, want the one passed, %d", tc.en.inodes, want)
			}
		})
	}
}

// TestHandoverMetrics: every result's series is there from the start, at 0,
// and a handover counts under its own.
func TestHandoverMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	socket := serve(t, Config{}, &enroller{answer: cniwire.Answer{Captured: true}}, reg)
	want := map[string]float64{"captured": 0, "not_captured": 0, "failed": 0}
	if got := handovers(t, reg); !maps.Equal(got, want) {
		t.Errorf("sockmesh_cni_handovers_total before any handover = %v, want %v", got, want)
	}
	if _, err := cniwire.Add(t.Context(), socket, pod, netns(t)); err != nil {
		t.Fatal(err)
	}
	want["captured"] = 1
	if got := handovers(t, reg); !maps.Equal(got, want) {
		t.Errorf("sockmesh_cni_handovers_total after a captured handover = %v, want %v", got, want)
	}
}

// handovers reads sockmesh_cni_handovers_total's series from reg, by result.
func handovers(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sockmesh_cni_handovers_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// TestAddUnreachable: no agent, or a socket an agent left, is
// ErrUnreachable (the plugin's exemptions apply to it).
func TestAddUnreachable(t *testing.T) {
	dir := t.TempDir()
	left := filepath.Join(dir, "left.sock")
	ln, err := Listen(left)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close() // the socket file stays, no one listens
	if _, err := os.Stat(left); err != nil {
		t.Fatalf("the socket file after Close: %v, want it kept for the next agent", err)
	}
	for _, socket := range []string{filepath.Join(dir, "absent.sock"), left} {
		if _, err := cniwire.Add(t.Context(), socket, pod, netns(t)); !errors.Is(err, cniwire.ErrUnreachable) {
			t.Errorf("Add to %s = %v, want cniwire.ErrUnreachable", socket, err)
		}
	}
}

// TestListen: the directory is root's alone, and a socket left by an agent
// that stopped is replaced.
func TestListen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "cni.sock")
	for range 2 {
		ln, err := Listen(path)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("dial the socket Listen opened: %v", err)
		}
		c.Close()
		ln.Close()
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("socket directory mode = %v (%v), want 0700", fi.Mode(), err)
	}
}
