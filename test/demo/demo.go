package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/test/dnsserver"
	"github.com/sockmesh/sockmesh/test/pki"
)

// config is what the demo runs with.
type config struct {
	binDir    string // sockmesh and sockmesh-echo
	manifests string // examples/demo
	verbose   bool   // copy the agent's log to out
	out       io.Writer
}

// The demo's addresses. 10.231.0.0/16 is used by nothing else in this
// repository (the cluster tier uses 10.244.0.0/16 and 10.250.0.1), so no
// concurrent test can make a pod address ambiguous.
var (
	nodeIP    = netip.MustParseAddr("10.231.0.1") // on the node's lo: the proxy's node address
	clientGW  = netip.MustParsePrefix("10.231.1.1/24")
	clientIP  = netip.MustParsePrefix("10.231.1.10/24")
	backendGW = netip.MustParsePrefix("10.231.2.1/24")
	backendIP = netip.MustParsePrefix("10.231.2.20/24")
)

const (
	demoNamespace = "demo"
	nodeName      = "demo-node" // spec.nodeName of the example's pods
	proxyPort     = 15001
	healthAddr    = "127.0.0.1:15021" // inside the node's netns
	// serviceCIDR is the example Services' range, refused for external
	// hostnames; the backend's address is outside it.
	serviceCIDR = "10.96.0.0/16"
	readyWithin = 30 * time.Second
)

// topology is the demo's node.
type topology struct {
	node, client, backend *sandbox.NetNS
}

// run is the whole demo; every object it makes is removed by t's cleanups.
func run(ctx context.Context, t sandbox.TB, cfg config) error {
	agentBin, err := binary(cfg.binDir, "sockmesh")
	if err != nil {
		return err
	}
	echoBin, err := binary(cfg.binDir, "sockmesh-echo")
	if err != nil {
		return err
	}
	m, err := readManifests(cfg.manifests)
	if err != nil {
		return err
	}
	cases, err := loadCases(m)
	if err != nil {
		return err
	}
	dir := t.TempDir()
	certs, err := newCerts(dir, cases)
	if err != nil {
		return err
	}

	topo := newTopology(t)
	for _, c := range cases {
		startEcho(t, topo.backend, echoBin, c, certs)
	}
	dns := startDNS(t, topo.node)
	for _, c := range cases {
		if c.externalHost != "" {
			dns.Set(c.externalHost, 30, backendIP.Addr())
		}
	}
	manifestDir := filepath.Join(dir, "manifests")
	if err := writeManifests(m, manifestDir, certs); err != nil {
		return err
	}
	// The client's sockets are this process's: it joins the cgroup the
	// programs attach to. The agent is born there (its proxy's sockets need
	// the getsockopt and sockops programs).
	cg := sandbox.NewCgroup(t)
	cg.Enter(t)
	bpffs := sandbox.TempBPFFS(t)

	args := []string{"agent",
		"--source=file", "--manifests=" + manifestDir, "--node-name=" + nodeName,
		"--proxy-mode=node-ip", fmt.Sprintf("--proxy-listen=%s", netip.AddrPortFrom(nodeIP, proxyPort)),
		"--health-listen=" + healthAddr, "--metrics-listen=" + healthAddr,
		"--bpffs=" + bpffs, "--cgroup=" + cg.Path,
		"--service-cidr=" + serviceCIDR, "--dns-server=" + dns.Addr,
		"--log-format=json", "--drain-timeout=5s",
	}
	printIntro(cfg.out, topo, cases, args)
	start := time.Now()
	ag := startAgent(t, topo.node, cg, agentBin, args, filepath.Join(dir, "agent.log"), cfg)
	if err := ag.waitReady(ctx, topo.node); err != nil {
		return err
	}
	fmt.Fprintf(cfg.out, "agent ready in %s\n\n", time.Since(start).Round(10*time.Millisecond))

	results := runCases(ctx, topo.client, cases)
	printResults(cfg.out, results)
	redirected, err := redirects(topo.node)
	if err != nil {
		return err
	}
	printSummary(cfg.out, results, redirected)

	fmt.Fprintln(cfg.out, "stopping the agent (SIGTERM): it drains, and leaves capture pinned for the next agent")
	if err := ag.stop(); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, agentBin, "uninstall", "--bpffs="+bpffs).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sockmesh uninstall: %w\n%s", err, out)
	}
	fmt.Fprintf(cfg.out, "sockmesh uninstall: %s", out)
	var failed []string
	for _, r := range results {
		if r.err != nil {
			failed = append(failed, r.c.service)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("the backends of %s did not see what their owners declared (agent log: %s)",
			strings.Join(failed, ", "), ag.logTail(20))
	}
	return nil
}

