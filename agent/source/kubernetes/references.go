package kubernetes

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/internal/tlsrefs"
)

// refKey names a referenced ConfigMap or Secret; tlsrefs.Of lists them,
// the same way sockmeshctl describe does.
type refKey = tlsrefs.Ref

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
	store  cache.Store
	cancel context.CancelFunc
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
		if _, found := slices.BinarySearchFunc(want, k, tlsrefs.Compare); !found {
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
		for _, obj := range w.store.List() {
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

// watch starts the single-object informer for k.
//
// A reference watch is a plain informer (cache.NewInformerWithOptions),
// not a shared one: nothing else subscribes to it, and a shared informer's
// event distribution costs each watch two more goroutines and a 16 KiB
// buffer. Its requests ask for no compression: the watched object is one
// small ConfigMap or Secret, and an HTTP/2 stream with transparent gzip
// keeps a ~40 KiB decompressor for the life of the watch. With a hundred
// references those two were 7 MiB of the agent's heap.
func (r *references) watch(parent context.Context, k refKey) *refWatch {
	ctx, cancel := context.WithCancel(parent)
	byName := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", k.Name).String()
	}
	core := r.kube.CoreV1().RESTClient()
	resource, obj := "configmaps", runtime.Object(&corev1.ConfigMap{})
	if k.Secret {
		resource, obj = "secrets", &corev1.Secret{}
	}
	store, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.NewFilteredListWatchFromClient(identityGetter{core}, resource, k.Namespace, byName),
		ObjectType:    obj,
		Handler:       r.handler(k.Kind()),
		Transform:     stripForCache,
	})
	w := &refWatch{store: store, cancel: cancel, ready: make(chan struct{})}
	go ctrl.RunWithContext(ctx)
	go func() {
		defer close(w.ready)
		wait, stop := context.WithTimeout(ctx, r.timeout)
		defer stop()
		if !cache.WaitForCacheSync(wait.Done(), ctrl.HasSynced) && ctx.Err() == nil {
			r.log.Warn("referenced object not listed in time; treating it as missing",
				"kind", k.Kind(), "namespace", k.Namespace, "name", k.Name, "timeout", r.timeout)
		}
	}()
	return w
}

// identityGetter makes requests that ask the API server not to compress
// the response. Setting Accept-Encoding also turns off the HTTP
// transport's transparent gzip for that request.
type identityGetter struct{ c rest.Interface }

func (g identityGetter) Get() *rest.Request {
	return g.c.Get().SetHeader("Accept-Encoding", "identity")
}
