package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/childproc"
)

// firstServiceIP is the kubernetes Service's ClusterIP: the first address
// of the service range.
func firstServiceIP() (netip.Addr, error) {
	p, err := netip.ParsePrefix(apiserver.ServiceCIDR)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("parse service cidr: %w", err)
	}
	return p.Masked().Addr().Next(), nil
}

// start starts a component and records it in the ledger.
func (n *Node) start(name, bin string, args ...string) error {
	p, err := childproc.Start(name, filepath.Join(n.lay.Logs, name+".log"), bin, args...)
	if err != nil {
		return err
	}
	n.procs[name] = p
	n.led.Procs[name] = recordOf(p)
	return n.led.save()
}

func (n *Node) k8sBin(name string) string { return filepath.Join(n.Binaries.Dir, name) }

// startControlPlane starts etcd and kube-apiserver and waits for /readyz.
func (n *Node) startControlPlane(ctx context.Context) error {
	l, ip := n.lay, n.IP.String()
	etcdURL := "http://" + net.JoinHostPort(ip, strconv.Itoa(etcdClientPort))
	peerURL := "http://" + net.JoinHostPort(ip, strconv.Itoa(etcdPeerPort))
	if err := n.start("etcd", n.Binaries.Etcd,
		"--name="+n.Name, "--data-dir="+l.Etcd,
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster="+n.Name+"="+peerURL,
		// The node's data is thrown away: fsync would only make the disk
		// the bottleneck of every write.
		"--unsafe-no-fsync", "--log-level=warn",
	); err != nil {
		return err
	}
	c := n.certs
	if err := n.start("kube-apiserver", n.k8sBin("kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address="+ip, "--advertise-address="+ip, "--secure-port="+strconv.Itoa(apiserverPort),
		"--cert-dir="+filepath.Join(l.PKI, "apiserver-generated"),
		"--tls-cert-file="+c.apiserverCert, "--tls-private-key-file="+c.apiserverKey,
		"--client-ca-file="+c.caFile,
		// The front-proxy settings the controller manager and scheduler read
		// from extension-apiserver-authentication (they log an error every
		// 10 s without them). No client has the allowed name: nothing can
		// use the request headers.
		"--requestheader-client-ca-file="+c.caFile,
		"--requestheader-allowed-names=sockmesh-node-front-proxy",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+c.saPub, "--service-account-signing-key-file="+c.saKey,
		"--service-cluster-ip-range="+apiserver.ServiceCIDR,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		// The DaemonSet's init container mounts bpffs with Bidirectional
		// propagation, which only privileged containers may.
		"--allow-privileged=true",
		"--kubelet-client-certificate="+c.kubeletClientCert, "--kubelet-client-key="+c.kubeletClientKey,
		"--kubelet-certificate-authority="+c.caFile,
		// Without it the API server resolves the node's name through DNS
		// to reach the kubelet (logs, exec).
		"--kubelet-preferred-address-types=InternalIP",
		"--profiling=false",
	); err != nil {
		return err
	}
	return n.poll(ctx, 90*time.Second, "kube-apiserver /readyz", func(ctx context.Context) (bool, error) {
		body, err := n.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
}

// startRuntime starts containerd and imports the images, before the
// kubelet exists: it would otherwise race the imports.
func (n *Node) startRuntime(ctx context.Context, images []string) error {
	l := n.lay
	if err := n.start("containerd", "containerd", "--config="+l.ContainerdConfig, "--log-level=warn"); err != nil {
		return err
	}
	if err := n.poll(ctx, 30*time.Second, "containerd cri", func(ctx context.Context) (bool, error) {
		return criReady(ctx, l.ContainerdSocket) == nil, nil
	}); err != nil {
		return err
	}
	for _, img := range images {
		if err := importImage(ctx, l.ContainerdSocket, img); err != nil {
			return err
		}
	}
	n.log.Info("images imported", "count", len(images))
	return nil
}

// startNode starts the controller manager, the scheduler, kube-proxy and
// the kubelet, and waits until the node can run pods.
func (n *Node) startNode(ctx context.Context) error {
	l, ip := n.lay, n.IP.String()
	kc := func(name string) string { return filepath.Join(l.PKI, name+".kubeconfig") }
	if err := n.start("kube-controller-manager", n.k8sBin("kube-controller-manager"),
		"--kubeconfig="+kc("kube-controller-manager"),
		"--authentication-kubeconfig="+kc("kube-controller-manager"),
		"--authorization-kubeconfig="+kc("kube-controller-manager"),
		"--bind-address="+ip,
		"--leader-elect=false",
		// The pod network is the fixed range of the CNI config.
		"--allocate-node-cidrs=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+n.certs.saKey,
		"--root-ca-file="+n.certs.caFile,
		"--service-cluster-ip-range="+apiserver.ServiceCIDR,
	); err != nil {
		return err
	}
	if err := n.start("kube-scheduler", n.k8sBin("kube-scheduler"),
		"--kubeconfig="+kc("kube-scheduler"),
		"--authentication-kubeconfig="+kc("kube-scheduler"),
		"--authorization-kubeconfig="+kc("kube-scheduler"),
		"--bind-address="+ip,
		"--leader-elect=false",
	); err != nil {
		return err
	}
	if err := n.start("kube-proxy", n.k8sBin("kube-proxy"), "--config="+l.KubeProxyConfig); err != nil {
		return err
	}
	if err := n.start("kubelet", n.k8sBin("kubelet"),
		"--config="+l.KubeletConfig,
		"--kubeconfig="+l.KubeletKubeconfig,
		"--root-dir="+l.KubeletRoot,
		"--hostname-override="+n.Name,
		"--node-ip="+ip,
	); err != nil {
		return err
	}
	if err := n.poll(ctx, 90*time.Second, "node Ready", func(ctx context.Context) (bool, error) {
		node, err := n.Kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	// Pods cannot be created before their namespace's ServiceAccount.
	if err := n.poll(ctx, 60*time.Second, "default service account", func(ctx context.Context) (bool, error) {
		_, err := n.Kube.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return err
	}
	healthz := "http://" + net.JoinHostPort(ip, strconv.Itoa(kubeProxyHealthz)) + "/healthz"
	return n.poll(ctx, 60*time.Second, "kube-proxy healthz", func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, healthz, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// poll calls cond every 100 ms until it reports done, fails, a component
// exits, or timeout passes.
func (n *Node) poll(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		done, err := cond(ctx)
		if err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		if done {
			return nil
		}
		for _, p := range n.procs {
			select {
			case <-p.Exited():
				return fmt.Errorf("wait for %s: %w", what, p.ExitErr())
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", what, errors.Join(context.Cause(ctx), n.logTails()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logTails returns the end of every component's log, for an error.
func (n *Node) logTails() error {
	var errs []error
	for name, p := range n.procs {
		errs = append(errs, fmt.Errorf("%s log:\n%s", name, childproc.Tail(p.LogPath, 15)))
	}
	return errors.Join(errs...)
}
