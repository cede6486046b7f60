package status

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwxclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/typed/apisx/v1alpha1"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// The Gateway API's limits on status lists.
const (
	maxPolicyAncestors  = 16 // PolicyStatus.ancestors
	maxRouteParents     = 32 // RouteStatus.parents
	maxXBackendAncestor = 32 // BackendStatus.ancestors
)

// Config configures a Writer.
type Config struct {
	// FieldManager names sockmesh in the objects' managedFields (zero:
	// "sockmesh").
	FieldManager string
	// Parallel is how many objects are written at once (zero: 8).
	Parallel int
}

// Writer writes translate's status. It is safe for concurrent use, but the
// caller should serialise Write calls so that an older status never
// overwrites a newer one.
type Writer struct {
	cfg     Config
	gw      gwclient.Interface
	log     *slog.Logger
	writes  *prometheus.CounterVec
	dropped *prometheus.CounterVec
	recent  recent
}

// New returns a Writer that writes through gw.
func New(cfg Config, gw gwclient.Interface, log *slog.Logger, reg prometheus.Registerer) (*Writer, error) {
	if cfg.FieldManager == "" {
		cfg.FieldManager = "sockmesh"
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 8
	}
	w := &Writer{
		cfg: cfg,
		gw:  gw,
		log: log.With("component", "status"),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_status_writes_total",
			Help: "Status patches sent, by kind and result (written, conflict, error).",
		}, []string{"kind", "result"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_status_entries_dropped_total",
			Help: "Status entries left out of a status write because the object's list was full, by kind.",
		}, []string{"kind"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{w.writes, w.dropped} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register status metrics: %w", err)
			}
		}
	}
	return w, nil
}

// Write merges st into the objects of in, the Input translate judged: it
// compares against those (cached) objects first and sends nothing for an
// object whose status is already right. Objects in st that in no longer
// has are skipped. It returns the errors of the objects it could not
// write; the others are written regardless.
//
// An object of in that an earlier Write wrote (or read again after a
// conflict) in the same term, and that in still holds at the version it
// held then, is compared against the version that Write left instead:
// handed the same Input again (a retry), Write sends nothing it already
// wrote. ctx's Done channel identifies the term (the control plane's
// leader term): a Write with another one forgets what earlier Writes left,
// since another writer may have written since. Each object's write goes
// through g (nil: every object is written).
func (w *Writer) Write(ctx context.Context, in translate.Input, st translate.Status, g *controlplane.Gate) error {
	w.recent.begin(ctx.Done())
	defer w.recent.end()
	pa := entryKind[gwv1.PolicyAncestorStatus]{
		ref:        func(e *gwv1.PolicyAncestorStatus) gwv1.ParentReference { return e.AncestorRef },
		controller: func(e *gwv1.PolicyAncestorStatus) gwv1.GatewayController { return e.ControllerName },
		conditions: func(e *gwv1.PolicyAncestorStatus) *[]metav1.Condition { return &e.Conditions },
	}
	ba := entryKind[gwxv1alpha1.BackendAncestorStatus]{
		ref:        func(e *gwxv1alpha1.BackendAncestorStatus) gwv1.ParentReference { return e.AncestorRef },
		controller: func(e *gwxv1alpha1.BackendAncestorStatus) gwv1.GatewayController { return e.ControllerName },
		conditions: func(e *gwxv1alpha1.BackendAncestorStatus) *[]metav1.Condition { return &e.Conditions },
	}
	rp := entryKind[gwv1.RouteParentStatus]{
		ref:        func(e *gwv1.RouteParentStatus) gwv1.ParentReference { return e.ParentRef },
		controller: func(e *gwv1.RouteParentStatus) gwv1.GatewayController { return e.ControllerName },
		conditions: func(e *gwv1.RouteParentStatus) *[]metav1.Condition { return &e.Conditions },
	}
	gw, opts := w.gw, w.patchOptions()
	var jobs []func(context.Context) error
	jobs = append(jobs, entryJobs(w, g, targetOf[*gwv1.BackendTLSPolicy]("BackendTLSPolicy", gwv1.Resource("backendtlspolicies"), gw.GatewayV1().BackendTLSPolicies, opts),
		pa, maxPolicyAncestors, "ancestors", in.BackendTLSPolicies, st.BackendTLSPolicies,
		func(o *gwv1.BackendTLSPolicy) []gwv1.PolicyAncestorStatus { return o.Status.Ancestors })...)
	jobs = append(jobs, entryJobs(w, g, targetOf[*gwxv1alpha1.XBackendTrafficPolicy]("XBackendTrafficPolicy", gwxv1alpha1.Resource("xbackendtrafficpolicies"), gw.ExperimentalV1alpha1().XBackendTrafficPolicies, opts),
		pa, maxPolicyAncestors, "ancestors", in.XBackendTrafficPolicies, st.XBackendTrafficPolicies,
		func(o *gwxv1alpha1.XBackendTrafficPolicy) []gwv1.PolicyAncestorStatus { return o.Status.Ancestors })...)
	jobs = append(jobs, entryJobs(w, g, targetOf[*gwxv1alpha1.XBackend]("XBackend", gwxv1alpha1.Resource("xbackends"), gw.ExperimentalV1alpha1().XBackends, opts),
		ba, maxXBackendAncestor, "ancestors", in.XBackends, st.XBackends,
		func(o *gwxv1alpha1.XBackend) []gwxv1alpha1.BackendAncestorStatus { return o.Status.Ancestors })...)
	jobs = append(jobs, entryJobs(w, g, targetOf[*gwv1.HTTPRoute]("HTTPRoute", gwv1.Resource("httproutes"), gw.GatewayV1().HTTPRoutes, opts),
		rp, maxRouteParents, "parents", in.HTTPRoutes, st.HTTPRoutes,
		func(o *gwv1.HTTPRoute) []gwv1.RouteParentStatus { return o.Status.Parents })...)
	jobs = append(jobs, entryJobs(w, g, targetOf[*gwv1.GRPCRoute]("GRPCRoute", gwv1.Resource("grpcroutes"), gw.GatewayV1().GRPCRoutes, opts),
		rp, maxRouteParents, "parents", in.GRPCRoutes, st.GRPCRoutes,
		func(o *gwv1.GRPCRoute) []gwv1.RouteParentStatus { return o.Status.Parents })...)
	jobs = append(jobs, w.meshJobs(g, in.XMeshes, st.XMeshes)...)
	return w.run(ctx, jobs)
}

