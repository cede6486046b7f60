package kubernetes

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	dto "github.com/prometheus/client_model/go"

	"github.com/sockmesh/sockmesh/agent/source"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/pki"
)

var _ source.Source = (*Source)(nil)

const (
	ns       = "source-test"
	nodeName = "smt-node"
)

func ptr[T any](v T) *T { return &v }

func startSource(t *testing.T, env *apiserver.Env, configure ...func(*Config)) *Source {
	t.Helper()
	cfg := Config{NodeName: nodeName}
	for _, f := range configure {
		f(&cfg)
	}
	s, err := New(cfg, env.Kube, env.Gateway, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s
}

// waitInput waits for Changed signals until Input satisfies ok.
func waitInput(t *testing.T, s *Source, what string, ok func(translate.Input) bool) translate.Input {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case <-s.Changed():
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
		if in := s.Input(); ok(in) {
			return in
		}
	}
}

func names[T metav1.Object](objs []T) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetNamespace()+"/"+o.GetName())
	}
	slices.Sort(out)
	return out
}

// TestSourceAgainstAPIServer lists and watches a real API server: every
// kind arrives, only this node's pods, only referenced ConfigMaps and
// Secrets; a changed CA reaches Input; a deleted policy stops the watch of
// its ConfigMap; the Node object fills Input.Node.
func TestSourceAgainstAPIServer(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	kube, gw := env.Kube, env.Gateway
	must.Succeed(t)(kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	// No controller-manager runs to create it, and pods need it.
	must.Succeed(t)(kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}},
		Spec:       corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, PodCIDR: "10.244.1.0/24"},
	}, metav1.CreateOptions{}))
	node := must.Value[*corev1.Node](t)(kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}))
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.7"}, {Type: corev1.NodeHostName, Address: nodeName}}
	must.Succeed(t)(kube.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}))

	s := startSource(t, env)
	in := waitInput(t, s, "the first listing", func(translate.Input) bool { return true })
	if want := []netip.Addr{netip.MustParseAddr("192.0.2.7")}; in.Node.Name != nodeName || !slices.Equal(in.Node.IPs, want) ||
		len(in.Node.PodCIDRs) != 2 || in.Node.Zone != "zone-a" {
		t.Errorf("Input.Node = %+v; want name %s, IPs %v, two pod CIDRs and zone-a", in.Node, nodeName, want)
	}
	if in.ClusterTrustBundlesUnavailable {
		t.Error("ClusterTrustBundles reported unavailable on Kubernetes 1.37")
	}

	must.Succeed(t)(kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "svc", Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "svc-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.5"},
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(8443))}},
	}, metav1.CreateOptions{}))
	for _, p := range []struct{ name, node string }{{"here", nodeName}, {"elsewhere", "other-node"}} {
		must.Succeed(t)(kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: ns},
			Spec:       corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "c", Image: "localhost/none"}}},
		}, metav1.CreateOptions{}))
	}
	for _, name := range []string{"ca", "unreferenced"} {
		must.Succeed(t)(kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Data:       map[string]string{"ca.crt": "first"},
		}, metav1.CreateOptions{}))
	}
	for _, name := range []string{"client-cert", "unrelated-secret"} {
		must.Succeed(t)(kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Data:       map[string][]byte{"tls.crt": []byte("x"), "tls.key": []byte("y")},
		}, metav1.CreateOptions{}))
	}
	must.Succeed(t)(kube.CertificatesV1().ClusterTrustBundles().Create(ctx, &certificatesv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "bundle"},
		Spec:       certificatesv1.ClusterTrustBundleSpec{TrustBundle: testCA(t)},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(gw.GatewayV1().BackendTLSPolicies(ns).Create(ctx, &gwv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "policy", Namespace: ns},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{
				LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Group: "", Kind: "Service", Name: "svc"},
			}},
			Validation: gwv1.BackendTLSPolicyValidation{
				CACertificateRefs: []gwv1.LocalObjectReference{{Group: "", Kind: "ConfigMap", Name: "ca"}},
				Hostname:          "svc.example.com",
			},
		},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(gw.ExperimentalV1alpha1().XBackends(ns).Create(ctx, &gwxv1alpha1.XBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: ns},
		Spec: gwxv1alpha1.BackendSpec{
			Type:             gwxv1alpha1.BackendTypeExternalHostname,
			Port:             gwxv1alpha1.BackendPort{Number: 443},
			ExternalHostname: &gwxv1alpha1.ExternalHostnameBackend{Hostname: "api.example.com"},
			TLS: &gwxv1alpha1.BackendTLS{
				Mode:                 gwxv1alpha1.BackendTLSModeClientAndServer,
				ClientCertificateRef: &gwv1.SecretObjectReference{Name: "client-cert"},
				Validation:           &gwv1.BackendTLSPolicyValidation{WellKnownCACertificates: ptr(gwv1.WellKnownCACertificatesSystem), Hostname: "api.example.com"},
			},
		},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(gw.GatewayV1().HTTPRoutes(ns).Create(ctx, &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "route", Namespace: ns},
		Spec: gwv1.HTTPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{
			Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Name: "svc"}}}},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(gw.GatewayV1().ReferenceGrants(ns).Create(ctx, &gwv1.ReferenceGrant{
		ObjectMeta: metav1.ObjectMeta{Name: "grant", Namespace: ns},
		Spec: gwv1.ReferenceGrantSpec{
			From: []gwv1.ReferenceGrantFrom{{Group: gwv1.GroupName, Kind: "HTTPRoute", Namespace: "elsewhere"}},
			To:   []gwv1.ReferenceGrantTo{{Kind: "Service"}},
		},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(gw.ExperimentalV1alpha1().XMeshes().Create(ctx, &gwxv1alpha1.XMesh{
		ObjectMeta: metav1.ObjectMeta{Name: "mesh"},
		Spec:       gwxv1alpha1.MeshSpec{ControllerName: translate.ControllerName},
	}, metav1.CreateOptions{}))

	in = waitInput(t, s, "every object", func(in translate.Input) bool {
		return len(in.Services) >= 2 && len(in.EndpointSlices) >= 1 && len(in.Pods) == 1 && len(in.ConfigMaps) == 1 &&
			len(in.Secrets) == 1 && len(in.ClusterTrustBundles) == 1 && len(in.BackendTLSPolicies) == 1 &&
			len(in.XBackends) == 1 && len(in.HTTPRoutes) == 1 && len(in.ReferenceGrants) == 1 && len(in.XMeshes) == 1 &&
			len(in.Namespaces) >= 1
	})
	for _, es := range in.EndpointSlices {
		if es.Name != "svc-1" {
			continue
		}
		if h := es.Endpoints[0].Hints; h == nil || len(h.ForZones) != 1 {
			t.Errorf("endpoint hints = %v, want zone-a's (translate reads them)", h)
		}
	}
	if got := names(in.Pods); !slices.Equal(got, []string{ns + "/here"}) {
		t.Errorf("pods = %v, want only this node's", got)
	}
	if got := names(in.ConfigMaps); !slices.Equal(got, []string{ns + "/ca"}) {
		t.Errorf("configmaps = %v, want only the referenced one", got)
	}
	if got := names(in.Secrets); !slices.Equal(got, []string{ns + "/client-cert"}) {
		t.Errorf("secrets = %v, want only the referenced one", got)
	}
	for _, svc := range in.Services {
		if len(svc.ManagedFields) > 0 {
			t.Errorf("service %s/%s cached with managed fields", svc.Namespace, svc.Name)
		}
	}

	// A new CA in the ConfigMap reaches Input.
	cm := must.Value[*corev1.ConfigMap](t)(kube.CoreV1().ConfigMaps(ns).Get(ctx, "ca", metav1.GetOptions{}))
	cm.Data["ca.crt"] = "second"
	must.Succeed(t)(kube.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}))
	waitInput(t, s, "the new CA", func(in translate.Input) bool {
		return len(in.ConfigMaps) == 1 && in.ConfigMaps[0].Data["ca.crt"] == "second"
	})

	// A policy that references a ConfigMap created later: Input waits for
	// the reference's watch, so the ConfigMap is there as soon as the policy.
	must.Succeed(t)(kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "ca-2", Namespace: ns}, Data: map[string]string{"ca.crt": "third"},
	}, metav1.CreateOptions{}))
	p2 := must.Value[*gwv1.BackendTLSPolicy](t)(gw.GatewayV1().BackendTLSPolicies(ns).Get(ctx, "policy", metav1.GetOptions{}))
	p2.Spec.Validation.CACertificateRefs = append(p2.Spec.Validation.CACertificateRefs, gwv1.LocalObjectReference{Kind: "ConfigMap", Name: "ca-2"})
	must.Succeed(t)(gw.GatewayV1().BackendTLSPolicies(ns).Update(ctx, p2, metav1.UpdateOptions{}))
	in = waitInput(t, s, "the policy's second reference", func(in translate.Input) bool {
		return len(in.BackendTLSPolicies) == 1 && len(in.BackendTLSPolicies[0].Spec.Validation.CACertificateRefs) == 2
	})
	if got := names(in.ConfigMaps); !slices.Equal(got, []string{ns + "/ca", ns + "/ca-2"}) {
		t.Errorf("configmaps with the policy's second reference = %v, want both", got)
	}

	// Deleting the policy drops its ConfigMaps from Input.
	if err := gw.GatewayV1().BackendTLSPolicies(ns).Delete(ctx, "policy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitInput(t, s, "the policy and its ConfigMaps to go", func(in translate.Input) bool {
		return len(in.BackendTLSPolicies) == 0 && len(in.ConfigMaps) == 0
	})
	s.refs.mu.Lock()
	n := len(s.refs.watches)
	s.refs.mu.Unlock()
	if n != 1 {
		t.Errorf("%d reference watches after the policy went, want 1 (the XBackend's client certificate)", n)
	}

	// The node moves zone (a cloud controller labels it after the kubelet
	// registered it): topology hints must be judged by the new one.
	node = must.Value[*corev1.Node](t)(kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}))
	node.Labels[corev1.LabelTopologyZone] = "zone-b"
	must.Succeed(t)(kube.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}))
	waitInput(t, s, "the node's new zone", func(in translate.Input) bool { return in.Node.Zone == "zone-b" })

	// A load balancer controller gives a Service an address: translate
	// refuses external hostnames resolving to it, so the cache keeps it.
	lb := must.Value[*corev1.Service](t)(kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "lb", Namespace: ns},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}, metav1.CreateOptions{}))
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.7"}}
	must.Succeed(t)(kube.CoreV1().Services(ns).UpdateStatus(ctx, lb, metav1.UpdateOptions{}))
	waitInput(t, s, "the Service's load-balancer IP", func(in translate.Input) bool {
		return slices.ContainsFunc(in.Services, func(s *corev1.Service) bool {
			return s.Name == "lb" && len(s.Status.LoadBalancer.Ingress) == 1 && s.Status.LoadBalancer.Ingress[0].IP == "198.51.100.7"
		})
	})
}

