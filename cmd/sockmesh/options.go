package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/cniwire"
	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
	"github.com/sockmesh/sockmesh/agent/resolve"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/datapath/bpffs"
	"github.com/sockmesh/sockmesh/internal/gcfloor"
)

// options are the agent's flags as typed. Every flag may also be set in the
// --config file under its own name; a flag given on the command line wins.
type options struct {
	configFile              string
	source                  string
	manifests               string
	kubeconfig              string
	nodeName                string
	proxyMode               string
	proxyListen             []string
	inPodPort               uint16
	healthListen            string
	metricsListen           string
	bpffs                   string
	accelerate              bool
	cgroup                  string
	leaderElect             bool
	leaderElectionNamespace string
	serviceCIDRs            []string
	podCIDRs                []string
	nodeCIDRs               []string
	clusterDomain           string
	dnsServers              []string
	dnsMaxStale             time.Duration
	dnsParallel             int
	egressAllow             []string
	logLevel                string
	logFormat               string
	drainTimeout            time.Duration
	handoverWait            time.Duration
	stallTimeout            time.Duration
	memoryLimit             string
	gcHeapFloor             string
	kubeAPIQPS              float32
	kubeAPIBurst            int
	maxConnsPerPod          int
	poolPodShare            string
	introspection           httpapi.Config
	cni                     cniSettings
}

// Environment variables the flags take their defaults from, as the
// DaemonSet sets them from the downward API.
const (
	envNodeName     = "NODE_NAME"     // spec.nodeName
	envPodNamespace = "POD_NAMESPACE" // metadata.namespace
	envPodName      = "POD_NAME"      // metadata.name
	envHostIP       = "HOST_IP"       // status.hostIP
	envHostIPs      = "HOST_IPS"      // status.hostIPs: comma-separated, one per family
	envMemoryLimit  = "MEMORY_LIMIT"  // resourceFieldRef limits.memory, in bytes
)

// softLimitShare is the share of --memory-limit the Go runtime's soft
// memory limit is set to. The rest is for what the runtime does not count:
// eBPF maps (charged to the agent's cgroup), the page cache, and the
// runtime's own slack. 90% is the usual choice for Go services.
const softLimitShare = 0.9

const defaultProxyPort = 15001

// minMemoryLimit is the least --memory-limit taken: the agent's heap alone
// is some megabytes, and a smaller value is a slip of units.
var minMemoryLimit = resource.MustParse("16Mi")

