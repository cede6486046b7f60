package main

import (
	"errors"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
	"github.com/sockmesh/sockmesh/agent/resolve"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/internal/gcfloor"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/test/pki"
)

// parse runs the agent command's flag handling: defaults from env, the
// command line, then the config file under it; the node's address, its
// default-route one, is 192.0.2.7.
func parse(t *testing.T, env map[string]string, configFile string, args ...string) (settings, error) {
	t.Helper()
	return parseWith(t, env, fixedHost{ips: []netip.Addr{netip.MustParseAddr("192.0.2.7")}}, configFile, args...)
}

// fixedHost is a node whose default-route addresses are ips, or which
// fails to tell with err.
type fixedHost struct {
	ips []netip.Addr
	err error
}

func (h fixedHost) DefaultRouteAddrs() ([]netip.Addr, error) { return h.ips, h.err }

// parseWith is parse on the node host.
func parseWith(t *testing.T, env map[string]string, host hostNetns, configFile string, args ...string) (settings, error) {
	t.Helper()
	getenv := func(k string) string { return env[k] }
	var o options
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	o.addFlags(fs, getenv)
	if configFile != "" {
		path := filepath.Join(t.TempDir(), "agent.yaml")
		if err := os.WriteFile(path, []byte(configFile), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config="+path)
	}
	if err := fs.Parse(args); err != nil {
		return settings{}, err
	}
	return o.load(fs, getenv, host)
}

func TestDefaults(t *testing.T) {
	got, err := parse(t, map[string]string{"NODE_NAME": "node-a", "POD_NAMESPACE": "sockmesh-system", "POD_NAME": "sockmesh-x1"}, "")
	if err != nil {
		t.Fatal(err)
	}
	want := settings{
		source: "kubernetes", nodeName: "node-a", podName: "sockmesh-x1", mode: enrol.NodeIP,
		proxyListen: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.7:15001")}, inPodPort: 15001,
		healthListen: ":15021", metricsListen: ":15090", bpffs: "/sys/fs/bpf", leaderNS: "sockmesh-system",
		node:     translate.Node{IPs: []netip.Addr{netip.MustParseAddr("192.0.2.7")}},
		logLevel: slog.LevelInfo, drainTimeout: 20 * time.Second,
		introspection: httpapi.Config{Socket: httpapi.DefaultSocket},
		gcHeapFloor:   gcfloor.Default,
		kubeQPS:       100, kubeBurst: 200, maxConnsPerPod: 4096, stallTimeout: time.Minute, poolPodShare: 0.875,
		dns: resolve.Config{MaxStale: 5 * time.Minute, Parallel: 64},
		// The CNI handover is off; its plugin's defaults wait for it.
		cni: cniSettings{binDir: "/opt/cni/bin", timeout: 10 * time.Second, exempt: []string{"kube-system"}},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(settings{}, cniSettings{}), cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("settings from defaults (-want +got):\n%s", diff)
	}
}

func TestAccelerateFlag(t *testing.T) {
	got, err := parse(t, map[string]string{"NODE_NAME": "n"}, "", "--accelerate")
	if err != nil {
		t.Fatal(err)
	}
	if !got.accelerate {
		t.Error("--accelerate did not turn acceleration on")
	}
}

// TestNodeAddressesAreTheProxyDefault: without --proxy-listen the proxy
// listens on the node's addresses from the downward API, one per family, so
// that a dual-stack node serves its pods' IPv6 connections too.
func TestNodeAddressesAreTheProxyDefault(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"dual-stack ($HOST_IPS)", map[string]string{"HOST_IPS": "10.250.0.1,fd00:250::1", "HOST_IP": "10.250.0.1"},
			[]string{"10.250.0.1:15001", "[fd00:250::1]:15001"}},
		{"IPv6 primary", map[string]string{"HOST_IPS": "fd00:250::1,10.250.0.1"}, []string{"[fd00:250::1]:15001", "10.250.0.1:15001"}},
		{"first of a family", map[string]string{"HOST_IPS": "10.250.0.1, 10.250.0.2,::ffff:10.250.0.3"}, []string{"10.250.0.1:15001"}},
		{"single-stack ($HOST_IPS)", map[string]string{"HOST_IPS": "fd00:250::1"}, []string{"[fd00:250::1]:15001"}},
		{"$HOST_IP without $HOST_IPS", map[string]string{"HOST_IP": "10.250.0.1"}, []string{"10.250.0.1:15001"}},
		{"default route's interface", nil, []string{"192.0.2.7:15001"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := maps.Clone(c.env)
			if env == nil {
				env = map[string]string{}
			}
			env["NODE_NAME"] = "n"
			got, err := parse(t, env, "")
			if err != nil {
				t.Fatal(err)
			}
			var want []netip.AddrPort
			var wantIPs []netip.Addr
			for _, s := range c.want {
				ap := netip.MustParseAddrPort(s)
				want, wantIPs = append(want, ap), append(wantIPs, ap.Addr())
			}
			if !slices.Equal(got.proxyListen, want) {
				t.Errorf("proxyListen = %v, want %v", got.proxyListen, want)
			}
			if !slices.Equal(got.node.IPs, wantIPs) {
				t.Errorf("node IPs = %v, want %v", got.node.IPs, wantIPs)
			}
		})
	}
	_, err := parse(t, map[string]string{"NODE_NAME": "n", "HOST_IPS": "10.250.0.1,node-a"}, "")
	if err == nil || !strings.Contains(err.Error(), "HOST_IPS") {
		t.Errorf("settings with $HOST_IPS=10.250.0.1,node-a: %v, want an error naming $HOST_IPS", err)
	}
}