// TestSourceMissingCRDs: a kind whose CRD is not installed lists as empty
// rather than blocking the first signal.
func TestSourceMissingCRDs(t *testing.T) {
	env := apiserver.Start(t)
	deleteCRD(t, env, "xmeshes.gateway.networking.x-k8s.io")
	waitUnserved(t, env, gwxv1alpha1.GroupVersion.String(), kindXMesh)
	s := startSource(t, env)
	in := waitInput(t, s, "the first listing", func(translate.Input) bool { return true })
	if in.XMeshes != nil {
		t.Errorf("XMeshes = %v, want none", in.XMeshes)
	}
}

// TestRunEndsWhileAPIServerHangs: Run returns, cleanly, once its context
// ends, though the API server hangs in the middle of the discovery Run
// starts with (it accepts connections and never answers, as one stopped in
// an outage does): nothing but the context ends the discovery's requests,
// and an agent stopped then must still exit.
func TestRunEndsWhileAPIServerHangs(t *testing.T) {
	s, accepted := hungSource(t, func(*Config) {})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	<-accepted // Run's first request is the discovery's
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after its context ended = %v, want nil", err)
	}
}

// TestRefreshBoundedWhileAPIServerHangs: a later discovery against an API
// server that accepts and never answers gives up after the discovery
// interval, keeping what is watched, rather than hold every later one.
func TestRefreshBoundedWhileAPIServerHangs(t *testing.T) {
	s, _ := hungSource(t, func(c *Config) { c.DiscoveryInterval = 100 * time.Millisecond })
	done := make(chan struct{})
	go func() {
		s.refresh(t.Context(), map[string]*kindWatch{})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a bound on the wait, not a measure
		t.Fatal("a discovery against a hung API server still waits after 30 s, want it ended after the 100 ms interval")
	}
}

