package apiserver_test

import (
	"context"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/test/apiserver"
)

// TestEnv checks what the integration tests rely on: the server's version
// matches the build, the experimental CRDs are served by the typed clients,
// their CEL validation runs, and the kubeconfig file works for a binary.
func TestEnv(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()

	v, err := env.Kube.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v.GitVersion, "v1.") || v.GitVersion == "v0.0.0" {
		t.Errorf("server version = %q, want the built v1.x release", v.GitVersion)
	}

	for _, want := range []string{
		"backendtlspolicies.gateway.networking.k8s.io",
		"httproutes.gateway.networking.k8s.io",
		"grpcroutes.gateway.networking.k8s.io",
		"xbackends.gateway.networking.x-k8s.io",
		"xbackendtrafficpolicies.gateway.networking.x-k8s.io",
		"xmeshes.gateway.networking.x-k8s.io",
	} {
		if !slices.Contains(env.CRDs, want) {
			t.Errorf("CRDs = %v, missing %s", env.CRDs, want)
		}
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "env-test"}}
	if _, err := env.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Gateway.GatewayV1().BackendTLSPolicies("env-test").Create(ctx, &gwv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{
				LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Group: "", Kind: "Service", Name: "svc"},
			}},
			Validation: gwv1.BackendTLSPolicyValidation{
				WellKnownCACertificates: ptr(gwv1.WellKnownCACertificatesSystem),
				Hostname:                "svc.example.com",
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Errorf("create BackendTLSPolicy: %v", err)
	}

	// The XBackend CRD's CEL rules refuse cluster-internal hostnames: proof
	// that the real v1.7 experimental schema is installed.
	_, err = env.Gateway.ExperimentalV1alpha1().XBackends("env-test").Create(ctx, &gwxv1alpha1.XBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "internal"},
		Spec: gwxv1alpha1.BackendSpec{
			Type:             gwxv1alpha1.BackendTypeExternalHostname,
			Port:             gwxv1alpha1.BackendPort{Number: 443},
			ExternalHostname: &gwxv1alpha1.ExternalHostnameBackend{Hostname: "foo.default.svc.cluster.local"},
		},
	}, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Errorf("create XBackend with a cluster-local hostname: err = %v, want Invalid", err)
	}

	// The kubeconfig file works directly and through a relay (here on
	// another loopback port; the harnesses put it in a node's netns).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for _, kubeconfig := range []string{env.Kubeconfig, env.KubeconfigVia(t, ln)} {
		out, err := exec.CommandContext(context.Background(), env.Binaries.Kubectl, "--kubeconfig", kubeconfig,
			"get", "backendtlspolicies", "-n", "env-test", "-o", "name").CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl with %s: %v\n%s", kubeconfig, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != "backendtlspolicy.gateway.networking.k8s.io/p" {
			t.Errorf("kubectl get backendtlspolicies with %s = %q", kubeconfig, got)
		}
	}
}

func ptr[T any](v T) *T { return &v }