// TestDefaultRouteAddrsWithoutDownwardAPI: an agent run by hand (no
// $HOST_IPS, no $HOST_IP) listens on its node's default-route address of
// each family the node routes — both on a dual-stack node, whose pods'
// connections in either family must find a listener.
func TestDefaultRouteAddrsWithoutDownwardAPI(t *testing.T) {
	node4, node6 := netip.MustParsePrefix("10.219.1.2/24"), netip.MustParsePrefix("fd00:219:1::2/64")
	gw4, gw6 := netip.MustParseAddr("10.219.1.1"), netip.MustParseAddr("fd00:219:1::1")
	for _, tc := range []struct {
		name string
		ipv6 bool // a default route in IPv6 too
		want []netip.AddrPort
	}{
		{"dual-stack", true, []netip.AddrPort{netip.AddrPortFrom(node4.Addr(), 15001), netip.AddrPortFrom(node6.Addr(), 15001)}},
		{"IPv4 only", false, []netip.AddrPort{netip.AddrPortFrom(node4.Addr(), 15001)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, router := sandbox.NewNetNS(t), sandbox.NewNetNS(t)
			sandbox.NewVeth(t, node, router, []netip.Prefix{node4, node6},
				[]netip.Prefix{netip.PrefixFrom(gw4, 24), netip.PrefixFrom(gw6, 64)})
			node.AddRoute(t, netip.MustParsePrefix("0.0.0.0/0"), gw4)
			if tc.ipv6 {
				node.AddRoute(t, netip.MustParsePrefix("::/0"), gw6)
			}
			got, err := parseWith(t, map[string]string{"NODE_NAME": "n"}, node, "")
			if err != nil || !slices.Equal(got.proxyListen, tc.want) {
				t.Errorf("proxyListen = %v, %v; want %v", got.proxyListen, err, tc.want)
			}
		})
	}
}

