package translate

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// externalEndpoints turns the agent's DNS answers for an ExternalHostname
// XBackend into endpoints, refusing answers that would make sockmesh a
// confused deputy (GEP-4894): an external name must not lead the proxy to
// this node, to pods or Services, or to addresses that mean "here". It
// returns the Invalid reason and message when no endpoint remains.
func (t *translator) externalEndpoints(host string, port uint16) ([]snapshot.Endpoint, string, string) {
	in := t.in
	answers, resolved := in.Resolved[host]
	if !resolved {
		return nil, ReasonUnresolved, fmt.Sprintf("%s has not been resolved yet", host)
	}
	var (
		eps     []snapshot.Endpoint
		refused []string
	)
	for _, a := range answers {
		a = a.Unmap()
		if why := refusedAddress(a, in.Node, t.clusterAddresses()); why != "" {
			refused = append(refused, fmt.Sprintf("%s (%s)", a, why))
			continue
		}
		ap := netip.AddrPortFrom(a, port)
		if slices.ContainsFunc(eps, func(e snapshot.Endpoint) bool { return e.Addr == ap }) {
			continue
		}
		eps = append(eps, snapshot.Endpoint{Addr: ap, Ready: true, Serving: true})
	}
	slices.SortFunc(eps, func(a, b snapshot.Endpoint) int { return a.Addr.Compare(b.Addr) })
	switch {
	case len(eps) > 0:
		return eps, "", ""
	case len(refused) > 0:
		slices.Sort(refused)
		return nil, ReasonAddressesRefused, fmt.Sprintf("every address %s resolves to is refused: %s", host, strings.Join(refused, ", "))
	}
	return nil, ReasonUnresolved, fmt.Sprintf("%s resolves to no address", host)
}

// cloudMetadata are the clouds' instance metadata services that are not
// link-local, as 169.254.169.254 is: reached from the node, they hand out
// the node's credentials, the address GEP-4894 names for the confused
// deputy.
var cloudMetadata = []netip.Addr{
	netip.MustParseAddr("fd00:ec2::254"),   // AWS's IMDS over IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud's metadata service
	netip.MustParseAddr("168.63.129.16"),   // Azure's WireServer (extension settings)
}

// nat64Prefixes hold IPv6 addresses that a NAT64 gateway (RFC 6146) takes
// to the IPv4 address in their last 32 bits: RFC 6052's well-known prefix
// and RFC 8215's local-use block, whose networks are /96s in the common
// layout that this decodes (the other RFC 6052 lengths split the IPv4
// address around a reserved octet, and are not decoded).
var nat64Prefixes = []netip.Prefix{
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
}

// refusedAddress says why an external name may not lead to a, or "".
// cluster maps the Services' ClusterIPs and endpoint addresses to what they
// are (clusterAddresses). A NAT64 address is judged by the IPv4 address it
// leads to: from a node behind a NAT64 gateway, 64:ff9b::a9fe:a9fe is
// 169.254.169.254.
func refusedAddress(a netip.Addr, node Node, cluster map[netip.Addr]string) string {
	if slices.ContainsFunc(nat64Prefixes, func(p netip.Prefix) bool { return p.Contains(a) }) {
		b := a.As16()
		if why := refusedAddress(netip.AddrFrom4([4]byte(b[12:])), node, cluster); why != "" {
			return "NAT64 of " + why
		}
	}
	switch {
	case !a.IsValid():
		return "invalid"
	case a.IsUnspecified(), a.Is4() && a.As4()[0] == 0:
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "link-local"
	case a.IsMulticast():
		return "multicast"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "broadcast"
	case slices.Contains(cloudMetadata, a):
		return "cloud metadata"
	case slices.ContainsFunc(node.IPs, func(n netip.Addr) bool { return n.Unmap() == a }):
		return "node address"
	case cluster[a] != "":
		return cluster[a]
	case slices.ContainsFunc(node.PodCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }):
		return "pod range"
	case slices.ContainsFunc(node.ServiceCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }):
		return "service range"
	case slices.ContainsFunc(node.NodeCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }):
		return "node range"
	}
	return ""
}

