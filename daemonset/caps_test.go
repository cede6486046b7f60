package daemonset_test

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

// TestAgentRunsWithItsCapabilities runs the agent (built from cmd/sockmesh)
// with no capability but those daemonset.yaml adds, as runc would start
// its container: it must load, attach and pin its programs, enter its
// network namespace and turn ready. Without CAP_SYS_ADMIN it must fail
// (setns, the maps of an address's takeover by ID, and CAP_PERFMON for the
// programs' bpf_skc_to_* helpers, which CAP_SYS_ADMIN implies): the test
// would otherwise prove nothing about the set.
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

	// command returns the agent's command with caps, and its network
	// namespace.
	command := func(t *testing.T, caps []string) (*exec.Cmd, *sandbox.NetNS) {
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
		return cmd, ns
	}

	t.Run(strings.Join(caps, ","), func(t *testing.T) {
		cmd, ns := command(t, caps)
		a := agentproc.Start(t, agentproc.Config{Cmd: cmd, NetNS: ns})
		if _, err := a.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := a.Stop(); err != nil {
			t.Error(err)
		}
	})
	// It fails its start: at the health address's takeover, which finds
	// the address's steering maps by ID.
	t.Run("without sys_admin", func(t *testing.T) {
		cmd, ns := command(t, slices.DeleteFunc(slices.Clone(caps), func(c string) bool { return c == "sys_admin" }))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		p := sandbox.Start(t, cmd, ns, nil)
		exited := make(chan error, 1)
		go func() { exited <- p.Wait() }()
		select {
		case err := <-exited:
			if err == nil {
				t.Fatalf("the agent exited 0 without CAP_SYS_ADMIN:\n%s", &out)
			}
		case <-time.After(time.Minute): // only keeps a broken agent from hanging the test
			t.Fatal("the agent still runs a minute without CAP_SYS_ADMIN: the test cannot tell a needed capability from a missing one")
		}
	})
}
