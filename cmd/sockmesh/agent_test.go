package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/nshttp"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/test/dnsserver"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestAgentNodeIP runs the agent in node-IP mode through its whole life:
// ready, TLS originated for a plaintext client, metrics, a malformed
// manifest that changes nothing, the introspection report, a SIGTERM that
// drains a streaming response, capture that stays pinned (and refuses)
// while no agent runs, a restart that adopts the pins, and an uninstall
// that leaves no program attached.
func TestAgentNodeIP(t *testing.T) {
	e := newEnv(t)
	a := e.startAgent(t, "--proxy-mode=node-ip", "--proxy-listen="+addrs.Node.String()+":0")
	// A record at start names the effective configuration.
	start := a.logged(t, `"starting"`, func(r agentproc.Record) bool { return r.Msg() == "starting" })
	for key, want := range map[string]string{"source": "file", "node": testNode, "proxy_mode": "node-ip",
		"bpffs": e.bpffs, "cgroup": e.cg.Path, "manifests": e.manifests, "drain_timeout": "10s", "pool_pod_share": "87.5%"} {
		if got := start.Str(key); got != want {
			t.Errorf("starting record: %s=%q, want %q", key, got, want)
		}
	}
	if got, want := string(start["proxy_listen"]), `["`+addrs.Node.String()+`:0"]`; got != want {
		t.Errorf("starting record: proxy_listen=%s, want %s", got, want)
	}
	proxyAddr := netip.MustParseAddrPort(a.logged(t, "proxy listener", agentproc.Listening("proxy")).Str("addr"))
	if proxyAddr.Addr() != addrs.Node || proxyAddr.Port() == 0 {
		t.Fatalf("proxy listens on %s, want %s with a kernel-chosen port", proxyAddr, addrs.Node)
	}

	body := a.waitReady(t)
	for _, check := range []string{"datapath", "snapshot", "proxy", "heartbeat"} {
		if !strings.Contains(body, "[+]"+check+" ok") {
			t.Errorf("/readyz body lacks a passing %s check:\n%s", check, body)
		}
	}
	a.logged(t, `"agent ready"`, func(r agentproc.Record) bool { return r.Msg() == "agent ready" })
	checkTLSOriginated(t, e.get(t, "/hello"))

	// The agent runs with the GODEBUG settings the proxy needs: it
	// re-executes itself when its environment lacks them.
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", a.Process.Cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, setting := range proxy.RuntimeSettings {
		if !slices.ContainsFunc(strings.Split(string(environ), "\x00"), func(kv string) bool {
			return strings.HasPrefix(kv, "GODEBUG=") && strings.Contains(kv, setting)
		}) {
			t.Errorf("agent environment lacks GODEBUG %s: %q", setting, environ)
		}
	}

	t.Run("metrics", func(t *testing.T) { checkMetrics(t, e, a) })

	// A manifest that does not parse: reported, and the last good objects
	// keep being served.
	e.writeFile(t, "broken.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: [oops\n")
	a.logged(t, "a warning about broken.yaml", func(r agentproc.Record) bool {
		return r.Str("level") == "WARN" && strings.Contains(r.Str("err"), "broken.yaml")
	})
	checkTLSOriginated(t, e.get(t, "/after-broken"))

	t.Run("introspection report", func(t *testing.T) {
		rep := report(t, a)
		if len(rep.Pods) != 1 || rep.Pods[0].State != enrol.Enrolled || rep.Pods[0].NetNSCookie != e.clientCookie ||
			rep.Pods[0].Proxy.V4 != proxyAddr {
			t.Errorf("report pods = %+v, want the client Enrolled with netns cookie %d, proxy %s", rep.Pods, e.clientCookie, proxyAddr)
		}
		if rep.Snapshot == nil || rep.Snapshot.Version == 0 || len(rep.Snapshot.Frontends) != 1 {
			t.Errorf("report snapshot = %+v, want one frontend", rep.Snapshot)
		}
		if rep.Datapath.Counters["redirected"] < 2 {
			t.Errorf("report counters = %v, want at least the 2 requests redirected", rep.Datapath.Counters)
		}
		if p, ok := rep.Datapath.Enrolments[e.clientCookie]; !ok || p.V4 != proxyAddr {
			t.Errorf("report datapath enrolments = %v, want %d -> %s", rep.Datapath.Enrolments, e.clientCookie, proxyAddr)
		}
		found := false
		for _, ev := range rep.Events {
			found = found || ev.Component == "file_source" && strings.Contains(ev.Attrs["err"], "broken.yaml")
		}
		if !found || !rep.Ready {
			t.Errorf("report ready=%v (%s), events %+v; want ready and the broken.yaml warning", rep.Ready, rep.NotReady, rep.Events)
		}
	})

	// SIGTERM while a response streams: the stream completes, then the
	// agent exits cleanly.
	const events = 8
	stream, err := nshttp.Client(e.client, 10*time.Second).Get("http://" + vip.String() + "/sse?n=" + strconv.Itoa(events) + "&interval=100ms")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	sc := bufio.NewScanner(stream.Body)
	readEvent := func() bool {
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") {
				return true
			}
		}
		return false
	}
	if !readEvent() {
		t.Fatalf("no first event: %v", sc.Err())
	}
	if err := a.Process.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a.logged(t, `"shutting down"`, func(r agentproc.Record) bool { return r.Msg() == "shutting down" })
	got := 1
	for readEvent() {
		got++
	}
	streamEnd := time.Now()
	if got != events {
		t.Errorf("the stream in flight at SIGTERM delivered %d of %d events (%v)", got, events, sc.Err())
	}
	select {
	case <-a.Exited():
	case <-time.After(waitFor):
		t.Fatal("agent still running after the drain")
	}
	if err := a.Process.Wait(); err != nil {
		t.Errorf("agent exit after SIGTERM: %v", err)
	}
	stopped := a.logged(t, `"stopped"`, func(r agentproc.Record) bool { return r.Msg() == "stopped" })
	if ts, err := time.Parse(time.RFC3339Nano, stopped.Str("time")); err != nil || ts.Before(streamEnd.Add(-50*time.Millisecond)) {
		t.Errorf("agent stopped at %v, before the stream it drained ended at %v", ts, streamEnd)
	}

	// No agent: the pinned capture keeps redirecting to the proxy address,
	// where nothing listens. The client is refused; nothing reaches the
	// TLS backend in plaintext.
	before := e.backendConns.Load()
	if c, err := e.client.Dial(&net.Dialer{Timeout: 5 * time.Second}, "tcp", vip.String()); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Errorf("connect to %s with no agent running: %v, want connection refused", vip, err)
	}
	if n := e.backendConns.Load(); n != before {
		t.Errorf("backend accepted %d connections while no agent ran", n-before)
	}

	// The next agent adopts every pinned link and serves again.
	b := e.startAgent(t, "--proxy-mode=node-ip", "--proxy-listen="+addrs.Node.String()+":0")
	b.waitReady(t)
	if n := b.Log.Count(func(r agentproc.Record) bool { return r.Msg() == "adopted pinned link" }); n != 6 {
		t.Errorf("restarted agent adopted %d pinned links, want all 6 hooks", n)
	}
	checkTLSOriginated(t, e.get(t, "/after-restart"))
	b.stop(t)

	// uninstall removes the pins and detaches every program.
	out, err := sandbox.HelperCommand(t, "sockmesh", "uninstall", "--bpffs="+e.bpffs).CombinedOutput()
	if err != nil {
		t.Fatalf("sockmesh uninstall: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(e.bpffs, "sockmesh")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory after uninstall: %v, want it gone", err)
	}
	if n := attachedPrograms(t, e.cg.Path); n != 0 {
		t.Errorf("%d programs attached to %s after uninstall, want none", n, e.cg.Path)
	}
}