func TestNoNodeAddress(t *testing.T) {
	var o options
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	getenv := func(string) string { return "" }
	o.addFlags(fs, getenv)
	if err := fs.Parse([]string{"--source=file", "--manifests=" + t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	_, err := o.load(fs, getenv, fixedHost{err: errors.New("no default route")})
	if err == nil || !strings.Contains(err.Error(), "--proxy-listen") || !strings.Contains(err.Error(), "no default route") {
		t.Errorf("settings without a node address = %v, want an error naming --proxy-listen and the cause", err)
	}
}

func TestConfigFileUnderFlags(t *testing.T) {
	manifests := t.TempDir()
	file := `
source: file
manifests: ` + manifests + `
proxy-mode: in-pod
in-pod-port: 15006
service-cidr: [10.96.0.0/16, "fd00:96::/112"]
pod-cidr: 10.244.0.0/16,fd00:244::/56
node-cidr: [192.168.0.0/24, "2001:db8:1::/64"]
egress-allow: ["*.example.com"]
dns-server: [10.0.0.10]
log-level: debug
log-format: json
drain-timeout: 5s
health-listen: 127.0.0.1:0
max-conns-per-pod: 100
`
	got, err := parse(t, nil, file, "--proxy-mode=node-ip", "--proxy-listen=10.1.2.3:0", "--log-level=warn")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"source (file)", got.source, "file"},
		{"manifests (file)", got.manifests, manifests},
		{"mode (flag over file)", got.mode, enrol.NodeIP},
		{"proxy listen (flag)", got.proxyListen, []netip.AddrPort{netip.MustParseAddrPort("10.1.2.3:0")}},
		{"node IPs (the proxy listener's)", got.node.IPs, []netip.Addr{netip.MustParseAddr("10.1.2.3")}},
		{"in-pod port (file, number)", got.inPodPort, uint16(15006)},
		{"service CIDRs (file, YAML list)", got.node.ServiceCIDRs, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}},
		{"pod CIDRs (file, comma-separated)", got.node.PodCIDRs, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}},
		{"node CIDRs (file, YAML list)", got.node.NodeCIDRs, []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("2001:db8:1::/64")}},
		{"egress allow (file)", got.node.EgressAllow, []string{"*.example.com"}},
		{"dns servers (file, default port)", got.dns.Servers, []string{"10.0.0.10:53"}},
		{"log level (flag over file)", got.logLevel, slog.LevelWarn},
		{"log json (file)", got.logJSON, true},
		{"drain timeout (file)", got.drainTimeout, 5 * time.Second},
		{"health listen (file)", got.healthListen, "127.0.0.1:0"},
		{"metrics listen (default)", got.metricsListen, ":15090"},
		{"connections per pod (file)", got.maxConnsPerPod, 100},
	} {
		if diff := cmp.Diff(c.want, c.got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
			cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b }),
			cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.what, diff)
		}
	}
}

func TestConfigFileErrors(t *testing.T) {
	for _, c := range []struct {
		name, file, want string
	}{
		{"unknown key", "proxy-mod: in-pod\n", `unknown key "proxy-mod"`},
		{"config key", "config: other.yaml\n", `unknown key "config"`},
		{"list for a scalar", "proxy-mode: [in-pod]\n", "not a list"},
		{"bad duration", "drain-timeout: soon\n", "drain-timeout"},
		{"bad number", "in-pod-port: 70000\n", "in-pod-port"},
		{"null", "source:\n", "has no value"},
		{"nested map", "source: {kind: file}\n", "unexpected"},
		{"not YAML", "source: [file\n", "parse config file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parse(t, map[string]string{"NODE_NAME": "n"}, c.file)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("config file %q: error %v, want one containing %q", c.file, err, c.want)
			}
		})
	}
}

// TestDNSServers: --dns-server takes an IP address with or without a
// port (53), an IPv6 one also in brackets without a port, as users write
// IPv6 resolvers — refused as invalid before.
func TestDNSServers(t *testing.T) {
	node := map[string]string{"NODE_NAME": "n"}
	for flag, want := range map[string]string{
		"10.0.0.10":      "10.0.0.10:53",
		"10.0.0.10:5353": "10.0.0.10:5353",
		"fd00::53":       "[fd00::53]:53",
		"[fd00::53]":     "[fd00::53]:53",
		"[fd00::53]:54":  "[fd00::53]:54",
	} {
		got, err := parse(t, node, "", "--dns-server="+flag)
		if err != nil || !slices.Equal(got.dns.Servers, []string{want}) {
			t.Errorf("--dns-server=%s: %q, %v; want %q", flag, got.dns.Servers, err, want)
		}
	}
}