// addFlags defines the agent's flags on fs, with defaults read through
// getenv.
func (o *options) addFlags(fs *pflag.FlagSet, getenv func(string) string) {
	fs.StringVar(&o.configFile, "config", "", "YAML file setting any of these flags by name (e.g. proxy-mode: in-pod); flags given on the command line win")
	fs.StringVar(&o.source, "source", "kubernetes", "where the objects come from: kubernetes (watch the API server) or file (a directory of manifests)")
	fs.StringVar(&o.manifests, "manifests", "", "directory of YAML manifests (file source)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (kubernetes source; default: $KUBECONFIG, ~/.kube/config, then the in-cluster service account)")
	fs.StringVar(&o.nodeName, "node-name", getenv(envNodeName), "this node's name: only its pods are enrolled (default $"+envNodeName+"; required for the kubernetes source)")
	fs.StringVar(&o.proxyMode, "proxy-mode", string(enrol.NodeIP), "where the proxy listens: node-ip (listeners on the node's addresses, one per family) or in-pod (listeners inside each pod's network namespace)")
	fs.StringSliceVar(&o.proxyListen, "proxy-listen", nil, "node-ip mode listener addresses, IP:port, at most one per family; port 0 picks a free port (default: the first address of each family in $"+envHostIPs+", else $"+envHostIP+", else each family's default-route address: the route's src, else the first global address of its interface; port "+strconv.Itoa(defaultProxyPort)+")")
	fs.Uint16Var(&o.inPodPort, "in-pod-port", enrol.DefaultPodPort, "in-pod mode listener port, on the pod's loopback addresses")
	fs.StringVar(&o.healthListen, "health-listen", ":15021", "address serving /healthz and /readyz (empty: off; a host name is resolved once, at start, and its first IPv4 address, else its first, is bound; so for --metrics-listen and --introspection-listen)")
	fs.StringVar(&o.metricsListen, "metrics-listen", ":15090", "address serving Prometheus /metrics (empty: off; may equal --health-listen, written alike, but not overlap it on its port otherwise: localhost beside 127.0.0.1 does, and so does 0.0.0.0, which Go listens on for both families, beside any address)")
	fs.StringVar(&o.bpffs, "bpffs", bpffs.DefaultPath, "BPF filesystem holding the pinned programs, links and maps (mounted when absent)")
	fs.BoolVar(&o.accelerate, "accelerate", false, "hand bytes between apps and the proxy with sockhash/sk_msg instead of loopback TCP (Linux 6.10; a socket turns back to TCP, which pushes back, once 256 KiB went unanswered or lie unread)")
	fs.StringVar(&o.cgroup, "cgroup", "", "cgroup v2 directory the programs attach to (empty: the root of the cgroup v2 hierarchy)")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "elect one agent (a Lease) to write status and generated Services (kubernetes source); without it this agent writes them, whatever other agents do")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", getenv(envPodNamespace), "namespace of the leader Lease (default $"+envPodNamespace+")")
	fs.StringSliceVar(&o.serviceCIDRs, "service-cidr", nil, "the cluster's Service ranges, besides its ServiceCIDR objects' (Kubernetes 1.33+); external hostnames resolving into them are refused")
	fs.StringSliceVar(&o.podCIDRs, "pod-cidr", nil, "the cluster's pod ranges; external hostnames resolving into them are refused (without it, only this node's pod range, from its Node, and the pods EndpointSlices list: another node's pod that backs no Service is reachable)")
	fs.StringSliceVar(&o.nodeCIDRs, "node-cidr", nil, "the ranges of the cluster's node addresses; external hostnames resolving into them are refused (without it, only this node's addresses, from its Node, and the hostNetwork pods EndpointSlices list: another node is reachable)")
	fs.StringVar(&o.clusterDomain, "cluster-domain", "", "the cluster's DNS domain when not cluster.local; external hostnames may not be in it")
	fs.StringSliceVar(&o.dnsServers, "dns-server", nil, "DNS servers (IP or IP:port, port 53 by default; IPv6 with or without brackets) resolving ExternalHostname XBackends (default: /etc/resolv.conf)")
	fs.DurationVar(&o.dnsMaxStale, "dns-max-stale", 5*time.Minute, "how long an ExternalHostname keeps its last addresses of a family (A or AAAA) while lookups fail (SERVFAIL, timeouts, no server reachable), counted from when they were due for refresh; past it they are dropped and the XBackend fails closed on this node until a lookup answers (NXDOMAIN and NODATA empty them at once)")
	fs.IntVar(&o.dnsParallel, "dns-parallel", 64, "DNS lookups of ExternalHostname XBackends under way at once, so that many names do not flood the DNS servers; the others wait their turn")
	fs.StringSliceVar(&o.egressAllow, "egress-allow", nil, "hostname patterns (example.com, *.example.com) ExternalHostname XBackends may use (default: any)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: json or text")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 20*time.Second, "on SIGTERM, how long connections may drain before those still open are reset (never closed: a cut answer must not read as complete)")
	fs.DurationVar(&o.handoverWait, "handover-wait", 0, "on SIGTERM, how long the agent serves on, before it drains, while no newer agent answers ready on --health-listen (a rolling update's successor, or a deleted pod's replacement, still starting; agents tell each other apart by their container, the mount namespace); it stops at once when one does, or when `sockmesh uninstall` removed capture (0: stop at once, as where no agent follows)")
	fs.DurationVar(&o.stallTimeout, "stall-timeout", 60*time.Second, "how long an app may leave a read of its request body, or a write of the answer to it, under way with no byte through before the proxy ends the request (reset, counted as app_stalled): a pod that stops mid-upload or stops reading would otherwise hold one of an endpoint's upstream connections, which every pod on the node shares; a quiet answer stream (server-sent events, gRPC streaming) waits on the backend and is never cut")
	// client-go's own default, 5 requests/s, makes an agent that watches
	// a hundred referenced CA ConfigMaps (one watch each) wait 20 s to
	// start them, past the 10 s after which it treats them as missing.
	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", 100, "requests per second to the API server (kubernetes source), sustained")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 200, "requests to the API server in a burst (kubernetes source)")
	// A default a pod hardly reaches (its connections through the proxy
	// at once), yet low enough that one pod cannot take most of the memory
	// of an agent limited to 512 MiB (some 10–20 KiB per idle connection).
	fs.IntVar(&o.maxConnsPerPod, "max-conns-per-pod", 4096, "connections one pod may have open through the proxy at once, IPv4 and IPv6 together (enrolled hostNetwork pods, which share the node's addresses, share one count; in node-ip mode a source address no enrolled pod holds has its own); past it, its new ones are reset, counted and logged, so that one app opening connections without end cannot take the proxy from every other pod (0: no limit)")
	fs.StringVar(&o.poolPodShare, "pool-pod-share", "87.5%", "the most of the HTTP/1.1 connections the proxy may open to one backend endpoint (1024, shared by the node's pods) that one pod may hold at once, as a percentage, rounded up to a whole connection: the rest stays for the other pods, so that one whose exchanges never end (event streams, long polls) does not leave their requests to the endpoint failing pool_busy; 100% keeps none back")
	fs.StringVar(&o.gcHeapFloor, "gc-heap-floor", resource.NewQuantity(gcfloor.Default, resource.BinarySI).String(), "heap the Go garbage collector lets grow before it collects (bytes or a quantity; 0: GOGC alone): a proxy with a small heap otherwise collects many times a second under load; above the floor GOGC applies, and the soft memory limit always wins")
	fs.StringVar(&o.memoryLimit, "memory-limit", getenv(envMemoryLimit), "memory the agent's container may use (bytes, or a quantity like 512Mi; at least "+minMemoryLimit.String()+"): the Go runtime's soft memory limit is set to 90% of it, so that the GC works harder before the OOM killer would end the agent; $GOMEMLIMIT, when set, wins (default $"+envMemoryLimit+"; empty or 0: no soft limit)")
	in := &o.introspection
	fs.StringVar(&in.Socket, "introspection-socket", httpapi.DefaultSocket, "unix socket serving the read-only introspection API (sockmeshctl), mode 0600")
	fs.StringVar(&in.Group, "introspection-group", "", "group (name or ID) that may also use the introspection socket (mode 0660)")
	fs.StringVar(&in.Listen, "introspection-listen", "", "TCP address serving the introspection API to remote sockmeshctl, with TLS and a bearer token (empty: off)")
	fs.StringVar(&in.TLSCertFile, "introspection-tls-cert", "", "TLS certificate of --introspection-listen (loaded again when it or the key changes)")
	fs.StringVar(&in.TLSKeyFile, "introspection-tls-key", "", "TLS key of --introspection-listen")
	fs.StringVar(&in.TokenFile, "introspection-token-file", "", "file holding the bearer token remote clients of --introspection-listen must send (read at each request)")
	c := &o.cni
	fs.StringVar(&c.socket, "cni-socket", "", "unix socket serving sockmesh-cni's handovers, in a directory only root may enter (the DaemonSet: "+cniwire.DefaultSocket+"; empty: off)")
	fs.StringVar(&c.confDir, "cni-conf-dir", "", "the node's CNI conf directory: the agent chains sockmesh-cni into the network configuration the runtime uses there, and installs its binary in --cni-bin-dir (needs --cni-socket; empty: off; sockmesh uninstall --cni-conf-dir removes both)")
	fs.StringVar(&c.binDir, "cni-bin-dir", "/opt/cni/bin", "the node's CNI bin directory (with --cni-conf-dir)")
	fs.StringVar(&c.plugin, "cni-plugin", "", "the sockmesh-cni binary --cni-conf-dir installs (default: sockmesh-cni beside the agent's binary, as in its image)")
	fs.DurationVar(&c.timeout, "cni-timeout", 10*time.Second, "how long sockmesh-cni's ADD waits for the agent before it fails (the kubelet then makes the pod's sandbox again later); --cni-conf-dir writes it into the plugin's entry, and the agent gives a handover four fifths of it, for the plugin to read its reason")
	fs.StringSliceVar(&c.exempt, "cni-exempt-namespace", []string{"kube-system"}, "namespaces whose pods sockmesh-cni lets start when the agent cannot enrol them (the cluster's own, which bringing the agent back may need); other pods wait for the agent")
}

