package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/test/dnsserver"
)

// mode is the agent's --proxy-mode.
type mode string

const (
	nodeIP mode = "node-ip"
	inPod  mode = "in-pod"
)

// proxyPort is the node-IP listeners' port, the agent's default (not 0,
// since a restarted agent must listen where its predecessor's pinned
// enrolments send pods). It is inside the node's namespace, not the host's.
const proxyPort = 15001

// node is one "node": a network namespace standing for its root namespace,
// the cgroup its pods' processes are born in and the agent attaches to, a
// private BPF filesystem, a DNS server in a namespace of its own, and the
// agent.
type node struct {
	c        *cluster
	name     string
	mode     mode
	ns       *sandbox.NetNS
	cg       *sandbox.Cgroup
	bpffs    string
	ip4, ip6 netip.Addr
	// kubeconfig reaches the API server from inside ns.
	kubeconfig string
	dns        *dnsserver.Server
	dnsAddr    netip.AddrPort
	// clientNS holds the node's client pod.
	clientNS string
	client   *host
	agent    *agent
}

// newNode makes a node, starts its agent, and enrols a client pod.
func (c *cluster) newNode(t *testing.T, m mode) *node {
	t.Helper()
	i := c.nodes.Add(1)
	n := &node{c: c, name: fmt.Sprintf("e2e-%s-%d", m, i), mode: m, ns: sandbox.NewNetNS(t)}
	n.ip4 = netip.AddrFrom4([4]byte{10, 251, 128, byte(i)})
	_, v6 := subnetAddrs(128, byte(i))
	n.ip6 = v6
	n.ns.AddAddr(t, "lo", netip.PrefixFrom(n.ip4, 32))
	n.ns.AddAddr(t, "lo", netip.PrefixFrom(n.ip6, 128))
	// The node routes between its pods (the kube-proxy stand-in's DNAT
	// forwards a pod's connection to another pod).
	err := n.ns.Do(func() error {
		for _, p := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(p, []byte("1"), 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("enable forwarding in node %s: %v", n.name, err)
	}
	n.cg = sandbox.NewCgroup(t)
	n.bpffs = sandbox.TempBPFFS(t)
	// The API server listens on the host's loopback: a relay on the
	// node's loopback reaches it.
	relay, err := n.ns.Listen(context.Background(), nil, "tcp", "127.0.0.1:6443")
	if err != nil {
		t.Fatal(err)
	}
	n.kubeconfig = n.c.api.KubeconfigVia(t, relay)
	n.startDNS(t)
	c.createNode(t, n)
	n.clientNS = "clients-" + n.name
	c.newNamespace(t, n.clientNS)

	n.agent = n.startAgent(t)
	n.agent.waitReady(t)
	n.client = n.newPod(t, n.clientNS, "client")
	n.client.dialer = startDialer(t, n.client.ns, n.cg)
	n.checkEnrolment(t, n.agent.waitEnrolled(t, n.client))
	return n
}

// checkEnrolment checks that the client pod's connections go where the
// mode says: the node's listeners in the node's namespace (node-IP), or
// loopback listeners in the pod's own namespace (in-pod).
func (n *node) checkEnrolment(t *testing.T, p enrol.Pod) {
	t.Helper()
	podCookie, err := n.client.ns.Cookie()
	if err != nil {
		t.Fatal(err)
	}
	want := datapath.Proxy{NetNSCookie: podCookie,
		V4: netip.MustParseAddrPort("127.0.0.1:15001"), V6: netip.MustParseAddrPort("[::1]:15001")}
	if n.mode == nodeIP {
		nodeCookie, err := n.ns.Cookie()
		if err != nil {
			t.Fatal(err)
		}
		want = datapath.Proxy{NetNSCookie: nodeCookie,
			V4: netip.AddrPortFrom(n.ip4, proxyPort), V6: netip.AddrPortFrom(n.ip6, proxyPort)}
	}
	if p.NetNSCookie != podCookie || p.Proxy != want {
		t.Fatalf("%s mode: client pod enrolled as netns %d -> %+v, want netns %d -> %+v", n.mode, p.NetNSCookie, p.Proxy, podCookie, want)
	}
}

// host is a network namespace with a veth to its node: a pod when it has
// a Pod object (namespace and name set), an external host otherwise.
type host struct {
	node            *node
	namespace, name string
	ns              *sandbox.NetNS
	// ip4 and ip6 are the host's addresses, gw4 and gw6 its node's end of
	// the veth: the source address of the node's (the proxy's)
	// connections to it.
	ip4, ip6, gw4, gw6 netip.Addr
	// cg is where the host's processes are born: the node's cgroup for
	// pods, nil (the test's own) outside the cluster.
	cg *sandbox.Cgroup
	// dialer makes the pod's client connections (client pods only).
	dialer *dialer
}

// newPod makes a pod on n: its namespace, then its Pod object, so that the
// agent finds the namespace as soon as it learns of the pod.
func (n *node) newPod(t testing.TB, namespace, name string) *host {
	t.Helper()
	h := n.newHost(t, subnet(t, &n.c.podSubnets, 1, maxPodSubnet+1))
	h.namespace, h.name, h.cg = namespace, name, n.cg
	n.c.createPod(t, h)
	return h
}

// newExternalHost makes a host outside the cluster's ranges, reached
// through n (as the internet is, through a node's default route).
func (n *node) newExternalHost(t testing.TB, name string) *host {
	t.Helper()
	h := n.newHost(t, subnet(t, &n.c.outsideSubnets, firstOutsideSubnet, endOutsideSubnet))
	h.name = name
	return h
}

func (n *node) newHost(t testing.TB, k uint32) *host {
	t.Helper()
	h := &host{node: n, ns: sandbox.NewNetNS(t)}
	h.gw4, h.gw6 = subnetAddrs(k, 1)
	h.ip4, h.ip6 = subnetAddrs(k, 2)
	sandbox.NewVeth(t, n.ns, h.ns,
		[]netip.Prefix{netip.PrefixFrom(h.gw4, 24), netip.PrefixFrom(h.gw6, 64)},
		[]netip.Prefix{netip.PrefixFrom(h.ip4, 24), netip.PrefixFrom(h.ip6, 64)})
	h.ns.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), h.gw4)
	h.ns.AddRoute(t, netip.MustParsePrefix("::/0"), h.gw6)
	return h
}

