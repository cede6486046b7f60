package e2ecluster

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/cluster/node"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/test/pki"
)

const (
	scenarioNS  = "e2e-sockmesh"
	backendHost = "echo.e2e-sockmesh.test"
	agentNS     = "sockmesh-system"
	agentDS     = "sockmesh"
)

// TestSockmesh installs sockmesh as a user would — the Gateway API CRDs,
// then `kubectl apply --server-side -k daemonset/` with the agent image
// imported — and checks, in node-IP and then in-pod proxy mode, that an
// app pod speaking plaintext to a Service reaches its backend the way the
// backend's owner declared: TLS with the policy's SNI (BackendTLSPolicy),
// h2c (appProtocol kubernetes.io/h2c), WebSocket over TLS (kubernetes.io/wss
// with a BackendTLSPolicy). Before the agent runs, the same requests must
// fail or arrive plain: the scenarios can tell sockmesh's work apart.
// Along the way: the ready agent has attached at the host's cgroup v2 root,
// the elected one wrote Accepted into the policy's status, the app pod is
// enrolled, and only in in-pod mode does a proxy listen inside it. After
// the DaemonSet is deleted capture stays pinned (as for an upgrade), and
// `sockmesh uninstall` must then leave no program attached at the root.
func TestSockmesh(t *testing.T) {
	n := cluster(t)
	requireAgentImage(t)
	ctx := t.Context()
	cgroupRoot := cgroup2Root(t)
	baseline := attachedPrograms(t, cgroupRoot)

	start := time.Now()
	installCRDs(t, n)
	timing("crds", start)
	w := deployScenarioWorkloads(t, n)

	t.Run("without-agent", func(t *testing.T) { checkWithoutAgent(t, w) })

	start = time.Now()
	if _, err := n.Kubectl(ctx, "apply", "--server-side", "-k", "../../daemonset"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uninstall(t, n, cgroupRoot, baseline) })
	waitDaemonSetReady(t, n, agentNS, agentDS, 3*time.Minute)
	timing("agent ready", start)
	agentDiag := func() string { return agentLogs(n) }
	// Ready means attached, and at the host's cgroup v2 root, not at the
	// root of the agent container's own view.
	if got := attachedPrograms(t, cgroupRoot); got[ebpf.AttachCGroupInet4Connect] <= baseline[ebpf.AttachCGroupInet4Connect] {
		t.Fatalf("agent ready but no connect4 program attached at %s: %v (before: %v)\n%s", cgroupRoot, got, baseline, agentDiag())
	}

	// The elected agent judges the policies and writes their status.
	waitFor(t, time.Minute, "BackendTLSPolicy status Accepted", func(ctx context.Context) error {
		return policyAccepted(ctx, n, scenarioNS, "tls")
	}, agentDiag)

	start = time.Now()
	runScenarios(t, n, w, "node-ip")
	checkMode(t, n, w, "node-ip")
	timing("scenarios node-ip", start)

	start = time.Now()
	t.Run("rollout-to-in-pod", func(t *testing.T) {
		rolloutUnderTraffic(t, n, w, "the rolling update from node-ip to in-pod mode", true, func() { setProxyMode(t, n, "in-pod") })
	})
	timing("rollout to in-pod", start)
	start = time.Now()
	runScenarios(t, n, w, "in-pod")
	checkMode(t, n, w, "in-pod")
	timing("scenarios in-pod", start)

	t.Run("rollout-same-mode", func(t *testing.T) {
		rolloutUnderTraffic(t, n, w, "a rolling restart of the agent", true, func() { restartAgents(t, n) })
	})
	t.Run("agent-pod-deleted", func(t *testing.T) {
		rolloutUnderTraffic(t, n, w, "the agent's pod deleted", false, func() { deleteAgentPods(t, n) })
	})
	t.Run("rollout-moves-h2", func(t *testing.T) { checkRolloutMovesH2(t, n, w, agentDiag) })
	t.Run("serving-terminating", func(t *testing.T) { checkServingTerminating(t, n, w, agentDiag) })
}

