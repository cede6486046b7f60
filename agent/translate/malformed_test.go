package translate_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
	"sigs.k8s.io/randfill"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestTranslateMalformed feeds objects that are nil, empty, or hold
// fields no API server would accept: Translate must neither panic nor
// return an error, and what it returns must keep the fail-closed rules.
func TestTranslateMalformed(t *testing.T) {
	corpus := map[string]translate.Input{
		"zero": {},
		"nil objects": {
			Services: []*corev1.Service{nil}, EndpointSlices: []*discoveryv1.EndpointSlice{nil},
			Namespaces: []*corev1.Namespace{nil}, Pods: []*corev1.Pod{nil}, ConfigMaps: []*corev1.ConfigMap{nil},
			Secrets: []*corev1.Secret{nil}, ClusterTrustBundles: []*certificatesv1.ClusterTrustBundle{nil},
			BackendTLSPolicies: []*gwv1.BackendTLSPolicy{nil}, HTTPRoutes: []*gwv1.HTTPRoute{nil},
			GRPCRoutes: []*gwv1.GRPCRoute{nil}, XBackends: []*gwxv1alpha1.XBackend{nil},
			XBackendTrafficPolicies: []*gwxv1alpha1.XBackendTrafficPolicy{nil}, XMeshes: []*gwxv1alpha1.XMesh{nil},
			ReferenceGrants: []*gwv1.ReferenceGrant{nil},
		},
		"empty objects": {
			Services: []*corev1.Service{{}}, EndpointSlices: []*discoveryv1.EndpointSlice{{}},
			Namespaces: []*corev1.Namespace{{}}, Pods: []*corev1.Pod{{}}, ConfigMaps: []*corev1.ConfigMap{{}},
			Secrets: []*corev1.Secret{{}}, ClusterTrustBundles: []*certificatesv1.ClusterTrustBundle{{}},
			BackendTLSPolicies: []*gwv1.BackendTLSPolicy{{}}, HTTPRoutes: []*gwv1.HTTPRoute{{}},
			GRPCRoutes: []*gwv1.GRPCRoute{{}}, XBackends: []*gwxv1alpha1.XBackend{{}},
			XBackendTrafficPolicies: []*gwxv1alpha1.XBackendTrafficPolicy{{}}, XMeshes: []*gwxv1alpha1.XMesh{{}},
			ReferenceGrants: []*gwv1.ReferenceGrant{{}},
		},
	}
	// Objects pointing at each other with nothing else set.
	empty := gwv1.Group("")
	svcKind := gwv1.Kind("Service")
	sectionName := gwv1.SectionName("missing")
	corpus["bare references"] = translate.Input{
		Services: []*corev1.Service{{Spec: corev1.ServiceSpec{ClusterIP: "10.0.0.1", Ports: []corev1.ServicePort{{Port: 443}}}}},
		BackendTLSPolicies: []*gwv1.BackendTLSPolicy{{Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{
				{LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Kind: "Service"}},
				{LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Kind: "Service"}, SectionName: &sectionName},
			},
			Validation: gwv1.BackendTLSPolicyValidation{CACertificateRefs: []gwv1.LocalObjectReference{{Kind: "ConfigMap"}, {Group: "certificates.k8s.io", Kind: "ClusterTrustBundle"}}},
		}}},
		XBackends: []*gwxv1alpha1.XBackend{
			{Spec: gwxv1alpha1.BackendSpec{Type: gwxv1alpha1.BackendTypeEndpointSelector, EndpointSelector: &gwxv1alpha1.EndpointSelectorBackend{}}},
			{Spec: gwxv1alpha1.BackendSpec{Type: gwxv1alpha1.BackendTypeExternalHostname, ExternalHostname: &gwxv1alpha1.ExternalHostnameBackend{},
				TLS: &gwxv1alpha1.BackendTLS{Mode: gwxv1alpha1.BackendTLSModeClientAndServer, ClientCertificateRef: &gwv1.SecretObjectReference{}, Validation: &gwv1.BackendTLSPolicyValidation{}}}},
		},
		HTTPRoutes: []*gwv1.HTTPRoute{{Spec: gwv1.HTTPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Group: &empty, Kind: &svcKind}}}}}},
		Resolved:   map[string][]netip.Addr{"": {{}}},
	}
	for name, in := range corpus {
		t.Run(name, func(t *testing.T) { checkInvariants(t, in) })
	}
}