// TestAgentNotReadyWithoutCapture: `sockmesh uninstall` refuses to take a
// running agent's capture away unless forced; /readyz fails once the
// agent's programs no longer run on their hooks (here after
// `sockmesh uninstall --force`), since fail-closed Services are then
// reached in cleartext.
func TestAgentNotReadyWithoutCapture(t *testing.T) {
	e := newEnv(t)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	a := e.startAgent(t, "--proxy-mode=node-ip", "--proxy-listen="+addrs.Node.String()+":0", "--introspection-socket="+socket)
	a.waitReady(t)
	uninstall := func(args ...string) ([]byte, error) {
		return sandbox.HelperCommand(t, "sockmesh", append([]string{"uninstall", "--introspection-socket=" + socket}, args...)...).CombinedOutput()
	}
	readyz := func() (int, string) {
		resp, err := nshttp.Client(e.node, waitFor).Get("http://" + a.Health + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}

	// Without --force, uninstall leaves a running agent's capture alone.
	out, err := uninstall("--bpffs=" + e.bpffs)
	if err == nil || !strings.Contains(string(out), "--force") {
		t.Fatalf("sockmesh uninstall with an agent running: %v\n%s, want a failure that names --force", err, out)
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz after a refused uninstall: %d\n%s, want 200", code, body)
	}
	// An agent on another --bpffs is none of its business.
	if out, err := uninstall("--bpffs=" + t.TempDir()); err != nil {
		t.Fatalf("sockmesh uninstall of another bpffs: %v\n%s", err, out)
	}

	if out, err := uninstall("--bpffs="+e.bpffs, "--force"); err != nil {
		t.Fatalf("sockmesh uninstall --force: %v\n%s", err, out)
	}
	if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]datapath") {
		t.Errorf("/readyz with no program attached: %d\n%s, want 503 and a failing datapath check", code, body)
	}
	a.stop(t)
	// Once the agent stopped, its socket answers no more.
	if out, err := uninstall("--bpffs=" + e.bpffs); err != nil {
		t.Errorf("sockmesh uninstall after the agent stopped: %v\n%s", err, out)
	}
}