// checkMode checks that the agent enrolled the app pod and proxies for it
// the way mode says: in-pod mode listens inside the pod's network
// namespace (on enrol.DefaultPodPort), node-IP mode must not.
func checkMode(t *testing.T, n *node.Node, w workloads, mode string) {
	t.Helper()
	if v := agentMetric(t, n, `sockmesh_enrol_pods{state="Enrolled"}`); v < 3 {
		t.Errorf("%s: sockmesh_enrol_pods{state=Enrolled} = %v, want the scenario's three pods at least", mode, v)
	}
	in := inspect(t, "http://"+net.JoinHostPort(w.app, strconv.Itoa(appClientPort))+"/inspect")
	inPod := slices.ContainsFunc(in.Listeners, func(l string) bool {
		ap, err := netip.ParseAddrPort(l)
		return err == nil && ap.Port() == enrol.DefaultPodPort
	})
	if inPod != (mode == "in-pod") {
		t.Errorf("%s: listeners in the app pod %q: an in-pod proxy listener (port %d) present = %v", mode, in.Listeners, enrol.DefaultPodPort, inPod)
	}
}

// checkWithoutAgent is the negative control: without the agent the TLS
// backend refuses the app's plaintext with Go's 400 for HTTP sent to an
// HTTPS server, and the h2c backend hears HTTP/1.1, so the scenarios can
// only pass through sockmesh. It polls until kube-proxy has programmed the
// new Services.
func checkWithoutAgent(t *testing.T, w workloads) {
	waitFor(t, 30*time.Second, "plaintext refused by the TLS backend", func(ctx context.Context) error {
		res, err := call(ctx, w.app, Call{URL: "http://" + w.tlsVIP + "/tls", Mode: "http1"})
		if err != nil {
			return err
		}
		if rep, err := res.Report(); err == nil && rep.TLS != nil {
			return fmt.Errorf("plaintext arrived as TLS without the agent: %+v", rep.TLS)
		}
		if res.Status != http.StatusBadRequest {
			return fmt.Errorf("status %d (%s %s), want 400", res.Status, res.Text, res.Error)
		}
		return nil
	}, nil)
	waitFor(t, 30*time.Second, "HTTP/1.1 at the h2c backend", func(ctx context.Context) error {
		res, err := call(ctx, w.app, Call{URL: "http://" + w.h2cVIP + "/h2c", Mode: "http1"})
		if err != nil {
			return err
		}
		rep, err := res.Report()
		if err != nil {
			return err
		}
		if rep.Proto != "HTTP/1.1" {
			return fmt.Errorf("backend saw %s without the agent, want HTTP/1.1", rep.Proto)
		}
		return nil
	}, nil)
}

// workloads are the scenario objects' addresses.
type workloads struct {
	app                    string // the app pod's IP
	tlsVIP, wssVIP, h2cVIP string
	// drainingVIP is an h2c Service whose echo serves on for a while
	// after SIGTERM (checkServingTerminating).
	drainingVIP string
}

