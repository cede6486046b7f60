package snapshot

import (
	"net/netip"
	"testing"
)

// TestWorkloadByAddress: an address names the enrolled pod that alone
// holds it. A finished pod keeps in its status an address the node may
// have given to a new pod, and host-network pods share the node's with
// every host process — one such pod alone enrolled included; taking either
// for the client would apply another namespace's consumer routes to its
// requests (GEP-1294).
func TestWorkloadByAddress(t *testing.T) {
	podIP := netip.MustParseAddr("10.244.0.5")
	nodeIP := netip.MustParseAddr("192.168.1.10")
	hostIP := netip.MustParseAddr("192.168.1.11")
	w := func(ns, name string, enrolled bool, ip netip.Addr) Workload {
		return Workload{Pod: ObjectRef{Namespace: ns, Name: name}, IPs: []netip.Addr{ip}, Enrolled: enrolled, HostNetwork: ip != podIP}
	}
	s, err := New(1, nil, nil, []Workload{
		w("app", "web", true, podIP),
		w("batch", "job-done", false, podIP), // Succeeded; sorts after app/web
		w("a", "agent", true, nodeIP),
		w("z", "exporter", true, nodeIP),
		w("kube-system", "proxy", true, hostIP),
		w("zz", "not-enrolled", false, hostIP),
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ip   netip.Addr
		want string // "" for no workload
	}{
		{podIP, "app/web"},
		{nodeIP, ""}, // two enrolled host-network pods: which one sent it is unknown
		{hostIP, ""}, // one enrolled host-network pod: host processes send from it too
		{netip.MustParseAddr("::ffff:10.244.0.5"), "app/web"},
	}
	for _, tc := range tests {
		got := ""
		if w, ok := s.Workload(tc.ip); ok {
			got = w.Pod.String()
		}
		if got != tc.want {
			t.Errorf("Workload(%s) = %q, want %q", tc.ip, got, tc.want)
		}
	}
	// The node's addresses, held by enrolled host-network pods, are one
	// client's for the proxy's connection limit, however many pods share
	// them.
	for ip, want := range map[netip.Addr]bool{podIP: false, nodeIP: true, hostIP: true, netip.MustParseAddr("::ffff:192.168.1.10"): true} {
		if got := s.HostNetwork(ip); got != want {
			t.Errorf("HostNetwork(%s) = %v, want %v", ip, got, want)
		}
	}
}
