package e2ecluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/sockmesh/sockmesh/daemonset"
	"github.com/sockmesh/sockmesh/internal/yamldocs"
	"github.com/sockmesh/sockmesh/test/cluster/node"
	"github.com/sockmesh/sockmesh/test/e2ecluster/appapi"
	"github.com/sockmesh/sockmesh/test/echo"
)

// manifests decodes the embedded daemonset/ manifests, in kustomization
// order.
func manifests(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, f := range []string{"namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "daemonset.yaml"} {
		data, err := fs.ReadFile(daemonset.Manifests, f)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := yamldocs.Decode(data)
		if err != nil {
			t.Fatalf("decode %s: %v", f, err)
		}
		for _, m := range docs {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	return objs
}

// apply server-side-applies objs as the test's field manager.
func apply(t *testing.T, n *node.Node, objs ...*unstructured.Unstructured) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(n.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(n.Kube.Discovery()))
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("map %s: %v", gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if o.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Apply(t.Context(), o.GetName(), o, metav1.ApplyOptions{FieldManager: "sockmesh-e2e", Force: true}); err != nil {
			t.Fatalf("apply %s %s: %v", gvk.Kind, o.GetName(), err)
		}
	}
}

// toUnstructured converts a typed object for apply.
func toUnstructured(t *testing.T, obj any) *unstructured.Unstructured {
	t.Helper()
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		t.Fatal(err)
	}
	return u
}

// waitFor polls cond every 200 ms until it returns nil or timeout passes,
// then fails t with cond's last error and diag's output.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) error, diag func() string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	for {
		err := cond(ctx)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("wait for %s (%s): %v", what, timeout, err)
			if diag != nil {
				msg += "\n" + diag()
			}
			t.Fatal(msg)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// namespaceDiag lists a namespace's pods and events, for a failure.
func namespaceDiag(n *node.Node, ns string) func() string {
	return func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		pods, _ := n.Kubectl(ctx, "get", "pods", "-n", ns, "-o", "wide")
		events, _ := n.Kubectl(ctx, "get", "events", "-n", ns, "--sort-by=.lastTimestamp")
		return fmt.Sprintf("pods in %s:\n%s\nevents:\n%s\nkubelet log:\n%s", ns, pods, events, n.LogTail("kubelet", 20))
	}
}

// createNamespace creates ns and deletes it when t ends.
func createNamespace(t *testing.T, n *node.Node, ns string) {
	t.Helper()
	_, err := n.Kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, n, "namespace", ns, "") })
}

// deleteAndWait deletes an object with kubectl and waits until it is gone
// (its pods too, for a namespace or a DaemonSet).
func deleteAndWait(t *testing.T, n *node.Node, kind, name, ns string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := []string{"delete", kind, name, "--ignore-not-found", "--wait=true", "--cascade=foreground", "--timeout=110s"}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	if _, err := n.Kubectl(ctx, args...); err != nil {
		t.Errorf("delete %s %s: %v", kind, name, err)
	}
}

// deployment is a one-replica Deployment of image running args, labelled
// app=name.
func deployment(ns, name, image string, args []string, volumes []corev1.Volume, mounts []corev1.VolumeMount) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	one := int32(1)
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: new(int64),
					Volumes:                       volumes,
					Containers: []corev1.Container{{
						Name: name, Image: image, ImagePullPolicy: corev1.PullNever, Args: args,
						Env: []corev1.EnvVar{
							{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
							{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
						},
						VolumeMounts: mounts,
					}},
				},
			},
		},
	}
}

// service is a ClusterIP Service on port 80 for the pods labelled
// app=selector, sending to targetPort, with an optional appProtocol.
func service(ns, name, selector string, targetPort int32, appProtocol string) *corev1.Service {
	port := corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(targetPort)}
	if appProtocol != "" {
		port.AppProtocol = &appProtocol
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": selector}, Ports: []corev1.ServicePort{port}},
	}
}

// readyPod waits until the Deployment's pod is Ready and returns it.
func readyPod(t *testing.T, n *node.Node, ns, app string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, 2*time.Minute, "pod "+ns+"/"+app+" Ready", func(ctx context.Context) error {
		pods, err := n.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp == nil && podReady(p) && p.Status.PodIP != "" {
				pod = p
				return nil
			}
		}
		return fmt.Errorf("%d pods, none Ready", len(pods.Items))
	}, namespaceDiag(n, ns))
	return pod
}

func podReady(p *corev1.Pod) bool { return podCondition(p, corev1.PodReady) }

// podCondition reports whether p's condition of type c is true.
func podCondition(p *corev1.Pod, c corev1.PodConditionType) bool {
	for _, pc := range p.Status.Conditions {
		if pc.Type == c {
			return pc.Status == corev1.ConditionTrue
		}
	}
	return false
}

// clusterIP returns the ClusterIP of a Service.
func clusterIP(t *testing.T, n *node.Node, ns, name string) string {
	t.Helper()
	svc, err := n.Kube.CoreV1().Services(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// Call is what the appclient in a pod is asked to do.
type Call = appapi.Call

// Result is the appclient's answer.
type Result struct{ appapi.Result }

// Report decodes the echo backend's report from the body.
func (r Result) Report() (echo.Report, error) {
	var rep echo.Report
	if len(r.Body) == 0 {
		return rep, fmt.Errorf("no JSON body (status %d, text %q, error %q)", r.Status, r.Text, r.Error)
	}
	err := json.Unmarshal(r.Body, &rep)
	return rep, err
}

// call asks the appclient in the pod at podIP to make c from inside its pod.
func call(ctx context.Context, podIP string, c Call) (Result, error) {
	body, _ := json.Marshal(c)
	url := "http://" + podIP + ":" + strconv.Itoa(appClientPort) + "/call"
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Result{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Result{}, fmt.Errorf("reach appclient at %s: %w", podIP, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return Result{}, fmt.Errorf("appclient: %s: %s", resp.Status, b)
	}
	var r Result
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return Result{}, fmt.Errorf("decode appclient result: %w", err)
	}
	return r, nil
}