func (w *Writer) patchOptions() metav1.PatchOptions {
	return metav1.PatchOptions{FieldManager: w.cfg.FieldManager}
}

// run executes jobs, cfg.Parallel at a time.
func (w *Writer) run(ctx context.Context, jobs []func(context.Context) error) error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, w.cfg.Parallel)
	for _, job := range jobs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return errors.Join(append(errs, ctx.Err())...)
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := job(ctx); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// target reads and patches one kind of object.
type target[O metav1.Object] struct {
	kind     string
	resource schema.GroupResource
	get      func(ctx context.Context, namespace, name string) (O, error)
	patch    func(ctx context.Context, namespace, name string, mergePatch []byte) (O, error)
}

// statusClient is what every generated typed client of a kind offers.
type statusClient[O any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (O, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (O, error)
}

// targetOf reads and merge-patches the status of the kind client serves.
func targetOf[O metav1.Object, C statusClient[O]](kind string, resource schema.GroupResource, client func(namespace string) C, opts metav1.PatchOptions) target[O] {
	return target[O]{
		kind:     kind,
		resource: resource,
		get: func(ctx context.Context, ns, name string) (O, error) {
			return client(ns).Get(ctx, name, metav1.GetOptions{})
		},
		patch: func(ctx context.Context, ns, name string, data []byte) (O, error) {
			return client(ns).Patch(ctx, name, types.MergePatchType, data, opts, "status")
		},
	}
}

// entryJobs makes one job per object in desired whose status is a list of
// entries (field names the list in the status).
func entryJobs[O metav1.Object, E any](w *Writer, g *controlplane.Gate, t target[O], k entryKind[E], max int, field string,
	cached []O, desired map[types.NamespacedName][]E, entries func(O) []E) []func(context.Context) error {
	byName := make(map[types.NamespacedName]O, len(cached))
	for _, o := range cached {
		byName[types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}] = o
	}
	var jobs []func(context.Context) error
	for _, nn := range slices.SortedFunc(maps.Keys(desired), compareNames) {
		obj, ok := byName[nn]
		if !ok {
			continue
		}
		ours, judged := desired[nn], obj.GetGeneration()
		var conds [][]metav1.Condition
		for i := range ours {
			conds = append(conds, *k.conditions(&ours[i]))
		}
		jobs = append(jobs, func(ctx context.Context) error {
			return writeObject(ctx, w, g, t, obj, func(o O) (any, bool) {
				if stale(o.GetGeneration(), judged, conds...) {
					return nil, false
				}
				merged, changed, dropped := mergeEntries(k, o.GetNamespace(), entries(o), ours, max)
				if !changed {
					// Entries left out of a list that stays as it is were
					// reported with the write that left them out: once
					// per change, not once per translation.
					return nil, false
				}
				if dropped > 0 {
					w.dropped.WithLabelValues(t.kind).Add(float64(dropped))
					w.log.Warn("status list full; entries left out", "kind", t.kind,
						"namespace", o.GetNamespace(), "name", o.GetName(), "dropped", dropped, "max", max)
				}
				if merged == nil {
					// The ancestors and parents lists are required by
					// the CRDs: write an empty list, not null.
					merged = []E{}
				}
				return statusPatch(o.GetResourceVersion(), map[string]any{field: merged}), true
			})
		})
	}
	return jobs
}

