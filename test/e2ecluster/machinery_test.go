package e2ecluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sockmesh/sockmesh/test/cluster/node"
	"github.com/sockmesh/sockmesh/test/e2ecluster/appapi"
	"github.com/sockmesh/sockmesh/test/echo"
)

// TestNodeMachinery checks what the sockmesh scenarios stand on, without
// the agent: images imported without a registry run; the DaemonSet of
// daemonset/ — its security context, capabilities, hostPath volumes and
// mount propagation, probes, tolerations, priority class — is admitted and
// runs on this node when the agent's process is swapped for the app
// client (which reports the capabilities and mounts it got); pods reach a
// Service's pods through kube-proxy with HTTP/1.1, h2c and WebSocket, the
// way the scenarios' app pod will.
func TestNodeMachinery(t *testing.T) {
	n := cluster(t)

	t.Run("daemonset", func(t *testing.T) {
		var objs []*unstructured.Unstructured
		var ds *appsv1.DaemonSet
		for _, o := range manifests(t) {
			if o.GetKind() == "DaemonSet" {
				ds = &appsv1.DaemonSet{}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, ds); err != nil {
					t.Fatal(err)
				}
				continue
			}
			objs = append(objs, o)
		}
		apply(t, n, objs...)
		standIn := machineryDaemonSet(t, ds)
		apply(t, n, toUnstructured(t, standIn))
		t.Cleanup(func() { deleteAndWait(t, n, "daemonset", standIn.Name, standIn.Namespace) })
		waitDaemonSetReady(t, n, standIn.Namespace, standIn.Name, 2*time.Minute)

		// The stand-in serves on the agent's health port, in the host's
		// network namespace.
		q := url.Values{"path": {"/sys/fs/bpf", cgroup2Root(t)}}
		in := inspect(t, "http://"+n.IP.String()+":15021/inspect?"+q.Encode())
		// BPF(39) NET_ADMIN(12) SYS_ADMIN(21) SYS_PTRACE(19), nothing else.
		const want = 1<<39 | 1<<12 | 1<<21 | 1<<19
		got, err := strconv.ParseUint(in.CapEff, 16, 64)
		if err != nil || got != want {
			t.Errorf("agent container CapEff = %s, want %x (BPF NET_ADMIN SYS_ADMIN SYS_PTRACE)", in.CapEff, uint64(want))
		}
		for p, fs := range map[string]string{"/sys/fs/bpf": "bpf", cgroup2Root(t): "cgroup2"} {
			if in.FS[p] != fs {
				t.Errorf("agent container sees %s as %q, want %s", p, in.FS[p], fs)
			}
		}
		if !in.HostPID {
			t.Errorf("agent container is not in the host PID namespace")
		}
	})

	t.Run("service", func(t *testing.T) {
		const ns = "e2e-machinery"
		createNamespace(t, n, ns)
		for _, d := range []*appsv1.Deployment{
			deployment(ns, "echo", echoImage, []string{"-listen=:8080"}, nil, nil),
			deployment(ns, "app", appImage, []string{"serve", "-listen=:" + strconv.Itoa(appClientPort)}, nil, nil),
		} {
			if _, err := n.Kube.AppsV1().Deployments(ns).Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := n.Kube.CoreV1().Services(ns).Create(t.Context(), service(ns, "echo", "echo", 8080, ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		echoPod := readyPod(t, n, ns, "echo")
		app := readyPod(t, n, ns, "app")
		vip := clusterIP(t, n, ns, "echo")

		// Pods reach the node IP (on the host's lo) through the bridge, as
		// they will reach the agent's node-IP proxy: the API server's TLS
		// port answers plaintext HTTP with Go's 400.
		nodeURL := "http://" + net.JoinHostPort(n.IP.String(), "6443") + "/"
		waitFor(t, 30*time.Second, "the node IP from a pod", func(ctx context.Context) error {
			res, err := call(ctx, app.Status.PodIP, Call{URL: nodeURL, Mode: "http1"})
			if err != nil {
				return err
			}
			if res.Status != http.StatusBadRequest {
				return fmt.Errorf("status %d (%s), want 400 from the API server's TLS port", res.Status, res.Error)
			}
			return nil
		}, namespaceDiag(n, ns))

		for _, tc := range []struct {
			mode, url, wantProto string
		}{
			{"http1", "http://" + vip + "/machinery", "HTTP/1.1"},
			{"h2c", "http://" + vip + "/machinery", "HTTP/2.0"},
			{"websocket", "ws://" + vip + "/ws", "HTTP/1.1"},
		} {
			t.Run(tc.mode, func(t *testing.T) {
				var rep echo.Report
				// kube-proxy programs the Service within a moment of its
				// endpoints appearing.
				waitFor(t, 30*time.Second, tc.mode+" to the Service", func(ctx context.Context) error {
					res, err := call(ctx, app.Status.PodIP, Call{URL: tc.url, Mode: tc.mode, Message: "ping"})
					if err != nil {
						return err
					}
					if res.Error != "" {
						return fmt.Errorf("%s", res.Error)
					}
					if tc.mode == "websocket" && res.Echo != "ping" {
						return fmt.Errorf("websocket echo = %q, want ping", res.Echo)
					}
					rep, err = res.Report()
					return err
				}, namespaceDiag(n, ns))
				if rep.Proto != tc.wantProto || rep.Pod != echoPod.Name || rep.TLS != nil {
					t.Errorf("backend saw proto %s from pod %s (tls %v), want %s at %s in plaintext", rep.Proto, rep.Pod, rep.TLS, tc.wantProto, echoPod.Name)
				}
				if !strings.HasPrefix(rep.RemoteAddr, app.Status.PodIP+":") {
					t.Errorf("backend saw the request from %s, want the app pod %s", rep.RemoteAddr, app.Status.PodIP)
				}
			})
		}
	})
}

// machineryDaemonSet is the agent's DaemonSet with the agent's process
// swapped for the app client (the init container checks that it sees
// bpffs, the main one serves the probes on the agent's health port) under
// another name and selector, so that it never counts as the agent.
func machineryDaemonSet(t *testing.T, agent *appsv1.DaemonSet) *appsv1.DaemonSet {
	t.Helper()
	ds := agent.DeepCopy()
	ds.TypeMeta = metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"}
	ds.Name = "sockmesh-machinery"
	labels := map[string]string{"app.kubernetes.io/name": "sockmesh-machinery"}
	ds.Labels, ds.Spec.Selector = labels, &metav1.LabelSelector{MatchLabels: labels}
	ds.Spec.Template.Labels = labels
	spec := &ds.Spec.Template.Spec
	if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
		t.Fatalf("DaemonSet has %d init containers and %d containers, want 1 and 1", len(spec.InitContainers), len(spec.Containers))
	}
	init, main := &spec.InitContainers[0], &spec.Containers[0]
	init.Image, init.Command, init.Args = appImage, []string{"/appclient", "statfs", "/sys/fs/bpf", "bpf"}, nil
	main.Image, main.Command, main.Args = appImage, []string{"/appclient", "serve", "-listen=:15021"}, nil
	// The agent's startup probe is `sockmesh probe`, which the app image
	// has not: the stand-in's is the HTTP check of /healthz it stands for.
	if p := main.StartupProbe; p == nil || p.Exec == nil {
		t.Fatalf("the agent's startup probe is %+v, want an exec probe (sockmesh probe)", p)
	}
	main.StartupProbe.Exec = nil
	main.StartupProbe.HTTPGet = &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(15021)}
	return ds
}

