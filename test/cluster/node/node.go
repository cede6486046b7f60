package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/childproc"
)

// Defaults of Config's zero values.
const (
	DefaultDir  = "/var/lib/sockmesh-node"
	DefaultName = "sockmesh-e2e"
	// PauseImage is the sandbox image Up builds from ./pause and imports.
	PauseImage = "localhost/sockmesh-pause:dev"
	// LockPath is the lock a running node holds. It is one per machine,
	// whatever Config.Dir says: nodes share the node IP, bridge, ports and
	// the paths components hard-code.
	LockPath = "/run/lock/sockmesh-node.lock"
	// PausePackage is the pause program's import path.
	PausePackage = "github.com/sockmesh/sockmesh/test/cluster/node/pause"
	// systemCNIBinDir holds the Debian package's CNI plugins the node runs.
	systemCNIBinDir = "/usr/lib/cni"
)

// cniPlugins are the CNI plugins the node runs: its conflist's and the
// loopback containerd sets up in every sandbox.
var cniPlugins = []string{"bridge", "host-local", "loopback"}

var (
	// DefaultIP is the node IP: a /32 on lo (the VM has no dummy netdev
	// driver), in a range nothing else on this machine uses.
	DefaultIP = netip.MustParseAddr("10.250.0.1")
	// DefaultPodCIDR is the pod network on the node's bridge.
	DefaultPodCIDR = netip.MustParsePrefix("10.244.0.0/24")
)

// ErrMissing reports that this machine lacks a program the node needs (a
// Kubernetes binary not built yet, a Debian package not installed). Tests
// skip on it outside CI.
var ErrMissing = errors.New("node prerequisite missing")