// hungSource returns a Source whose API server accepts connections and
// never answers, and a channel told of each connection accepted.
func hungSource(t *testing.T, configure func(*Config)) (*Source, <-chan struct{}) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan struct{}, 1)
	go func() {
		var conns []net.Conn // held open, never answered
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // the listener closed: the test ended
			}
			conns = append(conns, c)
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	kube, gw, err := NewClients(&rest.Config{Host: "http://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{NodeName: nodeName}
	configure(&cfg)
	s, err := New(cfg, kube, gw, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, accepted
}

// TestClusterTrustBundlesTurnedOn: a cluster that starts serving
// ClusterTrustBundles is noticed without an agent restart (GEP-5075: the
// API's availability is probed at intervals), and its bundles reach Input.
func TestClusterTrustBundlesTurnedOn(t *testing.T) {
	env := apiserver.Start(t, "--runtime-config=certificates.k8s.io/v1/clustertrustbundles=false")
	ctx := t.Context()
	s := startSource(t, env, func(c *Config) { c.DiscoveryInterval = 100 * time.Millisecond })
	if in := waitInput(t, s, "the first listing", func(translate.Input) bool { return true }); !in.ClusterTrustBundlesUnavailable {
		t.Fatal("ClusterTrustBundles reported available while the API server does not serve them")
	}
	if err := env.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	must.Succeed(t)(env.Kube.CertificatesV1().ClusterTrustBundles().Create(ctx, &certificatesv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "corp"}, Spec: certificatesv1.ClusterTrustBundleSpec{TrustBundle: testCA(t)},
	}, metav1.CreateOptions{}))
	waitInput(t, s, "the ClusterTrustBundle", func(in translate.Input) bool {
		return !in.ClusterTrustBundlesUnavailable && len(in.ClusterTrustBundles) == 1
	})
}

