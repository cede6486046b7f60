package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	clusternode "github.com/sockmesh/sockmesh/test/cluster/node"
)

// buildAgent builds cmd/sockmesh once for the run, into a temporary
// directory, as the image's static binary is built.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sockmesh")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if err := clusternode.BuildBinary(ctx, "github.com/sockmesh/sockmesh/cmd/sockmesh", bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// agent is one run of the agent binary on a node.
type agent struct {
	n      *node
	p      *sandbox.Process
	exited chan struct{}
	log    *agentLog
	// health is the host:port of /readyz inside the node's namespace.
	health string
}

// startAgent runs `sockmesh agent` in the node's namespace and cgroup (its
// proxy's sockets need the getsockopt and sockops programs attached there)
// and waits until it serves /readyz. Cleanup stops it gracefully and then
// runs `sockmesh uninstall`, as an operator removing the agent would.
func (n *node) startAgent(t *testing.T) *agent {
	t.Helper()
	args := []string{"agent",
		"--source=kubernetes", "--kubeconfig=" + n.kubeconfig, "--node-name=" + n.name,
		"--proxy-mode=" + string(n.mode),
		"--health-listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
		"--bpffs=" + n.bpffs, "--cgroup=" + n.cg.Path,
		"--leader-elect", "--leader-election-namespace=" + leaderNamespace,
		"--service-cidr=" + strings.Join(serviceCIDRs, ","), "--pod-cidr=" + strings.Join(podCIDRs, ","),
		"--dns-server=" + n.dnsAddr.String(),
		"--log-format=json", "--drain-timeout=5s",
		// Not the host's /run/sockmesh: every test agent has its own socket.
		"--introspection-socket=" + filepath.Join(t.TempDir(), "agent.sock"),
	}
	if n.mode == nodeIP {
		args = append(args, "--proxy-listen="+netip.AddrPortFrom(n.ip4, proxyPort).String()+","+
			netip.AddrPortFrom(n.ip6, proxyPort).String())
	}
	cmd := exec.Command(n.c.agentBin, args...)
	// The pod name makes the Lease identity differ between runs on a node.
	cmd.Env = append(os.Environ(), "POD_NAME="+sandbox.Name())
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	a := &agent{n: n, exited: make(chan struct{}), log: newAgentLog(r)}
	a.p = sandbox.Start(t, cmd, n.ns, n.cg)
	w.Close()
	go func() { a.p.Wait(); close(a.exited) }()
	// After sandbox's kill, so it runs first: a graceful stop, then
	// uninstall. A test that stopped the agent itself skips both.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent %s log (last lines, without reports):\n%s", n.name, a.log.tail(150))
		}
		select {
		case <-a.exited:
			return
		default:
		}
		if err := a.stop(); err != nil {
			t.Error(err)
		}
		if n.agent != a {
			return // a newer agent on this node uninstalls
		}
		out, err := exec.Command(n.c.agentBin, "uninstall", "--bpffs="+n.bpffs).CombinedOutput()
		if err != nil {
			t.Errorf("sockmesh uninstall: %v\n%s", err, out)
		}
	})
	rec, err := a.log.wait(func(r logRecord) bool { return r.Msg == "listening" && r.Listener == "health" })
	if err != nil {
		t.Fatalf("agent %s: %v\n%s", n.name, err, a.log.tail(50))
	}
	a.health = rec.Addr
	return a
}

// waitReady polls /readyz until it answers 200.
func (a *agent) waitReady(t testing.TB) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
			return a.n.ns.Dial(nil, network, addr)
		},
	}}
	eventually(t, "agent "+a.n.name+" /readyz", func() error {
		select {
		case <-a.exited:
			t.Fatalf("agent %s exited: %v\n%s", a.n.name, a.p.Wait(), a.log.tail(50))
		default:
		}
		resp, err := c.Get("http://" + a.health + "/readyz")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", resp.Status, body)
		}
		return nil
	})
}

// stop sends SIGTERM and waits for a clean exit.
func (a *agent) stop() error {
	if err := a.p.Cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop agent %s: %w", a.n.name, err)
	}
	select {
	case <-a.exited:
	case <-time.After(waitFor):
		return fmt.Errorf("agent %s still running %s after SIGTERM", a.n.name, waitFor)
	}
	if err := a.p.Wait(); err != nil {
		return fmt.Errorf("agent %s exit after SIGTERM: %w\n%s", a.n.name, err, a.log.tail(30))
	}
	return nil
}