// applyConfigFile sets, from the YAML file at path, every flag of fs the
// command line did not set. Keys are flag names; lists may be YAML lists.
// Unknown keys are errors, so that a typo is not silently ignored.
func applyConfigFile(fs *pflag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config file: %w", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("parse config file %s: %w", path, err)
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	slices.Sort(keys) // report the first bad key deterministically
	for _, key := range keys {
		f := fs.Lookup(key)
		if f == nil || key == "config" {
			return fmt.Errorf("config file %s: unknown key %q (keys are the agent's flag names)", path, key)
		}
		if f.Changed {
			continue
		}
		if err := setFlag(f, doc[key]); err != nil {
			return fmt.Errorf("config file %s: %s: %w", path, key, err)
		}
	}
	return nil
}

// setFlag sets f from a value decoded from YAML (through JSON: numbers are
// float64).
func setFlag(f *pflag.Flag, v any) error {
	switch v := v.(type) {
	case []any:
		sv, ok := f.Value.(pflag.SliceValue)
		if !ok {
			return fmt.Errorf("takes one %s, not a list", f.Value.Type())
		}
		items := make([]string, len(v))
		for i, item := range v {
			s, err := scalar(item)
			if err != nil {
				return fmt.Errorf("item %d: %w", i, err)
			}
			items[i] = s
		}
		return sv.Replace(items)
	case nil:
		return errors.New("has no value")
	default:
		s, err := scalar(v)
		if err != nil {
			return err
		}
		// A list flag given one string takes it as on the command line:
		// comma-separated.
		return f.Value.Set(s)
	}
}

