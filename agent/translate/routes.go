package translate

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// Route status reasons and condition types beyond those Gateway API names.
const (
	// ReasonConflicted (Accepted=False): on every port it names, the route
	// lost to a GRPCRoute of the same role (GEP-1294: GRPCRoute, then
	// HTTPRoute).
	ReasonConflicted = "Conflicted"
	// condPartiallyInvalid is the API's PartiallyInvalid condition.
	condPartiallyInvalid = string(gwv1.RouteConditionPartiallyInvalid)
	// ConditionTypePrefix starts the condition types sockmesh defines
	// itself, where the API defines none: the API lets implementations
	// add domain-prefixed types to their entries.
	ConditionTypePrefix = "sockmesh.io/"
	// ConditionRulesShadowed (True, reason ReasonIdenticalMatches, set only
	// beside Accepted=True and only when True) names the route's rules that
	// get no request on the parent: each of their matches repeats one that
	// takes precedence (markShadowed). Gateway API v1.7 defines no route
	// condition for it.
	ConditionRulesShadowed = ConditionTypePrefix + "RulesShadowed"
	// ReasonIdenticalMatches is ConditionRulesShadowed's reason.
	ReasonIdenticalMatches = "IdenticalMatches"
	// maxRouteParents is RouteStatus.Parents' MaxItems.
	maxRouteParents = 32
)

// routeEval is one HTTPRoute or GRPCRoute, checked once, whatever its
// parents.
type routeEval struct {
	kind       snapshot.RouteKind
	ref        snapshot.ObjectRef // Kind is the route kind
	created    metav1.Time
	generation int64
	parentRefs []gwv1.ParentReference
	// parentServices are the Services its parentRefs name.
	parentServices map[types.NamespacedName]bool
	// specRules is how many rules the spec has.
	specRules int
	// invalid says what the CRD would refuse in the spec as a whole: the
	// route, converted all the same for its status, then takes part in no
	// routing.
	invalid string
	// rules are the rules that take part in routing (valid, or Invalid
	// and answering 500); matches index them.
	rules   []snapshot.RouteRule
	matches []routeMatch
	// dropped and failing describe the rules that are left out and those
	// that answer 500; incompatible is set when one of them combines
	// filters that cannot go together.
	dropped, failing []string
	incompatible     bool
	// idle says which valid rules forward no request, and what their
	// requests get: without a redirect, they have no backendRef of weight
	// above 0 (the API's 500), or there are no rules at all. The route is
	// valid, so only the Accepted message says so.
	idle        []string
	refProblems []refProblem
	// xbackends are the XBackends its valid rules lead to.
	xbackends []*xbackendEval
	// parents holds the outcome per Service parentRef.
	parents []*parentOutcome
	// existing is the route's status as the informer shows it: the room
	// other controllers' entries leave ours (routeStatus).
	existing []gwv1.RouteParentStatus
}

// parentOutcome is what became of one Service parentRef.
type parentOutcome struct {
	ref gwv1.ParentReference
	svc *corev1.Service
	// problem is the Accepted=False reason and message when the parent or
	// its ports cannot be found.
	problem *refProblem
	// ports are the Service ports the route attached to; conflicted those
	// where routes of the other kind govern (governingKind), and winners
	// those routes ("namespace/name"), for the status to name.
	ports, conflicted []int32
	winners           []string
	consumer          bool
	// shadowed are the route's rules that get no request on some of ports.
	shadowed []shadowedRule
}

// installed reports whether the route takes part in routing: it has rules
// that do, or none at all (a GRPCRoute may have no rules; every request
// then finds no match).
func (e *routeEval) installed() bool {
	return e.invalid == "" && (len(e.rules) > 0 || e.specRules == 0)
}

// accepted reports whether the route is Accepted where it attaches: it
// takes part in routing, and some rule of it is honoured (the API: a route
// with at least one rule implemented), or it has none.
func (e *routeEval) accepted() bool {
	return e.installed() && (e.specRules == 0 || e.validRules() > 0)
}

