package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	certinformers "k8s.io/client-go/informers/certificates/v1"
	networkinginformers "k8s.io/client-go/informers/networking/v1"
	k8s "k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions/apis/v1"
	gwxinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions/apisx/v1alpha1"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/internal/tlsrefs"
)

// Config configures a Source.
type Config struct {
	// NodeName is the node the agent runs on: only its Pods are listed, and
	// its Node object gives Input.Node its name, addresses and pod CIDRs.
	// Required.
	NodeName string
	// ReferenceSyncTimeout bounds how long Input waits for a newly
	// referenced ConfigMap or Secret to be listed; after it Input goes on
	// as if the object did not exist, and translate fails the policy closed
	// (zero: 10 s).
	ReferenceSyncTimeout time.Duration
	// DiscoveryInterval is how often the API server is asked again which
	// optional kinds it serves: a Gateway API CRD installed, or a channel
	// upgraded, is watched and one removed is dropped without an agent
	// restart, and ClusterTrustBundles are found once turned on, as
	// GEP-5075 asks (zero: 1 min).
	DiscoveryInterval time.Duration
}

// Source lists and watches the cluster. Create it with New, start Run, and
// call Input after the first Changed signal.
type Source struct {
	cfg     Config
	log     *slog.Logger
	kube    k8s.Interface
	gw      gwclient.Interface
	changed chan struct{}
	events  *prometheus.CounterVec
	watched *prometheus.GaugeVec
	refs    *references

	synced atomic.Bool
	// mu guards l, which Run fills before the first signal and replaces
	// when an optional kind starts or stops being served, and what Kinds
	// reports: the last discovery's answer (served) and the watches of
	// the optional kinds (watching, with their errors).
	mu       sync.Mutex
	l        *listers
	served   map[string]bool
	watching map[string]*kindWatch
}

// listers read the informers' caches.
type listers struct {
	services       corelisters.ServiceLister
	endpointSlices discoverylisters.EndpointSliceLister
	namespaces     corelisters.NamespaceLister
	pods           corelisters.PodLister
	nodes          corelisters.NodeLister
	// optional holds the cache of each optional kind listed; a kind the
	// cluster does not serve (its CRD is not installed) is absent and
	// lists as empty.
	optional map[string]cache.Indexer
}

// New returns a Source for the cluster kube and gw reach.
func New(cfg Config, kube k8s.Interface, gw gwclient.Interface, log *slog.Logger, reg prometheus.Registerer) (*Source, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("kubernetes source: node name is required")
	}
	if cfg.ReferenceSyncTimeout <= 0 {
		cfg.ReferenceSyncTimeout = 10 * time.Second
	}
	if cfg.DiscoveryInterval <= 0 {
		cfg.DiscoveryInterval = time.Minute
	}
	s := &Source{
		cfg:     cfg,
		log:     log.With("component", "source_kubernetes"),
		kube:    kube,
		gw:      gw,
		changed: make(chan struct{}, 1),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_source_events_total",
			Help: "Watch events the kubernetes source received that may change the Snapshot, by kind.",
		}, []string{"kind"}),
		watched: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sockmesh_source_kind_watched",
			Help: "1 when the API server serves an optional kind (a Gateway API CRD, ClusterTrustBundle, ServiceCIDR) and the source lists it; 0 when its objects are taken as none.",
		}, []string{"kind"}),
	}
	refWatches := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sockmesh_source_reference_watches",
		Help: "ConfigMaps and Secrets watched because a policy or XBackend references them.",
	})
	if reg != nil {
		for _, c := range []prometheus.Collector{s.events, s.watched, refWatches} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register source metrics: %w", err)
			}
		}
	}
	s.refs = newReferences(kube, cfg.ReferenceSyncTimeout, refWatches, s.log,
		func(kind string) cache.ResourceEventHandler { return s.handler(kind, nil) })
	return s, nil
}

// Changed receives a value when Input may have changed (see source.Source).
func (s *Source) Changed() <-chan struct{} { return s.changed }

