package translate

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate/tlsvalidation"
)

// Translate computes the Snapshot parts and the status that in deserves.
//
// It never panics on malformed objects: what cannot be understood is
// reported in status or left out, and a captured port whose backend
// properties cannot be honoured gets a fail-closed Backend.Invalid entry.
// Its output is sorted, so equal inputs give equal Results. A bug that
// one object's data reaches (a panic while judging it) is contained to
// that object, judged invalid and listed in Result.Failures. The error is
// only ever an internal inconsistency (a bug), never a property of the
// objects.
func Translate(in Input) (Result, error) { return translateWith(in, nil) }

// translateWith is Translate with fault, when not nil, called before each
// object's judgement and each Service port's route join (faultRouteJoin):
// tests make it panic for one, as a bug the data there reached would.
func translateWith(in Input, fault func(snapshot.ObjectRef)) (Result, error) {
	t := newTranslator(in)
	t.fault = fault
	t.translateXBackends()
	t.evalTrafficPolicies()
	t.translatePolicies()
	t.translateRoutes()
	t.captureServices()
	t.xbackendStatus()
	t.settleFailures()

	res := Result{
		Workloads: workloads(in),
		Status: Status{
			BackendTLSPolicies:      t.policyStatus,
			XBackendTrafficPolicies: t.trafficStatus,
			XBackends:               t.xbackendStatuses,
			HTTPRoutes:              t.httpRouteStatus,
			GRPCRoutes:              t.grpcRouteStatus,
			XMeshes:                 meshes(in),
		},
		EndpointSelectorServices: t.selectorServices,
		Unrepresented:            t.unrepresented,
		ChangesAt:                t.changesAt,
		Failures:                 t.failures,
	}
	res.Frontends, res.Backends = t.snapshotParts()

	// snapshot.New is the data planes' own consistency check (every
	// frontend's backend exists, no address claimed twice); it sorts the
	// slices in place, which is the order Result promises.
	if _, err := snapshot.New(0, res.Frontends, res.Backends, res.Workloads); err != nil {
		return Result{}, fmt.Errorf("translate: inconsistent snapshot: %w", err)
	}
	return res, nil
}

// translator holds one Translate call's indexes and partial results. It
// lives for the call only.
type translator struct {
	in  Input
	now metav1.Time

	services   []*corev1.Service // sorted by namespace/name, no nils
	byService  map[types.NamespacedName]*corev1.Service
	slices     map[types.NamespacedName][]*discoveryv1.EndpointSlice // by Service, sorted by name
	configMaps map[types.NamespacedName]*corev1.ConfigMap
	secrets    map[types.NamespacedName]*corev1.Secret
	bundles    map[string]*certificatesv1.ClusterTrustBundle
	xbackends  map[types.NamespacedName]*xbackendEval
	grants     map[string][]*gwv1.ReferenceGrant // by namespace, sorted by name
	certs      tlsvalidation.CertCache
	// clusterAddrs is clusterAddresses' index, nil until first used.
	clusterAddrs map[netip.Addr]string

	// portPolicies holds the BackendTLSPolicy that governs each Service port.
	portPolicies map[portKey]*portPolicy
	// routeTables holds the mesh route table of each Service port that
	// routes attach to.
	routeTables map[portKey]*snapshot.RouteTable
	// trafficPolicies holds the XBackendTrafficPolicy that governs each
	// Service and XBackend.
	trafficPolicies map[trafficKey]*trafficEval

	frontends        []snapshot.Frontend
	backends         map[snapshot.BackendRef]*snapshot.Backend
	policyStatus     map[types.NamespacedName][]gwv1.PolicyAncestorStatus
	trafficStatus    map[types.NamespacedName][]gwv1.PolicyAncestorStatus
	unrepresented    []Unrepresented
	xbackendStatuses map[types.NamespacedName][]gwxv1alpha1.BackendAncestorStatus
	httpRouteStatus  map[types.NamespacedName][]gwv1.RouteParentStatus
	grpcRouteStatus  map[types.NamespacedName][]gwv1.RouteParentStatus
	selectorServices []*corev1.Service
	// changesAt is Result.ChangesAt: judgedUntil keeps the earliest.
	changesAt time.Time
	// failures are the objects whose judgement panicked (containObject)
	// and the routes at Service ports whose route join panicked
	// (joinContained): joined holds those routes, joinFailures the panic
	// per such port. fault is translateWith's.
	failures     []Failure
	joined       map[snapshot.ObjectRef]bool
	joinFailures map[portKey]string
	fault        func(snapshot.ObjectRef)
}