func binary(dir, name string) (string, error) {
	p, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not built (make build): %w", name, err)
	}
	return p, nil
}

// newTopology makes the node, client and backend network namespaces: each
// pod has a veth to the node and a default route through it; the node
// holds its address on lo, as a kubelet's node IP often is.
func newTopology(t sandbox.TB) topology {
	topo := topology{node: sandbox.NewNetNS(t), client: sandbox.NewNetNS(t), backend: sandbox.NewNetNS(t)}
	topo.node.AddAddr(t, "lo", netip.PrefixFrom(nodeIP, 32))
	sandbox.NewVeth(t, topo.node, topo.client, []netip.Prefix{clientGW}, []netip.Prefix{clientIP})
	topo.client.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), clientGW.Addr())
	sandbox.NewVeth(t, topo.node, topo.backend, []netip.Prefix{backendGW}, []netip.Prefix{backendIP})
	topo.backend.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), backendGW.Addr())
	return topo
}

// certs are the run's PKI, as files for the echo servers and PEM for the
// manifests.
type certs struct {
	ca     *pki.CA
	caFile string
	client *pki.Leaf
	// server certificate and key files by case
	serverCert, serverKey map[string]string
}

// clientCN names the client certificate the XBackend presents.
const clientCN = "sockmesh-demo-client"

func newCerts(dir string, cases []*demoCase) (*certs, error) {
	ca, err := pki.NewCA("sockmesh demo CA")
	if err != nil {
		return nil, err
	}
	c := &certs{ca: ca, serverCert: map[string]string{}, serverKey: map[string]string{}}
	if c.caFile, err = ca.WriteFile(dir, "ca"); err != nil {
		return nil, err
	}
	if c.client, err = ca.Issue(pki.LeafOptions{CommonName: clientCN, Client: true,
		URIs: []string{"spiffe://cluster.local/ns/demo/sa/client"}}); err != nil {
		return nil, err
	}
	for _, dc := range cases {
		if dc.serverName == "" {
			continue
		}
		leaf, err := ca.Issue(pki.LeafOptions{CommonName: dc.service, DNSNames: []string{dc.serverName}})
		if err != nil {
			return nil, err
		}
		if c.serverCert[dc.service], c.serverKey[dc.service], err = leaf.WriteFiles(dir, dc.service); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// writeManifests writes the example with this run's addresses and
// certificates into dir.
func writeManifests(m *manifests, dir string, c *certs) error {
	ip := clientIP.Addr().String()
	be := backendIP.Addr()
	for _, err := range []error{
		m.set("Pod", demoNamespace, "client", ip, "status", "podIP"),
		m.set("Pod", demoNamespace, "client", []any{map[string]any{"ip": ip}}, "status", "podIPs"),
		m.setEndpoints(demoNamespace, "payments-demo", be),
		m.setEndpoints(demoNamespace, "grpc-demo", be),
		m.setEndpoints(demoNamespace, "chat-demo", be),
		m.set("ConfigMap", demoNamespace, "payments-ca", string(c.ca.CertPEM), "data", "ca.crt"),
		m.set("ConfigMap", demoNamespace, "partner-ca", string(c.ca.CertPEM), "data", "ca.crt"),
		m.set("Secret", demoNamespace, "partner-client", string(c.client.CertPEM), "stringData", "tls.crt"),
		m.set("Secret", demoNamespace, "partner-client", string(c.client.KeyPEM), "stringData", "tls.key"),
	} {
		if err != nil {
			return fmt.Errorf("rewrite the example: %w", err)
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("write manifests: %w", err)
	}
	return m.write(dir)
}

// startEcho runs one sockmesh-echo server for c in the backend pod.
func startEcho(t sandbox.TB, backend *sandbox.NetNS, bin string, c *demoCase, crt *certs) {
	t.Helper()
	addr := netip.AddrPortFrom(backendIP.Addr(), c.backendPort)
	args := []string{"-listen=" + addr.String()}
	if c.serverName != "" {
		args = append(args, "-tls-cert="+crt.serverCert[c.service], "-tls-key="+crt.serverKey[c.service])
	}
	if c.mutualTLS {
		args = append(args, "-client-ca="+crt.caFile)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "POD_NAMESPACE="+demoNamespace, "POD_NAME="+c.backendPod)
	// Its own process group: Ctrl-C reaches the demo, which stops it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := sandbox.Start(t, cmd, backend, nil)
	exited := waitChan(p)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := backend.Dial(&net.Dialer{Timeout: time.Second}, "tcp", addr.String())
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			t.Fatalf("sockmesh-echo %s exited: %v", addr, p.Wait())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sockmesh-echo on %s does not accept connections: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitChan is closed when p exits.
func waitChan(p *sandbox.Process) <-chan struct{} {
	ch := make(chan struct{})
	go func() { p.Wait(); close(ch) }()
	return ch
}

// startDNS serves the demo's DNS zone on the node's loopback, where the
// agent resolves ExternalHostname XBackends.
func startDNS(t sandbox.TB, node *sandbox.NetNS) *dnsserver.Server {
	t.Helper()
	var (
		udp net.PacketConn
		tcp net.Listener
	)
	err := node.Do(func() error {
		var err error
		if udp, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			return err
		}
		tcp, err = net.Listen("tcp", udp.LocalAddr().String())
		return err
	})
	if err != nil {
		t.Fatalf("dns server: %v", err)
	}
	s := &dnsserver.Server{Addr: udp.LocalAddr().String()}
	go s.ServePacket(udp)
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s.ServeConn(c, true)
			}()
		}
	}()
	t.Cleanup(func() {
		udp.Close()
		tcp.Close()
	})
	return s
}

