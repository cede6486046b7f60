package describe

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwfake "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"
)

// TestLoadPartialAccess checks what Load does with what it may not read:
// a forbidden Secret and an API server without ClusterTrustBundles. The
// happy path runs against a real API server in cmd/sockmeshctl's TestCLI;
// these failures are what a fake client can produce on demand.
func TestLoadPartialAccess(t *testing.T) {
	policy := func(name, kind, ref string) *gwv1.BackendTLSPolicy {
		return &gwv1.BackendTLSPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name},
			Spec: gwv1.BackendTLSPolicySpec{Validation: gwv1.BackendTLSPolicyValidation{Hostname: "x.app.svc",
				CACertificateRefs: []gwv1.LocalObjectReference{{Group: "", Kind: gwv1.Kind(kind), Name: gwv1.ObjectName(ref)}}}},
		}
	}
	kube := kubefake.NewClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "ca"}, Data: map[string]string{"ca.crt": "x"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "unused"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "secret-ca"}},
	)
	kube.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "secret-ca", nil)
	})
	kube.PrependReactor("list", "clustertrustbundles", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "certificates.k8s.io", Resource: "clustertrustbundles"}, "")
	})
	gw := gwfake.NewSimpleClientset(policy("a", "ConfigMap", "ca"), policy("b", "Secret", "secret-ca"), policy("c", "ConfigMap", "missing"))

	in, warnings, err := Load(context.Background(), kube, gw, time.Unix(0, 0), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(in.BackendTLSPolicies) != 3 || len(in.ConfigMaps) != 1 || in.ConfigMaps[0].Name != "ca" || len(in.Secrets) != 0 {
		t.Errorf("Load() = %d policies, configmaps %v, %d secrets; want 3, only the referenced one, none",
			len(in.BackendTLSPolicies), in.ConfigMaps, len(in.Secrets))
	}
	if !in.ClusterTrustBundlesUnavailable {
		t.Error("ClusterTrustBundlesUnavailable = false with the kind not served")
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "cannot read Secret app/secret-ca (forbidden)") {
		t.Errorf("warnings = %q, want one about the forbidden Secret", warnings)
	}
	if !slices.ContainsFunc(in.ConfigMaps, func(c *corev1.ConfigMap) bool { return c.Name == "ca" }) {
		t.Error("the referenced ConfigMap was not read")
	}
}