func (s *Source) signal() {
	if !s.synced.Load() {
		return
	}
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Run starts the informers, signals once every kind is listed and returns
// when ctx ends. It fails when the API server cannot be asked which kinds
// it serves (or an informer refuses its handler, which fresh ones do not).
// A kind it may not list (missing RBAC) keeps the first
// signal from coming, unless the API server stops serving it meanwhile;
// client-go's reflector logs why.
func (s *Source) Run(ctx context.Context) error {
	served, err := s.discover(ctx)
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return err
	}
	for _, k := range optionalKinds {
		if !served[k.kind] {
			s.log.Warn("kind not served by the api server; treating it as empty", "kind", k.kind, "group_version", k.groupVersion)
		}
	}
	s.refs.start(ctx)

	strip := informers.WithTransform(stripForCache)
	core := informers.NewSharedInformerFactoryWithOptions(s.kube, 0, strip)
	onNode := informers.NewSharedInformerFactoryWithOptions(s.kube, 0, strip,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", s.cfg.NodeName).String()
		}))
	node := informers.NewSharedInformerFactoryWithOptions(s.kube, 0, strip,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.cfg.NodeName).String()
		}))

	l := &listers{}
	var errs []error
	watch := func(kind string, inf cache.SharedIndexInformer, relevant func(old, new any) bool) {
		if _, err := inf.AddEventHandler(s.handler(kind, relevant)); err != nil {
			errs = append(errs, fmt.Errorf("watch %s: %w", kind, err))
		}
	}
	svc := core.Core().V1().Services()
	watch("Service", svc.Informer(), nil)
	l.services = svc.Lister()
	eps := core.Discovery().V1().EndpointSlices()
	watch("EndpointSlice", eps.Informer(), nil)
	l.endpointSlices = eps.Lister()
	nss := core.Core().V1().Namespaces()
	watch("Namespace", nss.Informer(), labelsChanged)
	l.namespaces = nss.Lister()
	pods := onNode.Core().V1().Pods()
	// Pods rewrite their status often (conditions, container states);
	// enrolment only looks at a few fields.
	watch("Pod", pods.Informer(), podChanged)
	l.pods = pods.Lister()
	nodes := node.Core().V1().Nodes()
	// A kubelet rewrites its Node's status every few minutes for
	// heartbeats; only addresses, pod CIDRs and the zone matter here.
	watch("Node", nodes.Informer(), nodeChanged)
	l.nodes = nodes.Lister()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	watches := make(map[string]*kindWatch)
	defer func() {
		for _, w := range watches {
			w.end()
		}
	}()
	if err := s.follow(ctx, watches, served); err != nil {
		return err
	}

	factories := []interface {
		Start(<-chan struct{})
		WaitForCacheSync(<-chan struct{}) map[reflect.Type]bool
		Shutdown()
	}{core, onNode, node}
	start := time.Now()
	for _, f := range factories {
		f.Start(ctx.Done())
		// Shutdown waits for the informers' goroutines after ctx ends.
		defer f.Shutdown()
	}
	for _, f := range factories {
		f.WaitForCacheSync(ctx.Done())
	}
	s.settle(ctx, watches)
	if ctx.Err() != nil {
		return nil
	}
	l.optional = listed(watches)
	s.mu.Lock()
	s.l = l
	s.mu.Unlock()
	s.setWatched(l.optional)
	s.synced.Store(true)
	s.log.Info("caches synced", "duration", time.Since(start).Round(time.Millisecond))
	s.signal()
	s.rediscover(ctx, watches)
	s.synced.Store(false)
	return nil
}

// optionalKind is a kind served only when its API is there: a Gateway API
// CRD (of the standard or the experimental channel),
// certificates.k8s.io/v1 ClusterTrustBundles (Kubernetes >= 1.37, or
// turned on), or networking.k8s.io/v1 ServiceCIDRs (Kubernetes >= 1.33).
type optionalKind struct {
	kind, groupVersion string
	// relevant lets updates through to a rebuild (nil: all; see handler).
	relevant func(old, new any) bool
	informer func(k8s.Interface, gwclient.Interface) cache.SharedIndexInformer
}

