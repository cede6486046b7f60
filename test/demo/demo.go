package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/nodetopo"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
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

// addrs is the demo's node (internal/nodetopo). 10.231.0.0/16 is used by
// nothing else in this repository (the cluster tier uses 10.244.0.0/16 and
// 10.250.0.1), so no concurrent test can make a pod address ambiguous. The
// node IP, on the node's lo, is the proxy's node address.
var addrs = nodetopo.Plan(231)

// externalAddr is where the external hostname resolves: an address of the
// backend namespace that no Service or endpoint holds, since sockmesh
// refuses an external name that leads to a pod or a Service (GEP-4894).
var externalAddr = addrs.Backend.Addr().Next()

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

	topo := nodetopo.New(t, addrs)
	topo.Backend.AddAddr(t, "lo", netip.PrefixFrom(externalAddr, externalAddr.BitLen()))
	for _, c := range cases {
		startEcho(t, topo.Backend, echoBin, c, certs)
	}
	dns := startDNS(t, topo.Node)
	for _, c := range cases {
		if c.externalHost != "" {
			dns.Set(c.externalHost, 30, externalAddr)
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
		"--proxy-mode=node-ip", fmt.Sprintf("--proxy-listen=%s", netip.AddrPortFrom(addrs.Node, proxyPort)),
		"--health-listen=" + healthAddr, "--metrics-listen=" + healthAddr,
		"--bpffs=" + bpffs, "--cgroup=" + cg.Path,
		"--service-cidr=" + serviceCIDR, "--dns-server=" + dns.Addr,
		"--log-format=json", "--drain-timeout=5s",
	}
	printIntro(cfg.out, topo, cases, args)
	start := time.Now()
	ag := startAgent(t, topo.Node, cg, agentBin, args, cfg)
	if _, err := ag.WaitReady(ctx); err != nil {
		return err
	}
	fmt.Fprintf(cfg.out, "agent ready in %s\n\n", time.Since(start).Round(10*time.Millisecond))

	results := runCases(ctx, ag, topo.Client, cases)
	printResults(cfg.out, results)
	redirected, err := redirects(topo.Node)
	if err != nil {
		return err
	}
	printSummary(cfg.out, results, redirected)

	fmt.Fprintln(cfg.out, "stopping the agent (SIGTERM): it drains, and leaves capture pinned for the next agent")
	if err := ag.Stop(); err != nil {
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
			strings.Join(failed, ", "), ag.Log.Tail(20))
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
	ip := addrs.Client.Addr().String()
	be := addrs.Backend.Addr()
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
	addr := netip.AddrPortFrom(c.listenAddr(), c.backendPort)
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
	t.Cleanup(func() { udp.Close() })
	tcpserve.Serve(t, tcp, func(c net.Conn) { s.ServeConn(c, true) })
	return s
}

// startAgent runs the agent in the node's netns, born in cg, and waits
// until it logged its health listener.
func startAgent(t sandbox.TB, node *sandbox.NetNS, cg *sandbox.Cgroup, bin string, args []string, cfg config) *agentproc.Agent {
	t.Helper()
	cmd := exec.Command(bin, args...)
	// Its own process group: Ctrl-C reaches the demo, which stops it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	acfg := agentproc.Config{Name: "the agent", Cmd: cmd, NetNS: node, Cgroup: cg, Timeout: readyWithin}
	if cfg.verbose {
		acfg.Copy = cfg.out
	}
	a := agentproc.Start(t, acfg)
	// Registered after Start's kill, so it runs first: a graceful stop.
	t.Cleanup(func() {
		if err := a.Stop(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return a
}
