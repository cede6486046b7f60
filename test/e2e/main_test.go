package e2e

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/datapath"
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
	sandbox.ClaimAddrs(t, addressPlan...)
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

// addressPlan is every address this tier gives out: sandbox.ClaimAddrs
// serialises runs of the tier on the machine (two would share the plan, and
// a pod IP held by two namespaces cannot be enrolled) and fails on a
// crashed run's leftovers.
var addressPlan = []netip.Prefix{netip.MustParsePrefix("10.251.0.0/16"), netip.MustParsePrefix("fd00:251::/48")}

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
