package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/childproc"
)

// The address plan (see doc.go).
var (
	// serviceCIDRs is the API server's Service range, dual-stack.
	serviceCIDRs = []string{"10.251.240.0/20", "fd00:251:0:f0::/112"}
	// podCIDRs are the pods' ranges: 10.251.K.0/24 and fd00:251:0:K::/64
	// for K < 128.
	podCIDRs = []string{"10.251.0.0/17", "fd00:251::/57"}
)

const (
	maxPodSubnet       = 127
	firstOutsideSubnet = 200 // DNS servers and external hosts: 10.251.K.0/24, K in [200, 240)
	endOutsideSubnet   = 240
	// leaderNamespace holds the agents' status-writer Lease.
	leaderNamespace = "sockmesh-system"
	// waitFor bounds every wait. No result depends on it: it only keeps a
	// broken agent from hanging the run.
	waitFor = 30 * time.Second
)

// cluster is what every node and scenario of a run shares: one API server,
// the agent binary and the address allocators.
type cluster struct {
	api      *apiserver.Env
	mapper   meta.RESTMapper
	agentBin string
	// podSubnets and outsideSubnets hand out the K of 10.251.K.0/24.
	podSubnets, outsideSubnets atomic.Uint32
	nodes                      atomic.Uint32
}

func newCluster(t *testing.T, agentBin string) *cluster {
	t.Helper()
	c := &cluster{api: startAPIServer(t), agentBin: agentBin}
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.api.Kube.Discovery()))
	c.newNamespace(t, leaderNamespace)
	return c
}

// startAPIServer runs etcd and kube-apiserver (test/apiserver) with a
// dual-stack Service range of this tier's own: test/apiserver's range is
// IPv4 only, and IPv6 ClusterIPs need the API server's flag (a ServiceCIDR
// object cannot add a family). The binary is wrapped in a script that
// appends the flag; kube-apiserver takes the last value of a repeated flag.
func startAPIServer(t *testing.T) *apiserver.Env {
	t.Helper()
	bins, err := apiserver.FindBinaries()
	if errors.Is(err, apiserver.ErrNoBinaries) {
		testenv.SkipOrFail(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "kube-apiserver")
	script := fmt.Sprintf("#!/bin/sh\nexec '%s' \"$@\" --service-cluster-ip-range=%s\n",
		bins.KubeAPIServer, strings.Join(serviceCIDRs, ","))
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	bins.KubeAPIServer = wrapper
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	env, err := apiserver.Run(ctx, apiserver.Options{Binaries: bins, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log (last lines):\n%s", childproc.Tail(filepath.Join(dir, "kube-apiserver.log"), 30))
		}
		if err := env.Stop(); err != nil {
			t.Errorf("stop the api server: %v", err)
		}
	})
	return env
}

// newNamespace creates a namespace and its default ServiceAccount (there
// is no controller manager to make it, and pods need it).
func (c *cluster) newNamespace(t testing.TB, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.api.Kube.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	if _, err := c.api.Kube.CoreV1().ServiceAccounts(name).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the default service account of %s: %v", name, err)
	}
}

// apply server-side applies the YAML documents in manifests, in namespace
// ns unless a document names its own, and returns the objects as stored.
func (c *cluster) apply(t testing.TB, ns, manifests string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifests)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read manifests: %v", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("manifest: %v\n%s", err, doc)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("manifest: %v\n%s", err, doc)
		}
		gvk := u.GroupVersionKind()
		m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("map %s: %v", gvk, err)
		}
		var ri dynamic.ResourceInterface = c.api.Dynamic.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			if u.GetNamespace() == "" {
				u.SetNamespace(ns)
			}
			ri = c.api.Dynamic.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		got, err := ri.Apply(context.Background(), u.GetName(), u, metav1.ApplyOptions{FieldManager: "sockmesh-e2e", Force: true})
		if err != nil {
			t.Fatalf("apply %s %s/%s: %v", gvk.Kind, u.GetNamespace(), u.GetName(), err)
		}
		out = append(out, got)
	}
}

// createPod creates the Pod object of h, bound to its node, with the
// status a kubelet would write: Running, and the namespace's addresses.
func (c *cluster) createPod(t testing.TB, h *host) {
	t.Helper()
	ctx := context.Background()
	no := false
	p, err := c.api.Kube.CoreV1().Pods(h.namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: h.name, Namespace: h.namespace, Labels: map[string]string{"app": h.name}},
		Spec: corev1.PodSpec{
			NodeName:                     h.node.name,
			AutomountServiceAccountToken: &no,
			Containers:                   []corev1.Container{{Name: "app", Image: "registry.invalid/sockmesh-e2e:1"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", h.namespace, h.name, err)
	}
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, HostIP: h.node.ip4.String(), PodIP: h.ip4.String(),
		PodIPs:  []corev1.PodIP{{IP: h.ip4.String()}, {IP: h.ip6.String()}},
		HostIPs: []corev1.HostIP{{IP: h.node.ip4.String()}, {IP: h.node.ip6.String()}},
	}
	if _, err := c.api.Kube.CoreV1().Pods(h.namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("write the status of pod %s/%s: %v", h.namespace, h.name, err)
	}
}

// createNode creates the Node object of n with its addresses, as a kubelet
// registers itself.
func (c *cluster) createNode(t testing.TB, n *node) {
	t.Helper()
	ctx := context.Background()
	obj, err := c.api.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", n.name, err)
	}
	obj.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: n.ip4.String()},
		{Type: corev1.NodeInternalIP, Address: n.ip6.String()},
	}
	if _, err := c.api.Kube.CoreV1().Nodes().UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("write the status of node %s: %v", n.name, err)
	}
}

// subnet hands out the K of 10.251.K.0/24 from counter, starting at first.
func subnet(t testing.TB, counter *atomic.Uint32, first, end uint32) uint32 {
	t.Helper()
	k := first + counter.Add(1) - 1
	if k >= end {
		t.Fatalf("address plan exhausted: subnet %d is past %d", k, end-1)
	}
	return k
}

// subnetAddrs are the addresses of 10.251.k.0/24 and fd00:251:0:k::/64
// with host part host.
func subnetAddrs(k uint32, host byte) (netip.Addr, netip.Addr) {
	v6 := netip.MustParseAddr("fd00:251::").As16()
	v6[7] = byte(k)
	v6[15] = host
	return netip.AddrFrom4([4]byte{10, 251, byte(k), host}), netip.AddrFrom16(v6)
}

// eventually polls cond until it returns nil, failing t with cond's last
// error after waitFor.
func eventually(t testing.TB, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v after %s", what, err, waitFor)
		}
		<-tick.C
	}
}