// TestTranslateRandom runs checkInvariants on random object sets from fixed
// seeds, so every run covers the same cases; FuzzTranslate explores more.
func TestTranslateRandom(t *testing.T) {
	n := 200
	if testing.Short() {
		n = 30
	}
	for seed := range int64(n) {
		in := randomInput(randfill.NewWithSeed(seed))
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkInvariants(t, in) })
	}
}

func FuzzTranslate(f *testing.F) {
	for _, s := range []string{"", "sockmesh", "\x00\x01\x02\x03\x04\x05\x06\x07", "BackendTLSPolicy XBackend"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkInvariants(t, randomInput(randfill.NewFromGoFuzz(data)))
	})
}

// checkInvariants translates in and checks what must hold whatever the
// objects: no error, the same output twice, and checkResult.
func checkInvariants(t *testing.T, in translate.Input) {
	t.Helper()
	res, err := translate.Translate(in)
	if err != nil {
		t.Fatalf("Translate error: %v", err)
	}
	again, err := translate.Translate(in)
	if err != nil {
		t.Fatalf("second Translate error: %v", err)
	}
	a, _ := json.Marshal(toGolden(res))
	b, _ := json.Marshal(toGolden(again))
	if string(a) != string(b) {
		t.Fatalf("Translate is not deterministic")
	}
	checkResult(t, res)
	checkXBackends(t, in, res)
	checkStatusWithoutDNS(t, in, res)
}

// checkStatusWithoutDNS translates again with no DNS answers and requires
// the same status: DNS answers are node-local, and the elected agent
// writes the status every agent would.
func checkStatusWithoutDNS(t *testing.T, in translate.Input, first translate.Result) {
	t.Helper()
	in.Resolved = nil
	res, err := translate.Translate(in)
	if err != nil {
		t.Fatalf("Translate without DNS answers: %v", err)
	}
	if diff := cmp.Diff(toGolden(first).Status, toGolden(res).Status, cmpOpts...); diff != "" {
		t.Errorf("status depends on this node's DNS answers (-with +without):\n%s", diff)
	}
}

// checkXBackends checks that every XBackend's backend keeps what its spec
// asks of the wire, or is Invalid: never plaintext where TLS is asked for,
// never without the client certificate of ClientAndServer, and TLS exactly
// where its protocol needs or forbids it (the CRD's rules).
func checkXBackends(t *testing.T, in translate.Input, res translate.Result) {
	t.Helper()
	specs := map[types.NamespacedName][]*gwxv1alpha1.XBackend{}
	for _, xb := range in.XBackends {
		if xb != nil {
			k := types.NamespacedName{Namespace: xb.Namespace, Name: xb.Name}
			specs[k] = append(specs[k], xb)
		}
	}
	for _, be := range res.Backends {
		xbs := specs[types.NamespacedName{Namespace: be.Ref.Namespace, Name: be.Ref.Name}]
		if be.Ref.Kind != snapshot.KindXBackend || len(xbs) != 1 || be.Invalid != nil {
			continue // a duplicate name leaves which one won to translate
		}
		spec := xbs[0].Spec
		mode := gwxv1alpha1.BackendTLSModeNone
		if spec.TLS != nil {
			mode = spec.TLS.Mode
		}
		switch {
		case mode != gwxv1alpha1.BackendTLSModeNone && be.TLS == nil:
			t.Errorf("XBackend %s: tls.mode %s, but a valid backend without TLS", be.Ref, mode)
		case mode == gwxv1alpha1.BackendTLSModeNone && be.TLS != nil:
			t.Errorf("XBackend %s: tls.mode None, but a backend with TLS", be.Ref)
		case mode == gwxv1alpha1.BackendTLSModeClientAndServer && be.TLS.Mode != snapshot.TLSMutual:
			t.Errorf("XBackend %s: ClientAndServer, but TLS mode %s", be.Ref, be.TLS.Mode)
		case be.Protocol == snapshot.ProtocolH2C && be.TLS != nil,
			(be.Protocol == snapshot.ProtocolHTTP2 || be.Protocol == snapshot.ProtocolWSS) && be.TLS == nil:
			t.Errorf("XBackend %s: protocol %s with TLS %v", be.Ref, be.Protocol, be.TLS != nil)
		}
		if spec.Protocol != nil && string(be.Protocol) != string(*spec.Protocol) || spec.Protocol == nil && be.Protocol != snapshot.ProtocolAuto {
			t.Errorf("XBackend %s: protocol %q, want the spec's %v", be.Ref, be.Protocol, spec.Protocol)
		}
	}
}