// validRules counts the rules that route rather than answer 500.
func (e *routeEval) validRules() int {
	n := 0
	for _, r := range e.rules {
		if r.Invalid == nil {
			n++
		}
	}
	return n
}

// routeBuilder converts one route.
type routeBuilder struct {
	t    *translator
	e    *routeEval
	kind snapshot.RouteKind
}

// translateRoutes checks every mesh route, attaches it to the Service
// ports its parentRefs name, and builds each port's route table. It runs
// before capture, which captures the ports that got a table.
func (t *translator) translateRoutes() {
	var routes []*routeEval
	seen := map[types.NamespacedName]bool{}
	for _, r := range sortedObjects(t.in.HTTPRoutes) {
		if !seen[key(r)] {
			seen[key(r)] = true
			e := t.evalRouteContained(snapshot.KindHTTPRoute, r.ObjectMeta, r.Spec.ParentRefs, func() *routeEval { return t.evalHTTPRoute(r) })
			e.existing = r.Status.Parents
			routes = append(routes, e)
		}
	}
	clear(seen)
	for _, r := range sortedObjects(t.in.GRPCRoutes) {
		if !seen[key(r)] {
			seen[key(r)] = true
			e := t.evalRouteContained(snapshot.KindGRPCRoute, r.ObjectMeta, r.Spec.ParentRefs, func() *routeEval { return t.evalGRPCRoute(r) })
			e.existing = r.Status.Parents
			routes = append(routes, e)
		}
	}
	attached := map[portKey]map[string][]*routeEval{} // role ("" producer, else consumer namespace) → routes
	for _, e := range routes {
		t.attach(e, attached)
	}
	// In port order, so that the failures of joins that panic come in
	// the same order at each translation.
	for _, k := range slices.SortedFunc(maps.Keys(attached), comparePortKeys) {
		t.routeTables[k] = t.joinContained(k, attached[k])
	}
	for _, e := range routes {
		st := t.routeStatus(e)
		if e.kind == snapshot.KindGRPCRoute {
			t.grpcRouteStatus[types.NamespacedName{Namespace: e.ref.Namespace, Name: e.ref.Name}] = st
		} else {
			t.httpRouteStatus[types.NamespacedName{Namespace: e.ref.Namespace, Name: e.ref.Name}] = st
		}
	}
}

func newRouteEval(kind snapshot.RouteKind, meta metav1.ObjectMeta, parents []gwv1.ParentReference) *routeEval {
	e := &routeEval{
		kind: kind, ref: snapshot.ObjectRef{Kind: string(kind), Namespace: meta.Namespace, Name: meta.Name},
		created: meta.CreationTimestamp, generation: meta.Generation, parentRefs: parents,
		parentServices: map[types.NamespacedName]bool{},
	}
	for _, p := range parents {
		if isServiceParent(p) {
			e.parentServices[types.NamespacedName{Namespace: cmp.Or(deref(p.Namespace), meta.Namespace), Name: string(p.Name)}] = true
		}
	}
	return e
}