// clusterAddresses returns every Service ClusterIP, external IP and
// load-balancer IP and every EndpointSlice endpoint address of the cluster,
// built on first use: the proxy dials from the node, outside the pods'
// NetworkPolicies, so an external name must not lead to a pod or Service
// anywhere, though the agent knows no pod range but its own node's (and
// --pod-cidr's). Pods that back no Service are covered by the pod ranges
// only; other nodes by their hostNetwork pods that back a Service, and by
// --node-cidr. Values say what the address is, without naming the Service:
// the message reaches whoever owns the XBackend.
func (t *translator) clusterAddresses() map[netip.Addr]string {
	if t.clusterAddrs != nil {
		return t.clusterAddrs
	}
	t.clusterAddrs = map[netip.Addr]string{}
	add := func(s, what string) {
		if a, err := netip.ParseAddr(s); err == nil { // "", "None" and hostnames do not parse
			t.clusterAddrs[a.Unmap()] = what
		}
	}
	for _, es := range t.in.EndpointSlices {
		if es == nil {
			continue
		}
		for _, ep := range es.Endpoints {
			for _, s := range ep.Addresses {
				add(s, "Service endpoint")
			}
		}
	}
	// A Service's external and load-balancer IPs are its own, never an
	// external host's: kube-proxy and most CNIs take them, inside the
	// cluster, straight to the Service's pods (ipMode VIP, the default).
	// Those of ipMode Proxy are refused too: the load balancer they go
	// through leads to the same pods. The deprecated spec.loadBalancerIP
	// is the address a cloud provider may give before status says so.
	for _, svc := range t.services {
		for _, s := range svc.Spec.ExternalIPs {
			add(s, "Service external IP")
		}
		add(svc.Spec.LoadBalancerIP, "Service load-balancer IP")
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			add(ing.IP, "Service load-balancer IP")
		}
	}
	// ClusterIPs last: an address that is both is named as the ClusterIP.
	for _, svc := range t.services {
		for _, s := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
			add(s, "Service ClusterIP")
		}
	}
	return t.clusterAddrs
}

// externalHostnameProblem says why an ExternalHostname may not be used
// ("" when it may): it must be a DNS name (not an IP address) outside the
// cluster's domain (the XBackend API's implementer notes).
func externalHostnameProblem(host, clusterDomain string) string {
	if _, err := netip.ParseAddr(host); err == nil {
		return fmt.Sprintf("externalHostname.hostname %q is an IP address; a DNS name is required", host)
	}
	if errs := validation.IsDNS1123Subdomain(host); len(errs) > 0 {
		return fmt.Sprintf("externalHostname.hostname %q is not a valid DNS name: %s", host, errs[0])
	}
	// The CRD refuses cluster.local whatever the cluster's domain is. The
	// host is lower-case (a valid name); the domain, as configured, may not be.
	for _, domain := range []string{"cluster.local", strings.ToLower(strings.Trim(clusterDomain, "."))} {
		if domain != "" && (host == domain || strings.HasSuffix(host, "."+domain)) {
			return fmt.Sprintf("externalHostname.hostname %q is inside the cluster domain %s; use a Service", host, domain)
		}
	}
	return ""
}

// egressAllowed reports whether host matches one of the allow-list
// patterns: "example.com" matches itself only, "*.example.com" any name
// below example.com. An empty list allows every host.
func egressAllowed(host string, patterns []string) bool {
	if len(patterns) == 0 {
		return true
	}
	host = strings.ToLower(host)
	for _, p := range patterns {
		p = strings.ToLower(strings.TrimSpace(p))
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if suffix != "" && strings.HasSuffix(host, "."+suffix) {
				return true
			}
		} else if p != "" && host == p {
			return true
		}
	}
	return false
}
