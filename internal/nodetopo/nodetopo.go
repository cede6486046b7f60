package nodetopo

import (
	"net/netip"

	"github.com/sockmesh/sockmesh/internal/sandbox"
)

// Addrs is the address plan of one node in 10.<octet>.0.0/16.
type Addrs struct {
	// Node is 10.<octet>.0.1, on the node's lo (as a kubelet's node IP
	// often is): where a node-IP mode proxy listens.
	Node netip.Addr
	// ClientGW and Client are the node's and the client pod's ends of the
	// client's veth: 10.<octet>.1.1/24 and 10.<octet>.1.10/24.
	ClientGW, Client netip.Prefix
	// BackendGW and Backend are the node's and the backend pod's ends of
	// the backend's veth: 10.<octet>.2.1/24 and 10.<octet>.2.20/24.
	BackendGW, Backend netip.Prefix
}

// Plan returns the address plan in 10.<octet>.0.0/16.
func Plan(octet byte) Addrs {
	addr := func(third, fourth byte) netip.Addr { return netip.AddrFrom4([4]byte{10, octet, third, fourth}) }
	return Addrs{
		Node:      addr(0, 1),
		ClientGW:  netip.PrefixFrom(addr(1, 1), 24),
		Client:    netip.PrefixFrom(addr(1, 10), 24),
		BackendGW: netip.PrefixFrom(addr(2, 1), 24),
		Backend:   netip.PrefixFrom(addr(2, 20), 24),
	}
}

// Topology is a built node and its two pods.
type Topology struct {
	Addrs                 Addrs
	Node, Client, Backend *sandbox.NetNS
}

// New claims the plan's 10.<octet>.0.0/16 on the machine
// (sandbox.ClaimAddrs: it waits while another run of the same tests holds
// it) and builds the topology of a; t's cleanups remove it.
func New(t sandbox.TB, a Addrs) *Topology {
	t.Helper()
	sandbox.ClaimAddrs(t, netip.PrefixFrom(a.Node, 16))
	topo := &Topology{Addrs: a, Node: sandbox.NewNetNS(t), Client: sandbox.NewNetNS(t), Backend: sandbox.NewNetNS(t)}
	topo.Node.AddAddr(t, "lo", netip.PrefixFrom(a.Node, 32))
	sandbox.NewVeth(t, topo.Node, topo.Client, []netip.Prefix{a.ClientGW}, []netip.Prefix{a.Client})
	topo.Client.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), a.ClientGW.Addr())
	sandbox.NewVeth(t, topo.Node, topo.Backend, []netip.Prefix{a.BackendGW}, []netip.Prefix{a.Backend})
	topo.Backend.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), a.BackendGW.Addr())
	return topo
}
