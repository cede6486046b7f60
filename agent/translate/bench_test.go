package translate_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