func (t *translator) evalHTTPRoute(r *gwv1.HTTPRoute) *routeEval {
	e := newRouteEval(snapshot.KindHTTPRoute, r.ObjectMeta, r.Spec.ParentRefs)
	rb := &routeBuilder{t: t, e: e, kind: snapshot.KindHTTPRoute}
	e.invalid = specProblem(r.Spec.ParentRefs, r.Spec.Hostnames, r.Spec.Rules, func(r *gwv1.HTTPRouteRule) (*gwv1.SectionName, int) {
		if r.Matches == nil {
			// The CRD defaults absent matches to one PathPrefix "/" match
			// before its rule counts them; "matches: []" stays empty.
			return r.Name, 1
		}
		return r.Name, len(r.Matches)
	})
	rules := r.Spec.Rules
	if e.invalid == "" && rules != nil && len(rules) == 0 {
		// The CRD defaults absent rules but refuses an empty list
		// (MinItems 1), which only a manifest file can hold.
		e.invalid = "rules is an empty list"
	}
	if len(rules) == 0 {
		// The CRD's default: one rule matching every request (which, with
		// no backendRefs, answers 500).
		rules = []gwv1.HTTPRouteRule{{}}
	}
	e.specRules = len(rules)
	for i := range rules {
		rule := &rules[i]
		var b ruleBuild
		addMatches(&b, rule.Matches, httpMatch)
		if b.drop != "" {
			rb.add(i, deref(rule.Name), &b, snapshot.RouteRule{})
			continue
		}
		out := snapshot.RouteRule{Filters: rb.filters(&b, "", httpFilters(rule.Filters))}
		if out.Redirect != nil && len(rule.BackendRefs) > 0 {
			b.badf("a RequestRedirect filter cannot be combined with backendRefs")
		}
		for j, br := range rule.BackendRefs {
			out.Backends = append(out.Backends, rb.weighted(&b, j, br.BackendRef, httpFilters(br.Filters)))
		}
		// The API forbids RequestRedirect and URLRewrite on the same rule,
		// which a backendRef's redirect beside the rule's rewrite is; the
		// CRD checks each filter list alone. Redirecting there would skip
		// the rewrite.
		if out.Rewrite != nil && slices.ContainsFunc(out.Backends, func(wb snapshot.WeightedBackend) bool { return wb.Filters.Redirect != nil }) {
			b.incompatible = true
			b.badf("a URLRewrite filter on the rule cannot be combined with a RequestRedirect filter on a backendRef")
		}
		out.Timeouts = timeouts(&b, rule.Timeouts)
		out.Retry = retry(&b, rule.Retry)
		//lint:ignore SA1019 deprecated in v1.7 (GEP-4894) but still served; routes that set it are honoured
		out.SessionPersistence = rb.sessionPersistence(&b, i, rule.SessionPersistence, &out)
		rb.add(i, deref(rule.Name), &b, out)
	}
	if len(r.Spec.Rules) == 0 {
		// Say what the app team wrote, not the rule the CRD defaulted.
		e.idle = []string{"the route has no rules, and the rule the CRD gives it (matching every request) has no backendRefs, so every request gets " + e.failAnswer()}
	}
	return e
}

func (t *translator) evalGRPCRoute(r *gwv1.GRPCRoute) *routeEval {
	e := newRouteEval(snapshot.KindGRPCRoute, r.ObjectMeta, r.Spec.ParentRefs)
	rb := &routeBuilder{t: t, e: e, kind: snapshot.KindGRPCRoute}
	e.invalid = specProblem(r.Spec.ParentRefs, r.Spec.Hostnames, r.Spec.Rules, func(r *gwv1.GRPCRouteRule) (*gwv1.SectionName, int) { return r.Name, len(r.Matches) })
	e.specRules = len(r.Spec.Rules)
	if e.specRules == 0 {
		// The CRD gives a GRPCRoute no default rule.
		e.idle = []string{"the route has no rules, so no call matches it: every call gets UNIMPLEMENTED"}
	}
	for i := range r.Spec.Rules {
		rule := &r.Spec.Rules[i]
		var b ruleBuild
		addMatches(&b, rule.Matches, grpcMatch)
		if b.drop != "" {
			rb.add(i, deref(rule.Name), &b, snapshot.RouteRule{})
			continue
		}
		out := snapshot.RouteRule{Filters: rb.filters(&b, "", grpcFilters(rule.Filters))}
		for j, br := range rule.BackendRefs {
			out.Backends = append(out.Backends, rb.weighted(&b, j, br.BackendRef, grpcFilters(br.Filters)))
		}
		//lint:ignore SA1019 deprecated in v1.7 (GEP-4894) but still served; routes that set it are honoured
		out.SessionPersistence = rb.sessionPersistence(&b, i, rule.SessionPersistence, &out)
		rb.add(i, deref(rule.Name), &b, out)
	}
	return e
}

