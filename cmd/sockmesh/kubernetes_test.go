package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/test/apiserver"
)

// TestAgentKubernetes runs the agent on the kubernetes source against a
// real kube-apiserver, with leader election: the objects of the file tests,
// created through the API, must capture and originate TLS the same way, and
// the elected agent must hold the Lease and write the policy's status.
func TestAgentKubernetes(t *testing.T) {
	api := apiserver.Start(t)
	e := newEnv(t)
	ctx := t.Context()
	createManifests(t, api, e.manifests)
	a := startElecting(t, api, e)
	a.waitReady(t)
	checkTLSOriginated(t, e.get(t, "/hello"))

	eventually(t, "the BackendTLSPolicy's status written by the elected agent", func() error {
		p, err := api.Gateway.GatewayV1().BackendTLSPolicies("app").Get(ctx, "secure", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, anc := range p.Status.Ancestors {
			if anc.ControllerName != translate.ControllerName {
				continue
			}
			for _, c := range anc.Conditions {
				if c.Type == string(gwv1.PolicyConditionAccepted) && c.Status == metav1.ConditionTrue {
					return nil
				}
			}
		}
		return fmt.Errorf("status %+v", p.Status)
	})
	lease, err := api.Kube.CoordinationV1().Leases("sockmesh-system").Get(ctx, "sockmesh-writer", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("writer lease: %v", err)
	}
	if id := lease.Spec.HolderIdentity; id == nil || !strings.HasPrefix(*id, testNode+"/") {
		t.Errorf("lease holder = %v, want this node's agent", id)
	}
	a.stop(t)
}

// createManifests creates the objects of the YAML files in dir through the
// API, with the Pods' status as written.
func createManifests(t *testing.T, api *apiserver.Env, dir string) {
	t.Helper()
	ctx := t.Context()
	dec, err := manifests.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for _, name := range []string{"secure.yaml", "client.yaml"} { // namespaces first
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		o, err := dec.Decode(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o...)
	}
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = api.Kube.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
			if err == nil {
				// No controller manager: the default ServiceAccount pods need.
				_, err = api.Kube.CoreV1().ServiceAccounts(o.Name).Create(ctx,
					&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
			}
		case *corev1.Pod:
			var created *corev1.Pod
			if created, err = api.Kube.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{}); err == nil {
				created.Status = o.Status
				_, err = api.Kube.CoreV1().Pods(o.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
			}
		case *corev1.Service:
			_, err = api.Kube.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *discoveryv1.EndpointSlice:
			_, err = api.Kube.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ConfigMap:
			_, err = api.Kube.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *gwv1.BackendTLSPolicy:
			_, err = api.Gateway.GatewayV1().BackendTLSPolicies(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("createManifests: no case for %T", obj)
		}
		if err != nil {
			t.Fatalf("create %T: %v", obj, err)
		}
	}
}

// eventually polls cond until it holds or waitFor passes.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v after %s", what, err, waitFor)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAgentShutdownAPIServerHung stops the leading agent while the API
// server hangs (its process stopped: connections stay open, nothing
// answers), as in a control-plane outage or a partition, when nodes get
// drained. The agent must exit, its release of the writer lease failing
// with a timeout, and its proxy's drain must start without waiting for that
// release: the release's seconds must not come out of the drain's share of
// the termination grace period.
func TestAgentShutdownAPIServerHung(t *testing.T) {
	api := apiserver.Start(t)
	e := newEnv(t)
	a := startElecting(t, api, e)
	a.logged(t, "that it leads", func(r agentproc.Record) bool { return r.Msg() == "leading" })

	api.Freeze(t)
	a.stop(t) // fails unless the agent exits, cleanly, within waitFor

	// client-go logs the release's failure: the Get of the Lease (or, had
	// it answered, the Update) timed out.
	releaseFailed := func(r agentproc.Record) bool {
		m := r.Msg()
		return m == "error retrieving resource lock" || m == "Failed to release lease"
	}
	var order []string
	a.Log.Count(func(r agentproc.Record) bool {
		switch {
		case r.Msg() == "draining":
			order = append(order, "draining")
		case releaseFailed(r):
			order = append(order, "release failed: "+r.Str("err"))
		}
		return false
	})
	if len(order) != 2 || order[0] != "draining" || !strings.HasPrefix(order[1], "release failed: ") {
		t.Fatalf("logged %q, want the drain to start, then the lease's release to fail", order)
	}
	if !strings.Contains(order[1], "deadline exceeded") && !strings.Contains(order[1], "Timeout exceeded") {
		t.Errorf("%s, want a timeout", order[1])
	}
}

// startElecting starts the agent on the kubernetes source of api, which it
// reaches from the node's netns, with leader election in sockmesh-system
// (which it creates).
func startElecting(t *testing.T, api *apiserver.Env, e *env) *agentRun {
	t.Helper()
	if _, err := api.Kube.CoreV1().Namespaces().Create(t.Context(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sockmesh-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ln, err := e.node.Listen(t.Context(), nil, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return e.startAgent(t, "--source=kubernetes", "--kubeconfig="+api.KubeconfigVia(t, ln), "--leader-elect",
		"--leader-election-namespace=sockmesh-system", "--service-cidr="+apiserver.ServiceCIDR,
		"--proxy-listen="+addrs.Node.String()+":0")
}