// TestServiceCIDRs: the cluster's ServiceCIDRs (the API server's default
// one and any added later) are Input's service ranges, which external
// hostnames may not resolve into, though --service-cidr names none.
func TestServiceCIDRs(t *testing.T) {
	env := apiserver.Start(t)
	s := startSource(t, env)
	def := netip.MustParsePrefix(apiserver.ServiceCIDR)
	waitInput(t, s, "the default ServiceCIDR", func(in translate.Input) bool {
		return slices.Equal(in.Node.ServiceCIDRs, []netip.Prefix{def})
	})
	must.Succeed(t)(env.Kube.NetworkingV1().ServiceCIDRs().Create(t.Context(), &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "extra"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.200.0.0/16"}},
	}, metav1.CreateOptions{}))
	waitInput(t, s, "the added ServiceCIDR", func(in translate.Input) bool {
		return slices.Equal(in.Node.ServiceCIDRs, []netip.Prefix{def, netip.MustParsePrefix("10.200.0.0/16")})
	})
}

// TestCRDsInstalledLater: Gateway API CRDs installed after the agent
// started are watched without a restart, and a BackendTLSPolicy created
// then reaches Input.
func TestCRDsInstalledLater(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	for _, name := range env.CRDs {
		deleteCRD(t, env, name)
	}
	for _, k := range optionalKinds {
		if k.kind != kindClusterTrustBundle && k.kind != kindServiceCIDR { // built in, not CRDs
			waitUnserved(t, env, k.groupVersion, k.kind)
		}
	}
	s := startSource(t, env, func(c *Config) { c.DiscoveryInterval = 100 * time.Millisecond })
	if in := waitInput(t, s, "the first listing", func(translate.Input) bool { return true }); in.BackendTLSPolicies != nil {
		t.Fatalf("BackendTLSPolicies = %v before their CRD is installed", in.BackendTLSPolicies)
	}
	if got := watched(t, s, kindBackendTLSPolicy); got != 0 {
		t.Errorf("sockmesh_source_kind_watched{kind=BackendTLSPolicy} = %v without its CRD, want 0", got)
	}

	dir := must.Value[string](t)(apiserver.GatewayAPICRDDir(ctx))
	must.Succeed(t)(apiserver.InstallCRDs(ctx, env.Dynamic, dir))
	must.Succeed(t)(env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	must.Succeed(t)(env.Gateway.GatewayV1().BackendTLSPolicies(ns).Create(ctx, tlsPolicy("late"), metav1.CreateOptions{}))
	waitInput(t, s, "the BackendTLSPolicy created after its CRD", func(in translate.Input) bool {
		return len(in.BackendTLSPolicies) == 1
	})
	if got := watched(t, s, kindBackendTLSPolicy); got != 1 {
		t.Errorf("sockmesh_source_kind_watched{kind=BackendTLSPolicy} = %v once its CRD is installed, want 1", got)
	}
}

// TestCRDsRemoved: a kind whose CRD no longer serves the version the
// source watches, or is deleted, is dropped with its objects: the policies
// are gone, which is what the cluster says, and must no longer be applied.
func TestCRDsRemoved(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	must.Succeed(t)(env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	must.Succeed(t)(env.Gateway.GatewayV1().BackendTLSPolicies(ns).Create(ctx, tlsPolicy("policy"), metav1.CreateOptions{}))
	must.Succeed(t)(env.Gateway.GatewayV1().GRPCRoutes(ns).Create(ctx, &gwv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "route", Namespace: ns},
		Spec: gwv1.GRPCRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{
			Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Name: "svc"}}}},
	}, metav1.CreateOptions{}))
	s := startSource(t, env, func(c *Config) { c.DiscoveryInterval = 100 * time.Millisecond })
	waitInput(t, s, "the policy and the route", func(in translate.Input) bool {
		return len(in.BackendTLSPolicies) == 1 && len(in.GRPCRoutes) == 1
	})

	// BackendTLSPolicy v1 no longer served (as when an older Gateway API
	// release's CRD, v1alpha3 only, is applied over it): the policy stays
	// in etcd, but the source's v1 informer can list it no more.
	patch := `[{"op":"test","path":"/spec/versions/0/name","value":"v1"},{"op":"replace","path":"/spec/versions/0/served","value":false}]`
	must.Succeed(t)(env.Dynamic.Resource(crdResource).Patch(ctx, "backendtlspolicies.gateway.networking.k8s.io",
		types.JSONPatchType, []byte(patch), metav1.PatchOptions{}))
	waitInput(t, s, "the BackendTLSPolicy to be dropped", func(in translate.Input) bool { return in.BackendTLSPolicies == nil })
	if got := watched(t, s, kindBackendTLSPolicy); got != 0 {
		t.Errorf("sockmesh_source_kind_watched{kind=BackendTLSPolicy} = %v once v1 is not served, want 0", got)
	}

	deleteCRD(t, env, "grpcroutes.gateway.networking.k8s.io")
	// The CRD's cleanup deletes the route first; the kind itself must then
	// stop being watched, not be listed, failing, forever.
	waitInput(t, s, "GRPCRoutes to stop being watched", func(in translate.Input) bool {
		return in.GRPCRoutes == nil && watched(t, s, kindGRPCRoute) == 0
	})
}

