package daemonset_test

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

// TestAgentRunsWithItsCapabilities runs the agent (built from cmd/sockmesh)
// with no capability but those daemonset.yaml adds, as runc would start
// its container: it must load, attach and pin its programs, enter its
// network namespace and turn ready. Without CAP_SYS_ADMIN it must not
// (setns, and CAP_PERFMON for the programs' bpf_skc_to_* helpers, which
// CAP_SYS_ADMIN implies): the test would otherwise prove nothing about the
// set.
func TestAgentRunsWithItsCapabilities(t *testing.T) {
	testenv.RequireRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testenv.SkipOrFail(t, "setpriv (util-linux) drops the capabilities: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "sockmesh")
	build := exec.Command("go", "build", "-o", bin, "../cmd/sockmesh")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	spec := typed[appsv1.DaemonSet](t, objects(t), "DaemonSet")[0].Spec.Template.Spec
	var caps []string
	for _, c := range spec.Containers[0].SecurityContext.Capabilities.Add {
		caps = append(caps, strings.ToLower(string(c)))
	}

	run := func(t *testing.T, caps []string) *agentproc.Agent {
		ns := sandbox.NewNetNS(t)
		// The proxy listens on a node address, never loopback's.
		ns.AddAddr(t, "lo", netip.MustParsePrefix("198.18.231.1/32"))
		manifests := t.TempDir()
		bounding := "-all"
		for _, c := range caps {
			bounding += ",+" + c
		}
		cmd := exec.Command(setpriv, "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set="+bounding, "--",
			bin, "agent", "--source=file", "--manifests="+manifests, "--log-format=json",
			"--proxy-listen=198.18.231.1:15001", "--health-listen=127.0.0.1:0", "--metrics-listen=",
			"--bpffs="+sandbox.TempBPFFS(t), "--cgroup="+sandbox.NewCgroup(t).Path,
			"--introspection-socket="+filepath.Join(t.TempDir(), "agent.sock"))
		return agentproc.Start(t, agentproc.Config{Cmd: cmd, NetNS: ns})
	}

	t.Run(strings.Join(caps, ","), func(t *testing.T) {
		a := run(t, caps)
		if _, err := a.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := a.Stop(); err != nil {
			t.Error(err)
		}
	})
	t.Run("without sys_admin", func(t *testing.T) {
		a := run(t, slices.DeleteFunc(slices.Clone(caps), func(c string) bool { return c == "sys_admin" }))
		if _, err := a.WaitReady(t.Context()); err == nil {
			t.Fatal("the agent turned ready without CAP_SYS_ADMIN: the test cannot tell a needed capability from a missing one")
		}
	})
}