// ip is the host's address in family v6 (else IPv4).
func (h *host) ip(v6 bool) netip.Addr {
	if v6 {
		return h.ip6
	}
	return h.ip4
}

// gw is the node's address on the host's link in family v6 (else IPv4).
func (h *host) gw(v6 bool) netip.Addr {
	if v6 {
		return h.gw6
	}
	return h.gw4
}

// startDNS runs the node's DNS server (the agent's --dns-server) in a
// namespace of its own, linked to the node.
func (n *node) startDNS(t *testing.T) {
	t.Helper()
	h := n.newExternalHost(t, "dns")
	n.dnsAddr = netip.AddrPortFrom(h.ip4, 53)
	var (
		udp net.PacketConn
		tcp net.Listener
	)
	err := h.ns.Do(func() error {
		var err error
		if udp, err = net.ListenPacket("udp", n.dnsAddr.String()); err != nil {
			return err
		}
		tcp, err = net.Listen("tcp", n.dnsAddr.String())
		return err
	})
	if err != nil {
		t.Fatalf("dns server: %v", err)
	}
	n.dns = &dnsserver.Server{Addr: n.dnsAddr.String()}
	var wg sync.WaitGroup
	wg.Go(func() { n.dns.ServePacket(udp) })
	t.Cleanup(func() {
		udp.Close()
		wg.Wait()
	})
	tcpserve.Serve(t, tcp, func(c net.Conn) { n.dns.ServeConn(c, true) })
}

// kubeProxy stands in for kube-proxy on the node: pods' connections to
// vip:port that sockmesh does not capture are DNATed to ep (iptables in the
// node's namespace only).
func (n *node) kubeProxy(t testing.TB, vip netip.Addr, port uint16, ep netip.AddrPort) {
	t.Helper()
	bin := "iptables"
	if vip.Is6() {
		bin = "ip6tables"
	}
	if _, err := exec.LookPath(bin); err != nil {
		testenv.SkipOrFail(t, "the kube-proxy stand-in needs %s: %v", bin, err)
	}
	cmd := exec.Command(bin, "-w", "-t", "nat", "-A", "PREROUTING", "-d", vip.String(), "-p", "tcp",
		"--dport", strconv.Itoa(int(port)), "-j", "DNAT", "--to-destination", ep.String())
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := sandbox.Start(t, cmd, n.ns, nil).Wait(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out.String())
	}
}