// The optional kinds.
const (
	kindClusterTrustBundle    = "ClusterTrustBundle"
	kindServiceCIDR           = "ServiceCIDR"
	kindBackendTLSPolicy      = "BackendTLSPolicy"
	kindReferenceGrant        = "ReferenceGrant"
	kindHTTPRoute             = "HTTPRoute"
	kindGRPCRoute             = "GRPCRoute"
	kindXBackend              = "XBackend"
	kindXBackendTrafficPolicy = "XBackendTrafficPolicy"
	kindXMesh                 = "XMesh"
)

// optionalKinds are the optional kinds the source watches. Of Gateway API
// objects only spec, labels and annotations matter, not status (but for
// how many ancestors other controllers hold in a policy's); skipping
// status-only updates also keeps our own status writes from echoing back
// as a rebuild.
var optionalKinds = []optionalKind{
	{kindClusterTrustBundle, certificatesv1.SchemeGroupVersion.String(), nil, func(kube k8s.Interface, _ gwclient.Interface) cache.SharedIndexInformer {
		return certinformers.NewClusterTrustBundleInformer(kube, 0, cache.Indexers{})
	}},
	// A handful of objects, rarely updated: every update counts.
	{kindServiceCIDR, networkingv1.SchemeGroupVersion.String(), nil, func(kube k8s.Interface, _ gwclient.Interface) cache.SharedIndexInformer {
		return networkinginformers.NewServiceCIDRInformer(kube, 0, cache.Indexers{})
	}},
	{kindBackendTLSPolicy, gwv1.GroupVersion.String(), statusChanged, func(_ k8s.Interface, gw gwclient.Interface) cache.SharedIndexInformer {
		return gwinformers.NewBackendTLSPolicyInformer(gw, metav1.NamespaceAll, 0, cache.Indexers{})
	}},
	{kindReferenceGrant, gwv1.GroupVersion.String(), specChanged, func(_ k8s.Interface, gw gwclient.Interface) cache.SharedIndexInformer {
		return gwinformers.NewReferenceGrantInformer(gw, metav1.NamespaceAll, 0, cache.Indexers{})
	}},
	{kindHTTPRoute, gwv1.GroupVersion.String(), statusChanged, func(_ k8s.Interface, gw gwclient.Interface) cache.SharedIndexInformer {
		return gwinformers.NewHTTPRouteInformer(gw, metav1.NamespaceAll, 0, cache.Indexers{})
	}},
	{kindGRPCRoute, gwv1.GroupVersion.String(), statusChanged, func(_ k8s.Interface, gw gwclient.Interface) cache.SharedIndexInformer {
		return gwinformers.NewGRPCRouteInformer(gw, metav1.NamespaceAll, 0, cache.Indexers{})
	}},
	{kindXBackend, gwxv1alpha1.GroupVersion.String(), statusChanged, func(_ k8s.Interface, gw gwclient.Interface) cache.SharedIndexInformer {
		return gwxinformers.NewXBackendInformer(gw, metav1.NamespaceAll, 0, cache.Indexers{})
	}},
	{kindXBackendTrafficPolicy, gwxv1alpha1.GroupVersion.String(), statusChanged, func(_ k8s.Interface, gw gwclient.Interface) cache.SharedIndexInformer {
		return gwxinformers.NewXBackendTrafficPolicyInformer(gw, metav1.NamespaceAll, 0, cache.Indexers{})
	}},
	{kindXMesh, gwxv1alpha1.GroupVersion.String(), statusChanged, func(_ k8s.Interface, gw gwclient.Interface) cache.SharedIndexInformer {
		return gwxinformers.NewXMeshInformer(gw, 0, cache.Indexers{})
	}},
}

