package node

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestIPTablesCleanup(t *testing.T) {
	for _, tc := range []struct {
		name, rules, want string
	}{
		{
			name:  "nothing of ours",
			rules: "-P INPUT ACCEPT\n-N DOCKER\n-A FORWARD -j DOCKER\n",
			want:  "",
		},
		{
			name: "kube-proxy and kubelet chains",
			rules: `-P PREROUTING ACCEPT
-P OUTPUT ACCEPT
-N KUBE-SERVICES
-N KUBE-SVC-ABC
-N CALICO-X
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j CALICO-X
-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-ABC
-A CALICO-X -g KUBE-SVC-ABC
`,
			want: `*nat
-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D CALICO-X -g KUBE-SVC-ABC
-F KUBE-SERVICES
-F KUBE-SVC-ABC
-X KUBE-SERVICES
-X KUBE-SVC-ABC
COMMIT
`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := iptablesCleanup("nat", tc.rules); got != tc.want {
				t.Errorf("iptablesCleanup =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestWithin(t *testing.T) {
	for _, tc := range []struct {
		path, dir string
		want      bool
	}{
		{"/var/lib/sockmesh-node", "/var/lib/sockmesh-node", true},
		{"/var/lib/sockmesh-node/kubelet/pods", "/var/lib/sockmesh-node", true},
		{"/var/lib/sockmesh-node2", "/var/lib/sockmesh-node", false},
		{"/var/lib", "/var/lib/sockmesh-node", false},
		{"/a/b", "/a/", true},
	} {
		if got := within(tc.path, tc.dir); got != tc.want {
			t.Errorf("within(%q, %q) = %v, want %v", tc.path, tc.dir, got, tc.want)
		}
	}
}

func TestAbsentPaths(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "exists", "child"), 0o755)
	got := absentPaths([]string{
		filepath.Join(dir, "exists", "child"),         // present: nothing to remove
		filepath.Join(dir, "exists", "new", "deeper"), // the topmost missing one
		filepath.Join(dir, "exists", "new", "other"),  // the same ancestor once
		filepath.Join(dir, "gone"),
	})
	want := []string{filepath.Join(dir, "exists", "new"), filepath.Join(dir, "gone")}
	if !slices.Equal(got, want) {
		t.Errorf("absentPaths = %q, want %q", got, want)
	}
}

func TestRemoveTreeRefusesShortPaths(t *testing.T) {
	for _, p := range []string{"/", "/var", "relative/path", ""} {
		if err := removeTree(p); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Errorf("removeTree(%q) = %v, want a refusal", p, err)
		}
	}
}

func TestHasArg(t *testing.T) {
	args := []string{"containerd-shim-runc-v2", "-namespace", "k8s.io", "-address", "/var/lib/x/containerd.sock", "-publish-binary=/usr/bin/containerd"}
	for _, tc := range []struct {
		flag, value string
		want        bool
	}{
		{"-address", "/var/lib/x/containerd.sock", true},
		{"-address", "/run/containerd/containerd.sock", false},
		{"-publish-binary", "/usr/bin/containerd", true},
		{"-namespace", "default", false},
	} {
		if got := hasArg(args, tc.flag, tc.value); got != tc.want {
			t.Errorf("hasArg(%s %s) = %v, want %v", tc.flag, tc.value, got, tc.want)
		}
	}
}

func TestLedgerRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	if _, ok, err := loadLedger(path); ok || err != nil {
		t.Fatalf("loadLedger of nothing = %v, %v; want none", ok, err)
	}
	l := &ledger{path: path, Owner: 42, Procs: map[string]procRecord{"etcd": {PID: 7, Start: 99}},
		Sysctls: map[string]string{"net/ipv4/ip_forward": "0"}, Absent: []string{"/run/containerd"}, LoAddr: "10.250.0.1/32", BPFFSMountID: 300}
	if err := l.save(); err != nil {
		t.Fatal(err)
	}
	got, ok, err := loadLedger(path)
	if err != nil || !ok {
		t.Fatalf("loadLedger = %v, %v", ok, err)
	}
	if got.Owner != 42 || got.Procs["etcd"] != (procRecord{PID: 7, Start: 99}) || got.Sysctls["net/ipv4/ip_forward"] != "0" ||
		!slices.Equal(got.Absent, l.Absent) || got.LoAddr != l.LoAddr || got.BPFFSMountID != 300 {
		t.Errorf("loaded %+v, saved %+v", got, l)
	}
	os.WriteFile(path, []byte("{not json"), 0o600)
	if _, _, err := loadLedger(path); err == nil {
		t.Errorf("a corrupt ledger loaded without error")
	}
}

// TestLockExcludes checks that a second holder waits for the first, and
// gets the lock once it is released (and its file removed).
func TestLockExcludes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.lock")
	first, err := acquireLock(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := acquireLock(ctx, path); err == nil {
		t.Fatal("a second lock was granted while the first is held")
	}
	got := make(chan error, 1)
	go func() {
		l, err := acquireLock(t.Context(), path)
		if err == nil {
			l.release()
		}
		got <- err
	}()
	first.release()
	if err := <-got; err != nil {
		t.Fatalf("lock after release: %v", err)
	}
}

func TestProcRecord(t *testing.T) {
	self := procRecord{PID: os.Getpid(), Start: startTime(os.Getpid())}
	if !self.alive() {
		t.Errorf("this process does not count as alive: %+v", self)
	}
	// A reused PID has another start time.
	if (procRecord{PID: self.PID, Start: self.Start + 1}).alive() {
		t.Errorf("a record with another start time counts as alive")
	}
	if (procRecord{PID: 0}).alive() {
		t.Errorf("PID 0 counts as alive")
	}
}