// portKey names a Service port by number (TCP ports are unique by number).
type portKey struct {
	namespace, name string
	port            int32
}

func newTranslator(in Input) *translator {
	t := &translator{
		in:               in,
		now:              metav1.NewTime(in.Now),
		configMaps:       map[types.NamespacedName]*corev1.ConfigMap{},
		secrets:          map[types.NamespacedName]*corev1.Secret{},
		bundles:          map[string]*certificatesv1.ClusterTrustBundle{},
		xbackends:        map[types.NamespacedName]*xbackendEval{},
		grants:           map[string][]*gwv1.ReferenceGrant{},
		portPolicies:     map[portKey]*portPolicy{},
		routeTables:      map[portKey]*snapshot.RouteTable{},
		joined:           map[snapshot.ObjectRef]bool{},
		joinFailures:     map[portKey]string{},
		trafficPolicies:  map[trafficKey]*trafficEval{},
		trafficStatus:    map[types.NamespacedName][]gwv1.PolicyAncestorStatus{},
		backends:         map[snapshot.BackendRef]*snapshot.Backend{},
		policyStatus:     map[types.NamespacedName][]gwv1.PolicyAncestorStatus{},
		xbackendStatuses: map[types.NamespacedName][]gwxv1alpha1.BackendAncestorStatus{},
		httpRouteStatus:  map[types.NamespacedName][]gwv1.RouteParentStatus{},
		grpcRouteStatus:  map[types.NamespacedName][]gwv1.RouteParentStatus{},
	}
	// Sized up front: at 10,000 Services, growing these maps was a tenth
	// of a translation's time.
	t.byService = make(map[types.NamespacedName]*corev1.Service, len(in.Services))
	t.slices = make(map[types.NamespacedName][]*discoveryv1.EndpointSlice, len(in.Services))
	// Sources hand over unique objects; should one appear twice anyway,
	// the first in namespace/name order wins, whatever the input order.
	t.services = sortedObjects(in.Services)
	for _, s := range t.services {
		t.byService[key(s)] = s
	}
	for _, es := range sortedObjects(in.EndpointSlices) {
		svc := es.Labels[discoveryv1.LabelServiceName]
		if svc == "" {
			continue
		}
		k := types.NamespacedName{Namespace: es.Namespace, Name: svc}
		t.slices[k] = append(t.slices[k], es)
	}
	for _, cm := range sortedObjects(in.ConfigMaps) {
		addOnce(t.configMaps, key(cm), cm)
	}
	for _, s := range sortedObjects(in.Secrets) {
		addOnce(t.secrets, key(s), s)
	}
	for _, b := range sortedObjects(in.ClusterTrustBundles) {
		addOnce(t.bundles, b.Name, b)
	}
	for _, g := range sortedObjects(in.ReferenceGrants) {
		t.grants[g.Namespace] = append(t.grants[g.Namespace], g)
	}
	return t
}

// object is what every Kubernetes object pointer offers.
type object interface {
	comparable
	GetNamespace() string
	GetName() string
	GetCreationTimestamp() metav1.Time
}

// sortedObjects returns objs without nils, sorted by namespace/name;
// objects with the same namespace/name keep their input order.
func sortedObjects[T object](objs []T) []T {
	var zero T
	// A stable sort of 10,000 objects merges in O(n log² n) steps; an
	// unstable one with the input position as the last key gives the same
	// order in O(n log n).
	entries := make([]positioned[T], 0, len(objs))
	for i, o := range objs {
		if o != zero {
			entries = append(entries, positioned[T]{o, o.GetNamespace(), o.GetName(), i})
		}
	}
	slices.SortFunc(entries, func(a, b positioned[T]) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name), cmp.Compare(a.pos, b.pos))
	})
	out := make([]T, len(entries))
	for i, e := range entries {
		out[i] = e.obj
	}
	return out
}

// positioned is an object with its sort key and input position.
type positioned[T any] struct {
	obj             T
	namespace, name string
	pos             int
}