// discover asks the API server which optional kinds it serves.
func (s *Source) discover(ctx context.Context) (map[string]bool, error) {
	served := make(map[string]bool)
	asked := make(map[string]*metav1.APIResourceList)
	for _, k := range optionalKinds {
		list, ok := asked[k.groupVersion]
		if !ok {
			// With ctx: nothing else ends the request. The discovery
			// client's 32 s default timeout reaches only an HTTP client it
			// builds itself, not the clientset's shared one, and an API
			// server that hangs (an outage, a partition: when nodes get
			// drained) would hold the agent's exit on SIGTERM for ever.
			var err error
			list, err = s.kube.Discovery().ServerResourcesForGroupVersionWithContext(ctx, k.groupVersion)
			if apierrors.IsNotFound(err) {
				list, err = &metav1.APIResourceList{}, nil
			}
			if err != nil {
				return nil, fmt.Errorf("discover %s: %w", k.groupVersion, err)
			}
			asked[k.groupVersion] = list
		}
		served[k.kind] = slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Kind == k.kind })
	}
	return served, nil
}

// rediscover asks the API server every Config.DiscoveryInterval which
// optional kinds it serves, until ctx ends: a CRD installed (or a channel
// upgraded) after the agent started is watched, and a kind whose CRD is
// deleted, or whose version is no longer served, is dropped with its
// objects, rather than left to an informer that fails to list forever
// while the cache holds what the cluster no longer has. GEP-5075 asks the
// same of ClusterTrustBundles.
func (s *Source) rediscover(ctx context.Context, watches map[string]*kindWatch) {
	tick := time.NewTicker(s.cfg.DiscoveryInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.refresh(ctx, watches)
		// A kind still listing is published after a later discovery.
		s.waitListed(ctx, watches)
		s.publish(listed(watches))
	}
}

// settle waits for the first listing of every kind watched, asking the API
// server again every Config.DiscoveryInterval meanwhile which kinds it
// serves: a kind that cannot be listed and whose CRD is then deleted would
// otherwise hold the first signal back until the agent restarts.
func (s *Source) settle(ctx context.Context, watches map[string]*kindWatch) {
	for !s.waitListed(ctx, watches) && ctx.Err() == nil {
		s.refresh(ctx, watches)
	}
}

// refresh asks the API server which optional kinds it serves and follows
// its answer. The asking is bounded by Config.DiscoveryInterval: an
// answer later than the next one is of no use, and an API server that
// hangs would otherwise hold every later discovery (and settle's wait)
// until the connection is found dead.
func (s *Source) refresh(ctx context.Context, watches map[string]*kindWatch) {
	dctx, cancel := context.WithTimeout(ctx, s.cfg.DiscoveryInterval)
	served, err := s.discover(dctx)
	cancel()
	if err != nil {
		// An API server that does not answer has removed nothing: keep
		// what is watched. The informers log their own errors.
		s.log.Debug("cannot ask the api server which kinds it serves", "err", err)
		return
	}
	if err := s.follow(ctx, watches, served); err != nil {
		s.log.Warn("cannot watch a kind the api server now serves", "err", err)
	}
}

// follow starts watching the optional kinds served and ends the watch of a
// kind that two discoveries in a row found not served. One answer is not
// enough: an API server that is starting may not serve the CRDs' group
// versions yet, and dropping BackendTLSPolicies on its word would send
// their Services' traffic in cleartext until the next discovery.
func (s *Source) follow(ctx context.Context, watches map[string]*kindWatch, served map[string]bool) error {
	var errs []error
	for _, k := range optionalKinds {
		w := watches[k.kind]
		switch {
		case served[k.kind] && w == nil:
			w, err := s.startWatch(ctx, k)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			watches[k.kind] = w
		case served[k.kind]:
			w.unserved = false
		case w != nil && !w.unserved:
			w.unserved = true
		case w != nil:
			w.end()
			delete(watches, k.kind)
		}
	}
	s.mu.Lock()
	s.served, s.watching = served, maps.Clone(watches)
	s.mu.Unlock()
	return errors.Join(errs...)
}