// deployScenarioWorkloads creates, in scenarioNS: a TLS echo backend with a
// certificate for backendHost from a test CA (Secret), the CA in a
// ConfigMap, a plaintext echo backend, the app client, and three Services
// with their policies.
func deployScenarioWorkloads(t *testing.T, n *node.Node) workloads {
	t.Helper()
	ctx := t.Context()
	createNamespace(t, n, scenarioNS)
	deployTLSEcho(t, n, scenarioNS)
	core := n.Kube.CoreV1()
	for _, d := range []*appsv1.Deployment{
		deployment(scenarioNS, "plain-echo", echoImage, []string{"-listen=:8080"}, nil, nil),
		deployment(scenarioNS, "app", appImage, []string{"serve", "-listen=:" + strconv.Itoa(appClientPort)}, nil, nil),
		draining(deployment(scenarioNS, "draining-echo", echoImage, []string{"-listen=:8080", "-drain=30s"}, nil, nil)),
	} {
		if _, err := n.Kube.AppsV1().Deployments(scenarioNS).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*corev1.Service{
		service(scenarioNS, "tls", "tls-echo", 8443, ""),
		service(scenarioNS, "wss", "tls-echo", 8443, "kubernetes.io/wss"),
		service(scenarioNS, "h2c", "plain-echo", 8080, "kubernetes.io/h2c"),
		service(scenarioNS, "draining", "draining-echo", 8080, "kubernetes.io/h2c"),
	} {
		if _, err := core.Services(scenarioNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, svc := range []string{"tls", "wss"} {
		createBackendTLSPolicy(t, n, scenarioNS, svc)
	}
	readyPod(t, n, scenarioNS, "tls-echo")
	readyPod(t, n, scenarioNS, "plain-echo")
	readyPod(t, n, scenarioNS, "draining-echo")
	return workloads{
		app:         readyPod(t, n, scenarioNS, "app").Status.PodIP,
		tlsVIP:      clusterIP(t, n, scenarioNS, "tls"),
		wssVIP:      clusterIP(t, n, scenarioNS, "wss"),
		h2cVIP:      clusterIP(t, n, scenarioNS, "h2c"),
		drainingVIP: clusterIP(t, n, scenarioNS, "draining"),
	}
}

// deployTLSEcho creates, in ns, an echo backend (app=tls-echo) serving TLS
// on 8443 with a certificate for backendHost from a test CA (Secret
// echo-tls), and the CA in the ConfigMap echo-ca.
func deployTLSEcho(t *testing.T, n *node.Node, ns string) {
	t.Helper()
	ctx := t.Context()
	ca, err := pki.NewCA("sockmesh-e2e-ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: backendHost, DNSNames: []string{backendHost}})
	if err != nil {
		t.Fatal(err)
	}
	core := n.Kube.CoreV1()
	if _, err := core.Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-tls"},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-ca"},
		Data:       map[string]string{"ca.crt": string(ca.CertPEM)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tlsVolume := []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "echo-tls"}}}}
	tlsMount := []corev1.VolumeMount{{Name: "tls", MountPath: "/tls", ReadOnly: true}}
	d := deployment(ns, "tls-echo", echoImage, []string{"-listen=:8443", "-tls-cert=/tls/tls.crt", "-tls-key=/tls/tls.key"}, tlsVolume, tlsMount)
	if _, err := n.Kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createBackendTLSPolicy creates a BackendTLSPolicy named svc for the
// Service svc in ns: TLS to backendHost, verified with deployTLSEcho's CA.
func createBackendTLSPolicy(t *testing.T, n *node.Node, ns, svc string) {
	t.Helper()
	gw, err := gwclient.NewForConfig(n.Config)
	if err != nil {
		t.Fatal(err)
	}
	p := &gwv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: svc},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{
				LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Group: "", Kind: "Service", Name: gwv1.ObjectName(svc)},
			}},
			Validation: gwv1.BackendTLSPolicyValidation{
				CACertificateRefs: []gwv1.LocalObjectReference{{Group: "", Kind: "ConfigMap", Name: "echo-ca"}},
				Hostname:          backendHost,
			},
		},
	}
	if _, err := gw.GatewayV1().BackendTLSPolicies(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// draining gives d's pod the time its echo serves on after SIGTERM.
func draining(d *appsv1.Deployment) *appsv1.Deployment {
	grace := int64(60)
	d.Spec.Template.Spec.TerminationGracePeriodSeconds = &grace
	return d
}

// checkRolloutMovesH2 rolls the draining echo's Deployment out while the
// app keeps an h2c connection to it (relayed: appProtocol
// kubernetes.io/h2c): once the new pod is ready and the old one
// terminates, the proxy's GOAWAY moves the app's next calls to the new
// pod, where without it they stayed on the old pod for as long as it
// served on (-drain, 30 s) and then failed with its connection.
func checkRolloutMovesH2(t *testing.T, n *node.Node, w workloads, diag func() string) {
	kept := Call{URL: "http://" + w.drainingVIP + "/kept", Mode: "h2c-kept"}
	podOf := func(ctx context.Context) (string, error) {
		res, err := call(ctx, w.app, kept)
		if err != nil {
			return "", err
		}
		rep, err := res.Report()
		if err != nil || res.Status != http.StatusOK || res.Proto != "HTTP/2.0" || !strings.HasPrefix(rep.Pod, "draining-echo-") {
			return "", fmt.Errorf("status %d %s (%s %s), report %+v (%v), want 200 over HTTP/2 from a draining-echo pod", res.Status, res.Proto, res.Text, res.Error, rep, err)
		}
		return rep.Pod, nil
	}
	var old string
	waitFor(t, 15*time.Second, "a kept h2c connection to the draining echo", func(ctx context.Context) (err error) {
		old, err = podOf(ctx)
		return err
	}, diag)
	ctx := t.Context()
	if _, err := n.Kube.AppsV1().Deployments(scenarioNS).Patch(ctx, "draining-echo", types.MergePatchType,
		[]byte(`{"spec":{"template":{"metadata":{"annotations":{"e2e.sockmesh.dev/rollout":"1"}}}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the rollout's new pod ready and "+old+" terminating", func(ctx context.Context) error {
		list, err := n.Kube.DiscoveryV1().EndpointSlices(scenarioNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=draining"})
		if err != nil {
			return err
		}
		var ready, leaving bool
		for _, es := range list.Items {
			for _, ep := range es.Endpoints {
				c := ep.Conditions
				isOld := ep.TargetRef != nil && ep.TargetRef.Name == old
				ready = ready || (!isOld && c.Ready != nil && *c.Ready)
				leaving = leaving || (isOld && c.Terminating != nil && *c.Terminating)
			}
		}
		if !ready || !leaving {
			return fmt.Errorf("endpoints: %+v", list.Items)
		}
		return nil
	}, nil)
	waitFor(t, 15*time.Second, "the kept connection's calls on the new pod", func(ctx context.Context) error {
		pod, err := podOf(ctx)
		if err == nil && pod == old {
			err = fmt.Errorf("still reaching %s", old)
		}
		return err
	}, diag)
}

// checkServingTerminating scales the draining echo's Deployment to zero:
// its pod terminates but serves on (-drain), so the EndpointSlice
// controller lists it not ready but serving, and, as kube-proxy would,
// the proxy sends the app's requests there rather than answer 503 for
// want of a ready endpoint.
func checkServingTerminating(t *testing.T, n *node.Node, w workloads, diag func() string) {
	ctx := t.Context()
	if _, err := n.Kube.AppsV1().Deployments(scenarioNS).Patch(ctx, "draining-echo", types.MergePatchType,
		[]byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the draining echo's endpoint serving while terminating", func(ctx context.Context) error {
		list, err := n.Kube.DiscoveryV1().EndpointSlices(scenarioNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=draining"})
		if err != nil {
			return err
		}
		for _, es := range list.Items {
			for _, ep := range es.Endpoints {
				c := ep.Conditions
				if c.Ready != nil && !*c.Ready && c.Serving != nil && *c.Serving && c.Terminating != nil && *c.Terminating {
					return nil
				}
			}
		}
		return fmt.Errorf("endpoints: %+v", list.Items)
	}, nil)
	waitFor(t, 15*time.Second, "a request through the proxy to the terminating endpoint", func(ctx context.Context) error {
		res, err := call(ctx, w.app, Call{URL: "http://" + w.drainingVIP + "/drain", Mode: "http1"})
		if err != nil {
			return err
		}
		rep, err := res.Report()
		if err != nil || res.Status != http.StatusOK || !strings.HasPrefix(rep.Pod, "draining-echo-") {
			return fmt.Errorf("status %d, report %+v (%v), want 200 from the draining pod", res.Status, rep, err)
		}
		return nil
	}, diag)
}

// runScenarios sends the app's plaintext requests and checks what the
// backends saw. Each retries for a while: the agent applies a snapshot
// some time after the API objects change (and after a restart).
func runScenarios(t *testing.T, n *node.Node, w workloads, mode string) {
	for _, sc := range []struct {
		name  string
		call  Call
		check func(Result, echo.Report) error
	}{
		{"tls", Call{URL: "http://" + w.tlsVIP + "/tls", Mode: "http1"}, func(res Result, rep echo.Report) error {
			if res.Status != http.StatusOK || rep.Path != "/tls" {
				return fmt.Errorf("status %d path %q, want 200 /tls", res.Status, rep.Path)
			}
			return wantTLS(rep)
		}},
		{"h2c", Call{URL: "http://" + w.h2cVIP + "/h2c", Mode: "http1"}, func(res Result, rep echo.Report) error {
			if res.Status != http.StatusOK || rep.Proto != "HTTP/2.0" || rep.TLS != nil {
				return fmt.Errorf("status %d, backend saw %s (tls %v), want 200 over h2c", res.Status, rep.Proto, rep.TLS)
			}
			return nil
		}},
		{"wss", Call{URL: "ws://" + w.wssVIP + "/ws", Mode: "websocket", Message: "sockmesh over " + mode}, func(res Result, rep echo.Report) error {
			if res.Echo != "sockmesh over "+mode {
				return fmt.Errorf("echo %q, want the message back", res.Echo)
			}
			if rep.Path != "/ws" {
				return fmt.Errorf("backend saw path %q, want /ws", rep.Path)
			}
			return wantTLS(rep)
		}},
	} {
		t.Run(mode+"/"+sc.name, func(t *testing.T) {
			var last echo.Report
			waitFor(t, time.Minute, sc.name+" through sockmesh", func(ctx context.Context) error {
				res, err := call(ctx, w.app, sc.call)
				if err != nil {
					return err
				}
				if res.Error != "" {
					return fmt.Errorf("app: %s", res.Error)
				}
				rep, err := res.Report()
				if err != nil {
					return err
				}
				last = rep
				return sc.check(res, rep)
			}, func() string { return agentLogs(n) })
			host, _, _ := net.SplitHostPort(last.RemoteAddr)
			if mode == "node-ip" && host == w.app {
				t.Errorf("backend saw the app's own address %s: the connection did not go through the node's proxy", host)
			}
			t.Logf("%s: backend saw %s from %s, tls %+v", sc.name, last.Proto, last.RemoteAddr, last.TLS)
		})
	}
}

func wantTLS(rep echo.Report) error {
	if rep.TLS == nil {
		return fmt.Errorf("backend saw plaintext")
	}
	if rep.TLS.ServerName != backendHost {
		return fmt.Errorf("backend saw SNI %q, want %q", rep.TLS.ServerName, backendHost)
	}
	if rep.TLS.Version != "TLS 1.3" && rep.TLS.Version != "TLS 1.2" {
		return fmt.Errorf("backend saw %s", rep.TLS.Version)
	}
	return nil
}

// installCRDs installs the Gateway API experimental CRDs of the version
// go.mod pins, from the module cache (the same files daemonset/crds
// references upstream), with server-side apply.
func installCRDs(t *testing.T, n *node.Node) {
	t.Helper()
	dir, err := apiserver.GatewayAPICRDDir(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(n.Config)
	if err != nil {
		t.Fatal(err)
	}
	names, err := apiserver.InstallCRDs(t.Context(), dyn, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, "backendtlspolicies.gateway.networking.k8s.io") {
		t.Fatalf("installed CRDs %v lack BackendTLSPolicy", names)
	}
}

// policyAccepted reports whether sockmesh's status entry on the
// BackendTLSPolicy ns/name says Accepted.
func policyAccepted(ctx context.Context, n *node.Node, ns, name string) error {
	gw, err := gwclient.NewForConfig(n.Config)
	if err != nil {
		return err
	}
	p, err := gw.GatewayV1().BackendTLSPolicies(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, a := range p.Status.Ancestors {
		if a.ControllerName != translate.ControllerName {
			continue
		}
		for _, c := range a.Conditions {
			if c.Type == string(gwv1.PolicyConditionAccepted) && c.Status == metav1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("sockmesh's ancestor status: %+v", a.Conditions)
	}
	return fmt.Errorf("no ancestor status from %s: %+v", translate.ControllerName, p.Status)
}

// agentMetric scrapes the agent's metrics port on the node and returns
// the value of the sample named series (name{labels} exactly as exposed).
func agentMetric(t *testing.T, n *node.Node, series string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(n.IP.String(), "15090")+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape agent metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("agent metrics: %s", resp.Status)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("parse %s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("agent metrics have no %s", series)
	return 0
}

// setProxyMode changes the agent DaemonSet's --proxy-mode, which rolls the
// agent pod.
func setProxyMode(t *testing.T, n *node.Node, mode string) {
	t.Helper()
	dss := n.Kube.AppsV1().DaemonSets(agentNS)
	ds, err := dss.Get(t.Context(), agentDS, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args := ds.Spec.Template.Spec.Containers[0].Args
	i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "--proxy-mode=") })
	if i < 0 {
		t.Fatalf("agent args %q have no --proxy-mode", args)
	}
	args[i] = "--proxy-mode=" + mode
	if _, err := dss.Update(t.Context(), ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// restartAgents changes the agent's pod template without changing the
// agent, as `kubectl rollout restart` does.
func restartAgents(t *testing.T, n *node.Node) {
	t.Helper()
	if _, err := n.Kube.AppsV1().DaemonSets(agentNS).Patch(t.Context(), agentDS, types.MergePatchType,
		[]byte(`{"spec":{"template":{"metadata":{"annotations":{"e2e.sockmesh.dev/restart":"1"}}}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// deleteAgentPods deletes the agent's pods, as `kubectl delete pod` does:
// the DaemonSet replaces them.
func deleteAgentPods(t *testing.T, n *node.Node) {
	t.Helper()
	if err := n.Kube.CoreV1().Pods(agentNS).DeleteCollection(t.Context(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
}

func agentLogs(n *node.Node) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pods, _ := n.Kubectl(ctx, "get", "pods", "-n", agentNS, "-o", "wide")
	logs, _ := n.Kubectl(ctx, "logs", "-n", agentNS, "daemonset/"+agentDS, "--all-containers", "--tail=60")
	return fmt.Sprintf("agent pods:\n%s\nagent logs:\n%s", pods, logs)
}

// uninstall deletes the DaemonSet, runs `sockmesh uninstall` on the node
// (graceful agent shutdown leaves capture pinned on purpose), with args
// beside --bpffs, and checks that the cgroup root holds no more programs
// than before the test.
func uninstall(t *testing.T, n *node.Node, cgroupRoot string, baseline map[ebpf.AttachType]int, args ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := n.Kubectl(ctx, "delete", "-k", "../../daemonset", "--ignore-not-found", "--wait=true", "--timeout=120s"); err != nil {
		t.Errorf("delete the agent: %v", err)
	}
	if got := attachedPrograms(t, cgroupRoot); !t.Failed() && got[ebpf.AttachCGroupInet4Connect] <= baseline[ebpf.AttachCGroupInet4Connect] {
		t.Errorf("capture did not stay pinned after the agent stopped: %v attached at %s, %v before", got, cgroupRoot, baseline)
	}
	cmd := exec.CommandContext(ctx, suite.agentBin, append([]string{"uninstall", "--bpffs=/sys/fs/bpf"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("sockmesh uninstall: %v\n%s", err, out)
	}
	if got := attachedPrograms(t, cgroupRoot); !maps.Equal(got, baseline) {
		t.Errorf("programs attached at %s after uninstall: %v, before the test: %v", cgroupRoot, got, baseline)
	}
}

// attachedPrograms counts the programs attached at cgroup for each attach
// type sockmesh uses.
func attachedPrograms(t *testing.T, cgroup string) map[ebpf.AttachType]int {
	t.Helper()
	f, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	counts := map[ebpf.AttachType]int{}
	for _, at := range []ebpf.AttachType{
		ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect,
		ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername,
		ebpf.AttachCGroupSockOps, ebpf.AttachCGroupGetsockopt,
	} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
		if err != nil {
			t.Fatalf("query %s programs at %s: %v", at, cgroup, err)
		}
		counts[at] = len(res.Programs)
	}
	return counts
}