// olderFirst orders objects by Gateway API precedence: the older creation
// timestamp first, then namespace/name.
func olderFirst[T object](a, b T) int {
	ta, tb := a.GetCreationTimestamp(), b.GetCreationTimestamp()
	return cmp.Or(ta.Time.Compare(tb.Time), cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
}

func key[T object](o T) types.NamespacedName {
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
}

func compareNames(a, b types.NamespacedName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

func addOnce[K comparable, V any](m map[K]V, k K, v V) {
	if _, ok := m[k]; !ok {
		m[k] = v
	}
}

// ConfigMap, Secret, ClusterTrustBundle and CertCache make the translator the
// tlsvalidation.Objects of this call.
func (t *translator) ConfigMap(namespace, name string) *corev1.ConfigMap {
	return t.configMaps[types.NamespacedName{Namespace: namespace, Name: name}]
}

func (t *translator) Secret(namespace, name string) *corev1.Secret {
	return t.secrets[types.NamespacedName{Namespace: namespace, Name: name}]
}

func (t *translator) ClusterTrustBundle(name string) *certificatesv1.ClusterTrustBundle {
	return t.bundles[name]
}

// CertCache lets the policies and XBackends of this call share their CA
// bundles' parsing (tlsvalidation.CertCacher).
func (t *translator) CertCache() *tlsvalidation.CertCache { return &t.certs }

// judgedUntil records that a judgement made by Input.Now changes at when
// (zero: never), for Result.ChangesAt.
func (t *translator) judgedUntil(when time.Time) {
	if when.After(t.in.Now) && (t.changesAt.IsZero() || when.Before(t.changesAt)) {
		t.changesAt = when
	}
}

// capturePort records a captured Service port leading to b, with its mesh
// route table, and b (the first time it is seen).
func (t *translator) capturePort(svc *corev1.Service, sp corev1.ServicePort, addrs []netip.Addr, b snapshot.Backend) {
	t.frontends = append(t.frontends, snapshot.Frontend{
		Service:       snapshot.ObjectRef{Namespace: svc.Namespace, Name: svc.Name},
		PortName:      sp.Name,
		Port:          uint16(sp.Port),
		Addresses:     addrs,
		FailurePolicy: failurePolicy(svc, &b),
		Backend:       b.Ref,
		Routes:        t.routeTables[portKey{svc.Namespace, svc.Name, sp.Port}],
	})
	if _, ok := t.backends[b.Ref]; !ok {
		t.backends[b.Ref] = &b
	}
}

// snapshotParts returns the frontends, each address claimed once (by the
// older Service, should two malformed Services share a ClusterIP), and the
// backends they and their routes lead to.
func (t *translator) snapshotParts() ([]snapshot.Frontend, []snapshot.Backend) {
	created := func(ref snapshot.ObjectRef) metav1.Time {
		if s := t.byService[types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}]; s != nil {
			return s.CreationTimestamp
		}
		return metav1.Time{}
	}
	fs := slices.Clone(t.frontends)
	slices.SortStableFunc(fs, func(a, b snapshot.Frontend) int {
		ca, cb := created(a.Service), created(b.Service)
		return cmp.Or(ca.Time.Compare(cb.Time), cmp.Compare(a.Service.Namespace, b.Service.Namespace),
			cmp.Compare(a.Service.Name, b.Service.Name), cmp.Compare(a.Port, b.Port))
	})
	claimed := make(map[netip.AddrPort]bool, len(fs))
	var frontends []snapshot.Frontend
	if len(fs) > 0 {
		frontends = make([]snapshot.Frontend, 0, len(fs))
	}
	used := make(map[snapshot.BackendRef]bool, len(fs))
	for _, f := range fs {
		var addrs []netip.Addr
		for _, a := range f.Addresses {
			ap := netip.AddrPortFrom(a, f.Port)
			if !claimed[ap] {
				claimed[ap] = true
				addrs = append(addrs, a)
			}
		}
		if len(addrs) == 0 {
			continue
		}
		f.Addresses = addrs
		frontends = append(frontends, f)
		used[f.Backend] = true
		if f.Routes != nil {
			f.Routes.Sets(func(rs *snapshot.RouteSet) {
				for _, r := range rs.Rules {
					markRouteBackends(used, &r.Filters)
					for _, wb := range r.Backends {
						if wb.Invalid == nil {
							used[wb.Backend] = true
						}
						markRouteBackends(used, &wb.Filters)
					}
				}
			})
		}
	}
	if len(frontends) == 0 {
		frontends = nil // as when nothing is captured at all
	}
	var backends []snapshot.Backend
	if len(used) > 0 {
		backends = make([]snapshot.Backend, 0, len(used))
	}
	for _, ref := range slices.SortedFunc(maps.Keys(used), compareBackendRefs) {
		backends = append(backends, *t.backends[ref])
	}
	return frontends, backends
}

func markRouteBackends(used map[snapshot.BackendRef]bool, fs *snapshot.Filters) {
	for _, m := range fs.Mirrors {
		used[m.Backend] = true
	}
	if a := fs.ExternalAuth; a != nil {
		used[a.Backend] = true
	}
}

func compareBackendRefs(a, b snapshot.BackendRef) int {
	return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace),
		cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port))
}
