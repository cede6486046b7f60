package translate_test

import (
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// The Gateway API BackendTLSPolicy conformance tests that change objects
// between checks, as successive translations of one Input. The others
// (ConflictResolution, InvalidCACertificateRef, InvalidKind) are fixtures
// in testdata/conformance/backendtlspolicy-*.in.yaml.

const infraNS = "gateway-conformance-infra"

// btlsInput is a Service with one port named https and a BackendTLSPolicy
// naming it, its CA the ConfigMap caRef, as the upstream tests set up.
func btlsInput(t *testing.T, caRef string) (translate.Input, *gwv1.BackendTLSPolicy) {
	t.Helper()
	policy := &gwv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "test-policy", Namespace: infraNS, Generation: 1},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{
				LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Kind: "Service", Name: "tls-backend"},
				SectionName:                new(gwv1.SectionName("https")),
			}},
			Validation: gwv1.BackendTLSPolicyValidation{
				CACertificateRefs: []gwv1.LocalObjectReference{{Kind: "ConfigMap", Name: gwv1.ObjectName(caRef)}},
				Hostname:          "abc.example.com",
			},
		},
	}
	return translate.Input{
		Now: defaultNow,
		Services: []*corev1.Service{{
			ObjectMeta: metav1.ObjectMeta{Name: "tls-backend", Namespace: infraNS},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.200.9", ClusterIPs: []string{"10.96.200.9"},
				Ports: []corev1.ServicePort{{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443}}},
		}},
		BackendTLSPolicies: []*gwv1.BackendTLSPolicy{policy},
	}, policy
}

func caConfigMap(t *testing.T, name, caCrt string) *corev1.ConfigMap {
	t.Helper()
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: infraNS}, Data: map[string]string{"ca.crt": caCrt}}
}

func testCA(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "certs", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkPolicy translates in and requires the policy's one ancestor to say
// accepted and resolvedRefs with those reasons at the policy's generation,
// and the port to use TLS with serverName, or, when reason is not
// Accepted, to fail closed.
func checkPolicy(t *testing.T, in translate.Input, acceptedReason, resolvedRefsReason, serverName string) {
	t.Helper()
	res, err := translate.Translate(in)
	if err != nil {
		t.Fatalf("Translate: %v", err)
	}
	p := in.BackendTLSPolicies[0]
	st := res.Status.BackendTLSPolicies[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}]
	if len(st) != 1 {
		t.Fatalf("policy status has %d ancestors, want 1: %+v", len(st), st)
	}
	want := map[string]string{"Accepted": acceptedReason, "ResolvedRefs": resolvedRefsReason}
	for _, c := range st[0].Conditions {
		r, ok := want[c.Type]
		if !ok {
			continue
		}
		delete(want, c.Type)
		wantStatus := metav1.ConditionStatus("False")
		if r == c.Type {
			wantStatus = "True"
		}
		if c.Reason != r || c.Status != wantStatus || c.ObservedGeneration != p.Generation {
			t.Errorf("%s = %s/%s at generation %d, want %s/%s at %d", c.Type, c.Status, c.Reason, c.ObservedGeneration, wantStatus, r, p.Generation)
		}
	}
	if len(want) != 0 {
		t.Errorf("conditions %v missing from %+v", want, st[0].Conditions)
	}
	var b *snapshot.Backend
	for i := range res.Backends {
		if res.Backends[i].Ref.Name == "tls-backend" {
			b = &res.Backends[i]
		}
	}
	switch {
	case b == nil:
		t.Fatalf("no Backend for tls-backend in %+v", res.Backends)
	case acceptedReason != "Accepted":
		if b.Invalid == nil {
			t.Errorf("Backend %+v does not fail closed", b)
		}
	case b.Invalid != nil || b.TLS == nil || b.TLS.ServerName != serverName:
		t.Errorf("Backend %+v, want TLS with serverName %s", b, serverName)
	}
}

// TestBackendTLSPolicyConformanceCAReconcile is BackendTLSPolicy's
// "Changing the content of a ConfigMap used by BackendTLSPolicy as CA
// certificate should be reconciled": a CA ConfigMap missing, then created,
// then with an empty ca.crt, then restored.
func TestBackendTLSPolicyConformanceCAReconcile(t *testing.T) {
	in, _ := btlsInput(t, "reconcile-ca")
	checkPolicy(t, in, "NoValidCACertificate", "InvalidCACertificateRef", "")
	in.ConfigMaps = []*corev1.ConfigMap{caConfigMap(t, "reconcile-ca", testCA(t))}
	checkPolicy(t, in, "Accepted", "ResolvedRefs", "abc.example.com")
	in.ConfigMaps = []*corev1.ConfigMap{caConfigMap(t, "reconcile-ca", "")}
	checkPolicy(t, in, "NoValidCACertificate", "InvalidCACertificateRef", "")
	in.ConfigMaps = []*corev1.ConfigMap{caConfigMap(t, "reconcile-ca", testCA(t))}
	checkPolicy(t, in, "Accepted", "ResolvedRefs", "abc.example.com")
}

// TestBackendTLSPolicyConformanceObservedGenerationBump is
// BackendTLSPolicyObservedGenerationBump: after the hostname changes, the
// policy is Accepted at its new generation, and the new hostname is the SNI.
func TestBackendTLSPolicyConformanceObservedGenerationBump(t *testing.T) {
	in, policy := btlsInput(t, "tls-checks-ca-certificate")
	in.ConfigMaps = []*corev1.ConfigMap{caConfigMap(t, "tls-checks-ca-certificate", testCA(t))}
	checkPolicy(t, in, "Accepted", "ResolvedRefs", "abc.example.com")
	bumped := policy.DeepCopy()
	bumped.Generation++
	bumped.Spec.Validation.Hostname = "foo.example.com"
	in.BackendTLSPolicies = []*gwv1.BackendTLSPolicy{bumped}
	checkPolicy(t, in, "Accepted", "ResolvedRefs", "foo.example.com")
}
