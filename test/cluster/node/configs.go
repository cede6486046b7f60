package node

import (
	"bytes"
	"fmt"
	"os"
	"text/template"
)

// layout names the node's files; every path lies under Dir except the
// Debian packages' binaries and the paths in hardcodedPaths.
type layout struct {
	Dir, PKI, Logs, Etcd string

	ContainerdConfig, ContainerdRoot, ContainerdState, ContainerdSocket, ContainerdOpt, RuncRoot string
	CNIConfDir, CNIDataDir, CNIBinDir, CNINetwork, Bridge                                        string

	KubeletRoot, KubeletConfig, PodLogs, KubeProxyConfig string
	// KubeProxyBin runs `kube-proxy --cleanup` on the way down ("" if the
	// binaries are missing).
	KubeProxyBin string

	Name, IP, PodCIDR, ServiceCIDR, PauseImage string
	// Kubeconfigs of the kubelet and kube-proxy, the CA, the kubelet's
	// serving pair.
	KubeletKubeconfig, KubeProxyKubeconfig, CAFile, KubeletCert, KubeletKey string
}

// Ports the node's components listen on, all on the node IP (never on
// every address: other tests on this machine use loopback ports).
const (
	apiserverPort    = 6443
	etcdClientPort   = 2379
	etcdPeerPort     = 2380
	kubeletHealthz   = 10248
	kubeProxyHealthz = 10256
)

// containerd 1.6 configuration. restrict_oom_score_adj: this VM gives no
// process CAP_SYS_RESOURCE, and runc fails every sandbox that asks for a
// lower oom_score_adj than its own. SystemdCgroup false: no systemd, cgroup
// v1 with cgroupfs. The shim socket directory (/run/containerd/s) has no
// setting in 1.6; the runc root has one and stays in Dir.
var containerdTmpl = template.Must(template.New("containerd").Parse(`version = 2
root = "{{.ContainerdRoot}}"
state = "{{.ContainerdState}}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "{{.ContainerdSocket}}"

[ttrpc]
  address = "{{.ContainerdSocket}}.ttrpc"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{{.ContainerdOpt}}"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{{.PauseImage}}"
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "{{.RuncRoot}}"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{{.CNIBinDir}}"
      conf_dir = "{{.CNIConfDir}}"
      max_conf_num = 1
`))

// The pod network: one bridge, host-local IPAM with its state in Dir. No
// masquerade: pods only talk to each other, Services and the node IP.
var cniTmpl = template.Must(template.New("cni").Parse(`{
  "cniVersion": "1.0.0",
  "name": "{{.CNINetwork}}",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "{{.Bridge}}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "{{.CNIDataDir}}",
        "ranges": [[{"subnet": "{{.PodCIDR}}"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
`))

// The kubelet: cgroupfs on cgroup v1 (failCgroupV1 false), no swap check,
// image garbage collection off (imported images cannot be pulled again),
// images imported by ctr count as present (NeverVerify: no pull
// credentials exist for them), eviction only on a truly full disk, and
// every port on the node IP.
var kubeletTmpl = template.Must(template.New("kubelet").Parse(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {{.IP}}
readOnlyPort: 0
healthzBindAddress: {{.IP}}
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {{.CAFile}}
authorization:
  mode: Webhook
tlsCertFile: {{.KubeletCert}}
tlsPrivateKeyFile: {{.KubeletKey}}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{{.ContainerdSocket}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imagePullCredentialsVerificationPolicy: NeverVerify
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
podLogsDir: {{.PodLogs}}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
rotateCertificates: false
serializeImagePulls: false
`))

// kube-proxy in iptables mode. Zero conntrack settings leave the host's
// limits alone; localhostNodePorts false keeps route_localnet off.
var kubeProxyTmpl = template.Must(template.New("kube-proxy").Parse(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: {{.KubeProxyKubeconfig}}
hostnameOverride: {{.Name}}
bindAddress: {{.IP}}
healthzBindAddress: {{.IP}}:10256
metricsBindAddress: {{.IP}}:10249
clusterCIDR: {{.PodCIDR}}
nodePortAddresses: ["{{.IP}}/32"]
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`))

// writeTemplate renders t with l into path.
func writeTemplate(t *template.Template, l *layout, path string) error {
	var b bytes.Buffer
	if err := t.Execute(&b, l); err != nil {
		return fmt.Errorf("render %s: %w", t.Name(), err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