// TestCRDDeletedBeforeFirstListing: a kind the source waits to list (here
// its RBAC is missing) whose CRD is then deleted no longer holds back the
// first signal, which would otherwise keep the agent unready until it
// restarts.
func TestCRDDeletedBeforeFirstListing(t *testing.T) {
	env := apiserver.Start(t)
	// The source asks discovery at once; the CRD leaves discovery only
	// once its cleanup is done.
	s := startSource(t, withoutBackendTLSPolicies(t, env), func(c *Config) { c.DiscoveryInterval = 100 * time.Millisecond })
	deleteCRD(t, env, "backendtlspolicies.gateway.networking.k8s.io")
	waitInput(t, s, "the first listing", func(translate.Input) bool { return true })
}

// TestKinds: Kinds says which optional kinds the source watches and why
// not the others — a kind the API server does not serve, one the agent's
// RBAC does not let it list — which an operator otherwise learns from a
// gauge and the logs.
func TestKinds(t *testing.T) {
	env := apiserver.Start(t, "--runtime-config=certificates.k8s.io/v1/clustertrustbundles=false")
	want := func(kinds []KindStatus, kind string, watched bool, reason string) bool {
		i := slices.IndexFunc(kinds, func(k KindStatus) bool { return k.Kind == kind })
		return i >= 0 && kinds[i].Watched == watched && kinds[i].Reason == reason
	}

	// Without RBAC on BackendTLSPolicies, the first listing never ends:
	// Kinds says why while the agent is not ready.
	restricted := startSource(t, withoutBackendTLSPolicies(t, env))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		kinds := restricted.Kinds()
		if want(kinds, kindBackendTLSPolicy, false, KindForbidden) && want(kinds, kindClusterTrustBundle, false, KindNotServed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Kinds() = %+v; want BackendTLSPolicy Forbidden, ClusterTrustBundle NotServed", kinds)
		}
	}

	s := startSource(t, env)
	waitInput(t, s, "the first listing", func(translate.Input) bool { return true })
	kinds := s.Kinds()
	if len(kinds) != len(optionalKinds) {
		t.Fatalf("Kinds() = %+v, want every optional kind", kinds)
	}
	for _, k := range kinds {
		if k.Kind == kindClusterTrustBundle {
			if !want(kinds, k.Kind, false, KindNotServed) {
				t.Errorf("%+v, want ClusterTrustBundle NotServed", k)
			}
		} else if !want(kinds, k.Kind, true, "") {
			t.Errorf("%+v, want it watched", k)
		}
	}
}