func scalar(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case bool:
		return strconv.FormatBool(v), nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	}
	return "", fmt.Errorf("unexpected %T value", v)
}

// settings are the options checked and parsed: what the agent runs with.
type settings struct {
	source     string // "kubernetes" or "file"
	manifests  string
	kubeconfig string
	nodeName   string
	podName    string // for the leader identity
	mode       enrol.Mode
	// proxyListen are the node-ip listeners (empty in in-pod mode).
	proxyListen []netip.AddrPort
	inPodPort   uint16
	// healthListen, metricsListen and introspection.Listen are IP:port,
	// their flags' host names resolved (listenAddr), or empty: off.
	healthListen  string
	metricsListen string
	bpffs         string
	accelerate    bool
	cgroup        string
	leaderElect   bool
	leaderNS      string
	// node is what the control plane is told about the node and cluster;
	// its IPs are the proxy's node addresses (the control plane joins the
	// node's others as they change).
	node translate.Node
	// dns is the resolver's configuration (--dns-server, --dns-max-stale,
	// --dns-parallel).
	dns          resolve.Config
	logLevel     slog.Level
	logJSON      bool
	drainTimeout time.Duration
	handoverWait time.Duration
	// softMemoryLimit is the Go runtime's soft memory limit in bytes from
	// --memory-limit (0: none).
	softMemoryLimit int64
	// gcHeapFloor is the heap the GC lets grow before collecting
	// (internal/gcfloor; 0: GOGC alone).
	gcHeapFloor uint64
	// kubeQPS and kubeBurst rate-limit the kubernetes source's clients.
	kubeQPS   float32
	kubeBurst int
	// maxConnsPerPod is the proxy's MaxConnsPerClient.
	maxConnsPerPod int
	// poolPodShare is the proxy's upstream ClientShare, from
	// --pool-pod-share: a fraction in (0, 1].
	poolPodShare float64
	// stallTimeout is the proxy's StallTimeout.
	stallTimeout time.Duration
	// introspection is the introspection API server's configuration.
	introspection httpapi.Config
	// cni is the CNI handover's (cni.go).
	cni cniSettings
}

// hostNetns reads the node's default-route addresses from the agent's
// network namespace, the node's (the DaemonSet runs in hostNetwork): a
// *podns.NS.
type hostNetns interface {
	DefaultRouteAddrs() ([]netip.Addr, error)
}

// load applies the --config file under the flags parsed into fs, and
// checks the result (see settings).
func (o *options) load(fs *pflag.FlagSet, getenv func(string) string, host hostNetns) (settings, error) {
	if o.configFile != "" {
		if err := applyConfigFile(fs, o.configFile); err != nil {
			return settings{}, err
		}
	}
	return o.settings(getenv, host)
}

