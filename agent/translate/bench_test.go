package translate_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// BenchmarkTranslateScale translates issue 4's scale target: 10,000
// Services (a tenth with appProtocol h2c), 50,000 endpoints, and 1,000
// BackendTLSPolicies, each with its own CA ConfigMap.
func BenchmarkTranslateScale(b *testing.B) {
	in := scaleInput(b, 10000, 5, 1000)
	b.ReportAllocs()
	for b.Loop() {
		res, err := translate.Translate(in)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Frontends) != 2000 {
			b.Fatalf("%d frontends, want 2000", len(res.Frontends))
		}
	}
}

func scaleInput(b *testing.B, services, endpointsPer, policies int) translate.Input {
	ca, err := os.ReadFile(filepath.Join("testdata", "certs", "ca.pem"))
	if err != nil {
		b.Fatal(err)
	}
	var in translate.Input
	h2c := "kubernetes.io/h2c"
	for i := range services {
		ns, name := fmt.Sprintf("ns-%d", i%100), fmt.Sprintf("svc-%d", i)
		sp := corev1.ServicePort{Name: "http", Port: 80}
		if i%10 == 0 {
			sp.AppProtocol = &h2c
		}
		in.Services = append(in.Services, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), Ports: []corev1.ServicePort{sp}},
		})
		port, portName := int32(8080), "http"
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-abc", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
		}
		for j := range endpointsPer {
			n := i*endpointsPer + j
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 128+n/65536, n/256%256, n%256)}})
		}
		in.EndpointSlices = append(in.EndpointSlices, es)
	}
	for i := range policies {
		svc := in.Services[i*(services/policies)+1]
		in.ConfigMaps = append(in.ConfigMaps, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name + "-ca"},
			Data:       map[string]string{"ca.crt": string(ca)},
		})
		in.BackendTLSPolicies = append(in.BackendTLSPolicies, &gwv1.BackendTLSPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name},
			Spec: gwv1.BackendTLSPolicySpec{
				TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Kind: "Service", Name: gwv1.ObjectName(svc.Name)}}},
				Validation: gwv1.BackendTLSPolicyValidation{
					Hostname:          gwv1.PreciseHostname(svc.Name + ".example.com"),
					CACertificateRefs: []gwv1.LocalObjectReference{{Kind: "ConfigMap", Name: gwv1.ObjectName(svc.Name + "-ca")}},
				},
			},
		})
	}
	return in
}

// BenchmarkTranslateRoutes translates 1,000 HTTPRoutes (8 rules of 2
// matches each, backendRefs to two Services) attached to 100 Services.
func BenchmarkTranslateRoutes(b *testing.B) {
	in := scaleInput(b, 1000, 2, 0)
	group, kind := gwv1.Group(""), gwv1.Kind("Service")
	prefix, exact := gwv1.PathMatchPathPrefix, gwv1.PathMatchExact
	for i := range 1000 {
		// Services k and k+100 share a namespace (scaleInput).
		parent, other := in.Services[i%100], in.Services[i%100+100]
		r := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: parent.Namespace, Name: fmt.Sprintf("route-%d", i)}}
		r.Spec.ParentRefs = []gwv1.ParentReference{{Group: &group, Kind: &kind, Name: gwv1.ObjectName(parent.Name)}}
		port := gwv1.PortNumber(80)
		for j := range 8 {
			p1, p2 := fmt.Sprintf("/r%d/%d", i, j), fmt.Sprintf("/r%d/%d/exact", i, j)
			r.Spec.Rules = append(r.Spec.Rules, gwv1.HTTPRouteRule{
				Matches: []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: &prefix, Value: &p1}}, {Path: &gwv1.HTTPPathMatch{Type: &exact, Value: &p2}}},
				BackendRefs: []gwv1.HTTPBackendRef{
					{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(parent.Name), Port: &port}}},
					{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(other.Name), Port: &port}}},
				},
			})
		}
		in.HTTPRoutes = append(in.HTTPRoutes, r)
	}
	b.ReportAllocs()
	for b.Loop() {
		res, err := translate.Translate(in)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Status.HTTPRoutes) != 1000 || res.Status.HTTPRoutes[types.NamespacedName{Namespace: "ns-7", Name: "route-7"}][0].Conditions[1].Status != metav1.ConditionTrue {
			b.Fatalf("routes not all translated and resolved: %d in status", len(res.Status.HTTPRoutes))
		}
	}
}