// agentProc is the running agent.
type agentProc struct {
	p       *sandbox.Process
	exited  <-chan struct{}
	log     string
	stopped sync.Once
	stopErr error
}

func startAgent(t sandbox.TB, node *sandbox.NetNS, cg *sandbox.Cgroup, bin string, args []string, logPath string, cfg config) *agentProc {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if cfg.verbose {
		cmd.Stdout = io.MultiWriter(f, cfg.out)
		cmd.Stderr = cmd.Stdout
	}
	// Its own process group: Ctrl-C reaches the demo, which stops it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := sandbox.Start(t, cmd, node, cg)
	a := &agentProc{p: p, exited: waitChan(p), log: logPath}
	// Registered after Start's kill, so it runs first: a graceful stop.
	t.Cleanup(func() {
		if err := a.stop(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return a
}

// waitReady polls the agent's /readyz until it answers 200.
func (a *agentProc) waitReady(ctx context.Context, node *sandbox.NetNS) error {
	c := httpClient(node, 2*time.Second)
	deadline := time.Now().Add(readyWithin)
	var last string
	for {
		resp, err := c.Get("http://" + healthAddr + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = string(body)
		} else {
			last = err.Error()
		}
		select {
		case <-a.exited:
			return fmt.Errorf("the agent exited: %v\n%s", a.p.Wait(), a.logTail(30))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent is not ready after %s: %s\n%s", readyWithin, last, a.logTail(30))
		}
	}
}

// stop sends SIGTERM and waits for the agent to drain and exit; calls
// after the first return its result.
func (a *agentProc) stop() error {
	a.stopped.Do(func() {
		select {
		case <-a.exited:
		default:
			if err := a.p.Cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
				a.stopErr = fmt.Errorf("stop the agent: %w", err)
				return
			}
			select {
			case <-a.exited:
			case <-time.After(15 * time.Second):
				a.stopErr = fmt.Errorf("the agent did not stop within 15s after SIGTERM\n%s", a.logTail(20))
				return
			}
		}
		if err := a.p.Wait(); err != nil {
			a.stopErr = fmt.Errorf("the agent exited with %v\n%s", err, a.logTail(20))
		}
	})
	return a.stopErr
}

// logTail returns the last n lines of the agent's log.
func (a *agentProc) logTail(n int) string {
	f, err := os.Open(a.log)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// httpClient makes plain HTTP/1.1 requests from inside ns, one connection
// per request.
func httpClient(ns *sandbox.NetNS, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: transport(ns)}
}

func transport(ns *sandbox.NetNS) *http.Transport {
	return &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return ns.Dial(&net.Dialer{Timeout: 5 * time.Second}, network, addr)
		},
	}
}
