package tlsrefs_test

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/internal/tlsrefs"
)

func policy(ns string, refs ...gwv1.LocalObjectReference) *gwv1.BackendTLSPolicy {
	return &gwv1.BackendTLSPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"},
		Spec: gwv1.BackendTLSPolicySpec{Validation: gwv1.BackendTLSPolicyValidation{CACertificateRefs: refs}}}
}

func xbackend(ns string, tls *gwxv1alpha1.BackendTLS) *gwxv1alpha1.XBackend {
	return &gwxv1alpha1.XBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "x"}, Spec: gwxv1alpha1.BackendSpec{TLS: tls}}
}

func ptr[T any](v T) *T { return &v }

func TestOf(t *testing.T) {
	cm := func(name string) gwv1.LocalObjectReference {
		return gwv1.LocalObjectReference{Kind: "ConfigMap", Name: gwv1.ObjectName(name)}
	}
	secret := func(name string) gwv1.LocalObjectReference {
		return gwv1.LocalObjectReference{Kind: "Secret", Name: gwv1.ObjectName(name)}
	}
	for _, tc := range []struct {
		name      string
		policies  []*gwv1.BackendTLSPolicy
		xbackends []*gwxv1alpha1.XBackend
		grants    []*gwv1.ReferenceGrant
		want      []tlsrefs.Ref
	}{
		{name: "none"},
		{
			name: "policy CA refs sorted, duplicates once, other groups and kinds left out",
			policies: []*gwv1.BackendTLSPolicy{
				policy("b", cm("ca"), secret("ca"), cm("ca")),
				policy("a", cm("z"), gwv1.LocalObjectReference{Group: "example.com", Kind: "ConfigMap", Name: "g"}, gwv1.LocalObjectReference{Kind: "Pod", Name: "k"}),
			},
			want: []tlsrefs.Ref{{Namespace: "a", Name: "z"}, {Namespace: "b", Name: "ca"}, {Secret: true, Namespace: "b", Name: "ca"}},
		},
		{
			name: "xbackend CA and client certificate",
			xbackends: []*gwxv1alpha1.XBackend{
				xbackend("x", &gwxv1alpha1.BackendTLS{
					Validation:           &gwv1.BackendTLSPolicyValidation{CACertificateRefs: []gwv1.LocalObjectReference{cm("ca")}},
					ClientCertificateRef: &gwv1.SecretObjectReference{Name: "client"},
				}),
				xbackend("y", nil),
			},
			want: []tlsrefs.Ref{{Namespace: "x", Name: "ca"}, {Secret: true, Namespace: "x", Name: "client"}},
		},
		{
			name: "client certificate of another namespace, group or kind left out",
			xbackends: []*gwxv1alpha1.XBackend{
				xbackend("x", &gwxv1alpha1.BackendTLS{ClientCertificateRef: &gwv1.SecretObjectReference{Name: "a", Namespace: ptr(gwv1.Namespace("other"))}}),
				xbackend("x", &gwxv1alpha1.BackendTLS{ClientCertificateRef: &gwv1.SecretObjectReference{Name: "b", Group: ptr(gwv1.Group("example.com"))}}),
				xbackend("x", &gwxv1alpha1.BackendTLS{ClientCertificateRef: &gwv1.SecretObjectReference{Name: "c", Kind: ptr(gwv1.Kind("ConfigMap"))}}),
				xbackend("x", &gwxv1alpha1.BackendTLS{ClientCertificateRef: &gwv1.SecretObjectReference{Name: "d", Namespace: ptr(gwv1.Namespace("x")), Kind: ptr(gwv1.Kind("Secret"))}}),
			},
			want: []tlsrefs.Ref{{Secret: true, Namespace: "x", Name: "d"}},
		},
		{
			name: "client certificate of another namespace whose ReferenceGrant allows it",
			xbackends: []*gwxv1alpha1.XBackend{
				xbackend("x", &gwxv1alpha1.BackendTLS{ClientCertificateRef: &gwv1.SecretObjectReference{Name: "a", Namespace: ptr(gwv1.Namespace("other"))}}),
				xbackend("y", &gwxv1alpha1.BackendTLS{ClientCertificateRef: &gwv1.SecretObjectReference{Name: "b", Namespace: ptr(gwv1.Namespace("other"))}}),
			},
			grants: []*gwv1.ReferenceGrant{{
				ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "g"},
				Spec: gwv1.ReferenceGrantSpec{
					From: []gwv1.ReferenceGrantFrom{{Group: gwxv1alpha1.GroupName, Kind: "XBackend", Namespace: "x"}},
					To:   []gwv1.ReferenceGrantTo{{Kind: "Secret"}},
				},
			}},
			want: []tlsrefs.Ref{{Secret: true, Namespace: "other", Name: "a"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tlsrefs.Of(tc.policies, tc.xbackends, tc.grants)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Of() = %+v, want %+v", got, tc.want)
			}
			if !slices.IsSortedFunc(got, tlsrefs.Compare) {
				t.Errorf("Of() = %+v, not sorted by Compare", got)
			}
		})
	}
}