// withoutBackendTLSPolicies returns env with clients acting as a user
// whose RBAC lets it list and watch every kind the source reads but
// BackendTLSPolicies.
func withoutBackendTLSPolicies(t *testing.T, env *apiserver.Env) *apiserver.Env {
	t.Helper()
	ctx := t.Context()
	const user = "smt-agent"
	must.Succeed(t)(env.Kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "namespaces", "pods", "nodes", "configmaps", "secrets"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"clustertrustbundles"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"servicecidrs"}, Verbs: []string{"list", "watch"}},
			// Not backendtlspolicies.
			{APIGroups: []string{gwv1.GroupName}, Resources: []string{"httproutes", "grpcroutes", "referencegrants"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{gwxv1alpha1.GroupName}, Resources: []string{"xbackends", "xbackendtrafficpolicies", "xmeshes"}, Verbs: []string{"list", "watch"}},
		},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(env.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{}))
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate.UserName = user
	restricted := *env
	var err error
	if restricted.Kube, restricted.Gateway, err = NewClients(cfg); err != nil {
		t.Fatal(err)
	}
	return &restricted
}

// TestOneUnservedAnswerKeepsAKind: a kind is dropped only when two
// discoveries in a row do not find it; one may come from an API server
// that is starting.
func TestOneUnservedAnswerKeepsAKind(t *testing.T) {
	env := apiserver.Start(t)
	s, err := New(Config{NodeName: nodeName}, env.Kube, env.Gateway, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	watches := make(map[string]*kindWatch)
	t.Cleanup(func() {
		for _, w := range watches {
			w.end()
		}
	})
	if err := s.follow(t.Context(), watches, map[string]bool{kindBackendTLSPolicy: true}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		if err := s.follow(t.Context(), watches, map[string]bool{}); err != nil {
			t.Fatal(err)
		}
		if _, got := watches[kindBackendTLSPolicy]; got != want {
			t.Errorf("after %d answers without BackendTLSPolicy: watched %v, want %v", i+1, got, want)
		}
	}
}

// tlsPolicy returns a BackendTLSPolicy for Service svc in ns.
func tlsPolicy(name string) *gwv1.BackendTLSPolicy {
	return &gwv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{
				LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Group: "", Kind: "Service", Name: "svc"},
			}},
			Validation: gwv1.BackendTLSPolicyValidation{WellKnownCACertificates: ptr(gwv1.WellKnownCACertificatesSystem), Hostname: "svc.example.com"},
		},
	}
}

// waitUnserved waits until discovery no longer lists kind in groupVersion,
// as it does a little after its CRD is deleted: seconds, but the API
// server's CRD cleanup is slower on a loaded machine (30 s was seen to
// pass), so the bound is generous — it guards against a hang, not a time.
func waitUnserved(t *testing.T, env *apiserver.Env, groupVersion, kind string) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		list, err := env.Kube.Discovery().ServerResourcesForGroupVersion(groupVersion)
		if apierrors.IsNotFound(err) ||
			err == nil && !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Kind == kind }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still served after deleting its CRD", kind)
		}
	}
}

// watched reads sockmesh_source_kind_watched for kind.
func watched(t *testing.T, s *Source, kind string) float64 {
	t.Helper()
	var m dto.Metric
	if err := s.watched.WithLabelValues(kind).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// deleteCRD deletes the CRD name once every version it serves lists: the
// API server re-initialises a new CRD's storage a little after it is
// Established, and a CRD deleted meanwhile is finalised only after the
// finalizer's growing retries ("storage is (re)initializing"), minutes on
// a loaded machine — waitUnserved would then wait past its bound.
func deleteCRD(t *testing.T, env *apiserver.Env, name string) {
	t.Helper()
	ctx := t.Context()
	crd := must.Value[*unstructured.Unstructured](t)(env.Dynamic.Resource(crdResource).Get(ctx, name, metav1.GetOptions{}))
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		v, _ := v.(map[string]any)
		if served, _ := v["served"].(bool); !served {
			continue
		}
		version, _ := v["name"].(string)
		gvr := schema.GroupVersionResource{Group: group, Version: version, Resource: plural}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			_, err := env.Dynamic.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("list %s before deleting its CRD: %v", gvr, err)
			}
		}
	}
	if err := env.Dynamic.Resource(crdResource).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// testCA returns a CA certificate in PEM, as a ClusterTrustBundle must
// hold.
func testCA(t *testing.T) string {
	t.Helper()
	ca, err := pki.NewCA("source-test-ca")
	if err != nil {
		t.Fatal(err)
	}
	return string(ca.CertPEM)
}

