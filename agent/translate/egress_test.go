package translate

import (
	"net/netip"
	"testing"
)

func TestRefusedAddress(t *testing.T) {
	node := Node{
		IPs:          []netip.Addr{netip.MustParseAddr("192.168.1.5"), netip.MustParseAddr("2001:db8:1::5")},
		PodCIDRs:     []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/112")},
		NodeCIDRs:    []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("2001:db8:1::/64")},
	}
	for addr, want := range map[string]string{
		"203.0.113.9":     "",
		"2001:db8:2::1":   "",
		"10.1.2.3":        "", // private but outside the cluster's ranges
		"127.0.0.1":       "loopback",
		"127.8.9.1":       "loopback",
		"::1":             "loopback",
		"169.254.169.254": "link-local",
		"fe80::1":         "link-local",
		"0.0.0.0":         "unspecified",
		"0.1.2.3":         "unspecified",
		"::":              "unspecified",
		"224.0.0.251":     "link-local", // 224.0.0.0/24 is link-local multicast
		"239.1.2.3":       "multicast",
		"ff02::1":         "link-local",
		"ff0e::1":         "multicast",
		"255.255.255.255": "broadcast",
		"fd00:ec2::254":   "cloud metadata",
		"fd00:ec2::1":     "",
		"100.100.100.200": "cloud metadata",
		"168.63.129.16":   "cloud metadata",
		"192.168.1.5":     "node address",
		"2001:db8:1::5":   "node address",
		"192.168.1.6":     "node range", // another node
		"2001:db8:1::6":   "node range",
		"192.168.2.6":     "",
		"10.244.7.7":      "pod range",
		"10.100.0.1":      "service range",
		"fd00:96::1":      "service range",
		// NAT64: judged by the IPv4 address the gateway takes it to.
		"64:ff9b::a9fe:a9fe":  "NAT64 of link-local",
		"64:ff9b::7f00:1":     "NAT64 of loopback",
		"64:ff9b::c0a8:105":   "NAT64 of node address",
		"64:ff9b::af4:707":    "NAT64 of pod range",
		"64:ff9b:1:2::a64:1":  "NAT64 of service range",
		"64:ff9b::cb00:7109":  "", // 203.0.113.9
		"64:ff9b:2::c0a8:105": "", // outside the NAT64 prefixes
	} {
		if got := refusedAddress(netip.MustParseAddr(addr), node, nil); got != want {
			t.Errorf("refusedAddress(%s) = %q, want %q", addr, got, want)
		}
	}
}

func TestEgressAllowed(t *testing.T) {
	patterns := []string{"api.example.com", "*.partner.example", " *.UPPER.example "}
	for host, want := range map[string]bool{
		"api.example.com":       true,
		"API.example.com":       true,
		"www.example.com":       false,
		"example.com":           false,
		"a.partner.example":     true,
		"a.b.partner.example":   true,
		"partner.example":       false,
		"evilpartner.example":   false,
		"x.upper.example":       true,
		"api.example.com.evil":  false,
		"partner.example.other": false,
	} {
		if got := egressAllowed(host, patterns); got != want {
			t.Errorf("egressAllowed(%q) = %v, want %v", host, got, want)
		}
	}
	if !egressAllowed("anything.example", nil) {
		t.Error("an empty allow-list must allow every host")
	}
	if egressAllowed("x.example", []string{"*.", ""}) {
		t.Error("empty patterns must match nothing")
	}
}
