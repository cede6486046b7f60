package describe

import (
	"context"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/internal/tlsrefs"
)

// Load lists, cluster-wide, the objects translate reads, and gets the
// ConfigMaps and Secrets that policies and XBackends reference (only
// those: a CLI user need not read every Secret). Pods are not listed:
// describe is about Services and policies, not enrolment. Kinds the API
// server does not serve count as empty; what cannot be read (forbidden) is
// named in the warnings, since translate then judges without it. A kind
// the user may not list cluster-wide is listed in namespace alone, where
// the object asked about lives: an app team's RBAC is often a Role in its
// own namespace, and without the fallback its own Service was "not found".
func Load(ctx context.Context, kube kubernetes.Interface, gw gwclient.Interface, now time.Time, namespace string) (translate.Input, []string, error) {
	in := translate.Input{Now: now}
	var warnings []string
	// list runs fn cluster-wide (ns ""), then in namespace if that is
	// forbidden; kinds not served are empty, forbidden ones a warning,
	// anything else an error.
	list := func(kinds string, namespaced bool, fn func(ns string) error) error {
		err := fn("")
		if apierrors.IsForbidden(err) && namespaced && namespace != "" {
			if err = fn(namespace); err == nil {
				warnings = append(warnings, fmt.Sprintf("cannot list %s cluster-wide (forbidden), only in namespace %s: those elsewhere are left out", kinds, namespace))
				return nil
			}
		}
		switch {
		case err == nil:
		case apierrors.IsNotFound(err):
			if kinds == "ClusterTrustBundles" {
				in.ClusterTrustBundlesUnavailable = true
			}
		case apierrors.IsForbidden(err):
			warnings = append(warnings, fmt.Sprintf("cannot list %s (forbidden): what depends on them may be shown wrong", kinds))
		default:
			return fmt.Errorf("list %s: %w", kinds, err)
		}
		return nil
	}
	all := metav1.ListOptions{}
	steps := []struct {
		kinds      string
		namespaced bool
		fn         func(ns string) error
	}{
		{"Services", true, func(ns string) error {
			l, err := kube.CoreV1().Services(ns).List(ctx, all)
			in.Services = pointers(l, err, func() []corev1.Service { return l.Items })
			return err
		}},
		{"EndpointSlices", true, func(ns string) error {
			l, err := kube.DiscoveryV1().EndpointSlices(ns).List(ctx, all)
			in.EndpointSlices = pointers(l, err, func() []discoveryv1.EndpointSlice { return l.Items })
			return err
		}},
		{"Namespaces", false, func(string) error {
			l, err := kube.CoreV1().Namespaces().List(ctx, all)
			in.Namespaces = pointers(l, err, func() []corev1.Namespace { return l.Items })
			return err
		}},
		{"ClusterTrustBundles", false, func(string) error {
			l, err := kube.CertificatesV1().ClusterTrustBundles().List(ctx, all)
			in.ClusterTrustBundles = pointers(l, err, func() []certificatesv1.ClusterTrustBundle { return l.Items })
			return err
		}},
		{"BackendTLSPolicies", true, func(ns string) error {
			l, err := gw.GatewayV1().BackendTLSPolicies(ns).List(ctx, all)
			in.BackendTLSPolicies = pointers(l, err, func() []gwv1.BackendTLSPolicy { return l.Items })
			return err
		}},
		{"HTTPRoutes", true, func(ns string) error {
			l, err := gw.GatewayV1().HTTPRoutes(ns).List(ctx, all)
			in.HTTPRoutes = pointers(l, err, func() []gwv1.HTTPRoute { return l.Items })
			return err
		}},
		{"GRPCRoutes", true, func(ns string) error {
			l, err := gw.GatewayV1().GRPCRoutes(ns).List(ctx, all)
			in.GRPCRoutes = pointers(l, err, func() []gwv1.GRPCRoute { return l.Items })
			return err
		}},
		{"ReferenceGrants", true, func(ns string) error {
			l, err := gw.GatewayV1().ReferenceGrants(ns).List(ctx, all)
			in.ReferenceGrants = pointers(l, err, func() []gwv1.ReferenceGrant { return l.Items })
			return err
		}},
		{"XBackends", true, func(ns string) error {
			l, err := gw.ExperimentalV1alpha1().XBackends(ns).List(ctx, all)
			in.XBackends = pointers(l, err, func() []gwxv1alpha1.XBackend { return l.Items })
			return err
		}},
		{"XBackendTrafficPolicies", true, func(ns string) error {
			l, err := gw.ExperimentalV1alpha1().XBackendTrafficPolicies(ns).List(ctx, all)
			in.XBackendTrafficPolicies = pointers(l, err, func() []gwxv1alpha1.XBackendTrafficPolicy { return l.Items })
			return err
		}},
		{"XMeshes", false, func(string) error {
			l, err := gw.ExperimentalV1alpha1().XMeshes().List(ctx, all)
			in.XMeshes = pointers(l, err, func() []gwxv1alpha1.XMesh { return l.Items })
			return err
		}},
	}
	for _, s := range steps {
		if err := list(s.kinds, s.namespaced, s.fn); err != nil {
			return in, warnings, err
		}
	}
	for _, r := range tlsrefs.Of(in.BackendTLSPolicies, in.XBackends, in.ReferenceGrants) {
		var err error
		if r.Secret {
			var s *corev1.Secret
			if s, err = kube.CoreV1().Secrets(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{}); err == nil {
				in.Secrets = append(in.Secrets, s)
			}
		} else {
			var cm *corev1.ConfigMap
			if cm, err = kube.CoreV1().ConfigMaps(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{}); err == nil {
				in.ConfigMaps = append(in.ConfigMaps, cm)
			}
		}
		switch {
		case err == nil, apierrors.IsNotFound(err):
			// Missing: translate says so in status, as the agent does.
		case apierrors.IsForbidden(err):
			warnings = append(warnings, fmt.Sprintf("cannot read %s %s/%s (forbidden): policies using it are shown as if it were missing",
				r.Kind(), r.Namespace, r.Name))
		default:
			return in, warnings, fmt.Errorf("get %s %s/%s: %w", r.Kind(), r.Namespace, r.Name, err)
		}
	}
	return in, warnings, nil
}

// pointers returns pointers to the items of a successful list.
func pointers[T any, L any](l *L, err error, items func() []T) []*T {
	if err != nil || l == nil {
		return nil
	}
	objs := items()
	out := make([]*T, len(objs))
	for i := range objs {
		out[i] = &objs[i]
	}
	return out
}