// Config describes the node. The zero value is a node named DefaultName at
// DefaultIP working in DefaultDir with the cached binaries.
type Config struct {
	// Binaries locate etcd and the Kubernetes components (Binaries.Dir holds
	// kubelet, kube-proxy, ...). Zero: apiserver.FindBinaries.
	Binaries apiserver.Binaries
	// Dir holds everything the node writes: PKI, configs, logs, etcd's data,
	// containerd's root and state, the kubelet's root. It is fixed rather
	// than temporary so that the next run finds what a crashed one left.
	// Up removes whatever it holds; Down removes it. Zero: DefaultDir.
	Dir string
	// Name is the node's name. Zero: DefaultName.
	Name string
	// IP is the node IP, added to lo as a /32 for the node's lifetime; it
	// must not be in use. Zero: DefaultIP.
	IP netip.Addr
	// PodCIDR is the pod network. Zero: DefaultPodCIDR.
	PodCIDR netip.Prefix
	// Images are docker-archive tarballs (see BuildImage) imported before
	// the kubelet starts.
	Images []string
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

// Node is a running single-node cluster.
type Node struct {
	Name    string
	IP      netip.Addr
	PodCIDR netip.Prefix
	Dir     string
	// Kubeconfig is an admin (system:masters) kubeconfig file; Config and
	// Kube are the same identity.
	Kubeconfig string
	Config     *rest.Config
	Kube       kubernetes.Interface
	Binaries   apiserver.Binaries
	// CNIConfDir and CNIBinDir are containerd's CNI directories, under
	// Dir: a test may chain a plugin into the network configuration there
	// and install its binary without touching the host's. Down removes
	// both.
	CNIConfDir, CNIBinDir string

	log      *slog.Logger
	lay      *layout
	led      *ledger
	lock     *lockFile
	certs    *certs
	before   HostState
	procs    map[string]*childproc.Process
	downOnce sync.Once
	downErr  error
}

func (c Config) withDefaults() (Config, error) {
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	if !filepath.IsAbs(c.Dir) {
		return c, fmt.Errorf("node dir %q is not absolute", c.Dir)
	}
	c.Dir = filepath.Clean(c.Dir)
	if c.Name == "" {
		c.Name = DefaultName
	}
	if !c.IP.IsValid() {
		c.IP = DefaultIP
	}
	if !c.IP.Is4() {
		return c, fmt.Errorf("node IP %s: only IPv4 is supported", c.IP)
	}
	if !c.PodCIDR.IsValid() {
		c.PodCIDR = DefaultPodCIDR
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Binaries.Dir == "" {
		b, err := apiserver.FindBinaries()
		if err != nil {
			return c, fmt.Errorf("%w: %w", ErrMissing, err)
		}
		c.Binaries = b
	}
	return c, nil
}

func newLayout(c Config) *layout {
	d := c.Dir
	return &layout{
		Dir: d, PKI: filepath.Join(d, "pki"), Logs: filepath.Join(d, "logs"), Etcd: filepath.Join(d, "etcd"),
		ContainerdConfig: filepath.Join(d, "containerd", "config.toml"),
		ContainerdRoot:   filepath.Join(d, "containerd", "root"),
		ContainerdState:  filepath.Join(d, "containerd", "state"),
		ContainerdSocket: filepath.Join(d, "containerd", "containerd.sock"),
		ContainerdOpt:    filepath.Join(d, "containerd", "opt"),
		RuncRoot:         filepath.Join(d, "containerd", "runc"),
		CNIConfDir:       filepath.Join(d, "cni", "net.d"),
		CNIDataDir:       filepath.Join(d, "cni", "networks"),
		CNIBinDir:        filepath.Join(d, "cni", "bin"),
		CNINetwork:       "sockmesh-node",
		Bridge:           "sockmesh0",
		KubeletRoot:      filepath.Join(d, "kubelet"),
		KubeletConfig:    filepath.Join(d, "kubelet.yaml"),
		PodLogs:          filepath.Join(d, "pod-logs"),
		KubeProxyConfig:  filepath.Join(d, "kube-proxy.yaml"),
		Name:             c.Name, IP: c.IP.String(), PodCIDR: c.PodCIDR.String(),
		ServiceCIDR: apiserver.ServiceCIDR, PauseImage: PauseImage,
		KubeProxyBin: kubeProxyBin(c.Binaries),
	}
}

// hostPrograms are the programs of Debian packages the node runs.
var hostPrograms = []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "iptables-restore", "conntrack", "go"}

func checkPrereqs(c Config) error {
	var missing []string
	for _, p := range hostPrograms {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	for _, p := range cniPlugins {
		if _, err := os.Stat(filepath.Join(systemCNIBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(systemCNIBinDir, p))
		}
	}
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"} {
		if _, err := os.Stat(filepath.Join(c.Binaries.Dir, b)); err != nil {
			missing = append(missing, filepath.Join(c.Binaries.Dir, b)+" (run test/cluster/build-binaries.sh)")
		}
	}
	if _, err := os.Stat(c.Binaries.Etcd); err != nil {
		missing = append(missing, c.Binaries.Etcd+" (run test/cluster/build-binaries.sh)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %q (Debian: containerd runc containernetworking-plugins conntrack iptables)", ErrMissing, missing)
	}
	return nil
}

// Up brings the node up and returns once it is Ready, kube-proxy has
// synced and the default ServiceAccount exists. It first undoes what a
// crashed earlier run left (see Clean). On failure it takes down what it
// started and returns the error with the failing component's log. The
// caller must call Down.
func Up(ctx context.Context, cfg Config) (_ *Node, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	if err := checkPrereqs(cfg); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: root", ErrMissing)
	}
	start := time.Now()
	log := cfg.Logger.With("component", "node")
	lay := newLayout(cfg)
	n := &Node{
		Name: cfg.Name, IP: cfg.IP, PodCIDR: cfg.PodCIDR, Dir: cfg.Dir, Binaries: cfg.Binaries,
		CNIConfDir: lay.CNIConfDir, CNIBinDir: lay.CNIBinDir,
		log: log, lay: lay, procs: map[string]*childproc.Process{},
	}
	if n.lock, err = acquireLock(ctx, LockPath); err != nil {
		return nil, err
	}
	if err := clean(ctx, lay, log); err != nil {
		n.lock.release()
		return nil, fmt.Errorf("clean up an earlier run: %w", err)
	}
	if err := n.up(ctx, cfg); err != nil {
		if n.led == nil {
			// Nothing on the host changed yet: only Dir's files to remove.
			err = errors.Join(err, removeTree(cfg.Dir))
			n.lock.release()
		} else {
			err = errors.Join(err, n.Down())
		}
		return nil, err
	}
	log.Info("node up", "name", n.Name, "ip", n.IP.String(), "duration", time.Since(start).Round(time.Millisecond).String())
	return n, nil
}

// up brings the node up; the caller holds the lock and, once n.led is set,
// must call Down on failure.
func (n *Node) up(ctx context.Context, cfg Config) error {
	lay := n.lay
	// The machine as Down must leave it.
	var err error
	if n.before, err = ReadHostState(ctx, cfg); err != nil {
		return err
	}
	// What can fail without touching the host comes first.
	if err := os.MkdirAll(lay.Logs, 0o700); err != nil {
		return fmt.Errorf("create node dir: %w", err)
	}
	images := append([]string{filepath.Join(cfg.Dir, "pause.tar")}, cfg.Images...)
	if err := BuildImage(ctx, PausePackage, PauseImage, images[0]); err != nil {
		return err
	}
	cgroups, err := cgroupCandidates()
	if err != nil {
		return err
	}
	led := &ledger{
		path:             filepath.Join(cfg.Dir, "state.json"),
		Owner:            os.Getpid(),
		Procs:            map[string]procRecord{},
		Containerd:       lay.ContainerdSocket,
		ContainerdConfig: lay.ContainerdConfig,
		Sysctls:          readSysctls(watchedSysctls),
		Absent:           absentPaths(append(append([]string{}, hardcodedPaths...), cgroups...)),
		Netns:            listNetns(),
		NetnsDir:         exists("/run/netns"),
		Bridge:           lay.Bridge,
		CNINetwork:       lay.CNINetwork,
	}
	led.NFTTables, led.NFTKnown = nftTables(ctx)
	if err := led.save(); err != nil {
		return err
	}
	n.led = led

	if err := n.prepareHost(); err != nil {
		return err
	}
	if err := n.writeFiles(); err != nil {
		return err
	}
	if err := n.startControlPlane(ctx); err != nil {
		return err
	}
	if err := n.startRuntime(ctx, images); err != nil {
		return err
	}
	return n.startNode(ctx)
}