// checkResult checks the rules every Result keeps: ports whose backend
// needs TLS or is invalid fail closed, TLS settings are complete, and
// status conditions are well formed and within the API's limits.
func checkResult(t *testing.T, res translate.Result) {
	t.Helper()
	backends := map[snapshot.BackendRef]snapshot.Backend{}
	for _, be := range res.Backends {
		backends[be.Ref] = be
		if tls := be.TLS; tls != nil {
			if be.Invalid != nil {
				t.Errorf("backend %s has both TLS and Invalid", be.Ref)
			}
			if (tls.RootsPEM == "") == !tls.SystemRoots {
				t.Errorf("backend %s TLS: RootsPEM set %v, SystemRoots %v; want exactly one", be.Ref, tls.RootsPEM != "", tls.SystemRoots)
			}
			if tls.ServerName == "" {
				t.Errorf("backend %s TLS without a server name", be.Ref)
			}
			if (tls.Mode == snapshot.TLSMutual) != (tls.ClientCertificatePEM != "" && tls.ClientKeyPEM != "") {
				t.Errorf("backend %s TLS mode %s with client certificate %v", be.Ref, tls.Mode, tls.ClientCertificatePEM != "")
			}
		}
		if be.Invalid != nil && be.Invalid.Reason == "" {
			t.Errorf("backend %s Invalid without a reason", be.Ref)
		}
	}
	for _, f := range res.Frontends {
		be := backends[f.Backend]
		if (be.TLS != nil || be.Invalid != nil) && f.FailurePolicy != snapshot.FailClosed {
			t.Errorf("frontend %s:%d leads to a TLS or invalid backend but is %s", f.Service, f.Port, f.FailurePolicy)
		}
	}
	checkConditions := func(what string, conds []metav1.Condition) {
		for _, c := range conds {
			if c.Type == "" || c.Reason == "" || (c.Status != metav1.ConditionTrue && c.Status != metav1.ConditionFalse) {
				t.Errorf("%s: malformed condition %+v", what, c)
			}
		}
	}
	for k, ancestors := range res.Status.BackendTLSPolicies {
		if len(ancestors) > 16 {
			t.Errorf("BackendTLSPolicy %s: %d ancestors, more than 16", k, len(ancestors))
		}
		for _, a := range ancestors {
			checkConditions("BackendTLSPolicy "+k.String(), a.Conditions)
		}
	}
	for k, ancestors := range res.Status.XBackends {
		if len(ancestors) > 32 {
			t.Errorf("XBackend %s: %d ancestors, more than 32", k, len(ancestors))
		}
		for _, a := range ancestors {
			checkConditions("XBackend "+k.String(), a.Conditions)
		}
	}
	for name, m := range res.Status.XMeshes {
		checkConditions("XMesh "+name, m.Conditions)
	}
	for _, routes := range []map[types.NamespacedName][]gwv1.RouteParentStatus{res.Status.HTTPRoutes, res.Status.GRPCRoutes} {
		if routes == nil {
			t.Errorf("route status map is nil: routes were examined")
		}
		for k, parents := range routes {
			if len(parents) > 32 {
				t.Errorf("route %s: %d parents, more than 32", k, len(parents))
			}
			for _, p := range parents {
				checkConditions("route "+k.String(), p.Conditions)
				if len(p.Conditions) < 2 || p.Conditions[0].Type != "Accepted" || p.Conditions[1].Type != "ResolvedRefs" {
					t.Errorf("route %s: conditions %+v, want Accepted and ResolvedRefs first", k, p.Conditions)
				}
			}
		}
	}
	for _, s := range res.EndpointSelectorServices {
		// What the API server checks of a Service it creates: generateName
		// is a DNS-1035 label prefix, and so is the name it generates (58
		// characters of it, then 5 random ones).
		if s.Name == "" {
			for _, msg := range apivalidation.NameIsDNS1035Label(s.GenerateName, true) {
				t.Errorf("generated Service %s/%s: generateName: %s", s.Namespace, s.GenerateName, msg)
			}
			for _, msg := range apivalidation.NameIsDNS1035Label(s.GenerateName[:min(len(s.GenerateName), 58)]+"x7k2p", false) {
				t.Errorf("generated Service %s/%s: generated name: %s", s.Namespace, s.GenerateName, msg)
			}
		}
	}
	for _, f := range res.Frontends {
		if f.Routes == nil {
			continue
		}
		f.Routes.Sets(func(rs *snapshot.RouteSet) {
			for _, r := range rs.Rules {
				if r.Invalid != nil && (r.Invalid.Reason == "" || len(r.Backends) > 0 || r.Redirect != nil || r.Rewrite != nil ||
					r.RequestHeaders != nil || len(r.Mirrors) > 0) {
					t.Errorf("frontend %s:%d: invalid rule %s/%d carries settings: %+v", f.Service, f.Port, r.Route, r.Index, r)
				}
				if r.Redirect != nil && len(r.Backends) > 0 {
					t.Errorf("frontend %s:%d: rule %s/%d redirects and has backends", f.Service, f.Port, r.Route, r.Index)
				}
				for _, wb := range r.Backends {
					if (wb.Invalid == nil) == (wb.Backend == snapshot.BackendRef{}) {
						t.Errorf("frontend %s:%d: rule %s/%d backend %+v: want exactly one of Backend and Invalid", f.Service, f.Port, r.Route, r.Index, wb)
					}
				}
			}
		})
	}
}