func TestRelevantUpdates(t *testing.T) {
	base := &gwv1.BackendTLSPolicy{ObjectMeta: metav1.ObjectMeta{Generation: 1, Labels: map[string]string{"a": "b"}}}
	statusOnly := base.DeepCopy()
	statusOnly.ResourceVersion = "2"
	statusOnly.Status.Ancestors = []gwv1.PolicyAncestorStatus{{ControllerName: translate.ControllerName}}
	newSpec := base.DeepCopy()
	newSpec.Generation = 2
	relabelled := base.DeepCopy()
	relabelled.Labels["a"] = "c"
	for name, tc := range map[string]struct {
		new  *gwv1.BackendTLSPolicy
		want bool
	}{"status only": {statusOnly, false}, "new generation": {newSpec, true}, "labels": {relabelled, true}} {
		if got := specChanged(base, tc.new); got != tc.want {
			t.Errorf("specChanged(%s) = %v, want %v", name, got, tc.want)
		}
		if got := statusChanged(base, tc.new); got != tc.want {
			t.Errorf("statusChanged(%s) = %v, want %v", name, got, tc.want)
		}
	}
	// Our own status writes are no rebuild; another controller's entries
	// take room in the policy's status, which translate gives out.
	theirs := statusOnly.DeepCopy()
	theirs.Status.Ancestors = append(theirs.Status.Ancestors, gwv1.PolicyAncestorStatus{ControllerName: "example.net/gateway"})
	if !statusChanged(statusOnly, theirs) {
		t.Error("statusChanged(another controller's ancestor) = false, want true")
	}
}

// TestOtherControllersAncestorsSignal: another controller's new ancestor
// entry in a policy's status signals a change (translate gives the
// policy's targets the room left in its status), though status-only
// updates otherwise do not.
func TestOtherControllersAncestorsSignal(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	gw := env.Gateway
	must.Succeed(t)(env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	s := startSource(t, env)
	waitInput(t, s, "the first listing", func(translate.Input) bool { return true })
	target := []gwv1.LocalPolicyTargetReference{{Group: "", Kind: "Service", Name: "svc"}}
	tp := must.Value[*gwxv1alpha1.XBackendTrafficPolicy](t)(gw.ExperimentalV1alpha1().XBackendTrafficPolicies(ns).Create(ctx, &gwxv1alpha1.XBackendTrafficPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "budget", Namespace: ns},
		Spec:       gwxv1alpha1.BackendTrafficPolicySpec{TargetRefs: target},
	}, metav1.CreateOptions{}))
	tlsp := must.Value[*gwv1.BackendTLSPolicy](t)(gw.GatewayV1().BackendTLSPolicies(ns).Create(ctx, &gwv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "tls", Namespace: ns},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{LocalPolicyTargetReference: target[0]}},
			Validation: gwv1.BackendTLSPolicyValidation{WellKnownCACertificates: ptr(gwv1.WellKnownCACertificatesSystem), Hostname: "svc.example.com"},
		},
	}, metav1.CreateOptions{}))
	waitInput(t, s, "the policies", func(in translate.Input) bool {
		return len(in.BackendTLSPolicies) == 1 && len(in.XBackendTrafficPolicies) == 1
	})

	theirs := []gwv1.PolicyAncestorStatus{{
		AncestorRef:    gwv1.ParentReference{Name: "gw"},
		ControllerName: "example.net/gateway-controller",
		Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted",
			LastTransitionTime: metav1.Now()}},
	}}
	tlsp.Status.Ancestors = theirs
	must.Succeed(t)(gw.GatewayV1().BackendTLSPolicies(ns).UpdateStatus(ctx, tlsp, metav1.UpdateOptions{}))
	waitInput(t, s, "the BackendTLSPolicy's new ancestor", func(in translate.Input) bool {
		return len(in.BackendTLSPolicies) == 1 && len(in.BackendTLSPolicies[0].Status.Ancestors) == 1
	})
	tp.Status.Ancestors = theirs
	must.Succeed(t)(gw.ExperimentalV1alpha1().XBackendTrafficPolicies(ns).UpdateStatus(ctx, tp, metav1.UpdateOptions{}))
	waitInput(t, s, "the XBackendTrafficPolicy's new ancestor", func(in translate.Input) bool {
		return len(in.XBackendTrafficPolicies) == 1 && len(in.XBackendTrafficPolicies[0].Status.Ancestors) == 1
	})
}