// publish hands Input the caches of the optional kinds listed now, and
// signals when a kind came or went. A kind gone takes its objects with it,
// which is what the cluster says: a deleted BackendTLSPolicy CRD means no
// policies, so their Services fall back to what they are without one
// rather than failing closed, as a deleted policy does; routes to a kind
// gone no longer resolve, and ClusterTrustBundles turned off make
// references to them fail closed again (ClusterTrustBundlesUnavailable).
func (s *Source) publish(optional map[string]cache.Indexer) {
	s.mu.Lock()
	l := *s.l
	s.mu.Unlock()
	changed := false
	for _, k := range optionalKinds {
		_, was := l.optional[k.kind]
		_, is := optional[k.kind]
		switch {
		case is && !was:
			s.log.Info("kind now served by the api server; watching it", "kind", k.kind, "group_version", k.groupVersion)
		case was && !is:
			s.log.Warn("kind no longer served by the api server; dropping its objects", "kind", k.kind, "group_version", k.groupVersion)
		default:
			continue
		}
		changed = true
	}
	if !changed {
		return
	}
	// Only rediscover replaces l once Run has filled it.
	l.optional = optional
	s.mu.Lock()
	s.l = &l
	s.mu.Unlock()
	s.setWatched(optional)
	s.signal()
}

func (s *Source) setWatched(optional map[string]cache.Indexer) {
	for _, k := range optionalKinds {
		v := 0.0
		if _, ok := optional[k.kind]; ok {
			v = 1
		}
		s.watched.WithLabelValues(k.kind).Set(v)
	}
}

// kindWatch is the informer of an optional kind the API server serves.
type kindWatch struct {
	informer cache.SharedIndexInformer
	stop     context.CancelFunc
	done     chan struct{}
	// unserved: the last discovery did not find the kind.
	unserved bool
	// err is the informer's last error listing or watching the kind
	// before its first listing was done; Source.mu guards it.
	err error
}

func (s *Source) startWatch(ctx context.Context, k optionalKind) (*kindWatch, error) {
	inf := k.informer(s.kube, s.gw)
	if err := inf.SetTransform(stripForCache); err != nil {
		return nil, fmt.Errorf("watch %s: %w", k.kind, err)
	}
	if _, err := inf.AddEventHandler(s.handler(k.kind, k.relevant)); err != nil {
		return nil, fmt.Errorf("watch %s: %w", k.kind, err)
	}
	w := &kindWatch{informer: inf, done: make(chan struct{})}
	// Kinds says why a kind is not listed yet: its RBAC missing, most often.
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if !inf.HasSynced() {
			s.mu.Lock()
			w.err = err
			s.mu.Unlock()
		}
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		return nil, fmt.Errorf("watch %s: %w", k.kind, err)
	}
	ctx, w.stop = context.WithCancel(ctx)
	go func() {
		defer close(w.done)
		inf.RunWithContext(ctx)
	}()
	return w, nil
}

// end stops the informer and waits for its goroutines.
func (w *kindWatch) end() {
	w.stop()
	<-w.done
}

// waitListed waits until every watch has its first listing, for one
// Config.DiscoveryInterval at most (the next discovery may find a kind
// gone), and says whether they all have.
func (s *Source) waitListed(ctx context.Context, watches map[string]*kindWatch) bool {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DiscoveryInterval)
	defer cancel()
	var synced []cache.InformerSynced
	for _, w := range watches {
		synced = append(synced, w.informer.HasSynced)
	}
	return cache.WaitForCacheSync(ctx.Done(), synced...)
}

// listed returns the caches of the watches whose first listing is done.
func listed(watches map[string]*kindWatch) map[string]cache.Indexer {
	out := make(map[string]cache.Indexer)
	for kind, w := range watches {
		if w.informer.HasSynced() {
			out[kind] = w.informer.GetIndexer()
		}
	}
	return out
}

// handler counts and signals the events that relevant (nil: all) lets
// through. Policies and XBackends also need their references watched,
// which Input starts on demand.
func (s *Source) handler(kind string, relevant func(old, new any) bool) cache.ResourceEventHandler {
	event := func() {
		s.events.WithLabelValues(kind).Inc()
		s.signal()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { event() },
		UpdateFunc: func(old, new any) {
			if relevant == nil || relevant(old, new) {
				event()
			}
		},
		DeleteFunc: func(any) { event() },
	}
}

