package controlplane_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/leader"
	"github.com/sockmesh/sockmesh/agent/resolve"
	"github.com/sockmesh/sockmesh/agent/selectorsvc"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	kubesource "github.com/sockmesh/sockmesh/agent/source/kubernetes"
	"github.com/sockmesh/sockmesh/agent/status"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/dnsserver"
	"github.com/sockmesh/sockmesh/test/pki"
)

const (
	ns       = "cp-test"
	nodeName = "smt-node"
)

func ptr[T any](v T) *T { return &v }

func newCA(t *testing.T, name string) string {
	t.Helper()
	ca, err := pki.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(ca.CertPEM)
}

// agent is one run of the control plane, as the agent binary wires it.
type agent struct {
	cp     *controlplane.ControlPlane
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// agentConfig is what startAgent's options may change.
type agentConfig struct {
	rest *rest.Config        // the agent's client config: env.Config's
	cp   controlplane.Config // RetryInterval, AccessRecheck
	// passes, if set, counts the translations the writers were handed,
	// each once both writers returned.
	passes *atomic.Int64
}

func startAgent(t *testing.T, env *apiserver.Env, identity, dnsAddr string, opts ...func(*agentConfig)) *agent {
	t.Helper()
	ac := agentConfig{rest: rest.CopyConfig(env.Config)}
	for _, o := range opts {
		o(&ac)
	}
	kube, gwc, err := kubesource.NewClients(ac.rest)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	src, err := kubesource.New(kubesource.Config{NodeName: nodeName}, kube, gwc, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := resolve.New(resolve.Config{Servers: []string{dnsAddr}, MinInterval: 50 * time.Millisecond, MaxInterval: 200 * time.Millisecond}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	el, err := leader.New(leader.Config{Namespace: ns, Identity: identity,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond}, kube, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	sw, err := status.New(status.Config{}, gwc, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	svcs, err := selectorsvc.New(selectorsvc.Config{}, kube, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ac.cp
	cfg.Node = translate.Node{
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix(apiserver.ServiceCIDR)},
		PodCIDRs:     []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
	}
	cfg.Resolver, cfg.Leader, cfg.Access = res, el, controlplane.SelfAccess(kube.AuthorizationV1())
	cfg.Writers = []controlplane.Writer{
		controlplane.WriterFunc(func(ctx context.Context, in translate.Input, r translate.Result, g *controlplane.Gate) error {
			return sw.Write(ctx, in, r.Status, g)
		}),
		controlplane.WriterFunc(func(ctx context.Context, in translate.Input, r translate.Result, g *controlplane.Gate) error {
			return svcs.Apply(ctx, in, r.EndpointSelectorServices, g)
		}),
	}
	if ac.passes != nil {
		cfg.Writers = append(cfg.Writers, controlplane.WriterFunc(func(context.Context, translate.Input, translate.Result, *controlplane.Gate) error {
			ac.passes.Add(1)
			return nil
		}))
	}
	cp, err := controlplane.New(cfg, src, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{cp: cp, cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- cp.Run(ctx) }()
	t.Cleanup(func() { a.stop(t) })
	return a
}

func (a *agent) stop(t *testing.T) {
	a.once.Do(func() {
		a.cancel()
		if err := <-a.done; err != nil {
			t.Errorf("control plane run: %v", err)
		}
	})
}

// waitSnapshot waits for a published Snapshot that satisfies ok.
func (a *agent) waitSnapshot(t *testing.T, what string, ok func(*snapshot.Snapshot) bool) *snapshot.Snapshot {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		s, updated := a.cp.Current()
		if ok(s) {
			return s
		}
		select {
		case <-updated:
		case <-timeout:
			t.Fatalf("timed out waiting for a snapshot with %s; last version %d: %+v", what, s.Version, s)
		}
	}
}

// eventually polls cond (an API read) until it holds.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func backendFor(s *snapshot.Snapshot, svc string, port uint16) *snapshot.Backend {
	for _, f := range s.Frontends {
		if f.Service.Namespace == ns && f.Service.Name == svc && f.Port == port {
			b, _ := s.Backend(f.Backend)
			return b
		}
	}
	return nil
}

func endpointAddrs(b *snapshot.Backend) []netip.AddrPort {
	var out []netip.AddrPort
	for _, e := range b.Endpoints {
		out = append(out, e.Addr)
	}
	return out
}

// ourAncestors returns sockmesh's ancestor entries of the policy.
func ourAncestors(p *gwv1.BackendTLSPolicy) []gwv1.PolicyAncestorStatus {
	var out []gwv1.PolicyAncestorStatus
	for _, a := range p.Status.Ancestors {
		if a.ControllerName == translate.ControllerName {
			out = append(out, a)
		}
	}
	return out
}

// TestControlPlaneAgainstAPIServer runs the whole loop — kubernetes source,
// resolver, translate, Snapshot, leader election, status and generated
// Services — against a real API server, and through a restart.
func TestControlPlaneAgainstAPIServer(t *testing.T) {
	env := apiserver.Start(t)
	dns := dnsserver.Start(t)
	dns.Set("api.example.test", 5, netip.MustParseAddr("192.0.2.10"))
	ctx := t.Context()
	kube, gw := env.Kube, env.Gateway
	ca1, ca2 := newCA(t, "ca-1"), newCA(t, "ca-2")

	must.Succeed(t)(kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName,
		Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "web-ca", Namespace: ns}, Data: map[string]string{"ca.crt": ca1},
	}, metav1.CreateOptions{}))
	web := must.Value[*corev1.Service](t)(kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		// Topology hints: the node's zone (its Node's label) prefers the
		// first endpoint, the other is its fallback.
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
				Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}},
			{Addresses: []string{"10.244.2.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
				Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}}}},
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(8443))}},
	}, metav1.CreateOptions{}))
	policy := must.Value[*gwv1.BackendTLSPolicy](t)(gw.GatewayV1().BackendTLSPolicies(ns).Create(ctx, &gwv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web-tls", Namespace: ns},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{
				LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Group: "", Kind: "Service", Name: "web"},
			}},
			Validation: gwv1.BackendTLSPolicyValidation{
				CACertificateRefs: []gwv1.LocalObjectReference{{Group: "", Kind: "ConfigMap", Name: "web-ca"}},
				Hostname:          "web.example.com",
			},
		},
	}, metav1.CreateOptions{}))
	// Another controller reports on the same policy.
	theirs := gwv1.PolicyAncestorStatus{
		AncestorRef:    gwv1.ParentReference{Name: "edge-gateway"},
		ControllerName: "example.com/gateway-controller",
		Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted",
			Message: "theirs", ObservedGeneration: 1, LastTransitionTime: metav1.Now()}},
	}
	policy.Status.Ancestors = []gwv1.PolicyAncestorStatus{theirs}
	must.Succeed(t)(gw.GatewayV1().BackendTLSPolicies(ns).UpdateStatus(ctx, policy, metav1.UpdateOptions{}))

	// An external API reached through a Service that stands for an
	// XBackend, and an XBackend that selects pods.
	must.Succeed(t)(gw.ExperimentalV1alpha1().XBackends(ns).Create(ctx, &gwxv1alpha1.XBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: ns},
		Spec: gwxv1alpha1.BackendSpec{
			Type:             gwxv1alpha1.BackendTypeExternalHostname,
			Port:             gwxv1alpha1.BackendPort{Number: 443},
			ExternalHostname: &gwxv1alpha1.ExternalHostnameBackend{Hostname: "api.example.test"},
			TLS: &gwxv1alpha1.BackendTLS{Mode: gwxv1alpha1.BackendTLSModeServerOnly,
				Validation: &gwv1.BackendTLSPolicyValidation{WellKnownCACertificates: ptr(gwv1.WellKnownCACertificatesSystem), Hostname: "api.example.test"}},
		},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: ns, Annotations: map[string]string{translate.AnnotationXBackend: "ext"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(gw.ExperimentalV1alpha1().XBackends(ns).Create(ctx, &gwxv1alpha1.XBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "sel", Namespace: ns},
		Spec: gwxv1alpha1.BackendSpec{
			Type: gwxv1alpha1.BackendTypeEndpointSelector,
			Port: gwxv1alpha1.BackendPort{Number: 8080},
			EndpointSelector: &gwxv1alpha1.EndpointSelectorBackend{LabelSelector: gwxv1alpha1.LabelSelector{
				MatchLabels: map[gwv1.LabelKey]gwv1.LabelValue{"app": "sel"}}},
		},
	}, metav1.CreateOptions{}))
	must.Succeed(t)(gw.ExperimentalV1alpha1().XMeshes().Create(ctx, &gwxv1alpha1.XMesh{
		ObjectMeta: metav1.ObjectMeta{Name: "sockmesh"},
		Spec:       gwxv1alpha1.MeshSpec{ControllerName: translate.ControllerName},
	}, metav1.CreateOptions{}))

	a := startAgent(t, env, "agent-1", dns.Addr)

	// The Snapshot: web's ClusterIP port goes to its endpoints over TLS
	// with the ConfigMap's CA; ext's goes to the DNS answer.
	clusterIP := netip.MustParseAddr(web.Spec.ClusterIP)
	s := a.waitSnapshot(t, "web with CA 1 and ext resolved", func(s *snapshot.Snapshot) bool {
		b, e := backendFor(s, "web", 443), backendFor(s, "ext", 443)
		return b != nil && b.TLS != nil && b.TLS.RootsPEM == ca1 && e != nil && len(e.Endpoints) == 1
	})
	f, found := s.Frontend(netip.AddrPortFrom(clusterIP, 443))
	if !found || f.Service.Name != "web" || f.FailurePolicy != snapshot.FailClosed {
		t.Errorf("frontend for %s:443 = %+v, %v", clusterIP, f, found)
	}
	webBackend := backendFor(s, "web", 443)
	if got, want := endpointAddrs(webBackend), []netip.AddrPort{netip.MustParseAddrPort("10.244.1.5:8443"), netip.MustParseAddrPort("10.244.2.5:8443")}; !slices.Equal(got, want) ||
		webBackend.Endpoints[0].Fallback != 0 || webBackend.Endpoints[1].Fallback != snapshot.FallbackFar {
		t.Errorf("web endpoints = %+v, want %v, the second a fallback", webBackend.Endpoints, want)
	}
	if webBackend.TLS.ServerName != "web.example.com" || webBackend.Invalid != nil {
		t.Errorf("web TLS = %+v, invalid %+v", webBackend.TLS, webBackend.Invalid)
	}
	if got := endpointAddrs(backendFor(s, "ext", 443)); !slices.Equal(got, []netip.AddrPort{netip.MustParseAddrPort("192.0.2.10:443")}) {
		t.Errorf("ext endpoints = %v", got)
	}

	// Status: ours next to theirs; XBackend and XMesh accepted; the
	// EndpointSelector XBackend got its Service.
	var firstLTT metav1.Time
	eventually(t, "policy status", func() error {
		p, err := gw.GatewayV1().BackendTLSPolicies(ns).Get(ctx, "web-tls", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ours := ourAncestors(p)
		if len(p.Status.Ancestors) != 2 || len(ours) != 1 || p.Status.Ancestors[0].ControllerName != theirs.ControllerName {
			return fmt.Errorf("ancestors %+v", p.Status.Ancestors)
		}
		acc := findCondition(ours[0].Conditions, "Accepted")
		if acc == nil || acc.Status != metav1.ConditionTrue {
			return fmt.Errorf("our conditions %+v", ours[0].Conditions)
		}
		firstLTT = acc.LastTransitionTime
		return nil
	})
	eventually(t, "XBackend and XMesh status", func() error {
		xb, err := gw.ExperimentalV1alpha1().XBackends(ns).Get(ctx, "ext", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(xb.Status.Ancestors) == 0 {
			return fmt.Errorf("ext ancestors %+v", xb.Status.Ancestors)
		}
		m, err := gw.ExperimentalV1alpha1().XMeshes().Get(ctx, "sockmesh", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := findCondition(m.Status.Conditions, "Accepted"); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("xmesh status %+v", m.Status)
		}
		return nil
	})
	generated := func() ([]corev1.Service, error) {
		list, err := kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{
			LabelSelector: labels.SelectorFromSet(labels.Set{translate.LabelXBackend: "sel"}).String()})
		if err != nil {
			return nil, err
		}
		return list.Items, nil
	}
	eventually(t, "the EndpointSelector XBackend's Service", func() error {
		svcs, err := generated()
		if err != nil || len(svcs) != 1 {
			return fmt.Errorf("%d services, err %v", len(svcs), err)
		}
		return nil
	})

	// Rotate the CA: the next Snapshot trusts CA 2.
	cm := must.Value[*corev1.ConfigMap](t)(kube.CoreV1().ConfigMaps(ns).Get(ctx, "web-ca", metav1.GetOptions{}))
	cm.Data["ca.crt"] = ca2
	must.Succeed(t)(kube.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}))
	rotated := a.waitSnapshot(t, "CA 2", func(s *snapshot.Snapshot) bool {
		b := backendFor(s, "web", 443)
		return b != nil && b.TLS != nil && b.TLS.RootsPEM == ca2
	})
	if rotated.Version <= s.Version {
		t.Errorf("version after rotation %d, not above %d", rotated.Version, s.Version)
	}

	// The external name moves: the endpoints follow.
	dns.Set("api.example.test", 5, netip.MustParseAddr("192.0.2.11"))
	a.waitSnapshot(t, "ext's new address", func(s *snapshot.Snapshot) bool {
		e := backendFor(s, "ext", 443)
		return e != nil && slices.Equal(endpointAddrs(e), []netip.AddrPort{netip.MustParseAddrPort("192.0.2.11:443")})
	})

	// Restart the agent: a new source, writers and lease holder converge
	// on the same state without duplicating any entry or Service.
	a.stop(t)
	// While no agent runs, the EndpointSelector XBackend's Service is made
	// ExternalName by hand (no EndpointSlices), its type the only drift: the
	// agent that starts brings the Service back to the XBackend's spec,
	// though nothing changes after it starts.
	before := must.Value[[]corev1.Service](t)(generated())
	if len(before) != 1 {
		t.Fatalf("%d generated services before the restart, want 1", len(before))
	}
	edited := before[0]
	edited.Spec.Type, edited.Spec.ExternalName = corev1.ServiceTypeExternalName, "elsewhere.example.com"
	edited.Spec.ClusterIP, edited.Spec.ClusterIPs, edited.Spec.IPFamilies, edited.Spec.IPFamilyPolicy = "", nil, nil, nil
	must.Succeed(t)(kube.CoreV1().Services(ns).Update(ctx, &edited, metav1.UpdateOptions{}))
	b := startAgent(t, env, "agent-2", dns.Addr)
	eventually(t, "the generated Service brought to the XBackend's spec", func() error {
		svcs, err := generated()
		if err != nil || len(svcs) != 1 {
			return fmt.Errorf("%d services, err %v", len(svcs), err)
		}
		if s := svcs[0].Spec; s.Selector["app"] != "sel" || s.Type != corev1.ServiceTypeClusterIP || s.ClusterIP != corev1.ClusterIPNone {
			return fmt.Errorf("service %s selects %v, type %s, clusterIP %q", svcs[0].Name, s.Selector, s.Type, s.ClusterIP)
		}
		return nil
	})
	b.waitSnapshot(t, "the same state after a restart", func(s *snapshot.Snapshot) bool {
		w := backendFor(s, "web", 443)
		return w != nil && w.TLS != nil && w.TLS.RootsPEM == ca2 && backendFor(s, "ext", 443) != nil
	})
	// Wait until agent-2 has led and written once: its lease is held.
	eventually(t, "agent-2 to hold the lease", func() error {
		l, err := kube.CoordinationV1().Leases(ns).Get(ctx, "sockmesh-writer", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if h := l.Spec.HolderIdentity; h == nil || *h != "agent-2" {
			return fmt.Errorf("holder %v", h)
		}
		return nil
	})
	// Change the policy's spec so that agent-2, as leader, must write
	// (observedGeneration 2), then check that nothing was duplicated.
	p := must.Value[*gwv1.BackendTLSPolicy](t)(gw.GatewayV1().BackendTLSPolicies(ns).Get(ctx, "web-tls", metav1.GetOptions{}))
	p.Spec.Validation.Hostname = "web2.example.com"
	must.Succeed(t)(gw.GatewayV1().BackendTLSPolicies(ns).Update(ctx, p, metav1.UpdateOptions{}))
	eventually(t, "agent-2 to write generation 2", func() error {
		p, err := gw.GatewayV1().BackendTLSPolicies(ns).Get(ctx, "web-tls", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ours := ourAncestors(p)
		if len(ours) != 1 || len(p.Status.Ancestors) != 2 {
			return fmt.Errorf("ancestors %+v", p.Status.Ancestors)
		}
		acc := findCondition(ours[0].Conditions, "Accepted")
		if acc == nil || acc.ObservedGeneration != 2 {
			return fmt.Errorf("accepted %+v", acc)
		}
		if acc.Status != metav1.ConditionTrue || !acc.LastTransitionTime.Equal(&firstLTT) {
			t.Errorf("Accepted stayed true but its time moved: %+v, want time %v", acc, firstLTT)
		}
		return nil
	})
	if svcs, err := generated(); err != nil || len(svcs) != 1 {
		t.Errorf("after a restart: %d generated services (err %v), want 1", len(svcs), err)
	}

	// Delete the policy: web is no longer captured.
	must.Succeed(t)(nil, gw.GatewayV1().BackendTLSPolicies(ns).Delete(ctx, "web-tls", metav1.DeleteOptions{}))
	b.waitSnapshot(t, "web no longer captured", func(s *snapshot.Snapshot) bool {
		_, captured := s.Frontend(netip.AddrPortFrom(clusterIP, 443))
		return !captured && backendFor(s, "ext", 443) != nil
	})

	// Delete the EndpointSelector XBackend: its Service goes too.
	must.Succeed(t)(nil, gw.ExperimentalV1alpha1().XBackends(ns).Delete(ctx, "sel", metav1.DeleteOptions{}))
	eventually(t, "the generated Service to go", func() error {
		svcs, err := generated()
		if err != nil || len(svcs) != 0 {
			return fmt.Errorf("%d services, err %v", len(svcs), err)
		}
		return nil
	})
}

func findCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}