// settings checks o. host's default-route addresses are --proxy-listen's
// default, read only in node-ip mode without --proxy-listen, $HOST_IPS and
// $HOST_IP.
func (o *options) settings(getenv func(string) string, host hostNetns) (settings, error) {
	s := settings{
		source: o.source, manifests: o.manifests, kubeconfig: o.kubeconfig, nodeName: o.nodeName,
		podName: getenv(envPodName), mode: enrol.Mode(o.proxyMode), inPodPort: o.inPodPort,
		healthListen: o.healthListen, metricsListen: o.metricsListen, bpffs: o.bpffs, accelerate: o.accelerate, cgroup: o.cgroup,
		leaderElect: o.leaderElect, leaderNS: o.leaderElectionNamespace, drainTimeout: o.drainTimeout,
		handoverWait: o.handoverWait, introspection: o.introspection, kubeQPS: o.kubeAPIQPS, kubeBurst: o.kubeAPIBurst, maxConnsPerPod: o.maxConnsPerPod,
		stallTimeout: o.stallTimeout, cni: o.cni,
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	// Files are checked here, at start: found missing when first read, they
	// stopped the agent only after it had taken the datapath and the node's
	// listeners over from the agent it was to replace.
	switch s.source {
	case "file":
		if s.manifests == "" {
			bad("--source=file needs --manifests")
		} else if err := isDir(s.manifests); err != nil {
			bad("--manifests=%q: %w", s.manifests, err)
		}
		if s.kubeconfig != "" {
			bad("--kubeconfig applies to --source=kubernetes only")
		}
		if s.leaderElect {
			bad("--leader-elect needs --source=kubernetes (the file source writes no status)")
		}
	case "kubernetes":
		if s.nodeName == "" {
			bad("--source=kubernetes needs --node-name (or $%s)", envNodeName)
		}
		if s.leaderElect && s.leaderNS == "" {
			bad("--leader-elect needs --leader-election-namespace (or $%s)", envPodNamespace)
		} else if msgs := validation.IsDNS1123Label(s.leaderNS); s.leaderElect && len(msgs) > 0 {
			bad("--leader-election-namespace=%q: not a namespace name: %s", s.leaderNS, strings.Join(msgs, "; "))
		}
		if s.manifests != "" {
			bad("--manifests applies to --source=file only")
		}
		if s.kubeconfig != "" {
			if _, err := os.Stat(s.kubeconfig); err != nil {
				bad("--kubeconfig=%q: %w", s.kubeconfig, err)
			}
		}
	default:
		bad("--source=%q: want kubernetes or file", s.source)
	}

	switch s.mode {
	case enrol.NodeIP:
		addrs, err := proxyListen(o.proxyListen, getenv, host.DefaultRouteAddrs)
		if err != nil {
			errs = append(errs, err)
		}
		s.proxyListen = addrs
		for _, a := range addrs {
			s.node.IPs = append(s.node.IPs, a.Addr())
		}
	case enrol.InPod:
		if len(o.proxyListen) > 0 {
			bad("--proxy-listen applies to --proxy-mode=node-ip only (in-pod listeners use --in-pod-port)")
		}
		if s.inPodPort == 0 {
			bad("--in-pod-port must not be 0: enrolments name the port before the listener opens")
		}
	default:
		bad("--proxy-mode=%q: want node-ip or in-pod", o.proxyMode)
	}
	var err error
	if s.node.ServiceCIDRs, err = prefixes("--service-cidr", o.serviceCIDRs); err != nil {
		errs = append(errs, err)
	}
	if s.node.PodCIDRs, err = prefixes("--pod-cidr", o.podCIDRs); err != nil {
		errs = append(errs, err)
	}
	if s.node.NodeCIDRs, err = prefixes("--node-cidr", o.nodeCIDRs); err != nil {
		errs = append(errs, err)
	}
	s.node.ClusterDomain = strings.TrimSuffix(o.clusterDomain, ".")
	if msgs := validation.IsDNS1123Subdomain(s.node.ClusterDomain); s.node.ClusterDomain != "" && len(msgs) > 0 {
		bad("--cluster-domain=%q: not a DNS domain: %s", o.clusterDomain, strings.Join(msgs, "; "))
	}
	if s.cgroup != "" {
		if err := isDir(s.cgroup); err != nil {
			bad("--cgroup=%q: %w", s.cgroup, err)
		}
	}
	for _, p := range o.egressAllow {
		if err := checkEgressPattern(p); err != nil {
			bad("--egress-allow=%q: %w", p, err)
		}
	}
	s.node.EgressAllow = o.egressAllow
	for _, flag := range o.dnsServers {
		d := flag
		if _, _, err := net.SplitHostPort(d); err != nil {
			// No port: 53. An IPv6 address may come in brackets, as
			// beside a port (netip refuses an IPv4 one in brackets).
			if strings.HasPrefix(d, "[") {
				d += ":53"
			} else {
				d = net.JoinHostPort(d, "53")
			}
		}
		if ap, err := netip.ParseAddrPort(d); err != nil || ap.Port() == 0 {
			bad("--dns-server=%q: want an IP address, optionally with :port (not 0)", flag)
			continue
		}
		s.dns.Servers = append(s.dns.Servers, d)
	}
	// resolve.Config reads zero as its default: refuse it here, so a flag
	// that says 0 is not silently taken for 5m or 64.
	if s.dns.MaxStale = o.dnsMaxStale; s.dns.MaxStale <= 0 {
		bad("--dns-max-stale must be positive")
	}
	if s.dns.Parallel = o.dnsParallel; s.dns.Parallel <= 0 {
		bad("--dns-parallel must be positive")
	}
	if err := s.logLevel.UnmarshalText([]byte(o.logLevel)); err != nil {
		bad("--log-level=%q: want debug, info, warn or error", o.logLevel)
	}
	switch o.logFormat {
	case "json":
		s.logJSON = true
	case "text":
	default:
		bad("--log-format=%q: want json or text", o.logFormat)
	}
	if s.drainTimeout < 0 {
		bad("--drain-timeout must not be negative")
	}
	switch {
	case s.handoverWait < 0:
		bad("--handover-wait must not be negative")
	case s.handoverWait > 0 && s.healthListen == "":
		bad("--handover-wait needs --health-listen: a newer agent is seen ready there")
	}
	// NaN and +Inf parse as float32s: client-go's rate limiter would take
	// them.
	if !(s.kubeQPS > 0) || math.IsInf(float64(s.kubeQPS), 1) || s.kubeBurst <= 0 {
		bad("--kube-api-qps and --kube-api-burst must be positive numbers")
	}
	if s.stallTimeout <= 0 {
		bad("--stall-timeout must be positive")
	}
	if s.maxConnsPerPod < 0 {
		bad("--max-conns-per-pod must not be negative (0: no limit)")
	}
	if s.poolPodShare, err = percentage(o.poolPodShare); err != nil {
		bad("--pool-pod-share=%q: %w", o.poolPodShare, err)
	}
	if o.memoryLimit != "" {
		q, err := resource.ParseQuantity(o.memoryLimit)
		if err != nil || q.Sign() < 0 {
			bad("--memory-limit=%q: want bytes or a quantity such as 512Mi", o.memoryLimit)
		} else if q.Sign() > 0 && q.Cmp(minMemoryLimit) < 0 {
			// "512m" is 0.512 bytes: taken, it set no limit, and a few
			// bytes more a limit the GC would collect against without end.
			bad("--memory-limit=%q is below %s: a unit missing (512Mi, not 512m)?", o.memoryLimit, minMemoryLimit.String())
		} else {
			s.softMemoryLimit = int64(float64(q.Value()) * softLimitShare)
		}
	}
	if q, err := resource.ParseQuantity(o.gcHeapFloor); err != nil || q.Sign() < 0 {
		bad("--gc-heap-floor=%q: want bytes or a quantity such as 64Mi", o.gcHeapFloor)
	} else {
		s.gcHeapFloor = uint64(q.Value())
	}
	errs = append(errs, checkListeners(&s)...)
	if s.introspection.Socket == "" {
		bad("--introspection-socket must not be empty")
	}
	// Found only when the socket opened, an unknown group stopped the
	// agent after it had opened the datapath.
	if g := s.introspection.Group; g != "" {
		if _, err := httpapi.LookupGroup(g); err != nil {
			bad("--introspection-group=%q: %w", g, err)
		}
	}
	errs = append(errs, checkIntrospectionTLS(s.introspection)...)
	if s.cni.confDir != "" && s.cni.socket == "" {
		bad("--cni-conf-dir needs --cni-socket: the plugin it chains hands pods over there")
	}
	if s.cni.timeout < time.Second {
		bad("--cni-timeout must be at least 1s: a handover may wait for the agent's first Snapshot to list the pod")
	}
	return s, errors.Join(errs...)
}

// checkIntrospectionTLS refuses TLS flags without --introspection-listen
// (they would be ignored), and --introspection-listen without them or with
// files that cannot be used.
func checkIntrospectionTLS(in httpapi.Config) []error {
	anyTLS := in.TLSCertFile != "" || in.TLSKeyFile != "" || in.TokenFile != ""
	switch {
	case in.Listen == "" && anyTLS:
		return []error{errors.New("--introspection-tls-cert, --introspection-tls-key and --introspection-token-file apply to --introspection-listen only")}
	case in.Listen == "":
		return nil
	case in.TLSCertFile == "" || in.TLSKeyFile == "" || in.TokenFile == "":
		return []error{errors.New("--introspection-listen needs --introspection-tls-cert, --introspection-tls-key and --introspection-token-file")}
	}
	var errs []error
	if _, err := tls.LoadX509KeyPair(in.TLSCertFile, in.TLSKeyFile); err != nil {
		errs = append(errs, fmt.Errorf("--introspection-tls-cert=%q, --introspection-tls-key=%q: %w", in.TLSCertFile, in.TLSKeyFile, err))
	}
	// Read at each request, so that it may be rotated; it must exist now.
	if _, err := os.Stat(in.TokenFile); err != nil {
		errs = append(errs, fmt.Errorf("--introspection-token-file=%q: %w", in.TokenFile, err))
	}
	return errs
}

// percentage parses a share written as a percentage, "87.5%", into a
// fraction in (0, 1]. The % sign is required: a bare 0.875, meant as a
// fraction, would otherwise be taken for less than 1%.
func percentage(v string) (float64, error) {
	num, ok := strings.CutSuffix(strings.TrimSpace(v), "%")
	p, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if !ok || err != nil || !(p > 0 && p <= 100) { // NaN fails too
		return 0, errors.New("want a percentage above 0% and at most 100%, such as 87.5%")
	}
	return p / 100, nil
}

// isDir reports, as an error, why path is not a directory.
func isDir(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errors.New("not a directory")
	}
	return nil
}

