package main

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/pki"
)

type setupResult struct {
	objects  int
	duration time.Duration
}

func namespace(p params, i int) string { return fmt.Sprintf("bench-%d", i%p.Namespaces) }

func ptr[T any](v T) *T { return &v }

// createObjects fills the API server: namespaces (with the default
// ServiceAccount pods need, since no controller-manager runs), the node,
// one CA ConfigMap per namespace, the Services with their EndpointSlices,
// the policies on the first Services, and pods on the node.
func createObjects(ctx context.Context, env *apiserver.Env, p params, parallel int) (setupResult, error) {
	start := time.Now()
	var count atomic.Int64
	kube, gw := env.Kube, env.Gateway
	ca, err := pki.NewCA("bench-ca")
	if err != nil {
		return setupResult{}, err
	}

	// Each phase depends on the one before (namespaces first).
	phases := []struct {
		n    int
		make func(i int) error
	}{
		{p.Namespaces, func(i int) error {
			name := namespace(p, i)
			if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
				return err
			}
			count.Add(1)
			_, err := kube.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
			return err
		}},
		{1, func(int) error {
			_, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
			return err
		}},
		{p.Namespaces, func(i int) error {
			_, err := kube.CoreV1().ConfigMaps(namespace(p, i)).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "ca"}, Data: map[string]string{"ca.crt": string(ca.CertPEM)},
			}, metav1.CreateOptions{})
			return err
		}},
		{p.Services, func(i int) error {
			ns, name := namespace(p, i), fmt.Sprintf("svc-%d", i)
			if _, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
			}, metav1.CreateOptions{}); err != nil {
				return err
			}
			count.Add(1)
			eps := make([]discoveryv1.Endpoint, p.Endpoints)
			for j := range eps {
				eps[j] = discoveryv1.Endpoint{
					Addresses:  []string{endpointAddr(i*p.Endpoints + j).String()},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
				}
			}
			_, err := kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints:   eps,
				Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(8443))}},
			}, metav1.CreateOptions{})
			return err
		}},
		{p.Policies, func(i int) error {
			_, err := gw.GatewayV1().BackendTLSPolicies(namespace(p, i)).Create(ctx, &gwv1.BackendTLSPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("policy-%d", i)},
				Spec: gwv1.BackendTLSPolicySpec{
					TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{
						LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Kind: "Service", Name: gwv1.ObjectName(fmt.Sprintf("svc-%d", i))},
					}},
					Validation: gwv1.BackendTLSPolicyValidation{
						CACertificateRefs: []gwv1.LocalObjectReference{{Kind: "ConfigMap", Name: "ca"}},
						Hostname:          gwv1.PreciseHostname(fmt.Sprintf("svc-%d.example.com", i)),
					},
				},
			}, metav1.CreateOptions{})
			return err
		}},
		{p.Pods, func(i int) error {
			_, err := kube.CoreV1().Pods(namespace(p, i)).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i), Labels: map[string]string{"app": "bench"}},
				Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "localhost/none"}}},
			}, metav1.CreateOptions{})
			return err
		}},
	}
	for _, ph := range phases {
		if err := parallelDo(ph.n, parallel, ph.make); err != nil {
			return setupResult{}, err
		}
		count.Add(int64(ph.n))
	}
	return setupResult{objects: int(count.Load()), duration: time.Since(start)}, nil
}

// clearStatus empties the policies' status, so that each round's agent
// writes all of it (a thousand status patches, and the watch events they
// echo), as the first agent to lead in a cluster does.
func clearStatus(ctx context.Context, gw gwclient.Interface, p params, parallel int) error {
	patch := []byte(`{"status":{"ancestors":[]}}`)
	return parallelDo(p.Policies, parallel, func(i int) error {
		_, err := gw.GatewayV1().BackendTLSPolicies(namespace(p, i)).Patch(ctx, fmt.Sprintf("policy-%d", i),
			types.MergePatchType, patch, metav1.PatchOptions{}, "status")
		return err
	})
}

// endpointAddr spreads endpoint addresses over 10.128.0.0/10.
func endpointAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(128 + i>>16&0x3f), byte(i >> 8), byte(i)})
}

// parallelDo runs f(0..n-1) with at most parallel calls at once and
// returns the first error.
func parallelDo(n, parallel int, f func(int) error) error {
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	next := make(chan int)
	for range parallel {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					once.Do(func() { first = fmt.Errorf("object %d: %w", i, err) })
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}
