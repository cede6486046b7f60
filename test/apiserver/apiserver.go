package apiserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/test/childproc"
)

// ServiceCIDR is the service range the API server allocates ClusterIPs from.
const ServiceCIDR = "10.96.0.0/16"

// Env is a running etcd and kube-apiserver with clients for it.
type Env struct {
	// Config reaches the API server as a member of system:masters, with a
	// generous client-side rate limit (tests create objects in bulk).
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file equivalent to Config, for
	// binaries (the agent, kubectl) the end-to-end tests start.
	Kubeconfig string
	Kube       kubernetes.Interface
	Gateway    gwclient.Interface
	Dynamic    dynamic.Interface
	Binaries   Binaries
	// CRDs are the names of the installed CustomResourceDefinitions.
	CRDs []string
	// Dir holds the PKI, etcd's data and the processes' logs.
	Dir string

	etcd, apiserver *childproc.Process
	apiserverArgs   []string // every flag but the ones a start adds
	ownDir          bool
}

// Start runs an Env for t and stops it when t ends, kube-apiserver with
// apiserverArgs added to its flags (see Options). It skips t (fails it in
// CI) when the binaries are missing and fails t on any other error.
func Start(t testing.TB, apiserverArgs ...string) *Env {
	t.Helper()
	bins, err := FindBinaries()
	if errors.Is(err, ErrNoBinaries) {
		testenv.SkipOrFail(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Run(ctx, Options{Binaries: bins, Dir: t.TempDir(), APIServerArgs: apiserverArgs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log (last lines):\n%s", childproc.Tail(env.apiserver.LogPath, 40))
		}
		if err := env.Stop(); err != nil {
			t.Errorf("stop api server: %v", err)
		}
	})
	return env
}

// Options configure Run. The zero value finds the binaries with
// FindBinaries and works in a new temporary directory that Stop removes.
type Options struct {
	Binaries Binaries
	Dir      string
	// APIServerArgs are added to kube-apiserver's flags, e.g.
	// --runtime-config to turn an API off.
	APIServerArgs []string
}

// Run starts etcd and kube-apiserver, waits for /readyz and installs the
// Gateway API experimental CRDs. The caller must call Stop.
func Run(ctx context.Context, opts Options) (_ *Env, err error) {
	env := &Env{Binaries: opts.Binaries, Dir: opts.Dir}
	if env.Binaries.KubeAPIServer == "" {
		if env.Binaries, err = FindBinaries(); err != nil {
			return nil, err
		}
	}
	if env.Dir == "" {
		if env.Dir, err = os.MkdirTemp("", "sockmesh-apiserver-"); err != nil {
			return nil, fmt.Errorf("create work dir: %w", err)
		}
		env.ownDir = true
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, env.Stop())
		}
	}()

	firstServiceIP := netip.MustParsePrefix(ServiceCIDR).Addr().Next()
	pkiDir := filepath.Join(env.Dir, "pki")
	if err := os.MkdirAll(pkiDir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	certs, err := newPKI(pkiDir, firstServiceIP)
	if err != nil {
		return nil, err
	}

	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	env.etcd, err = childproc.Start("etcd", filepath.Join(env.Dir, "etcd.log"), env.Binaries.Etcd,
		"--name=sockmesh-test",
		"--data-dir="+filepath.Join(env.Dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=sockmesh-test="+peerURL,
		// A test's data is thrown away: fsync would only make a slow disk
		// the bottleneck of every write.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}

	port := ports[2]
	env.apiserverArgs = []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		// The default reconciler writes the advertise address into the
		// kubernetes Endpoints and complains every 10 s that it is loopback.
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(env.Dir, "certs"),
		"--tls-cert-file=" + certs.serverCertFile, "--tls-private-key-file=" + certs.serverKeyFile,
		"--client-ca-file=" + certs.caFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + certs.saPubFile,
		"--service-account-signing-key-file=" + certs.saKeyFile,
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--authorization-mode=Node,RBAC",
	}
	if env.apiserver, err = env.startAPIServer(opts.APIServerArgs); err != nil {
		return nil, err
	}

	env.Config = &rest.Config{
		Host: "https://127.0.0.1:" + strconv.Itoa(port),
		TLSClientConfig: rest.TLSClientConfig{
			CAData: certs.caPEM, CertData: certs.adminCertPEM, KeyData: certs.adminKeyPEM,
		},
		QPS:   1000,
		Burst: 2000,
	}
	if env.Kube, err = kubernetes.NewForConfig(env.Config); err != nil {
		return nil, fmt.Errorf("create kubernetes client: %w", err)
	}
	if env.Gateway, err = gwclient.NewForConfig(env.Config); err != nil {
		return nil, fmt.Errorf("create gateway api client: %w", err)
	}
	if env.Dynamic, err = dynamic.NewForConfig(env.Config); err != nil {
		return nil, fmt.Errorf("create dynamic client: %w", err)
	}
	if env.Kubeconfig, err = writeKubeconfig(env.Dir, env.Config); err != nil {
		return nil, err
	}
	if err := env.waitReady(ctx); err != nil {
		return nil, err
	}
	crdDir, err := GatewayAPICRDDir(ctx)
	if err != nil {
		return nil, err
	}
	if env.CRDs, err = InstallCRDs(ctx, env.Dynamic, crdDir); err != nil {
		return nil, err
	}
	return env, nil
}

func (e *Env) startAPIServer(extra []string) (*childproc.Process, error) {
	return childproc.Start("kube-apiserver", filepath.Join(e.Dir, "kube-apiserver.log"), e.Binaries.KubeAPIServer,
		append(slices.Clone(e.apiserverArgs), extra...)...)
}

// RestartAPIServer stops kube-apiserver and starts it again on the same
// address and etcd with extra added to its base flags (those of Run's
// APIServerArgs are dropped), e.g. to serve an API it did not. Clients
// reconnect as to any API server that restarts.
func (e *Env) RestartAPIServer(ctx context.Context, extra ...string) error {
	if err := e.apiserver.Stop(2 * time.Second); err != nil {
		return fmt.Errorf("stop kube-apiserver: %w", err)
	}
	var err error
	if e.apiserver, err = e.startAPIServer(extra); err != nil {
		return err
	}
	return e.waitReady(ctx)
}

// waitReady polls /readyz until it answers ok, the API server exits or ctx
// ends.
func (e *Env) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var last error
	for {
		body, err := e.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = err
		select {
		case <-e.apiserver.Exited():
			return e.apiserver.ExitErr()
		case <-e.etcd.Exited():
			return e.etcd.ExitErr()
		case <-ctx.Done():
			return fmt.Errorf("wait for kube-apiserver /readyz: %w (last: %v)\n%s", context.Cause(ctx), last, childproc.Tail(e.apiserver.LogPath, 30))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Freeze stops kube-apiserver with SIGSTOP until t ends, when it
// continues (before a Stop registered earlier runs): its connections stay
// open and nothing answers, as with a control plane that hangs. It returns
// once every thread of kube-apiserver has stopped: kill(2) returns when the
// signal is queued, and the other threads run on until the one that takes
// it stops them, meanwhile answering requests (on a busy machine, the
// request a test sent after Freeze).
func (e *Env) Freeze(t testing.TB) {
	t.Helper()
	pid := e.apiserver.Cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stop kube-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Errorf("continue kube-apiserver: %v", err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		running, err := runningThreads(pid)
		switch {
		case err != nil:
			t.Fatalf("freeze kube-apiserver: %v", err)
		case running == 0:
			return
		case time.Now().After(deadline):
			t.Fatalf("freeze kube-apiserver: %d threads still run 30s after SIGSTOP", running)
		}
		time.Sleep(time.Millisecond)
	}
}

// runningThreads counts the threads of process pid that are not stopped
// by a signal (state T in /proc/PID/task/TID/stat, proc(5)).
func runningThreads(pid int) (int, error) {
	stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid)) // the pattern is valid
	if len(stats) == 0 {
		return 0, fmt.Errorf("list the threads of process %d: %w", pid, os.ErrNotExist)
	}
	n := 0
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread ended
		}
		if err != nil {
			return 0, err
		}
		// The state follows the command name, which is in parentheses
		// and may hold some itself.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return 0, fmt.Errorf("parse %s: %q", path, b)
		}
		if b[i+2] != 'T' {
			n++
		}
	}
	return n, nil
}

// Stop ends kube-apiserver, then etcd, and removes Dir if Run created it.
// kube-apiserver drains watches for up to a minute on SIGTERM; a test's
// server has nothing worth draining, so it is killed after a short grace.
func (e *Env) Stop() error {
	var errs []error
	if e.apiserver != nil {
		errs = append(errs, e.apiserver.Stop(2*time.Second))
	}
	if e.etcd != nil {
		errs = append(errs, e.etcd.Stop(5*time.Second))
	}
	if e.ownDir {
		errs = append(errs, os.RemoveAll(e.Dir))
	}
	return errors.Join(errs...)
}

// freePorts reserves n loopback ports by listening and closing; another
// process could take one in between, which Run reports as a start failure.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserve port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func writeKubeconfig(dir string, cfg *rest.Config) (string, error) {
	path := filepath.Join(dir, "kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["sockmesh-test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["sockmesh-test"] = &clientcmdapi.Context{Cluster: "sockmesh-test", AuthInfo: "admin"}
	kc.CurrentContext = "sockmesh-test"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("write kubeconfig: %w", err)
	}
	return path, nil
}