// checkEgressPattern refuses an --egress-allow pattern that no hostname
// can match (translate compares them case-insensitively, spaces trimmed):
// a scheme, a port, or a wildcard other than a leading "*." would leave
// every ExternalHostname XBackend it was meant to allow refused.
func checkEgressPattern(p string) error {
	name := strings.TrimPrefix(strings.ToLower(strings.TrimSpace(p)), "*.")
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return fmt.Errorf("want a hostname or *.hostname: %s", strings.Join(msgs, "; "))
	}
	return nil
}

// checkListeners resolves the host names of --health-listen,
// --metrics-listen and --introspection-listen in s to the addresses they
// will bind, and refuses listeners that would share connections with one
// another or with --proxy-listen.
func checkListeners(s *settings) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	// A listener address wants host:port, and a host that resolves.
	// Found only when it opened, a bad --introspection-listen stopped the
	// agent after the datapath and the node listeners had taken over from
	// an older agent.
	type listen struct {
		flag, written string
		addr          netip.AddrPort
	}
	var listens []listen // the valid ones
	for _, a := range s.proxyListen {
		listens = append(listens, listen{"--proxy-listen", a.String(), a})
	}
	resolved := map[string]netip.AddrPort{} // by address as written
	for _, l := range []struct {
		flag    string
		address *string
	}{{"--health-listen", &s.healthListen}, {"--metrics-listen", &s.metricsListen},
		{"--introspection-listen", &s.introspection.Listen}} {
		written := *l.address
		if written == "" {
			continue
		}
		addr, ok := resolved[written]
		if !ok {
			var err error
			if addr, err = listenAddr(written); err != nil {
				bad("%s=%q: %w", l.flag, written, err)
				continue
			}
			resolved[written] = addr
		}
		listens = append(listens, listen{l.flag, written, addr})
		// A host name: the listener binds the address checked here, which
		// a lookup at bind could give otherwise (round-robin DNS). An IP
		// or no host is bound as written (":15021" falls back to IPv4
		// where IPv6 is off, where "[::]:15021" fails).
		if host, _, _ := net.SplitHostPort(written); host != "" && net.ParseIP(host) == nil {
			*l.address = addr.String()
		}
	}
	// Each listener takes its address over from any other on it
	// (datapath/takeover), the next agent's of a rolling update as this
	// agent's own: /healthz answered 404 once --metrics-listen=0.0.0.0:15021
	// had taken --health-listen=:15021 over; and a listener on one address
	// takes the connections to it from another on the unspecified one:
	// one on a proxy address would take the redirected connections, a proxy
	// on the node IP the kubelet's probes. Health and metrics share one
	// listener only when given the same address as written.
	for i, a := range listens {
		for _, b := range listens[i+1:] {
			sameSite := a.written == b.written && a.flag == "--health-listen" && b.flag == "--metrics-listen"
			if overlap(a.addr, b.addr) && !sameSite {
				bad("%s=%q is on %s=%q's port: give another port (health and metrics may share one address, written alike)", b.flag, b.written, a.flag, a.written)
			}
		}
	}
	return errs
}