// prepareHost makes the host changes, each recorded in the ledger first.
func (n *Node) prepareHost() error {
	n.led.LoAddr = netip.PrefixFrom(n.IP, 32).String()
	n.led.IPTables = true // the kubelet and kube-proxy write chains
	if err := n.led.save(); err != nil {
		return err
	}
	if err := addLoAddr(n.IP); err != nil {
		return err
	}
	// The pods' traffic to Services and to each other crosses the bridge
	// and, for ClusterIPs, the host's routing.
	if err := writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	return ensureSharedBPFFS(n.led)
}

// writeFiles writes the PKI, kubeconfigs and component configurations.
func (n *Node) writeFiles() error {
	l := n.lay
	for _, d := range []string{l.Etcd, filepath.Dir(l.ContainerdConfig), l.CNIConfDir, l.CNIBinDir, l.KubeletRoot, l.PodLogs} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	// The node's own CNI bin directory, so that a plugin a test installs
	// (sockmesh-cni) never lands in the system's.
	for _, p := range cniPlugins {
		if err := os.Symlink(filepath.Join(systemCNIBinDir, p), filepath.Join(l.CNIBinDir, p)); err != nil {
			return fmt.Errorf("link CNI plugin %s: %w", p, err)
		}
	}
	kubernetesIP, err := firstServiceIP()
	if err != nil {
		return err
	}
	c, err := newCerts(l.PKI, n.Name, n.IP, kubernetesIP)
	if err != nil {
		return err
	}
	server := "https://" + netip.AddrPortFrom(n.IP, apiserverPort).String()
	if n.Kubeconfig, err = c.kubeconfig("admin", server, "sockmesh-node-admin", "system:masters"); err != nil {
		return err
	}
	for _, k := range []struct{ name, user, group string }{
		{"kube-controller-manager", "system:kube-controller-manager", ""},
		{"kube-scheduler", "system:kube-scheduler", ""},
		{"kubelet", "system:node:" + n.Name, "system:nodes"},
		{"kube-proxy", "system:kube-proxy", ""},
	} {
		var groups []string
		if k.group != "" {
			groups = []string{k.group}
		}
		if _, err := c.kubeconfig(k.name, server, k.user, groups...); err != nil {
			return err
		}
	}
	l.KubeletKubeconfig = filepath.Join(l.PKI, "kubelet.kubeconfig")
	l.KubeProxyKubeconfig = filepath.Join(l.PKI, "kube-proxy.kubeconfig")
	l.CAFile, l.KubeletCert, l.KubeletKey = c.caFile, c.kubeletCert, c.kubeletKey
	n.certs = c
	if err := writeTemplate(containerdTmpl, l, l.ContainerdConfig); err != nil {
		return err
	}
	if err := writeTemplate(cniTmpl, l, filepath.Join(l.CNIConfDir, "10-"+l.CNINetwork+".conflist")); err != nil {
		return err
	}
	if err := writeTemplate(kubeletTmpl, l, l.KubeletConfig); err != nil {
		return err
	}
	if err := writeTemplate(kubeProxyTmpl, l, l.KubeProxyConfig); err != nil {
		return err
	}
	if n.Config, err = clientcmd.BuildConfigFromFlags("", n.Kubeconfig); err != nil {
		return fmt.Errorf("load admin kubeconfig: %w", err)
	}
	n.Config.QPS, n.Config.Burst = 200, 400
	if n.Kube, err = kubernetes.NewForConfig(n.Config); err != nil {
		return fmt.Errorf("create kubernetes client: %w", err)
	}
	return nil
}

func kubeProxyBin(b apiserver.Binaries) string {
	if b.Dir == "" {
		return ""
	}
	return filepath.Join(b.Dir, "kube-proxy")
}

// Kubectl runs the cached kubectl against the node as admin and returns
// its combined output.
func (n *Node) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, n.Binaries.Kubectl, append([]string{"--kubeconfig", n.Kubeconfig}, args...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// LogTail returns about the last lines of a component's log (etcd,
// kube-apiserver, containerd, kube-controller-manager, kube-scheduler,
// kube-proxy, kubelet), for a failing test's report.
func (n *Node) LogTail(component string, lines int) string {
	return childproc.Tail(filepath.Join(n.lay.Logs, component+".log"), lines)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