// TestAgentOutsideItsCgroup: --cgroup holds the pods but not the agent (a
// sub-tree of the pods' cgroups), so no sockops or getsockopt program runs
// for its proxy's sockets. The proxy still learns each connection's
// original destination, from the datapath's record, and originates TLS.
func TestAgentOutsideItsCgroup(t *testing.T) {
	e := newEnv(t)
	pods := sandbox.NewCgroup(t)
	// The agent is born in e.cg, outside the cgroup its programs attach to.
	a := e.startAgent(t, "--proxy-mode=node-ip", "--proxy-listen="+addrs.Node.String()+":0", "--cgroup="+pods.Path)
	a.waitReady(t)
	pods.Enter(t) // the client's sockets
	checkTLSOriginated(t, e.get(t, "/hello"))
	a.stop(t)
}

// TestAgentInPod runs the agent in in-pod mode: the proxy listens inside
// the client pod's netns on its loopback (IPv4 and IPv6), TLS is
// originated, and the listeners close when the pod goes.
func TestAgentInPod(t *testing.T) {
	e := newEnv(t)
	a := e.startAgent(t, "--proxy-mode=in-pod", "--in-pod-port=15001")
	a.waitReady(t)
	checkTLSOriginated(t, e.get(t, "/hello"))

	rep := report(t, a)
	want4, want6 := netip.MustParseAddrPort("127.0.0.1:15001"), netip.MustParseAddrPort("[::1]:15001")
	if len(rep.Pods) != 1 || rep.Pods[0].State != enrol.Enrolled || rep.Pods[0].NetNSCookie != e.clientCookie ||
		rep.Pods[0].Proxy.NetNSCookie != e.clientCookie || rep.Pods[0].Proxy.V4 != want4 || rep.Pods[0].Proxy.V6 != want6 {
		t.Errorf("report pods = %+v, want the client Enrolled with listeners %s and %s in its own netns %d",
			rep.Pods, want4, want6, e.clientCookie)
	}
	for _, addr := range []netip.AddrPort{want4, want6} {
		// Not redirected, so the proxy refuses to relay: it resets, during
		// connect or right after it (loopback is that fast). Refused would
		// mean no listener.
		c, err := e.client.Dial(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr.String())
		if err == nil {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Read(make([]byte, 1))
			c.Close()
		}
		if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
			t.Errorf("a direct connection to the in-pod listener %s: %v, want it reset unserved", addr, err)
		}
	}

	// The pod goes: its listeners close.
	if err := os.Remove(filepath.Join(e.manifests, "client.yaml")); err != nil {
		t.Fatal(err)
	}
	a.logged(t, `"pod unenrolled"`, func(r agentproc.Record) bool { return r.Msg() == "pod unenrolled" })
	deadline := time.Now().Add(waitFor)
	for {
		c, err := e.client.Dial(&net.Dialer{Timeout: 5 * time.Second}, "tcp", want4.String())
		if errors.Is(err, syscall.ECONNREFUSED) {
			break
		}
		if c != nil {
			c.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("in-pod listener %s still there after the pod went: %v", want4, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	a.stop(t)
}

// report asks the agent for its introspection report (SIGUSR1).
func report(t *testing.T, a *agentRun) introspect.Report {
	t.Helper()
	rep, err := a.Report()
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func checkMetrics(t *testing.T, e *env, a *agentRun) {
	resp, err := nshttp.Client(e.node, 10*time.Second).Get("http://" + a.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	values := map[string]float64{}
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(strings.TrimSpace(line[i+1:]), 64); err == nil {
				values[line[:i]] = v
			}
		}
	}
	for series, min := range map[string]float64{
		`sockmesh_agent_ready`:                                     1,
		`sockmesh_apply_snapshot_version`:                          1,
		`sockmesh_controlplane_snapshot_version`:                   1,
		`sockmesh_datapath_redirects_total{decision="redirected"}`: 1,
		`sockmesh_enrol_pods{state="Enrolled"}`:                    1,
		`sockmesh_proxy_connections_total{path="http1"}`:           1,
		`sockmesh_source_file_objects`:                             6,
	} {
		if values[series] < min {
			t.Errorf("metric %s = %v, want at least %v", series, values[series], min)
		}
	}
	build := false
	for series, v := range values {
		build = build || strings.HasPrefix(series, "sockmesh_build_info{") && strings.Contains(series, `version="`) && v == 1
	}
	if !build {
		t.Error("no sockmesh_build_info{version=...} 1 series")
	}
}

// attachedPrograms counts the programs attached to cgroup on sockmesh's
// hooks.
func attachedPrograms(t *testing.T, cgroup string) int {
	t.Helper()
	f, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for _, at := range []ebpf.AttachType{
		ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect,
		ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername,
		ebpf.AttachCGroupSockOps, ebpf.AttachCGroupGetsockopt,
	} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
		if err != nil {
			t.Fatalf("query %s programs: %v", at, err)
		}
		n += len(res.Programs)
	}
	return n
}

const extYAML = `apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackend
metadata: {name: ext, namespace: app}
spec:
  type: ExternalHostname
  port: {number: 443}
  externalHostname: {hostname: api.example.test}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: app, annotations: {sockmesh.io/xbackend: ext}}
spec:
  clusterIP: 10.96.232.11
  clusterIPs: [10.96.232.11]
  ports: [{name: https, port: 443, protocol: TCP}]
`

// TestAgentNodeAddressAddedLater: an address the node gains while the
// agent runs (here on a new interface) is a node address at once, and an
// ExternalHostname answer that is it is refused; losing it lifts the
// refusal. The node's addresses were read once at start: such an answer
// led the proxy to the node until the agent restarted.
func TestAgentNodeAddressAddedLater(t *testing.T) {
	e := newEnv(t)
	dns := e.serveDNS(t)
	later := netip.MustParseAddr("203.0.113.9")
	dns.Set("api.example.test", 1, later)
	e.writeFile(t, "ext.yaml", extYAML)

	a := e.startAgent(t, "--proxy-mode=node-ip", "--proxy-listen="+addrs.Node.String()+":0", "--dns-server="+dns.Addr)
	a.waitReady(t)
	accepted := func(b *snapshot.Backend) bool {
		return b.Invalid == nil && slices.ContainsFunc(b.Endpoints, func(ep snapshot.Endpoint) bool { return ep.Addr.Addr() == later })
	}
	waitExt(t, a, "the answer accepted", accepted)

	br := sandbox.Name()
	e.node.AddBridge(t, br)
	e.node.AddAddr(t, br, netip.PrefixFrom(later, 32))
	waitExt(t, a, "the answer refused as the node's", func(b *snapshot.Backend) bool {
		return b.Invalid != nil && strings.Contains(b.Invalid.Message, later.String()+" (node address)")
	})

	e.node.DelLink(t, br)
	waitExt(t, a, "the answer accepted again", accepted)
	a.stop(t)
}

// serveDNS serves DNS on UDP port 53 of the backend pod's namespace,
// which the node routes to, until t ends.
func (e *env) serveDNS(t *testing.T) *dnsserver.Server {
	t.Helper()
	addr := netip.AddrPortFrom(addrs.Backend.Addr(), 53)
	var udp net.PacketConn
	if err := e.backend.Do(func() (err error) {
		udp, err = net.ListenPacket("udp", addr.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	dns := &dnsserver.Server{Addr: addr.String()}
	done := make(chan struct{})
	go func() { dns.ServePacket(udp); close(done) }()
	t.Cleanup(func() { udp.Close(); <-done })
	return dns
}

// waitExt polls the agent's report until ext's backend satisfies ok.
func waitExt(t *testing.T, a *agentRun, what string, ok func(*snapshot.Backend) bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		rep := report(t, a)
		if rep.Snapshot != nil {
			for _, b := range rep.Snapshot.Backends {
				if b.Hostname == "api.example.test" && ok(&b) {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("ext's backend never had %s; last report's snapshot: %+v", what, rep.Snapshot)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