// waitDaemonSetReady waits until every scheduled pod of the DaemonSet runs
// the current template and is Ready.
func waitDaemonSetReady(t *testing.T, n *node.Node, ns, name string, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, "DaemonSet "+ns+"/"+name+" ready", func(ctx context.Context) error {
		ds, err := n.Kube.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := ds.Status
		if s.ObservedGeneration < ds.Generation || s.DesiredNumberScheduled == 0 ||
			s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberReady != s.DesiredNumberScheduled || s.NumberUnavailable != 0 {
			return fmt.Errorf("status %+v", s)
		}
		return nil
	}, func() string {
		out := namespaceDiag(n, ns)()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		logs, _ := n.Kubectl(ctx, "logs", "-n", ns, "daemonset/"+name, "--all-containers", "--tail=40")
		return out + "\ncontainer logs:\n" + string(logs)
	})
}

// inspect asks the appclient at u what its container was given.
func inspect(t *testing.T, u string) appapi.Inspection {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var in appapi.Inspection
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil {
		t.Fatal(err)
	}
	return in
}

// cgroup2Root is the host's cgroup v2 mount point, which the agent's
// container must see as cgroup2 at the same path.
func cgroup2Root(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if f := strings.Fields(pre); ok && strings.HasPrefix(post, "cgroup2 ") && len(f) >= 5 && f[3] == "/" {
			return f[4]
		}
	}
	t.Fatal("no cgroup2 mount on this host")
	return ""
}