// TestDNSTunables: --dns-max-stale and --dns-parallel reach the
// resolver's configuration; they were no flags, and resolve.Config's
// defaults (5m, 64) could not be changed.
func TestDNSTunables(t *testing.T) {
	got, err := parse(t, map[string]string{"NODE_NAME": "n"}, "", "--dns-max-stale=30s", "--dns-parallel=8")
	if err != nil {
		t.Fatal(err)
	}
	if got.dns.MaxStale != 30*time.Second || got.dns.Parallel != 8 {
		t.Errorf("--dns-max-stale=30s --dns-parallel=8: resolver config %+v, want MaxStale 30s, Parallel 8", got.dns)
	}
}

// TestPoolPodShare: --pool-pod-share, on the command line or in the config
// file, is the proxy's upstream client share as a fraction.
func TestPoolPodShare(t *testing.T) {
	node := map[string]string{"NODE_NAME": "n"}
	for _, c := range []struct {
		args   []string
		config string
		want   float64
	}{
		{[]string{"--pool-pod-share=50%"}, "", 0.5},
		{[]string{"--pool-pod-share= 12.5 %"}, "", 0.125},
		{nil, "pool-pod-share: 100%\n", 1},
	} {
		got, err := parse(t, node, c.config, c.args...)
		if err != nil || got.poolPodShare != c.want {
			t.Errorf("%v %q: pool pod share %v, %v; want %v", c.args, c.config, got.poolPodShare, err, c.want)
		}
	}
}

