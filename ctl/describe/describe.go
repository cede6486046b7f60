package describe

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/explain"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// ErrNotFound is returned for an object the API server does not have.
var ErrNotFound = errors.New("not found")

// Cluster is one translation of the cluster's objects.
type Cluster struct {
	in       translate.Input
	res      translate.Result
	snap     *snapshot.Snapshot
	warnings []string
}

// New translates in, as an agent would (without DNS answers: an
// ExternalHostname XBackend shows no endpoints). warnings are Load's.
func New(in translate.Input, warnings []string) (*Cluster, error) {
	res, err := translate.Translate(in)
	if err != nil {
		return nil, err
	}
	snap, err := snapshot.New(0, res.Frontends, res.Backends, res.Workloads)
	if err != nil {
		return nil, fmt.Errorf("build snapshot: %w", err)
	}
	return &Cluster{in: in, res: res, snap: snap, warnings: warnings}, nil
}

// Condition is one status condition translate computed.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// Ancestor is an object's status toward one ancestor (a policy's or
// XBackend's target) or parent (a route's).
type Ancestor struct {
	// Ref names it: Service namespace/name, with a port or section.
	Ref        string      `json:"ref"`
	Conditions []Condition `json:"conditions,omitempty"`
	// NoStatus says why a policy or route has no status entry toward it:
	// other controllers' entries fill its status, which makes a policy
	// unimplementable there (a route is served all the same) and leaves
	// no condition to say so.
	NoStatus string `json:"noStatus,omitempty"`
}

// Object is a policy, XBackend or route with the status translate
// computed for it now (not necessarily what the cluster's status says,
// which the elected agent writes).
type Object struct {
	Ref       snapshot.ObjectRef `json:"ref"`
	Created   time.Time          `json:"created,omitzero"`
	Ancestors []Ancestor         `json:"ancestors,omitempty"`
}

// Service is the effective backend properties of a Service.
type Service struct {
	Service snapshot.ObjectRef `json:"service"`
	// NoClusterIP says why none of its ports is captured when it has no
	// ClusterIP (NoClusterIP).
	NoClusterIP string `json:"noClusterIP,omitempty"`
	Ports       []Port `json:"ports"`
	// Policies (BackendTLSPolicies), TrafficPolicies
	// (XBackendTrafficPolicies), XBackends and Routes are the objects that
	// target this Service, with their status toward it; policies oldest
	// first (the precedence order among equals).
	Policies        []Object `json:"policies,omitempty"`
	TrafficPolicies []Object `json:"trafficPolicies,omitempty"`
	XBackends       []Object `json:"xbackends,omitempty"`
	Routes          []Object `json:"routes,omitempty"`
	// Failures are the objects whose translation panicked that govern
	// it (Failure.Services), the Service itself among them.
	Failures []translate.Failure `json:"failures,omitempty"`
	Warnings []string            `json:"warnings,omitempty"`
}

// Port is one Service port.
type Port struct {
	Name string `json:"name,omitempty"`
	Port uint16 `json:"port"`
	// Protocol is the port's transport (TCP, UDP, SCTP).
	Protocol    corev1.Protocol `json:"protocol"`
	AppProtocol string          `json:"appProtocol,omitempty"`
	// Captured ports are redirected to the proxy from enrolled pods.
	Captured      bool                   `json:"captured"`
	Addresses     []netip.Addr           `json:"addresses,omitempty"`
	FailurePolicy snapshot.FailurePolicy `json:"failurePolicy,omitempty"`
	// Backend is where connections go when no route applies.
	Backend *explain.Backend `json:"backend,omitempty"`
	// Routes are the producer set and the consumer sets.
	Routes []explain.Routes `json:"routes,omitempty"`
}