// specProblem is what the CRD would refuse in a route's spec as a whole
// (a cluster's CRD may be of another version), or "": parentRefs parentRefsProblem
// refuses, more than 16 hostnames or one that is no Hostname, more than
// 16 rules or 128 matches in all, a rule name that is no SectionName or
// that repeats. What it would refuse within a rule leaves out or fails
// that rule only.
func specProblem[R any](parents []gwv1.ParentReference, hostnames []gwv1.Hostname, rules []R, shape func(*R) (name *gwv1.SectionName, matches int)) string {
	if p := parentRefsProblem(parents); p != "" {
		return p
	}
	if len(hostnames) > 16 {
		return fmt.Sprintf("%d hostnames, more than 16", len(hostnames))
	}
	for _, h := range hostnames {
		if len(h) > 253 || !validPreciseHostname(strings.TrimPrefix(string(h), "*.")) {
			return fmt.Sprintf("hostname %q is not a DNS name, optionally led by \"*.\"", h)
		}
	}
	if len(rules) > 16 {
		return fmt.Sprintf("%d rules, more than 16", len(rules))
	}
	matches, names := 0, map[gwv1.SectionName]bool{}
	for i := range rules {
		name, n := shape(&rules[i])
		matches += n
		switch {
		case name == nil:
		case !validPreciseHostname(string(*name)):
			return fmt.Sprintf("rules[%d].name %q is not a section name (lower-case DNS labels)", i, *name)
		case names[*name]:
			return fmt.Sprintf("rules[%d].name %q is not unique within the route", i, *name)
		default:
			names[*name] = true
		}
	}
	if matches > 128 {
		return fmt.Sprintf("%d matches in all rules, more than 128", matches)
	}
	return ""
}

// parentRefsProblem applies the CRD's rules (experimental channel, which
// sockmesh installs) to parentRefs: at most 32, ports 1-65535, and those
// naming one parent more than once must all give a sectionName or none,
// all a port or none, and no two the same pair.
func parentRefsProblem(ps []gwv1.ParentReference) string {
	if len(ps) > maxRouteParents {
		return fmt.Sprintf("%d parentRefs, more than %d", len(ps), maxRouteParents)
	}
	for i, p := range ps {
		if p.Port != nil && !validPort(*p.Port) {
			return fmt.Sprintf("parentRefs[%d].port %d is not 1-65535", i, *p.Port)
		}
	}
	type parent struct{ group, kind, namespace, name string }
	type selector struct {
		section string
		port    gwv1.PortNumber
	}
	seen := map[parent][]selector{}
	for i, p := range ps {
		k := parent{gwv1.GroupName, "Gateway", deref(p.Namespace), string(p.Name)} // the CRD's defaults
		if p.Group != nil {
			k.group = string(*p.Group)
		}
		if p.Kind != nil {
			k.kind = string(*p.Kind)
		}
		s := selector{section: deref(p.SectionName)}
		if p.Port != nil {
			s.port = *p.Port
		}
		for _, o := range seen[k] {
			switch {
			case (o.section == "") != (s.section == "") || (o.port == 0) != (s.port == 0):
				return fmt.Sprintf("parentRefs[%d]: references to one parent must all give a sectionName or none, and all a port or none", i)
			case o == s:
				return fmt.Sprintf("parentRefs[%d] repeats an earlier reference: sectionName or port must tell them apart", i)
			}
		}
		seen[k] = append(seen[k], s)
	}
	return ""
}

