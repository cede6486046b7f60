package selectorsvc

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	dto "github.com/prometheus/client_model/go"

	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/childproc"
)

const ns = "selectorsvc-test"

// createSelectorXBackend creates namespace and in it the EndpointSelector
// XBackend "pods" (pods labelled app=pods, port 8080).
func createSelectorXBackend(t *testing.T, env *apiserver.Env, namespace string) *gwxv1alpha1.XBackend {
	t.Helper()
	ctx := t.Context()
	if _, err := env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	xb, err := env.Gateway.ExperimentalV1alpha1().XBackends(namespace).Create(ctx, &gwxv1alpha1.XBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "pods", Namespace: namespace},
		Spec: gwxv1alpha1.BackendSpec{
			Type: gwxv1alpha1.BackendTypeEndpointSelector,
			Port: gwxv1alpha1.BackendPort{Number: 8080},
			EndpointSelector: &gwxv1alpha1.EndpointSelectorBackend{LabelSelector: gwxv1alpha1.LabelSelector{
				MatchLabels: map[gwv1.LabelKey]gwv1.LabelValue{"app": "pods"}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return xb
}

// TestApply runs translate and Apply against a real API server: the
// Service is created once even when the cache lags, follows the XBackend's
// port, stays while the XBackend is invalid, and is deleted with it; a
// user's Service that merely carries the label, or replaced ours, is never
// touched.
func TestApply(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	kube, gw := env.Kube, env.Gateway
	xb := createSelectorXBackend(t, env, ns)
	// A user's Service with sockmesh's label but no XBackend owner.
	if _, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "users", Namespace: ns, Labels: map[string]string{translate.LabelXBackend: "pods"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	w, err := New(Config{}, kube, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	input := func() translate.Input { return inputOf(t, env) }
	apply := func(in translate.Input) {
		t.Helper()
		res, err := translate.Translate(in)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Apply(ctx, in, res.EndpointSelectorServices, nil); err != nil {
			t.Fatal(err)
		}
	}
	generatedServices := func() []corev1.Service {
		t.Helper()
		list, err := kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{
			LabelSelector: labels.SelectorFromSet(labels.Set{translate.LabelXBackend: "pods"}).String()})
		if err != nil {
			t.Fatal(err)
		}
		var out []corev1.Service
		for _, s := range list.Items {
			if s.Name != "users" {
				out = append(out, s)
			}
		}
		return out
	}

	lagging := input() // a cache that has not seen the Service yet
	apply(lagging)
	apply(lagging)
	got := generatedServices()
	if len(got) != 1 {
		t.Fatalf("generated services = %d, want 1 despite the lagging cache", len(got))
	}
	svc := got[0]
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Spec.Selector["app"] != "pods" ||
		len(svc.OwnerReferences) != 1 || svc.OwnerReferences[0].UID != xb.UID || svc.Spec.Ports[0].TargetPort.IntValue() != 8080 {
		t.Errorf("generated service = %+v", svc)
	}

	// The XBackend's port changes: the Service follows.
	setPort := func(port gwxv1alpha1.PortNumber) {
		t.Helper()
		xb.Spec.Port.Number = port
		if xb, err = gw.ExperimentalV1alpha1().XBackends(ns).Update(ctx, xb, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setPort(9090)
	apply(input())
	if got := generatedServices(); len(got) != 1 || got[0].Name != svc.Name || got[0].Spec.Ports[0].TargetPort.IntValue() != 9090 {
		t.Errorf("after the port change: %+v", got)
	}

	// The XBackend turns invalid for its TLS (its CA ConfigMap does not
	// exist) and fails closed; its Service stays, so fixing the XBackend
	// needs no new Service and EndpointSlices.
	xb.Spec.TLS = &gwxv1alpha1.BackendTLS{Mode: gwxv1alpha1.BackendTLSModeServerOnly, Validation: &gwv1.BackendTLSPolicyValidation{
		Hostname: "pods.example", CACertificateRefs: []gwv1.LocalObjectReference{{Kind: "ConfigMap", Name: "missing"}}}}
	if xb, err = gw.ExperimentalV1alpha1().XBackends(ns).Update(ctx, xb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	apply(input())
	if got := generatedServices(); len(got) != 1 || got[0].Name != svc.Name {
		t.Errorf("while the XBackend is invalid: %+v, want %s kept", got, svc.Name)
	}
	xb.Spec.TLS = nil

	// The port changes again while the cache still holds the Service that
	// a user's of the same name has replaced: the user's is left alone,
	// and no update is counted.
	setPort(7070)
	stale := input()
	if err := kube.CoreV1().Services(ns).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	apply(stale)
	if s, err := kube.CoreV1().Services(ns).Get(ctx, svc.Name, metav1.GetOptions{}); err != nil || s.Spec.Ports[0].Port != 80 || s.Spec.Selector != nil {
		t.Errorf("the user's Service that replaced ours: %v, %+v", err, s)
	}
	if n := updates(t, w, "ok"); n != 1 {
		t.Errorf("updates counted ok = %v, want 1 (the first port change only)", n)
	}

	// The XBackend goes (no garbage collector runs here): the Service goes.
	if err := gw.ExperimentalV1alpha1().XBackends(ns).Delete(ctx, "pods", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	apply(input())
	if got := generatedServices(); len(got) != 0 {
		t.Errorf("after the XBackend went: %d generated services remain", len(got))
	}
	if _, err := kube.CoreV1().Services(ns).Get(ctx, "users", metav1.GetOptions{}); err != nil {
		t.Errorf("the user's labelled Service: %v", err)
	}
}

// updates reads sockmesh_selectorsvc_operations_total{operation="update"}.
func updates(t *testing.T, w *Writer, result string) float64 {
	t.Helper()
	var m dto.Metric
	if err := w.ops.WithLabelValues("update", result).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestApplyQuotaFull: a namespace whose Service quota is used up refuses
// its generated Service; Apply still creates the other namespaces' and
// returns the refusal as one the control plane does not retry with backoff
// (which held every status write and generated Service in the cluster
// back, up to a minute at a time, for as long as the quota stayed full).
func TestApplyQuotaFull(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	const full, free = "quota-full", "quota-free"
	in := translate.Input{XBackends: []*gwxv1alpha1.XBackend{createSelectorXBackend(t, env, full), createSelectorXBackend(t, env, free)}}
	zero := corev1.ResourceList{corev1.ResourceServices: resource.MustParse("0")}
	q, err := env.Kube.CoreV1().ResourceQuotas(full).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "services", Namespace: full},
		Spec:       corev1.ResourceQuotaSpec{Hard: zero},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// What the resource quota controller (not run here) reports; until it
	// does, the quota refuses every Service alike.
	q.Status = corev1.ResourceQuotaStatus{Hard: zero, Used: zero}
	if _, err := env.Kube.CoreV1().ResourceQuotas(full).UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	w, err := New(Config{}, env.Kube, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := translate.Translate(in)
	if err != nil {
		t.Fatal(err)
	}
	err = w.Apply(ctx, in, res.EndpointSelectorServices, nil)
	if err == nil || controlplane.Retryable(err) || !strings.Contains(err.Error(), full+"/pods") {
		t.Errorf("Apply = %v (retryable %v), want the refusal of %s/pods only, not retryable", err, controlplane.Retryable(err), full)
	}
	for namespace, want := range map[string]int{full: 0, free: 1} {
		list, err := env.Kube.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != want {
			t.Errorf("services in %s = %d, want %d", namespace, len(list.Items), want)
		}
	}
}

// TestApplyHandEdits: the generated Service follows the XBackend's
// selector, a hand edit of its selector, ports, publishNotReadyAddresses
// or type is undone, one given a ClusterIP is replaced by a headless one,
// and one deleted by hand is made again, owned by the XBackend (so the
// garbage collector removes it with it).
func TestApplyHandEdits(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	kube, gw := env.Kube, env.Gateway
	xb := createSelectorXBackend(t, env, ns)
	w, err := New(Config{}, kube, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	// pass runs translate over what the API server holds now, as a cache
	// that caught up would, and Apply.
	pass := func(what string) {
		t.Helper()
		in := inputOf(t, env)
		res, err := translate.Translate(in)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Apply(ctx, in, res.EndpointSelectorServices, nil); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// apply runs a pass and returns the one generated Service.
	apply := func(what string) corev1.Service {
		t.Helper()
		pass(what)
		list, err := kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 1 {
			t.Fatalf("%s: %d services, want the generated one", what, len(list.Items))
		}
		s := list.Items[0]
		if o := s.OwnerReferences; len(o) != 1 || o[0].UID != xb.UID || o[0].Controller == nil || !*o[0].Controller {
			t.Errorf("%s: owner references %+v, want the XBackend as controller", what, o)
		}
		return s
	}
	first := apply("created")

	xb.Spec.EndpointSelector.MatchLabels = map[gwv1.LabelKey]gwv1.LabelValue{"app": "pods-v2"}
	if xb, err = gw.ExperimentalV1alpha1().XBackends(ns).Update(ctx, xb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := apply("selector changed"); s.Name != first.Name || s.Spec.Selector["app"] != "pods-v2" {
		t.Errorf("after the selector change: %s selects %v, want %s selecting app=pods-v2", s.Name, s.Spec.Selector, first.Name)
	}

	edited := apply("before the hand edit")
	edited.Spec.Selector = map[string]string{"app": "other"}
	edited.Spec.Ports[0].TargetPort = intstr.FromInt32(1)
	if _, err := kube.CoreV1().Services(ns).Update(ctx, &edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := apply("edited by hand"); s.Spec.Selector["app"] != "pods-v2" || s.Spec.Ports[0].TargetPort.IntValue() != 8080 {
		t.Errorf("after a hand edit: selector %v, target port %v; want app=pods-v2, 8080", s.Spec.Selector, s.Spec.Ports[0].TargetPort)
	}

	// Published addresses of pods that are not ready would be marked
	// ready in the EndpointSlices, and get requests.
	edited = apply("before publishing addresses that are not ready")
	edited.Spec.PublishNotReadyAddresses = true
	if _, err := kube.CoreV1().Services(ns).Update(ctx, &edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := apply("publishing addresses that are not ready"); s.Spec.PublishNotReadyAddresses {
		t.Errorf("after a hand edit of publishNotReadyAddresses: still true, want false")
	}

	// Made ExternalName by hand (the API server allows it of a headless
	// Service), it has no EndpointSlices: it is made headless again, in
	// place.
	edited = apply("before ExternalName")
	toExternalName := func(s *corev1.Service) {
		s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "elsewhere.example.com"
		s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = "", nil, nil, nil
	}
	toExternalName(&edited)
	if _, err := kube.CoreV1().Services(ns).Update(ctx, &edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := apply("made ExternalName"); s.Name != first.Name || s.Spec.Type != corev1.ServiceTypeClusterIP ||
		s.Spec.ClusterIP != corev1.ClusterIPNone || s.Spec.ExternalName != "" {
		t.Errorf("after a hand edit to ExternalName: %s type %s clusterIP %q externalName %q, want %s headless ClusterIP",
			s.Name, s.Spec.Type, s.Spec.ClusterIP, s.Spec.ExternalName, first.Name)
	}

	// Given a ClusterIP (ExternalName and back, or made so by a version
	// that did), which no update can take back: it is replaced by a
	// headless one.
	edited = apply("before a ClusterIP")
	toExternalName(&edited)
	updated, err := kube.CoreV1().Services(ns).Update(ctx, &edited, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	updated.Spec.Type, updated.Spec.ExternalName = corev1.ServiceTypeClusterIP, ""
	if updated, err = kube.CoreV1().Services(ns).Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if updated.Spec.ClusterIP == "" || updated.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Fatalf("set up: clusterIP %q, want one allocated", updated.Spec.ClusterIP)
	}
	pass("given a ClusterIP")
	if s := apply("replacing the Service with a ClusterIP"); s.Name == first.Name || s.Spec.ClusterIP != corev1.ClusterIPNone || s.Spec.Selector["app"] != "pods-v2" {
		t.Errorf("after the Service got a ClusterIP: %s clusterIP %q selecting %v, want a new headless Service selecting app=pods-v2", s.Name, s.Spec.ClusterIP, s.Spec.Selector)
	}
	first = apply("the replacement")

	if err := kube.CoreV1().Services(ns).Delete(ctx, first.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := apply("deleted by hand"); s.Name == first.Name || s.Spec.Selector["app"] != "pods-v2" {
		t.Errorf("after a hand delete: %s selecting %v, want a new Service selecting app=pods-v2", s.Name, s.Spec.Selector)
	}
}

// TestApplyLongNames: XBackends whose names are as long as a label value
// (63) and as a name may be (253, with dots) each get one Service, made
// once however often Apply runs before the cache shows it.
func TestApplyLongNames(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	const namespace = "selectorsvc-long"
	base := createSelectorXBackend(t, env, namespace)
	in := translate.Input{}
	for _, name := range []string{strings.Repeat("a", 63), strings.Repeat("b", 62) + "." + strings.Repeat("c", 62) + "." + strings.Repeat("d", 62) + "." + strings.Repeat("e", 63)} {
		xb := base.DeepCopy()
		xb.ObjectMeta = metav1.ObjectMeta{Name: name, Namespace: namespace}
		created, err := env.Gateway.ExperimentalV1alpha1().XBackends(namespace).Create(ctx, xb, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create XBackend of %d characters: %v", len(name), err)
		}
		in.XBackends = append(in.XBackends, created)
	}
	w, err := New(Config{}, env.Kube, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := translate.Translate(in)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the cache (in) never shows the Services made
		if err := w.Apply(ctx, in, res.EndpointSelectorServices, nil); err != nil {
			t.Fatal(err)
		}
	}
	list, err := env.Kube.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]int{}
	for _, s := range list.Items {
		for _, o := range s.OwnerReferences {
			owners[o.Name]++
		}
	}
	for _, xb := range in.XBackends {
		if owners[xb.Name] != 1 {
			t.Errorf("XBackend of %d characters owns %d Services, want 1", len(xb.Name), owners[xb.Name])
		}
	}
}

// TestEndpointsAtXBackendPort: with the real EndpointSlice controller
// making the generated Service's slices, the selected pods are dialled at
// the XBackend's port.number, the port the API names ("which endpoint port
// to connect to"): also in the moment after port.number changed, when the
// Service and then its slices still carry the old one, where they were
// dialled at the slices' port.
func TestEndpointsAtXBackendPort(t *testing.T) {
	env := apiserver.Start(t)
	ctx := t.Context()
	kube, gw := env.Kube, env.Gateway
	xb := createSelectorXBackend(t, env, ns)
	// Apps reach the XBackend through this Service.
	if _, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "front", Namespace: ns, Annotations: map[string]string{translate.AnnotationXBackend: xb.Name}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	startEndpointSliceController(t, env)
	createReadyPod(t, env, "pods-0", map[string]string{"app": "pods"}, "10.244.1.30")
	createReadyPod(t, env, "other-0", map[string]string{"app": "other"}, "10.244.1.31")
	w, err := New(Config{}, kube, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	// endpoints translates what the API server holds now, applies the
	// Services translate wants, and returns the XBackend's endpoints.
	endpoints := func() []string {
		t.Helper()
		in := inputOf(t, env)
		res, err := translate.Translate(in)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Apply(ctx, in, res.EndpointSelectorServices, nil); err != nil {
			t.Fatal(err)
		}
		for _, b := range res.Backends {
			if b.Ref.Kind == snapshot.KindXBackend && b.Ref.Name == xb.Name {
				var out []string
				for _, e := range b.Endpoints {
					out = append(out, e.Addr.String())
				}
				return out
			}
		}
		return nil
	}
	endpoints() // creates the Service
	waitSlicePort(t, env, 8080)
	if got := endpoints(); !slices.Equal(got, []string{"10.244.1.30:8080"}) {
		t.Errorf("endpoints = %v, want [10.244.1.30:8080]", got)
	}

	xb.Spec.Port.Number = 9090
	if _, err := gw.ExperimentalV1alpha1().XBackends(ns).Update(ctx, xb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The Service and its slice are as before: the pods are dialled at
	// 9090 already. This pass updates the Service; the controller then
	// rewrites its slice, and the pods stay at 9090.
	if got := endpoints(); !slices.Equal(got, []string{"10.244.1.30:9090"}) {
		t.Errorf("endpoints while the slice says 8080 = %v, want [10.244.1.30:9090]", got)
	}
	waitSlicePort(t, env, 9090)
	if got := endpoints(); !slices.Equal(got, []string{"10.244.1.30:9090"}) {
		t.Errorf("endpoints once the slice says 9090 = %v, want [10.244.1.30:9090]", got)
	}
}

// startEndpointSliceController runs kube-controller-manager's EndpointSlice
// controller, alone, against env until t ends.
func startEndpointSliceController(t *testing.T, env *apiserver.Env) {
	t.Helper()
	p, err := childproc.Start("kube-controller-manager", filepath.Join(env.Dir, "kube-controller-manager.log"),
		filepath.Join(env.Binaries.Dir, "kube-controller-manager"),
		"--kubeconfig="+env.Kubeconfig,
		"--controllers=endpointslice-controller",
		"--leader-elect=false",
		"--secure-port=0",
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-controller-manager log (last lines):\n%s", childproc.Tail(p.LogPath, 40))
		}
		if err := p.Stop(5 * time.Second); err != nil {
			t.Errorf("stop kube-controller-manager: %v", err)
		}
	})
}

// createReadyPod creates a pod in ns on node "node-a" and reports it
// running and ready at ip, as the scheduler and the kubelet (neither runs
// here) would.
func createReadyPod(t *testing.T, env *apiserver.Env, name string, labels map[string]string, ip string) {
	t.Helper()
	ctx := t.Context()
	kube := env.Kube
	// The pod's node and service account, made once.
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "localhost/none"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := kube.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitSlicePort waits until the generated Service's EndpointSlices are one
// slice listing one endpoint, at port.
func waitSlicePort(t *testing.T, env *apiserver.Env, port int32) {
	t.Helper()
	var last []discoveryv1.EndpointSlice
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := env.Kube.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		last = list.Items
		return len(last) == 1 && len(last[0].Ports) == 1 && last[0].Ports[0].Port != nil && *last[0].Ports[0].Port == port &&
			len(last[0].Endpoints) == 1, nil
	})
	if err != nil {
		t.Fatalf("wait for the generated Service's slice at port %d: %v; slices %+v", port, err, last)
	}
}

// inputOf is what translate reads of ns's Services, EndpointSlices and XBackends on env's
// API server now, as an informer cache that caught up would hold it.
func inputOf(t *testing.T, env *apiserver.Env) translate.Input {
	t.Helper()
	in := translate.Input{}
	svcs, err := env.Kube.CoreV1().Services(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range svcs.Items {
		in.Services = append(in.Services, &svcs.Items[i])
	}
	xbs, err := env.Gateway.ExperimentalV1alpha1().XBackends(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range xbs.Items {
		in.XBackends = append(in.XBackends, &xbs.Items[i])
	}
	eps, err := env.Kube.DiscoveryV1().EndpointSlices(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range eps.Items {
		in.EndpointSlices = append(in.EndpointSlices, &eps.Items[i])
	}
	return in
}
