package kubernetes

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	coreinformers "k8s.io/client-go/informers/core/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/prometheus/client_golang/prometheus"
)

// refKey names a referenced ConfigMap or Secret.
type refKey struct {
	secret    bool
	namespace string
	name      string
}

func (k refKey) kind() string {
	if k.secret {
		return "Secret"
	}
	return "ConfigMap"
}

// referencesOf lists the ConfigMaps and Secrets that translate may read for
// these objects: CA certificate references of BackendTLSPolicies and
// XBackends, and XBackend client certificates. References never leave the
// referrer's namespace (translate rejects a client certificate elsewhere,
// so it is not watched either).
func referencesOf(policies []*gwv1.BackendTLSPolicy, xbackends []*gwxv1alpha1.XBackend) []refKey {
	var keys []refKey
	addCARefs := func(namespace string, refs []gwv1.LocalObjectReference) {
		for _, r := range refs {
			if r.Group != "" {
				continue
			}
			switch r.Kind {
			case "ConfigMap":
				keys = append(keys, refKey{namespace: namespace, name: string(r.Name)})
			case "Secret":
				keys = append(keys, refKey{secret: true, namespace: namespace, name: string(r.Name)})
			}
		}
	}
	for _, p := range policies {
		addCARefs(p.Namespace, p.Spec.Validation.CACertificateRefs)
	}
	for _, xb := range xbackends {
		tls := xb.Spec.TLS
		if tls == nil {
			continue
		}
		if tls.Validation != nil {
			addCARefs(xb.Namespace, tls.Validation.CACertificateRefs)
		}
		if ref := tls.ClientCertificateRef; ref != nil && (ref.Group == nil || *ref.Group == "") &&
			(ref.Kind == nil || *ref.Kind == "Secret") && (ref.Namespace == nil || string(*ref.Namespace) == xb.Namespace) {
			keys = append(keys, refKey{secret: true, namespace: xb.Namespace, name: string(ref.Name)})
		}
	}
	slices.SortFunc(keys, compareKeys)
	return slices.Compact(keys)
}

func boolCompare(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	default:
		return -1
	}
}

// references runs one single-object watch per referenced ConfigMap or
// Secret.
type references struct {
	kube    k8s.Interface
	timeout time.Duration
	gauge   prometheus.Gauge
	log     *slog.Logger
	handler func(kind string) cache.ResourceEventHandler

	mu      sync.Mutex
	ctx     context.Context // the source's Run context; nil before start
	watches map[refKey]*refWatch
}

type refWatch struct {
	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
	// ready is closed once the object has been listed, or the source gave
	// up waiting for it.
	ready chan struct{}
}

func newReferences(kube k8s.Interface, timeout time.Duration, gauge prometheus.Gauge, log *slog.Logger, h func(kind string) cache.ResourceEventHandler) *references {
	return &references{kube: kube, timeout: timeout, gauge: gauge, log: log, handler: h, watches: make(map[refKey]*refWatch)}
}

// start makes watches live for as long as ctx.
func (r *references) start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ctx = ctx
}

// objects makes the watches match want (starting new ones, stopping those
// no longer wanted), waits until each wanted object is listed or its wait
// timed out, and returns the ones that exist.
func (r *references) objects(want []refKey) ([]*corev1.ConfigMap, []*corev1.Secret) {
	r.mu.Lock()
	ctx := r.ctx
	if ctx == nil {
		r.mu.Unlock()
		return nil, nil
	}
	for k, w := range r.watches {
		if _, found := slices.BinarySearchFunc(want, k, compareKeys); !found {
			w.cancel()
			delete(r.watches, k)
		}
	}
	watches := make([]*refWatch, len(want))
	for i, k := range want {
		w, ok := r.watches[k]
		if !ok {
			w = r.watch(ctx, k)
			r.watches[k] = w
		}
		watches[i] = w
	}
	r.gauge.Set(float64(len(r.watches)))
	r.mu.Unlock()

	var cms []*corev1.ConfigMap
	var secrets []*corev1.Secret
	for _, w := range watches {
		select {
		case <-w.ready:
		case <-ctx.Done():
			return nil, nil
		}
		for _, obj := range w.informer.GetStore().List() {
			switch o := obj.(type) {
			case *corev1.ConfigMap:
				cms = append(cms, o)
			case *corev1.Secret:
				secrets = append(secrets, o)
			}
		}
	}
	return cms, secrets
}

func compareKeys(a, b refKey) int {
	return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name), boolCompare(a.secret, b.secret))
}

// watch starts the single-object informer for k.
func (r *references) watch(parent context.Context, k refKey) *refWatch {
	ctx, cancel := context.WithCancel(parent)
	byName := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", k.name).String()
	}
	var inf cache.SharedIndexInformer
	if k.secret {
		inf = coreinformers.NewFilteredSecretInformer(r.kube, k.namespace, 0, cache.Indexers{}, byName)
	} else {
		inf = coreinformers.NewFilteredConfigMapInformer(r.kube, k.namespace, 0, cache.Indexers{}, byName)
	}
	// Neither fails on an informer that has not started.
	_ = inf.SetTransform(stripForCache)
	_, _ = inf.AddEventHandler(r.handler(k.kind()))
	w := &refWatch{informer: inf, cancel: cancel, ready: make(chan struct{})}
	go inf.RunWithContext(ctx)
	go func() {
		defer close(w.ready)
		wait, stop := context.WithTimeout(ctx, r.timeout)
		defer stop()
		if !cache.WaitForCacheSync(wait.Done(), inf.HasSynced) && ctx.Err() == nil {
			r.log.Warn("referenced object not listed in time; treating it as missing",
				"kind", k.kind(), "namespace", k.namespace, "name", k.name, "timeout", r.timeout)
		}
	}()
	return w
}