// weighted converts backendRef j of a rule. A reference that does not
// resolve stays, Invalid, so its share of requests gets 500; its filters
// are still checked, since a bad filter makes the whole rule fail, as one
// the CRD refuses (backendRefSpecProblem) does.
func (rb *routeBuilder) weighted(b *ruleBuild, j int, ref gwv1.BackendRef, fs []filterIn) snapshot.WeightedBackend {
	wb := snapshot.WeightedBackend{Weight: 1}
	if len(fs) > 0 {
		wb.Filters = rb.filters(b, fmt.Sprintf("backendRefs[%d].", j), fs)
	}
	if ref.Weight != nil {
		if *ref.Weight < 0 || *ref.Weight > 1000000 {
			b.badf("backendRefs[%d].weight %d is not 0-1000000", j, *ref.Weight)
		} else {
			wb.Weight = uint32(*ref.Weight)
		}
	}
	if why := rb.backendRefSpecProblem(ref.BackendObjectReference); why != "" {
		b.badf("backendRefs[%d]: %s", j, why)
		return wb
	}
	r, p := rb.resolveBackend(ref.BackendObjectReference, false)
	if p == nil {
		p = r.configProblem()
		rb.use(b, r)
		wb.Backend = r.backend.Ref
	} else {
		wb.Invalid = &snapshot.Invalid{Policy: rb.e.ref, Reason: p.reason, Message: p.message}
	}
	if p != nil {
		rb.e.refProblems = append(rb.e.refProblems, *p)
	}
	return wb
}

// mirror converts a RequestMirror filter; ok is false when its backendRef
// does not resolve (the mirror is then dropped, as the API asks).
func (rb *routeBuilder) mirror(b *ruleBuild, at string, f *gwv1.HTTPRequestMirrorFilter) (snapshot.Mirror, bool) {
	m := snapshot.Mirror{Numerator: 100, Denominator: 100}
	switch {
	case f.Percent != nil && f.Fraction != nil:
		b.badf("%s: only one of percent and fraction may be set", at)
	case f.Percent != nil:
		if *f.Percent < 0 || *f.Percent > 100 {
			b.badf("%s.percent %d is not 0-100", at, *f.Percent)
		} else {
			m.Numerator = uint32(*f.Percent)
		}
	case f.Fraction != nil:
		den := int32(100)
		if f.Fraction.Denominator != nil {
			den = *f.Fraction.Denominator
		}
		if num := f.Fraction.Numerator; num < 0 || den < 1 || num > den {
			b.badf("%s.fraction %d/%d is not a fraction from 0 to 1", at, num, den)
		} else {
			m.Numerator, m.Denominator = uint32(num), uint32(den)
		}
	}
	ref, ok := rb.filterBackend(b, "mirror", "the mirror is dropped", f.BackendRef, false)
	m.Backend = ref
	return m, ok
}

// filterBackend resolves the backendRef of a filter (what: "mirror"),
// reporting its problems in ResolvedRefs; unresolved says what then
// becomes of the filter; grpc says the filter sends gRPC to it.
func (rb *routeBuilder) filterBackend(b *ruleBuild, what, unresolved string, ref gwv1.BackendObjectReference, grpc bool) (snapshot.BackendRef, bool) {
	if why := rb.backendRefSpecProblem(ref); why != "" {
		b.badf("%s backendRef: %s", what, why)
		return snapshot.BackendRef{}, false
	}
	r, p := rb.resolveBackend(ref, grpc)
	if p != nil {
		p.message = what + " " + p.message + "; " + unresolved
		rb.e.refProblems = append(rb.e.refProblems, *p)
		return snapshot.BackendRef{}, false
	}
	if p := r.configProblem(); p != nil {
		p.message = what + " " + p.message
		rb.e.refProblems = append(rb.e.refProblems, *p)
	}
	rb.use(b, r)
	return r.backend.Ref, true
}

// use records a resolved backend for the snapshot, and its XBackend for
// the rule. A rule that ends up Invalid leaves backends behind that
// nothing routes to; snapshotParts lists only the backends routes name.
func (rb *routeBuilder) use(b *ruleBuild, r resolved) {
	if _, ok := rb.t.backends[r.backend.Ref]; !ok {
		be := r.backend
		rb.t.backends[be.Ref] = &be
	}
	if r.xbackend != nil {
		b.xbackends = append(b.xbackends, r.xbackend)
	}
}