// TestClientCertificateInAnotherNamespace: an XBackend's clientCertificateRef
// to a Secret in another namespace makes the source read that Secret only
// once a ReferenceGrant there allows it (a SecretObjectReference's
// namespace "requires a ReferenceGrant in the referent namespace"), and
// translate then uses it; without the grant the Secret is not read and the
// XBackend is ResolvedRefs=False/RefNotPermitted.
func TestClientCertificateInAnotherNamespace(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	kube, gw := env.Kube, env.Gateway
	const apps, certs = "xb-apps", "xb-certs"
	for _, n := range []string{apps, certs} {
		must.Succeed(t)(kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}))
	}
	ca, err := pki.NewCA("client-ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "client", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	must.Succeed(t)(kube.CoreV1().Secrets(certs).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "client", Namespace: certs},
		Data:       map[string][]byte{"tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.CoreV1().Services(apps).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "partner", Namespace: apps, Annotations: map[string]string{translate.AnnotationXBackend: "partner"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 443}}},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(gw.ExperimentalV1alpha1().XBackends(apps).Create(ctx, &gwxv1alpha1.XBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "partner", Namespace: apps},
		Spec: gwxv1alpha1.BackendSpec{
			Type:             gwxv1alpha1.BackendTypeExternalHostname,
			Port:             gwxv1alpha1.BackendPort{Number: 443},
			ExternalHostname: &gwxv1alpha1.ExternalHostnameBackend{Hostname: "api.example.com"},
			TLS: &gwxv1alpha1.BackendTLS{
				Mode:                 gwxv1alpha1.BackendTLSModeClientAndServer,
				ClientCertificateRef: &gwv1.SecretObjectReference{Name: "client", Namespace: ptr(gwv1.Namespace(certs))},
				Validation:           &gwv1.BackendTLSPolicyValidation{WellKnownCACertificates: ptr(gwv1.WellKnownCACertificatesSystem), Hostname: "api.example.com"},
			},
		},
	}, metav1.CreateOptions{}))
	s := startSource(t, env)

	// resolvedRefs translates in now, as the control plane does, and
	// returns the XBackend's ResolvedRefs condition.
	resolvedRefs := func(in translate.Input) metav1.Condition {
		t.Helper()
		in.Now = time.Now()
		res, err := translate.Translate(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range res.Status.XBackends[types.NamespacedName{Namespace: apps, Name: "partner"}] {
			for _, c := range a.Conditions {
				if c.Type == "ResolvedRefs" {
					return c
				}
			}
		}
		t.Fatalf("no ResolvedRefs condition on XBackend %s/partner: %+v", apps, res.Status.XBackends)
		return metav1.Condition{}
	}

	in := waitInput(t, s, "the XBackend", func(in translate.Input) bool { return len(in.XBackends) == 1 && len(in.Services) >= 1 })
	if got := names(in.Secrets); len(got) != 0 {
		t.Errorf("secrets without a ReferenceGrant = %v, want none read", got)
	}
	if c := resolvedRefs(in); c.Status != metav1.ConditionFalse || c.Reason != "RefNotPermitted" {
		t.Errorf("without a ReferenceGrant: ResolvedRefs = %s/%s (%s), want False/RefNotPermitted", c.Status, c.Reason, c.Message)
	}

	must.Succeed(t)(gw.GatewayV1().ReferenceGrants(certs).Create(ctx, &gwv1.ReferenceGrant{
		ObjectMeta: metav1.ObjectMeta{Name: "apps-xbackends", Namespace: certs},
		Spec: gwv1.ReferenceGrantSpec{
			From: []gwv1.ReferenceGrantFrom{{Group: gwxv1alpha1.GroupName, Kind: "XBackend", Namespace: apps}},
			To:   []gwv1.ReferenceGrantTo{{Kind: "Secret", Name: ptr(gwv1.ObjectName("client"))}},
		},
	}, metav1.CreateOptions{}))
	in = waitInput(t, s, "the client certificate Secret", func(in translate.Input) bool { return len(in.Secrets) == 1 })
	if got := names(in.Secrets); !slices.Equal(got, []string{certs + "/client"}) {
		t.Errorf("secrets with the ReferenceGrant = %v, want [%s/client]", got, certs)
	}
	if c := resolvedRefs(in); c.Status != metav1.ConditionTrue {
		t.Errorf("with the ReferenceGrant: ResolvedRefs = %s/%s (%s), want True", c.Status, c.Reason, c.Message)
	}

	// The grant goes: so does the Secret, and the reference is refused again.
	must.Succeed(t)(nil, gw.GatewayV1().ReferenceGrants(certs).Delete(ctx, "apps-xbackends", metav1.DeleteOptions{}))
	in = waitInput(t, s, "the Secret to go with the grant", func(in translate.Input) bool { return len(in.Secrets) == 0 && len(in.ReferenceGrants) == 0 })
	if c := resolvedRefs(in); c.Reason != "RefNotPermitted" {
		t.Errorf("after the ReferenceGrant went: ResolvedRefs = %s/%s, want RefNotPermitted", c.Status, c.Reason)
	}
}