// TestListenersSharingAPort: health and metrics may share one listener,
// given the same address; listeners on distinct addresses (localhost is
// the IPv4 one Go listens on), or on port 0, may share a port number
// (TestSettingsErrors has those that may not).
func TestListenersSharingAPort(t *testing.T) {
	node := map[string]string{"NODE_NAME": "n"}
	for _, args := range [][]string{
		{"--health-listen=:15021", "--metrics-listen=:15021"},
		{"--health-listen=localhost:15021", "--metrics-listen=localhost:15021"},
		{"--health-listen=10.0.0.1:15021", "--metrics-listen=10.0.0.2:15021"},
		{"--health-listen=localhost:15021", "--metrics-listen=[::1]:15021"},
		{"--health-listen=:0", "--metrics-listen=127.0.0.1:0"},
	} {
		if _, err := parse(t, node, "", args...); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestListenersBindTheCheckedAddress: a listener flag's host name is
// resolved once, for the checks, and the listener binds that address, not
// the name: resolved again at bind, a round-robin name could give an
// address the checks never saw (one another listener holds). Health and
// metrics written alike share the one address.
func TestListenersBindTheCheckedAddress(t *testing.T) {
	got, err := parse(t, map[string]string{"NODE_NAME": "n"}, "", append([]string{"--health-listen=localhost:0", "--metrics-listen=localhost:0",
		"--introspection-listen=localhost:9443"}, introspectionTLS(t)...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ flag, got, want string }{
		{"--health-listen", got.healthListen, "127.0.0.1:0"},
		{"--metrics-listen", got.metricsListen, "127.0.0.1:0"},
		{"--introspection-listen", got.introspection.Listen, "127.0.0.1:9443"},
	} {
		if c.got != c.want {
			t.Errorf("%s=localhost binds %q, want %q", c.flag, c.got, c.want)
		}
	}
}

// introspectionTLS returns the flags naming a certificate, its key and a
// token file that --introspection-listen can use.
func introspectionTLS(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA("introspection CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := leaf.WriteFiles(dir, "agent")
	if err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"--introspection-tls-cert=" + cert, "--introspection-tls-key=" + key, "--introspection-token-file=" + token}
}

// TestFlagsAccepted: values at the edge of what the checks refuse.
func TestFlagsAccepted(t *testing.T) {
	node := map[string]string{"NODE_NAME": "n"}
	// The checks only require that it exists; the client reads it later.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--egress-allow=example.com,*.example.com, API.Example.COM"},
		{"--cluster-domain=cluster.example.", "--cgroup=" + t.TempDir(), "--kube-api-qps=0.5"},
		{"--dns-server=10.0.0.10:5353,fd00::53,[fd00::53]:53"},
		{"--source=file", "--manifests=" + t.TempDir()},
		{"--kubeconfig=" + kubeconfig},
		append([]string{"--introspection-listen=127.0.0.1:9443"}, introspectionTLS(t)...),
		// A group ID need not be listed in /etc/group (an image lists none).
		{"--introspection-group=4294967294"},
		{"--introspection-group=root"},
	} {
		if _, err := parse(t, node, "", args...); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

func TestSettingsErrors(t *testing.T) {
	node := map[string]string{"NODE_NAME": "n"}
	missing := filepath.Join(t.TempDir(), "missing")
	aFile := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(aFile, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsFlags := introspectionTLS(t)
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"unknown source", node, []string{"--source=etcd"}, "--source"},
		{"file without manifests", node, []string{"--source=file"}, "--manifests"},
		{"kubernetes without node", nil, []string{"--source=kubernetes"}, "--node-name"},
		{"leader election without namespace", node, []string{"--leader-elect"}, "--leader-election-namespace"},
		{"leader election with files", node, []string{"--source=file", "--manifests=/m", "--leader-elect"}, "--leader-elect needs"},
		{"unknown mode", node, []string{"--proxy-mode=sidecar"}, "--proxy-mode"},
		{"unspecified listener", node, []string{"--proxy-listen=0.0.0.0:15001"}, "pods can reach"},
		{"loopback listener", node, []string{"--proxy-listen=127.0.0.1:15001"}, "pods can reach"},
		{"IPv6 link-local listener", node, []string{"--proxy-listen=10.0.0.1:15001,[fe80::1%eth0]:15001"}, "pods can reach"},
		{"listener without port", node, []string{"--proxy-listen=10.0.0.1"}, "IP:port"},
		{"two IPv4 listeners", node, []string{"--proxy-listen=10.0.0.1:1,10.0.0.2:1"}, "one address per family"},
		{"in-pod with a listener", node, []string{"--proxy-mode=in-pod", "--proxy-listen=10.0.0.1:1"}, "applies to --proxy-mode=node-ip only"},
		{"in-pod port 0", node, []string{"--proxy-mode=in-pod", "--in-pod-port=0"}, "--in-pod-port"},
		{"bad service CIDR", node, []string{"--service-cidr=10.96.0.0"}, "--service-cidr"},
		{"bad pod CIDR", node, []string{"--pod-cidr=pods"}, "--pod-cidr"},
		{"bad node CIDR", node, []string{"--node-cidr=192.168.0.0/33"}, "--node-cidr"},
		{"bad DNS server", node, []string{"--dns-server=dns.example"}, "--dns-server"},
		{"IPv4 DNS server in brackets", node, []string{"--dns-server=[10.0.0.10]"}, "--dns-server"},
		{"DNS server with a bracket missing", node, []string{"--dns-server=[fd00::53"}, "--dns-server"},
		{"zero DNS max stale", node, []string{"--dns-max-stale=0s"}, "--dns-max-stale must be positive"},
		{"negative DNS max stale", node, []string{"--dns-max-stale=-1m"}, "--dns-max-stale must be positive"},
		{"zero DNS parallel", node, []string{"--dns-parallel=0"}, "--dns-parallel must be positive"},
		{"negative DNS parallel", node, []string{"--dns-parallel=-4"}, "--dns-parallel must be positive"},
		{"bad $HOST_IP", map[string]string{"NODE_NAME": "n", "HOST_IP": "node-a"}, nil, "$HOST_IP"},
		{"kube API QPS not a number", node, []string{"--kube-api-qps=NaN"}, "--kube-api-qps"},
		{"kube API QPS infinite", node, []string{"--kube-api-qps=+Inf"}, "--kube-api-qps"},
		{"bad cluster domain", node, []string{"--cluster-domain=cluster local"}, "--cluster-domain"},
		{"bad leader election namespace", node, []string{"--leader-elect", "--leader-election-namespace=Sockmesh_System"}, "--leader-election-namespace"},
		{"missing cgroup", node, []string{"--cgroup=" + missing}, "--cgroup"},
		{"DNS server on port 0", node, []string{"--dns-server=10.0.0.10:0"}, "--dns-server"},
		{"missing manifests directory", node, []string{"--source=file", "--manifests=" + missing}, "--manifests"},
		{"manifests a file", node, []string{"--source=file", "--manifests=" + aFile}, "not a directory"},
		{"manifests with kubernetes", node, []string{"--source=kubernetes", "--manifests=" + t.TempDir()}, "--manifests applies to --source=file only"},
		{"cni conf dir without socket", node, []string{"--cni-conf-dir=/etc/cni/net.d"}, "--cni-conf-dir needs --cni-socket"},
		{"cni timeout below a second", node, []string{"--cni-timeout=500ms"}, "--cni-timeout must be at least 1s"},
		{"kubeconfig with files", node, []string{"--source=file", "--manifests=" + t.TempDir(), "--kubeconfig=" + aFile}, "--kubeconfig applies"},
		{"missing kubeconfig", node, []string{"--kubeconfig=" + missing}, "--kubeconfig"},
		{"introspection TLS without a listener", node, tlsFlags, "apply to --introspection-listen only"},
		{"missing introspection certificate", node, []string{"--introspection-listen=127.0.0.1:9443",
			"--introspection-tls-cert=" + missing, tlsFlags[1], tlsFlags[2]}, "--introspection-tls-cert"},
		{"introspection key not a key", node, []string{"--introspection-listen=127.0.0.1:9443",
			tlsFlags[0], "--introspection-tls-key=" + aFile, tlsFlags[2]}, "--introspection-tls-key"},
		{"missing introspection token", node, []string{"--introspection-listen=127.0.0.1:9443",
			tlsFlags[0], tlsFlags[1], "--introspection-token-file=" + missing}, "--introspection-token-file"},
		{"egress pattern with a scheme", node, []string{"--egress-allow=https://example.com"}, "--egress-allow"},
		{"egress pattern with a port", node, []string{"--egress-allow=example.com:443"}, "--egress-allow"},
		{"egress pattern with an inner wildcard", node, []string{"--egress-allow=api.*.example.com"}, "--egress-allow"},
		{"egress pattern wildcard without a dot", node, []string{"--egress-allow=*example.com"}, "--egress-allow"},
		{"egress pattern only a wildcard", node, []string{"--egress-allow=*"}, "--egress-allow"},
		{"bad log level", node, []string{"--log-level=loud"}, "--log-level"},
		{"bad log format", node, []string{"--log-format=xml"}, "--log-format"},
		{"negative drain", node, []string{"--drain-timeout=-1s"}, "--drain-timeout"},
		{"negative handover wait", node, []string{"--handover-wait=-1s"}, "--handover-wait must not be negative"},
		{"handover wait without health", node, []string{"--handover-wait=10s", "--health-listen="}, "--handover-wait needs --health-listen"},
		{"negative connection limit", node, []string{"--max-conns-per-pod=-1"}, "--max-conns-per-pod"},
		{"zero stall timeout", node, []string{"--stall-timeout=0s"}, "--stall-timeout"},
		{"pod share as a fraction", node, []string{"--pool-pod-share=0.875"}, `--pool-pod-share="0.875": want a percentage`},
		{"pod share of nothing", node, []string{"--pool-pod-share=0%"}, `--pool-pod-share="0%": want a percentage`},
		{"negative pod share", node, []string{"--pool-pod-share=-10%"}, `--pool-pod-share="-10%": want a percentage`},
		{"pod share above all", node, []string{"--pool-pod-share=150%"}, `--pool-pod-share="150%": want a percentage`},
		{"pod share not a number", node, []string{"--pool-pod-share=NaN%"}, `--pool-pod-share="NaN%": want a percentage`},
		{"empty pod share", node, []string{"--pool-pod-share="}, `--pool-pod-share="": want a percentage`},
		{"no introspection socket", node, []string{"--introspection-socket="}, "--introspection-socket"},
		{"unknown introspection group", node, []string{"--introspection-group=sockmesh-no-such-group"}, "--introspection-group"},
		{"introspection group ID (gid_t)-1", node, []string{"--introspection-group=4294967295"}, "--introspection-group"},
		{"introspection port without TLS", node, []string{"--introspection-listen=:9443"}, "--introspection-tls-cert"},
		{"health address without port", node, []string{"--health-listen=[::1]"}, "--health-listen"},
		{"metrics address without port", node, []string{"--metrics-listen=127.0.0.1"}, "--metrics-listen"},
		{"metrics on health's port", node, []string{"--health-listen=:15021", "--metrics-listen=0.0.0.0:15021"}, "--metrics-listen"},
		{"metrics on health's port, IPv6", node, []string{"--health-listen=:15021", "--metrics-listen=[::]:15021"}, "--metrics-listen"},
		{"metrics on health's port, both families", node, []string{"--health-listen=0.0.0.0:15021", "--metrics-listen=[::]:15021"}, "--metrics-listen"},
		{"health on the proxy's port", node, []string{"--proxy-listen=10.0.0.1:15021"}, "--health-listen"},
		{"metrics on the proxy's address", node, []string{"--proxy-listen=10.0.0.1:15001", "--metrics-listen=10.0.0.1:15001"}, "--metrics-listen"},
		{"metrics on health's address, IPv4-mapped", node, []string{"--health-listen=127.0.0.1:15021", "--metrics-listen=[::ffff:127.0.0.1]:15021"}, "--metrics-listen"},
		{"metrics on health's address, a host name", node, []string{"--health-listen=localhost:15021", "--metrics-listen=127.0.0.1:15021"}, "--metrics-listen"},
		{"metrics on health's port, a service name", node, []string{"--health-listen=:http", "--metrics-listen=127.0.0.1:80"}, "--metrics-listen"},
		{"metrics on health's port, 0.0.0.0 beside IPv6", node, []string{"--health-listen=0.0.0.0:15021", "--metrics-listen=[::1]:15021"}, "--metrics-listen"},
		{"metrics on health's port, IPv6 beside 0.0.0.0", node, []string{"--health-listen=[fd00::1]:15021", "--metrics-listen=0.0.0.0:15021"}, "--metrics-listen"},
		{"health host that does not resolve", node, []string{"--health-listen=health!host:15021"}, "--health-listen"},
		{"introspection on health's address", node, []string{"--health-listen=10.0.0.1:9443", "--introspection-listen=10.0.0.1:9443",
			"--introspection-tls-cert=c", "--introspection-tls-key=k", "--introspection-token-file=t"}, "--introspection-listen"},
		{"introspection address without port", node, []string{"--introspection-listen=[::1]", "--introspection-tls-cert=c",
			"--introspection-tls-key=k", "--introspection-token-file=t"}, "--introspection-listen"},
		{"introspection host that does not resolve", node, []string{"--introspection-listen=introspection!host:9443", "--introspection-tls-cert=c",
			"--introspection-tls-key=k", "--introspection-token-file=t"}, "--introspection-listen"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parse(t, c.env, "", c.args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: error %v, want one containing %q", c.args, err, c.want)
			}
		})
	}
}

func TestWithGODEBUG(t *testing.T) {
	settings := []string{"http2xconnect=1", "schedtrace=100"}
	for _, c := range []struct {
		env         []string
		want        []string
		wantChanged bool
	}{
		{[]string{"A=1"}, []string{"A=1", "GODEBUG=http2xconnect=1,schedtrace=100"}, true},
		{[]string{"GODEBUG=madvdontneed=1", "B=2"}, []string{"GODEBUG=madvdontneed=1,http2xconnect=1,schedtrace=100", "B=2"}, true},
		{[]string{"GODEBUG="}, []string{"GODEBUG=http2xconnect=1,schedtrace=100"}, true},
		{[]string{"GODEBUG=http2xconnect=1"}, []string{"GODEBUG=http2xconnect=1,schedtrace=100"}, true},
		{[]string{"GODEBUG=schedtrace=100,http2xconnect=1"}, []string{"GODEBUG=schedtrace=100,http2xconnect=1"}, false},
		// An operator who turned one off keeps it off.
		{[]string{"GODEBUG=x=1, http2xconnect=0"}, []string{"GODEBUG=x=1, http2xconnect=0,schedtrace=100"}, true},
		{[]string{"GODEBUG=schedtrace=0, http2xconnect=0"}, []string{"GODEBUG=schedtrace=0, http2xconnect=0"}, false},
	} {
		got, changed := withGODEBUG(c.env, settings)
		if !slices.Equal(got, c.want) || changed != c.wantChanged {
			t.Errorf("withGODEBUG(%q) = %q, %v; want %q, %v", c.env, got, changed, c.want, c.wantChanged)
		}
	}
}

func TestMemoryLimit(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		want    int64
		wantErr string
	}{
		{name: "unset", want: 0},
		{name: "from the downward API", env: map[string]string{"MEMORY_LIMIT": "1073741824"}, want: gib * 9 / 10},
		{name: "quantity", args: []string{"--memory-limit=1Gi"}, want: gib * 9 / 10},
		{name: "flag wins over env", env: map[string]string{"MEMORY_LIMIT": "1073741824"}, args: []string{"--memory-limit=2Gi"}, want: 2 * gib * 9 / 10},
		{name: "zero is none", args: []string{"--memory-limit=0"}, want: 0},
		{name: "negative", args: []string{"--memory-limit=-1Gi"}, wantErr: "--memory-limit"},
		{name: "garbage", args: []string{"--memory-limit=lots"}, wantErr: "--memory-limit"},
		{name: "milli, not mega", args: []string{"--memory-limit=512m"}, wantErr: "--memory-limit"},
		{name: "bytes, too few", env: map[string]string{"MEMORY_LIMIT": "4096"}, wantErr: "--memory-limit"},
		{name: "the least taken", args: []string{"--memory-limit=16Mi"}, want: 16 << 20 * 9 / 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"NODE_NAME": "n"}
			maps.Copy(env, tc.env)
			got, err := parse(t, env, "", tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.softMemoryLimit != tc.want {
				t.Errorf("soft memory limit = %d, want %d (90%% of the container's)", got.softMemoryLimit, tc.want)
			}
		})
	}
}

func TestGCHeapFloor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    uint64
		wantErr bool
	}{
		{name: "default", want: gcfloor.Default},
		{name: "quantity", args: []string{"--gc-heap-floor=128Mi"}, want: 128 << 20},
		{name: "zero turns it off", args: []string{"--gc-heap-floor=0"}, want: 0},
		{name: "negative", args: []string{"--gc-heap-floor=-1Mi"}, wantErr: true},
		{name: "garbage", args: []string{"--gc-heap-floor=big"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parse(t, map[string]string{"NODE_NAME": "n"}, "", tc.args...)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "--gc-heap-floor") {
					t.Fatalf("err = %v, want one naming --gc-heap-floor", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.gcHeapFloor != tc.want {
				t.Errorf("GC heap floor = %d, want %d", got.gcHeapFloor, tc.want)
			}
		})
	}
}