// listenAddr is the socket address net.Listen("tcp", address) binds: the
// port may be a service name; a host name is its first IPv4 address, else
// its first; and an unspecified host, 0.0.0.0 as well, is [::], where Go
// listens on both families (one dual-stack socket, IPV6_V6ONLY off).
func listenAddr(address string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("want host:port (an IPv6 host in brackets): %w", err)
	}
	ctx := context.Background()
	p, err := net.DefaultResolver.LookupPort(ctx, "tcp", port)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("resolve the port: %w", err)
	}
	ip := netip.IPv6Unspecified()
	if host != "" {
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("resolve the host: %w", err)
		}
		ip = ips[0]
		if i := slices.IndexFunc(ips, func(a netip.Addr) bool { return a.Unmap().Is4() }); i >= 0 {
			ip = ips[i]
		}
		if ip = ip.Unmap(); ip.IsUnspecified() {
			ip = netip.IPv6Unspecified()
		}
	}
	return netip.AddrPortFrom(ip, uint16(p)), nil
}

// overlap reports whether listeners on a and b (listenAddr's) would share
// connections: on one port, not 0, at the same address or one of them on
// the unspecified one, which takes every address of both families.
func overlap(a, b netip.AddrPort) bool {
	return a.Port() == b.Port() && a.Port() != 0 &&
		(a.Addr() == b.Addr() || a.Addr().IsUnspecified() || b.Addr().IsUnspecified())
}