// Service describes namespace/name.
func (c *Cluster) Service(namespace, name string) (*Service, error) {
	i := slices.IndexFunc(c.in.Services, func(s *corev1.Service) bool { return s.Namespace == namespace && s.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("Service %s/%s: %w", namespace, name, ErrNotFound)
	}
	svc := c.in.Services[i]
	ref := snapshot.ObjectRef{Namespace: namespace, Name: name}
	out := &Service{Service: ref, NoClusterIP: NoClusterIP(svc), Ports: []Port{}, Warnings: c.warnings,
		Failures: c.failures(func(f translate.Failure) bool { return slices.Contains(f.Services, ref) })}
	for _, sp := range svc.Spec.Ports {
		p := Port{Name: sp.Name, Port: uint16(sp.Port), Protocol: cmp.Or(sp.Protocol, corev1.ProtocolTCP)}
		if sp.AppProtocol != nil {
			p.AppProtocol = *sp.AppProtocol
		}
		for _, f := range c.snap.Frontends {
			// By name too: a UDP port may share a captured TCP port's
			// number, and names are unique within a Service.
			if f.Service != ref || f.Port != p.Port || f.PortName != sp.Name {
				continue
			}
			p.Captured, p.Addresses, p.FailurePolicy = true, f.Addresses, f.FailurePolicy
			if b, ok := c.snap.Backend(f.Backend); ok {
				v := explain.DescribeBackend(b)
				p.Backend = &v
			}
			if f.Routes != nil {
				if f.Routes.Producer != nil {
					p.Routes = append(p.Routes, *explain.DescribeRoutes(f.Routes.Producer, "producer", namespace, c.snap))
				}
				for _, cr := range f.Routes.Consumers {
					p.Routes = append(p.Routes, *explain.DescribeRoutes(&cr.Routes, "consumer", cr.Namespace, c.snap))
				}
			}
		}
		out.Ports = append(out.Ports, p)
	}
	isThis := func(ns *gwv1.Namespace, owner string, group *gwv1.Group, kind *gwv1.Kind, n gwv1.ObjectName) bool {
		if group != nil && *group != "" || kind != nil && *kind != "Service" {
			return false
		}
		target := owner
		if ns != nil {
			target = string(*ns)
		}
		return target == namespace && string(n) == name
	}
	policies := func(kind string, statuses map[types.NamespacedName][]gwv1.PolicyAncestorStatus) []Object {
		mine := map[types.NamespacedName][]Ancestor{}
		for key, as := range statuses {
			for _, a := range as {
				if isThis(a.AncestorRef.Namespace, key.Namespace, a.AncestorRef.Group, a.AncestorRef.Kind, a.AncestorRef.Name) {
					mine[key] = append(mine[key], ancestor(a.AncestorRef, key.Namespace, a.Conditions))
				}
			}
		}
		for _, u := range c.res.Unrepresented {
			key := types.NamespacedName{Namespace: u.Policy.Namespace, Name: u.Policy.Name}
			if u.Policy.Kind == kind && isThis(u.Target.Namespace, key.Namespace, u.Target.Group, u.Target.Kind, u.Target.Name) {
				a := ancestor(u.Target, key.Namespace, nil)
				a.NoStatus = u.Message
				mine[key] = append(mine[key], a)
			}
		}
		var objs []Object
		for key, as := range mine {
			objs = append(objs, c.object(kind, key, as))
		}
		return objs
	}
	out.Policies = policies("BackendTLSPolicy", c.res.Status.BackendTLSPolicies)
	out.TrafficPolicies = policies("XBackendTrafficPolicy", c.res.Status.XBackendTrafficPolicies)
	// withoutRoom adds to mine this Service as an ancestor or parent the
	// status of the object kind/key has no room for.
	withoutRoom := func(kind string, key types.NamespacedName, mine []Ancestor) []Ancestor {
		for _, u := range c.res.Unrepresented {
			if u.Policy.Kind == kind && u.Policy.Namespace == key.Namespace && u.Policy.Name == key.Name &&
				isThis(u.Target.Namespace, key.Namespace, u.Target.Group, u.Target.Kind, u.Target.Name) {
				a := ancestor(u.Target, key.Namespace, nil)
				a.NoStatus = u.Message
				mine = append(mine, a)
			}
		}
		return mine
	}
	// Every XBackend has a status, empty when nothing reaches it.
	for key, as := range c.res.Status.XBackends {
		var mine []Ancestor
		for _, a := range as {
			if isThis(a.AncestorRef.Namespace, key.Namespace, a.AncestorRef.Group, a.AncestorRef.Kind, a.AncestorRef.Name) {
				mine = append(mine, ancestor(a.AncestorRef, key.Namespace, a.Conditions))
			}
		}
		if mine = withoutRoom("XBackend", key, mine); mine != nil {
			out.XBackends = append(out.XBackends, c.object("XBackend", key, mine))
		}
	}
	for kind, statuses := range map[string]map[types.NamespacedName][]gwv1.RouteParentStatus{
		"HTTPRoute": c.res.Status.HTTPRoutes, "GRPCRoute": c.res.Status.GRPCRoutes,
	} {
		for key, ps := range statuses {
			var mine []Ancestor
			for _, p := range ps {
				if isThis(p.ParentRef.Namespace, key.Namespace, p.ParentRef.Group, p.ParentRef.Kind, p.ParentRef.Name) {
					mine = append(mine, ancestor(p.ParentRef, key.Namespace, p.Conditions))
				}
			}
			if mine = withoutRoom(kind, key, mine); mine != nil {
				out.Routes = append(out.Routes, c.object(kind, key, mine))
			}
		}
	}
	sortObjects(out.Policies)
	sortObjects(out.TrafficPolicies)
	sortObjects(out.XBackends)
	sortObjects(out.Routes)
	return out, nil
}

// NoClusterIP says, after the Service's name, why connections to svc are
// never captured when it has no ClusterIP: translate captures a Service's
// ClusterIPs alone, the only destinations the datapath redirects by. ""
// when svc has one.
func NoClusterIP(svc *corev1.Service) string {
	const never = "so sockmesh never captures connections to it: it redirects connections to a Service's ClusterIP, and policies, routes and appProtocol apply only there"
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return fmt.Sprintf("is an ExternalName Service, a DNS alias for %s with no ClusterIP, %s; connections go to the addresses %s resolves to, untouched",
			svc.Spec.ExternalName, never, svc.Spec.ExternalName)
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return "is headless (clusterIP None): clients connect to its pods' addresses directly, " + never
	}
	return ""
}