// Input returns the objects in the caches. It may block until the
// ConfigMaps and Secrets that policies newly reference are listed (at most
// Config.ReferenceSyncTimeout), so that translate never judges a policy by
// a reference the source has not looked up yet.
func (s *Source) Input() translate.Input {
	s.mu.Lock()
	l := s.l
	s.mu.Unlock()
	if l == nil {
		return translate.Input{}
	}
	in := translate.Input{
		Services:                list(l.services),
		EndpointSlices:          list(l.endpointSlices),
		Namespaces:              list(l.namespaces),
		Pods:                    list(l.pods),
		ClusterTrustBundles:     cached[*certificatesv1.ClusterTrustBundle](l.optional[kindClusterTrustBundle]),
		BackendTLSPolicies:      cached[*gwv1.BackendTLSPolicy](l.optional[kindBackendTLSPolicy]),
		ReferenceGrants:         cached[*gwv1.ReferenceGrant](l.optional[kindReferenceGrant]),
		HTTPRoutes:              cached[*gwv1.HTTPRoute](l.optional[kindHTTPRoute]),
		GRPCRoutes:              cached[*gwv1.GRPCRoute](l.optional[kindGRPCRoute]),
		XBackends:               cached[*gwxv1alpha1.XBackend](l.optional[kindXBackend]),
		XBackendTrafficPolicies: cached[*gwxv1alpha1.XBackendTrafficPolicy](l.optional[kindXBackendTrafficPolicy]),
		XMeshes:                 cached[*gwxv1alpha1.XMesh](l.optional[kindXMesh]),
		Node:                    s.node(l),

		ClusterTrustBundlesUnavailable: l.optional[kindClusterTrustBundle] == nil,
	}
	in.Node.ServiceCIDRs = serviceCIDRs(cached[*networkingv1.ServiceCIDR](l.optional[kindServiceCIDR]))
	in.ConfigMaps, in.Secrets = s.refs.objects(tlsrefs.Of(in.BackendTLSPolicies, in.XBackends, in.ReferenceGrants))
	return in
}

// node describes this node from its Node object; the agent adds what it
// is configured with (--service-cidr, --pod-cidr, egress allow-list).
func (s *Source) node(l *listers) translate.Node {
	n := translate.Node{Name: s.cfg.NodeName}
	obj, err := l.nodes.Get(s.cfg.NodeName)
	if err != nil {
		return n
	}
	n.Zone = obj.Labels[corev1.LabelTopologyZone]
	for _, a := range obj.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && !slices.Contains(n.IPs, ip) {
			n.IPs = append(n.IPs, ip)
		}
	}
	cidrs := obj.Spec.PodCIDRs
	if len(cidrs) == 0 && obj.Spec.PodCIDR != "" {
		cidrs = []string{obj.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			n.PodCIDRs = append(n.PodCIDRs, p.Masked())
		}
	}
	return n
}

// serviceCIDRs returns the ranges of the cluster's ServiceCIDRs, every
// one, ready or being deleted: its ClusterIPs may still be in use.
func serviceCIDRs(objs []*networkingv1.ServiceCIDR) []netip.Prefix {
	var out []netip.Prefix
	for _, o := range objs {
		for _, c := range o.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil && !slices.Contains(out, p.Masked()) {
				out = append(out, p.Masked())
			}
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare) // the cache lists in no order
	return out
}

// lister is what every generated lister has.
type lister[T any] interface {
	List(labels.Selector) ([]T, error)
}

// list returns every cached object. The cache lister's List never fails
// with labels.Everything().
func list[T any, L lister[T]](l L) []T {
	objs, _ := l.List(labels.Everything())
	return objs
}

// cached returns every object in the cache of an optional kind, or nil for
// a kind not served.
func cached[T any](c cache.Indexer) []T {
	if c == nil {
		return nil
	}
	var objs []T
	for _, o := range c.List() {
		objs = append(objs, o.(T))
	}
	return objs
}