// proxyListen parses --proxy-listen, or makes its default: the node's
// addresses (nodeAddrs) on port 15001.
func proxyListen(flag []string, getenv func(string) string, hostIPs func() ([]netip.Addr, error)) ([]netip.AddrPort, error) {
	if len(flag) == 0 {
		ips, err := nodeAddrs(getenv, hostIPs)
		if err != nil {
			return nil, err
		}
		out := make([]netip.AddrPort, len(ips))
		for i, ip := range ips {
			out[i] = netip.AddrPortFrom(ip, defaultProxyPort)
		}
		return out, nil
	}
	var out []netip.AddrPort
	for _, s := range flag {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return nil, fmt.Errorf("--proxy-listen=%q: want IP:port: %w", s, err)
		}
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if a := ap.Addr(); a.IsUnspecified() || a.IsLoopback() || (a.Is6() && a.IsLinkLocalUnicast()) {
			// Pods redirect to this address from their own namespaces:
			// it must be one they reach, and name one listener. An IPv6
			// link-local one is on the node's side of one link, and a
			// connect redirected to it has no scope (interface) to reach
			// it by: the kernel fails it (EINVAL), as a fail-closed
			// Service's every IPv6 connection then would.
			return nil, fmt.Errorf("--proxy-listen=%q: want a node address pods can reach, not %s", s, a)
		}
		if slices.ContainsFunc(out, func(o netip.AddrPort) bool { return o.Addr().Is4() == ap.Addr().Is4() }) {
			return nil, fmt.Errorf("--proxy-listen: at most one address per family, got %q", flag)
		}
		out = append(out, ap)
	}
	return out, nil
}

// nodeAddrs are the node addresses the proxy listens on by default: the
// first of each family in $HOST_IPS, else $HOST_IP, else hostIPs (the
// default route's address of each family, for an agent run by hand). A
// dual-stack node needs both families: a pod's connection finds no listener
// in a family the node does not listen in, and one to a fail-closed Service
// is then refused.
func nodeAddrs(getenv func(string) string, hostIPs func() ([]netip.Addr, error)) ([]netip.Addr, error) {
	var out []netip.Addr
	for s := range strings.SplitSeq(getenv(envHostIPs), ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("$%s=%q: want IP addresses, comma-separated: %w", envHostIPs, getenv(envHostIPs), err)
		}
		ip = ip.Unmap()
		if !slices.ContainsFunc(out, func(o netip.Addr) bool { return o.Is4() == ip.Is4() }) {
			out = append(out, ip)
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	if v := getenv(envHostIP); v != "" {
		// Set and wrong (a typo in the DaemonSet), it must not give way
		// to the default route's address, which may not be the one pods
		// reach.
		ip, err := netip.ParseAddr(v)
		if err != nil {
			return nil, fmt.Errorf("$%s=%q: want an IP address: %w", envHostIP, v, err)
		}
		return []netip.Addr{ip.Unmap()}, nil
	}
	ips, err := hostIPs()
	if err != nil {
		return nil, fmt.Errorf("find the node addresses for the proxy listeners (set --proxy-listen): %w", err)
	}
	return ips, nil
}

func prefixes(flag string, values []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range values {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", flag, v, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