// Policy is a BackendTLSPolicy and what it does to each target.
type Policy struct {
	Policy   Object   `json:"policy"`
	Hostname string   `json:"hostname"`
	CARefs   []string `json:"caCertificateRefs,omitempty"`
	// WellKnownCACertificates is "System" when set.
	WellKnownCACertificates string `json:"wellKnownCACertificates,omitempty"`
	// Targets are the Services it targets, as they stand with every
	// policy applied.
	Targets []Service `json:"targets,omitempty"`
	// Failures holds the policy's Failure when its translation panicked.
	Failures []translate.Failure `json:"failures,omitempty"`
	Warnings []string            `json:"warnings,omitempty"`
}

// BackendTLSPolicy describes namespace/name.
func (c *Cluster) BackendTLSPolicy(namespace, name string) (*Policy, error) {
	i := slices.IndexFunc(c.in.BackendTLSPolicies, func(p *gwv1.BackendTLSPolicy) bool { return p.Namespace == namespace && p.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("BackendTLSPolicy %s/%s: %w", namespace, name, ErrNotFound)
	}
	p := c.in.BackendTLSPolicies[i]
	key := types.NamespacedName{Namespace: namespace, Name: name}
	var as []Ancestor
	for _, a := range c.res.Status.BackendTLSPolicies[key] {
		as = append(as, ancestor(a.AncestorRef, namespace, a.Conditions))
	}
	out := &Policy{Policy: c.object("BackendTLSPolicy", key, as), Hostname: string(p.Spec.Validation.Hostname), Warnings: c.warnings}
	out.Failures = c.objectFailures(out.Policy.Ref)
	if w := p.Spec.Validation.WellKnownCACertificates; w != nil {
		out.WellKnownCACertificates = string(*w)
	}
	for _, r := range p.Spec.Validation.CACertificateRefs {
		out.CARefs = append(out.CARefs, fmt.Sprintf("%s %s/%s", r.Kind, namespace, r.Name))
	}
	seen := map[string]bool{}
	for _, t := range p.Spec.TargetRefs {
		if t.Group != "" || t.Kind != "Service" || seen[string(t.Name)] {
			continue
		}
		seen[string(t.Name)] = true
		if svc, err := c.Service(namespace, string(t.Name)); err == nil {
			svc.Warnings, svc.Failures = nil, nil
			out.Targets = append(out.Targets, *svc)
		}
	}
	return out, nil
}

// XBackend is an XBackend and the backend it makes.
type XBackend struct {
	XBackend Object            `json:"xbackend"`
	Backends []explain.Backend `json:"backends,omitempty"`
	// Services are the captured Service ports that lead to it.
	Services []string `json:"services,omitempty"`
	// Failures holds the XBackend's Failure when its translation panicked.
	Failures []translate.Failure `json:"failures,omitempty"`
	Warnings []string            `json:"warnings,omitempty"`
}

// XBackend describes namespace/name.
func (c *Cluster) XBackend(namespace, name string) (*XBackend, error) {
	if !slices.ContainsFunc(c.in.XBackends, func(x *gwxv1alpha1.XBackend) bool { return x.Namespace == namespace && x.Name == name }) {
		return nil, fmt.Errorf("XBackend %s/%s: %w", namespace, name, ErrNotFound)
	}
	key := types.NamespacedName{Namespace: namespace, Name: name}
	var as []Ancestor
	for _, a := range c.res.Status.XBackends[key] {
		as = append(as, ancestor(a.AncestorRef, namespace, a.Conditions))
	}
	out := &XBackend{XBackend: c.object("XBackend", key, as), Warnings: c.warnings}
	out.Failures = c.objectFailures(out.XBackend.Ref)
	for i := range c.snap.Backends {
		b := &c.snap.Backends[i]
		if b.Ref.Kind == snapshot.KindXBackend && b.Ref.Namespace == namespace && b.Ref.Name == name {
			out.Backends = append(out.Backends, explain.DescribeBackend(b))
			for _, f := range c.snap.Frontends {
				if f.Backend == b.Ref {
					out.Services = append(out.Services, fmt.Sprintf("%s:%d", f.Service, f.Port))
				}
			}
		}
	}
	return out, nil
}

// Route is an HTTPRoute or GRPCRoute and where its rules landed.
type Route struct {
	Route Object `json:"route"`
	// Placements are the Service ports whose route sets hold its rules.
	Placements []Placement `json:"placements,omitempty"`
	// Failures holds the route's Failure when its translation, or the join
	// of the routes at a port it attaches to, panicked.
	Failures []translate.Failure `json:"failures,omitempty"`
	Warnings []string            `json:"warnings,omitempty"`
}

// Placement is a route's rules in one Service port's route set.
type Placement struct {
	Service snapshot.ObjectRef `json:"service"`
	Port    uint16             `json:"port"`
	// Role and Namespace: the set the rules are in (consumer sets apply to
	// clients in Namespace only).
	Role      string            `json:"role"`
	Namespace string            `json:"namespace"`
	Kind      string            `json:"kind"`
	Rules     []explain.Rule    `json:"rules"`
	Backends  []explain.Backend `json:"backends,omitempty"`
}

// HTTPRoute describes namespace/name.
func (c *Cluster) HTTPRoute(namespace, name string) (*Route, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	found := slices.ContainsFunc(c.in.HTTPRoutes, func(r *gwv1.HTTPRoute) bool { return r.Namespace == namespace && r.Name == name })
	return c.route("HTTPRoute", key, found, c.res.Status.HTTPRoutes[key])
}

// GRPCRoute describes namespace/name.
func (c *Cluster) GRPCRoute(namespace, name string) (*Route, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	found := slices.ContainsFunc(c.in.GRPCRoutes, func(r *gwv1.GRPCRoute) bool { return r.Namespace == namespace && r.Name == name })
	return c.route("GRPCRoute", key, found, c.res.Status.GRPCRoutes[key])
}

// route describes a route of kind: its status per parent and the rules
// it placed in each Service port's route set.
func (c *Cluster) route(kind string, key types.NamespacedName, found bool, parents []gwv1.RouteParentStatus) (*Route, error) {
	if !found {
		return nil, fmt.Errorf("%s %s: %w", kind, key, ErrNotFound)
	}
	var as []Ancestor
	for _, p := range parents {
		as = append(as, ancestor(p.ParentRef, key.Namespace, p.Conditions))
	}
	out := &Route{Route: c.object(kind, key, as), Warnings: c.warnings}
	out.Failures = c.objectFailures(out.Route.Ref)
	self := snapshot.ObjectRef{Kind: kind, Namespace: key.Namespace, Name: key.Name}
	for _, f := range c.snap.Frontends {
		if f.Routes == nil {
			continue
		}
		add := func(set *snapshot.RouteSet, role, ns string) {
			if set == nil {
				return
			}
			r := explain.DescribeRoutes(set, role, ns, c.snap)
			pl := Placement{Service: f.Service, Port: f.Port, Role: role, Namespace: ns, Kind: string(r.Kind), Backends: r.Backends}
			for _, rule := range r.Rules {
				if rule.Route == self {
					pl.Rules = append(pl.Rules, rule)
				}
			}
			if pl.Rules != nil {
				out.Placements = append(out.Placements, pl)
			}
		}
		add(f.Routes.Producer, "producer", f.Service.Namespace)
		for _, cr := range f.Routes.Consumers {
			add(&cr.Routes, "consumer", cr.Namespace)
		}
	}
	return out, nil
}

// failures returns the translation's failures that concern describes.
func (c *Cluster) failures(concern func(translate.Failure) bool) []translate.Failure {
	var out []translate.Failure
	for _, f := range c.res.Failures {
		if concern(f) {
			out = append(out, f)
		}
	}
	return out
}

// objectFailures returns the Failure of the object ref names, if any.
func (c *Cluster) objectFailures(ref snapshot.ObjectRef) []translate.Failure {
	return c.failures(func(f translate.Failure) bool { return f.Object == ref })
}

func (c *Cluster) object(kind string, key types.NamespacedName, as []Ancestor) Object {
	o := Object{Ref: snapshot.ObjectRef{Kind: kind, Namespace: key.Namespace, Name: key.Name}, Ancestors: as}
	var meta *metav1.ObjectMeta
	switch kind {
	case "BackendTLSPolicy":
		meta = findMeta(c.in.BackendTLSPolicies, key, func(p *gwv1.BackendTLSPolicy) *metav1.ObjectMeta { return &p.ObjectMeta })
	case "HTTPRoute":
		meta = findMeta(c.in.HTTPRoutes, key, func(p *gwv1.HTTPRoute) *metav1.ObjectMeta { return &p.ObjectMeta })
	case "GRPCRoute":
		meta = findMeta(c.in.GRPCRoutes, key, func(p *gwv1.GRPCRoute) *metav1.ObjectMeta { return &p.ObjectMeta })
	case "XBackendTrafficPolicy":
		meta = findMeta(c.in.XBackendTrafficPolicies, key, func(p *gwxv1alpha1.XBackendTrafficPolicy) *metav1.ObjectMeta { return &p.ObjectMeta })
	case "XBackend":
		meta = findMeta(c.in.XBackends, key, func(p *gwxv1alpha1.XBackend) *metav1.ObjectMeta { return &p.ObjectMeta })
	}
	if meta != nil {
		o.Created = meta.CreationTimestamp.UTC()
	}
	return o
}

func findMeta[T any](objs []*T, key types.NamespacedName, meta func(*T) *metav1.ObjectMeta) *metav1.ObjectMeta {
	for _, o := range objs {
		if m := meta(o); m.Namespace == key.Namespace && m.Name == key.Name {
			return m
		}
	}
	return nil
}

// ancestor names p (whose namespace defaults to owner's, the namespace of
// the object whose status it is) and keeps its conditions.
func ancestor(p gwv1.ParentReference, owner string, conds []metav1.Condition) Ancestor {
	kind := "Service"
	if p.Kind != nil {
		kind = string(*p.Kind)
	}
	ns := owner
	if p.Namespace != nil {
		ns = string(*p.Namespace)
	}
	ref := kind + " " + ns + "/" + string(p.Name)
	if p.SectionName != nil && *p.SectionName != "" {
		ref += " section " + string(*p.SectionName)
	}
	if p.Port != nil {
		ref += fmt.Sprintf(" port %d", *p.Port)
	}
	a := Ancestor{Ref: ref}
	for _, c := range conds {
		a.Conditions = append(a.Conditions, Condition{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message})
	}
	return a
}

func sortObjects(objs []Object) {
	slices.SortFunc(objs, func(a, b Object) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.Ref.String(), b.Ref.String()))
	})
}