// meshJobs makes one job per XMesh translate judged. An XMesh's status
// belongs to the controller its spec names, so the conditions and
// supported features are ours to replace.
func (w *Writer) meshJobs(g *controlplane.Gate, cached []*gwxv1alpha1.XMesh, desired map[string]gwxv1alpha1.MeshStatus) []func(context.Context) error {
	meshes := w.gw.ExperimentalV1alpha1().XMeshes()
	t := targetOf[*gwxv1alpha1.XMesh]("XMesh", gwxv1alpha1.Resource("xmeshes"), func(string) gwxclient.XMeshInterface { return meshes }, w.patchOptions())
	byName := make(map[string]*gwxv1alpha1.XMesh, len(cached))
	for _, m := range cached {
		byName[m.Name] = m
	}
	var jobs []func(context.Context) error
	for _, name := range slices.Sorted(maps.Keys(desired)) {
		obj, ok := byName[name]
		if !ok {
			continue
		}
		want, judged := desired[name], obj.Generation
		jobs = append(jobs, func(ctx context.Context) error {
			return writeObject(ctx, w, g, t, obj, func(m *gwxv1alpha1.XMesh) (any, bool) {
				if stale(m.Generation, judged, want.Conditions) {
					return nil, false
				}
				conds, changed := mergeConditions(m.Status.Conditions, want.Conditions)
				features := want.SupportedFeatures
				if features == nil {
					features = []gwv1.SupportedFeature{}
				}
				if !changed && slices.Equal(m.Status.SupportedFeatures, want.SupportedFeatures) {
					return nil, false
				}
				return statusPatch(m.ResourceVersion, map[string]any{"conditions": conds, "supportedFeatures": features}), true
			})
		})
	}
	return jobs
}

func statusPatch(resourceVersion string, status map[string]any) any {
	// The resourceVersion makes the patch conditional: the API server
	// refuses it with a conflict if the object changed since it was read.
	return map[string]any{
		"metadata": map[string]any{"resourceVersion": resourceVersion},
		"status":   status,
	}
}

// writeObject patches obj's status with what update derives from it. On a
// conflict it reads the object again and derives anew, so a concurrent
// writer's entries are merged rather than overwritten. An object read
// again with another UID was deleted and recreated since translate judged
// obj: it gets nothing, since its generation need not have moved past the
// one judged (the watch event of the new object brings a fresh judgement).
// obj is merged against as w.recent has it: the version an earlier Write
// left if obj is the stale version that Write was handed. The write goes
// through g, which may hold it back.
func writeObject[O metav1.Object](ctx context.Context, w *Writer, g *controlplane.Gate, t target[O], obj O, update func(O) (any, bool)) error {
	ns, name := obj.GetNamespace(), obj.GetName()
	o := controlplane.Object{Verb: "patch", Group: t.resource.Group, Resource: t.resource.Resource, Subresource: "status",
		Namespace: ns, Name: name}
	return g.Do(ctx, o, func(ctx context.Context) error { return patchObject(ctx, w, t, obj, update) })
}

// patchObject is writeObject's write.
func patchObject[O metav1.Object](ctx context.Context, w *Writer, t target[O], obj O, update func(O) (any, bool)) error {
	ns, name, uid := obj.GetNamespace(), obj.GetName(), obj.GetUID()
	passVersion := obj.GetResourceVersion()
	obj = current(&w.recent, obj)
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if uid != "" && obj.GetUID() != uid {
			return nil
		}
		patch, ok := update(obj)
		if !ok {
			return nil
		}
		data, err := json.Marshal(patch)
		if err != nil {
			return fmt.Errorf("encode status patch: %w", err)
		}
		written, err := t.patch(ctx, ns, name, data)
		switch {
		case err == nil:
			w.writes.WithLabelValues(t.kind, "written").Inc()
			obj = written
			return nil
		case apierrors.IsConflict(err):
			w.writes.WithLabelValues(t.kind, "conflict").Inc()
			fresh, gerr := t.get(ctx, ns, name)
			if gerr != nil {
				return gerr
			}
			obj = fresh
			return err
		default:
			return err
		}
	})
	if apierrors.IsNotFound(err) {
		// Deleted since translate saw it: nothing to report on.
		return nil
	}
	if err != nil {
		w.writes.WithLabelValues(t.kind, "error").Inc()
		return fmt.Errorf("write status of %s %s/%s: %w", t.kind, ns, name, err)
	}
	if obj.GetUID() == uid {
		// obj is now the newest version known: the one written, or the
		// one read again after a conflict (or the pass's own, which
		// remember ignores).
		w.recent.remember(passVersion, obj)
	}
	return nil
}

func compareNames(a, b types.NamespacedName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}