// randomInput fills an Input with f. Names, references and
// the enumerations of these APIs come from small vocabularies, so random
// objects name each other and carry the values translate acts on.
func randomInput(f *randfill.Filler) translate.Input {
	ca, _ := os.ReadFile(filepath.Join("testdata", "certs", "ca.pem"))
	crt, _ := os.ReadFile(filepath.Join("testdata", "certs", "client.pem"))
	key, _ := os.ReadFile(filepath.Join("testdata", "certs", "client-key.pem"))
	names := []string{"a", "b", "web", "api.v2", "2fa"} // XBackend names need not be Service names
	words := []string{
		"", "a", "b", "web", "https", "http", "None", "10.96.0.1", "10.96.0.2", "fd00::1", "10.244.0.1",
		"fd00:244::1", "127.0.0.1", "not-an-ip", "a.example.com", "kubernetes.io/h2c", "kubernetes.io/ws",
		"kubernetes.io/wss", "FailClosed", "1.3", "X25519", "Pod", "ca.crt", "tls.crt", "tls.key",
		"spiffe://x/y", "*.example.com", string(ca), string(crt), string(key),
		"/", "/a", "/a/b", "/a/", "(", "/v[0-9]+", "a\nb", "http",
	}
	labelKeys := []string{"kubernetes.io/service-name", "sockmesh.io/xbackend", "sockmesh.io/capture", "app",
		"sockmesh.io/failure-policy", "sockmesh.io/min-tls-version", "sockmesh.io/curves", "sockmesh.io/bogus", "example.com/x"}
	labelValues := []string{"a", "b", "web", "disabled", "enabled", "FailClosed", "1.3", "X25519", "bad value!"}
	stamps := []time.Time{{}, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)}
	stringMap := func(c randfill.Continue) map[string]string {
		m := map[string]string{}
		for range c.Intn(4) {
			m[labelKeys[c.Intn(len(labelKeys))]] = labelValues[c.Intn(len(labelValues))]
		}
		return m
	}
	ports := []int32{0, -1, 80, 443, 443, 8443, 70000}
	f = f.NilChance(0.1).NumElements(1, 4).MaxDepth(12).Funcs(
		func(m *metav1.ObjectMeta, c randfill.Continue) {
			m.Name = names[c.Intn(len(names))]
			m.Namespace = []string{"apps", "apps", "apps", "other", ""}[c.Intn(5)]
			m.Labels, m.Annotations = stringMap(c), stringMap(c)
			m.CreationTimestamp = metav1.NewTime(stamps[c.Intn(len(stamps))])
			m.Generation = c.Int63n(3)
			m.UID = types.UID([]string{"", "u1", "u2"}[c.Intn(3)])
			c.Fill(&m.OwnerReferences)
		},
		func(s *corev1.ServiceSpec, c randfill.Continue) {
			c.FillNoCustom(s)
			if c.Intn(5) > 0 {
				pool := []string{"10.96.0.1", "10.96.0.2", "fd00::1", "None", "", "garbage"}
				s.ClusterIP = pool[c.Intn(len(pool))]
				s.ClusterIPs = []string{s.ClusterIP, pool[c.Intn(len(pool))]}[:1+c.Intn(2)]
			}
		},
		pick[string](words), pick[types.UID](names),
		pick[corev1.Protocol]([]string{"", "TCP", "UDP"}), pick[corev1.ServiceType]([]string{"", "ClusterIP", "ExternalName"}),
		pick[corev1.PodPhase]([]string{"", "Running", "Pending", "Failed"}),
		pick[discoveryv1.AddressType]([]string{"IPv4", "IPv6", "FQDN"}),
		pick[gwv1.Group]([]string{"", "", "", "certificates.k8s.io", "gateway.networking.x-k8s.io", "gateway.networking.k8s.io", "apps"}),
		pick[gwv1.Kind]([]string{"Service", "Service", "ConfigMap", "Secret", "ClusterTrustBundle", "XBackend", "Deployment", "HTTPRoute", "GRPCRoute"}),
		pick[gwv1.ObjectName](names), pick[gwv1.SectionName]([]string{"", "https", "http"}),
		pick[gwv1.Namespace]([]string{"", "apps", "apps", "other"}),
		pick[gwv1.PreciseHostname]([]string{"", "a.example.com", "x.cluster.local", "Bad!", "10.0.0.1"}),
		pick[gwv1.Hostname]([]string{"", "a.example.com", "*.example.com"}),
		pick[gwv1.AnnotationKey](labelKeys), pick[gwv1.AnnotationValue](labelValues),
		pick[gwv1.GatewayController]([]string{"sockmesh.io/mesh-controller", "other.io/mesh"}),
		pick[gwv1.SubjectAltNameType]([]string{"Hostname", "URI", ""}),
		pick[gwv1.WellKnownCACertificatesType]([]string{"", "System", "x.io/y"}),
		pick[gwv1.AbsoluteURI]([]string{"", "spiffe://x/y", "nope"}),
		pick[gwv1.LabelKey]([]string{"app", "bad key!"}), pick[gwv1.LabelValue](names),
		pick[gwv1.SessionPersistenceType]([]string{"", "Cookie", "Header", "Other"}),
		pick[gwv1.CookieName](names), pick[gwv1.HeaderName](names), pick[gwv1.Duration]([]string{"1h", "0s", "bad"}),
		pick[gwv1.CookieLifetimeType]([]string{"Permanent", "Session"}),
		pick[gwxv1alpha1.BackendType]([]string{"ExternalHostname", "EndpointSelector", ""}),
		pick[gwxv1alpha1.BackendProtocol]([]string{"TCP", "HTTP", "HTTP2", "HTTP11", "H2C", "MCP", "GRPC", "WSS", "bogus"}),
		pick[gwxv1alpha1.BackendTLSMode]([]string{"None", "ServerOnly", "ClientAndServer", ""}),
		pick[gwv1.PathMatchType]([]string{"Exact", "PathPrefix", "RegularExpression", "", "Bogus"}),
		pick[gwv1.HeaderMatchType]([]string{"Exact", "RegularExpression", ""}),
		pick[gwv1.QueryParamMatchType]([]string{"Exact", "RegularExpression", ""}),
		pick[gwv1.HTTPMethod]([]string{"GET", "POST", "FETCH"}),
		pick[gwv1.HTTPHeaderName]([]string{"x-a", "X-A", "Host", "bad name"}),
		pick[gwv1.HTTPRouteFilterType]([]string{"RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect",
			"URLRewrite", "RequestMirror", "ExtensionRef", "CORS", "Bogus"}),
		pick[gwv1.GRPCRouteFilterType]([]string{"RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "ExtensionRef"}),
		pick[gwv1.GRPCMethodMatchType]([]string{"Exact", "RegularExpression", ""}),
		pick[gwv1.GRPCHeaderMatchType]([]string{"Exact", "RegularExpression", ""}),
		pick[gwv1.HTTPPathModifierType]([]string{"ReplaceFullPath", "ReplacePrefixMatch", ""}),
		pickNumber[int32](ports), pickNumber[gwv1.PortNumber](ports), pickNumber[gwxv1alpha1.PortNumber](ports),
		func(s *gwxv1alpha1.BackendSpec, c randfill.Continue) {
			// Fields filled at random almost never make an XBackend the
			// CRD accepts: most are built in its shape, from the values
			// translate acts on, so checkXBackends meets accepted ones.
			if c.Intn(4) == 0 {
				c.FillNoCustom(s)
				return
			}
			*s = gwxv1alpha1.BackendSpec{Port: gwxv1alpha1.BackendPort{Number: gwxv1alpha1.PortNumber(443)}}
			if c.Intn(4) > 0 {
				c.Fill(&s.Protocol)
			}
			if c.Intn(2) == 0 {
				s.Type = gwxv1alpha1.BackendTypeExternalHostname
				s.ExternalHostname = &gwxv1alpha1.ExternalHostnameBackend{Hostname: "a.example.com"}
			} else {
				s.Type = gwxv1alpha1.BackendTypeEndpointSelector
				s.EndpointSelector = &gwxv1alpha1.EndpointSelectorBackend{LabelSelector: gwxv1alpha1.LabelSelector{
					MatchLabels: map[gwv1.LabelKey]gwv1.LabelValue{"app": gwv1.LabelValue(names[c.Intn(len(names))])}}}
			}
			validation := &gwv1.BackendTLSPolicyValidation{Hostname: "a.example.com", WellKnownCACertificates: ptr(gwv1.WellKnownCACertificatesSystem)}
			if c.Intn(2) == 0 {
				validation = &gwv1.BackendTLSPolicyValidation{Hostname: "a.example.com", CACertificateRefs: []gwv1.LocalObjectReference{{Kind: "ConfigMap", Name: "ca"}}}
			}
			switch c.Intn(4) {
			case 1:
				s.TLS = &gwxv1alpha1.BackendTLS{Mode: gwxv1alpha1.BackendTLSModeNone}
			case 2:
				s.TLS = &gwxv1alpha1.BackendTLS{Mode: gwxv1alpha1.BackendTLSModeServerOnly, Validation: validation}
			case 3:
				s.TLS = &gwxv1alpha1.BackendTLS{Mode: gwxv1alpha1.BackendTLSModeClientAndServer, Validation: validation,
					ClientCertificateRef: &gwv1.SecretObjectReference{Name: "client"}}
			}
		},
	)
	var in translate.Input
	f.Fill(&in)
	// What the agent adds is set, not random.
	in.Now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	in.Node = translate.Node{
		Name: "a", IPs: []netip.Addr{netip.MustParseAddr("192.168.0.1")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
	}
	in.Resolved = map[string][]netip.Addr{
		"a.example.com": {netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("127.0.0.1"), {}},
		"b":             nil,
	}
	// What the XBackends above refer to, and a Service standing for each
	// name, so that valid ones are reached.
	in.ConfigMaps = append(in.ConfigMaps, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ca", Namespace: "apps"},
		Data: map[string]string{"ca.crt": string(ca)}})
	in.Secrets = append(in.Secrets, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "client", Namespace: "apps"},
		Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}})
	for i, name := range names {
		in.Services = append(in.Services, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "xb-" + name, Namespace: "apps", Annotations: map[string]string{"sockmesh.io/xbackend": name}},
			Spec:       corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.9.%d", i+1), Ports: []corev1.ServicePort{{Name: "p", Port: 80}}},
		})
	}
	return in
}

func ptr[T any](v T) *T { return &v }

func pick[T ~string](words []string) func(*T, randfill.Continue) {
	return func(p *T, c randfill.Continue) { *p = T(words[c.Intn(len(words))]) }
}

func pickNumber[T ~int32](values []int32) func(*T, randfill.Continue) {
	return func(p *T, c randfill.Continue) { *p = T(values[c.Intn(len(values))]) }
}
