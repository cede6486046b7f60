package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/datapath/podns"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

func TestMain(m *testing.M) {
	// Pod processes are this test binary, re-executed as a helper.
	sandbox.Main(m, map[string]func([]string) error{
		backendHelper: runBackend,
		dialerHelper:  runDialer,
	})
}

// scenarioDef is one scenario of the matrix.
type scenarioDef struct {
	name string
	// bothModes runs it in node-IP and in-pod mode; otherwise node-IP only
	// (what it checks does not depend on where the proxy listens).
	bothModes bool
	// ownNode gives it a node and an agent of its own (it restarts the
	// agent).
	ownNode bool
	run     func(*scenario)
}

// scenarios is the matrix: these and the GAMMA ones (gamma_test.go).
var scenarios = append([]scenarioDef{
	{name: "tls-configmap-ca", bothModes: true, run: testConfigMapCA},
	{name: "tls-secret-ca", run: testSecretCA},
	{name: "tls-subject-alt-names", run: testSubjectAltNames},
	{name: "tls-invalid-ca", run: testInvalidCA},
	{name: "tls-conflict", run: testConflict},
	{name: "tls-ca-rotation", run: testCARotation},
	{name: "tls-policy-deletion", bothModes: true, run: testPolicyDeletion},
	{name: "tls-passthrough", bothModes: true, run: testPassthrough},
	{name: "ipv6", bothModes: true, run: testIPv6},
	{name: "h2c", bothModes: true, run: testH2C},
	{name: "ws", bothModes: true, run: testWS},
	{name: "wss", bothModes: true, run: testWSS},
	{name: "grpc", bothModes: true, run: testGRPC},
	{name: "xbackend-server-only", run: testXBackendServerOnly},
	{name: "xbackend-client-and-server", run: testXBackendMutual},
	{name: "agent-restart", bothModes: true, ownNode: true, run: testRestart},
	{name: "agent-rolling-restart", bothModes: true, ownNode: true, run: testRollingRestart},
	{name: "agent-next-dies", ownNode: true, run: testNextAgentDies},
}, gammaScenarios...)

// TestFastTier runs every scenario against one API server, with one node
// (one agent) per proxy mode shared by the scenarios of that mode, each in
// a namespace of its own, in parallel (-parallel at a time).
func TestFastTier(t *testing.T) {
	testenv.RequireRoot(t)
	start := time.Now()
	lockTier(t)
	checkNoLeftovers(t)
	bin := buildAgent(t)
	t.Logf("agent built in %s", time.Since(start).Round(time.Millisecond))
	c := newCluster(t, bin)
	t.Logf("api server ready at %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { t.Logf("fast tier took %s", time.Since(start).Round(time.Millisecond)) })
	for _, m := range []mode{nodeIP, inPod} {
		t.Run(string(m), func(t *testing.T) {
			t.Parallel()
			shared := c.newNode(t, m)
			if m == inPod {
				t.Cleanup(func() { wantAccelerated(t, shared) })
			}
			for _, sc := range scenarios {
				if m != nodeIP && !sc.bothModes {
					continue
				}
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					n := shared
					if sc.ownNode {
						n = c.newNode(t, m)
					}
					sc.run(newScenario(t, n))
				})
			}
		})
	}
}

// tierLock serialises runs of this tier on the machine: two runs would
// share the address plan, and a pod IP held by two namespaces cannot be
// enrolled. It lives in tmpfs and is left in place (an empty file).
const tierLock = "/run/lock/sockmesh-e2e-fast.lock"

// lockTier waits for tierLock and holds it until t ends.
func lockTier(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(tierLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("open %s: %v", tierLock, err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
	deadline := time.Now().Add(15 * time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			t.Fatalf("lock %s: %v", tierLock, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("another run of this tier still holds %s after 15 minutes", tierLock)
		}
		<-tick.C
	}
}

// addressPlan is every address this tier gives out.
var addressPlan = []netip.Prefix{netip.MustParsePrefix("10.251.0.0/16"), netip.MustParsePrefix("fd00:251::/48")}

// checkNoLeftovers fails when a network namespace already holds an address
// of the plan: a run that crashed (its cleanups never ran) left it, and the
// agent would find two namespaces for a pod IP. sandbox names it
// smt-<pid>-<n> after the dead test process.
func checkNoLeftovers(t *testing.T) {
	t.Helper()
	all, err := podns.List()
	if err != nil {
		t.Fatal(err)
	}
	var found []error
	for _, ns := range all {
		// An error means the namespace went away during the scan (its last
		// process exited): it holds nothing.
		addrs, _ := ns.Addrs()
		for _, a := range addrs {
			for _, p := range addressPlan {
				if p.Contains(a) {
					found = append(found, fmt.Errorf("%s holds %s", ns.Path(), a))
				}
			}
		}
		ns.Close()
	}
	if len(found) > 0 {
		t.Fatalf("leftovers of an earlier run use this tier's addresses (remove them, e.g. `ip netns del smt-...`): %v", errors.Join(found...))
	}
}

// wantAccelerated fails t unless the node's agent accelerated connections
// (its in-pod scenarios ran over sk_msg, not loopback TCP).
func wantAccelerated(t *testing.T, n *node) {
	t.Helper()
	c, err := datapath.PinnedAccelCounters(datapath.Config{BPFFS: n.bpffs})
	if err != nil {
		t.Error(err)
		return
	}
	if c.Redirected == 0 {
		t.Errorf("in-pod node ran with --accelerate but no socket was accelerated (counters %+v)", c)
	}
	t.Logf("in-pod node, acceleration: %+v", c)
}