// sessionPersistence converts rule i's route-inline sessionPersistence.
// GEP-1619: a route asking for it toward a Service with sessionAffinity
// ClientIP must be rejected, the two being incompatible.
func (rb *routeBuilder) sessionPersistence(b *ruleBuild, i int, sp *gwv1.SessionPersistence, rule *snapshot.RouteRule) *snapshot.SessionPersistence {
	owner := rb.e.ref
	owner.Name = fmt.Sprintf("%s/rule-%d", owner.Name, i)
	out, msg := sessionPersistence(sp, owner)
	if msg != "" {
		b.badf("%s", msg)
	}
	if out == nil {
		return nil
	}
	for _, wb := range rule.Backends {
		if wb.Invalid != nil || wb.Backend.Kind != snapshot.KindService {
			continue
		}
		svc := rb.t.byService[types.NamespacedName{Namespace: wb.Backend.Namespace, Name: wb.Backend.Name}]
		if svc != nil && svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			b.badf("sessionPersistence cannot be combined with Service %s/%s's sessionAffinity ClientIP (GEP-1619)", svc.Namespace, svc.Name)
		}
	}
	return out
}

// add finishes rule i: left out when its matches are invalid, answering
// 500 when something else in it is, routing otherwise.
func (rb *routeBuilder) add(i int, name string, b *ruleBuild, out snapshot.RouteRule) {
	e := rb.e
	label := ruleLabel(i, name)
	if b.drop != "" {
		e.dropped = append(e.dropped, fmt.Sprintf("%s: %s", label, b.drop))
		return
	}
	if len(out.Backends) > 16 {
		b.badf("%d backendRefs, more than 16", len(out.Backends))
	}
	onePrefix := len(b.matches) == 1 && b.matches[0].m.Path.Type == snapshot.PathPrefix
	if !onePrefix && (prefixReplaced(&out.Filters) ||
		slices.ContainsFunc(out.Backends, func(wb snapshot.WeightedBackend) bool { return prefixReplaced(&wb.Filters) })) {
		b.badf("ReplacePrefixMatch needs the rule to have exactly one match, of type PathPrefix")
	}
	if len(b.bad) > 0 {
		reason := gwv1.RouteReasonUnsupportedValue
		if b.incompatible {
			reason, e.incompatible = gwv1.RouteReasonIncompatibleFilters, true
		}
		msg := strings.Join(b.bad, "; ")
		e.failing = append(e.failing, fmt.Sprintf("%s: %s", label, msg))
		out = snapshot.RouteRule{Invalid: &snapshot.Invalid{Policy: e.ref, Reason: string(reason), Message: msg}}
	} else {
		if out.Redirect == nil && !slices.ContainsFunc(out.Backends, func(wb snapshot.WeightedBackend) bool { return wb.Weight > 0 }) {
			why := "has no backendRefs"
			if len(out.Backends) > 0 {
				why = "gives every backendRef weight 0"
			}
			e.idle = append(e.idle, fmt.Sprintf("%s %s, so requests it matches get %s", label, why, e.failAnswer()))
		}
		for _, xb := range b.xbackends {
			if !slices.Contains(e.xbackends, xb) {
				e.xbackends = append(e.xbackends, xb)
			}
		}
	}
	out.Route, out.Index, out.Name = e.ref, i, name
	idx := len(e.rules)
	e.rules = append(e.rules, out)
	for _, m := range b.matches {
		m.m.Rule = idx
		e.matches = append(e.matches, m)
	}
}

// ruleLabel names rule i of a route in messages.
func ruleLabel(i int, name string) string {
	if name != "" {
		return fmt.Sprintf("rule %d (%s)", i, name)
	}
	return fmt.Sprintf("rule %d", i)
}