// report asks the agent for its introspection report (SIGUSR1) and decodes
// the first one it logs after the request.
func (a *agent) report(t testing.TB) introspect.Report {
	t.Helper()
	seen := a.log.reportCount()
	if err := a.p.Cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatalf("ask agent %s for a report: %v", a.n.name, err)
	}
	raw, err := a.log.waitReport(a.exited, seen)
	if err != nil {
		t.Fatalf("agent %s: %v", a.n.name, err)
	}
	var rep introspect.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("decode the introspection report of %s: %v", a.n.name, err)
	}
	return rep
}

// waitSnapshot polls the agent's report until cond accepts the Snapshot it
// serves (the data planes have it then: the report shows the applied one).
func (a *agent) waitSnapshot(t testing.TB, what string, cond func(*snapshot.Snapshot) error) {
	t.Helper()
	eventually(t, "agent "+a.n.name+" serving "+what, func() error {
		rep := a.report(t)
		if rep.Snapshot == nil {
			return errors.New("no snapshot applied")
		}
		return cond(rep.Snapshot)
	})
}

// waitEnrolled waits until the agent has enrolled pod h, and returns its
// enrolment.
func (a *agent) waitEnrolled(t testing.TB, h *host) enrol.Pod {
	t.Helper()
	var got enrol.Pod
	eventually(t, "agent "+a.n.name+" enrolling "+h.namespace+"/"+h.name, func() error {
		rep := a.report(t)
		for _, p := range rep.Pods {
			if p.Pod.Namespace == h.namespace && p.Pod.Name == h.name {
				if p.State != enrol.Enrolled {
					return fmt.Errorf("%s: %s", p.State, p.Reason)
				}
				got = p
				return nil
			}
		}
		return errors.New("pod not in the report")
	})
	return got
}

// logRecord is the part of an agent's JSON log record the harness reads.
type logRecord struct {
	Msg      string `json:"msg"`
	Listener string `json:"listener"`
	Addr     string `json:"addr"`
}

// agentLog collects an agent's JSON log: the lines (introspection reports
// apart, they are large) and the reports.
type agentLog struct {
	mu       sync.Mutex
	lines    []string
	records  []logRecord
	reports  int
	lastRep  json.RawMessage
	grew     chan struct{} // closed and replaced on every line
	finished bool
}

const keepLogLines = 2000

func newAgentLog(r io.ReadCloser) *agentLog {
	l := &agentLog{grew: make(chan struct{})}
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 64<<20)
		for sc.Scan() {
			var rec struct {
				logRecord
				Report json.RawMessage `json:"report"`
			}
			json.Unmarshal(sc.Bytes(), &rec) // a non-JSON line (cobra's error) is kept as a line
			l.mu.Lock()
			if rec.Msg == "introspection report" {
				l.reports++
				l.lastRep = rec.Report
			} else {
				l.lines = append(l.lines, sc.Text())
				if len(l.lines) > keepLogLines {
					l.lines = slices.Delete(l.lines, 0, len(l.lines)-keepLogLines)
				}
				l.records = append(l.records, rec.logRecord)
			}
			close(l.grew)
			l.grew = make(chan struct{})
			l.mu.Unlock()
		}
		l.mu.Lock()
		l.finished = true
		close(l.grew)
		l.mu.Unlock()
	}()
	return l
}

// wait returns the first record that matches, waiting until the log ends
// (the agent exited) or waitFor passes.
func (l *agentLog) wait(match func(logRecord) bool) (logRecord, error) {
	timeout := time.After(waitFor)
	for {
		l.mu.Lock()
		grew, finished := l.grew, l.finished
		for _, r := range l.records {
			if match(r) {
				l.mu.Unlock()
				return r, nil
			}
		}
		l.mu.Unlock()
		if finished {
			return logRecord{}, errors.New("the agent exited before logging it")
		}
		select {
		case <-grew:
		case <-timeout:
			return logRecord{}, fmt.Errorf("not logged within %s", waitFor)
		}
	}
}

func (l *agentLog) reportCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reports
}

// waitReport returns the newest report once more than seen were logged.
func (l *agentLog) waitReport(exited <-chan struct{}, seen int) (json.RawMessage, error) {
	timeout := time.After(waitFor)
	for {
		l.mu.Lock()
		grew, n, rep := l.grew, l.reports, l.lastRep
		l.mu.Unlock()
		if n > seen {
			return rep, nil
		}
		select {
		case <-grew:
		case <-exited:
			return nil, errors.New("exited instead of reporting")
		case <-timeout:
			return nil, fmt.Errorf("no introspection report within %s", waitFor)
		}
	}
}

// tail returns the last n lines.
func (l *agentLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines[max(0, len(l.lines)-n):], "\n")
}
