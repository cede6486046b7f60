package translate

import (
	"cmp"
	"maps"
	"slices"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// routeTable builds a port's route table from the routes attached to it
// per role, each role's set by set.
func routeTable(roles map[string][]*routeEval, set func(role string, routes []*routeEval) snapshot.RouteSet) *snapshot.RouteTable {
	table := &snapshot.RouteTable{}
	for _, role := range slices.Sorted(maps.Keys(roles)) {
		s := set(role, roles[role])
		if role == "" {
			table.Producer = &s
		} else {
			table.Consumers = append(table.Consumers, snapshot.ConsumerRoutes{Namespace: role, Routes: s})
		}
	}
	return table
}

func comparePortKeys(a, b portKey) int {
	return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name), cmp.Compare(a.port, b.port))
}

// buildSet merges the routes of one role on one Service port. Routes of
// one kind govern it (governingKind); those of the other learn it in the
// status of their parentRefs to that port and role only. Matches are
// sorted by the API's precedence: the match's own (matchKey), then the
// older route, then namespace/name, then rule order, then match order.
func buildSet(k portKey, role string, routes []*routeEval) snapshot.RouteSet {
	kind := governingKind(routes)
	winners := slices.DeleteFunc(slices.Clone(routes), func(e *routeEval) bool { return e.kind != kind })
	for _, e := range routes {
		if e.kind == kind {
			continue
		}
		for _, po := range e.parentsAt(k, role) {
			if !slices.Contains(po.conflicted, k.port) {
				po.conflicted = append(po.conflicted, k.port)
				for _, w := range winners {
					if name := w.ref.Namespace + "/" + w.ref.Name; !slices.Contains(po.winners, name) {
						po.winners = append(po.winners, name)
					}
				}
			}
		}
	}
	slices.SortFunc(winners, func(a, b *routeEval) int {
		return cmp.Or(a.created.Time.Compare(b.created.Time), cmp.Compare(a.ref.Namespace, b.ref.Namespace), cmp.Compare(a.ref.Name, b.ref.Name))
	})
	type ranked struct {
		m           routeMatch
		route, rule int
	}
	set := snapshot.RouteSet{Kind: kind}
	var all []ranked
	var owners []*routeEval // the route of each of set.Rules
	for ri, e := range winners {
		offset := len(set.Rules)
		set.Rules = append(set.Rules, e.rules...)
		for range e.rules {
			owners = append(owners, e)
		}
		for _, m := range e.matches {
			m.m.Rule += offset
			all = append(all, ranked{m: m, route: ri, rule: e.rules[m.m.Rule-offset].Index})
		}
	}
	slices.SortStableFunc(all, func(a, b ranked) int {
		return cmp.Or(compareMatchKeys(a.m.key, b.m.key), cmp.Compare(a.route, b.route), cmp.Compare(a.rule, b.rule),
			cmp.Compare(a.m.key.position, b.m.key.position))
	})
	for _, r := range all {
		set.Matches = append(set.Matches, r.m.m)
	}
	markShadowed(k, role, set, owners)
	return set
}

// governingKind is the kind of route that governs a port for one role:
// GRPCRoute over HTTPRoute (GEP-1294), among the routes accepted there. A
// route that is not accepted (no rule of it can be honoured) takes no port
// from accepted routes of the other kind: GEP-1294 ignores rejected routes,
// and it would take every request there from routes that serve them only
// to fail them. Where none is accepted, GRPCRoutes still govern, and the
// failing rules answer (sockmesh never routes a rule without all it asks
// for), as each kind's do beside accepted routes of its own.
func governingKind(routes []*routeEval) snapshot.RouteKind {
	contenders := slices.DeleteFunc(slices.Clone(routes), func(e *routeEval) bool { return !e.accepted() })
	if len(contenders) == 0 {
		contenders = routes
	}
	if slices.ContainsFunc(contenders, func(e *routeEval) bool { return e.kind == snapshot.KindGRPCRoute }) {
		return snapshot.KindGRPCRoute
	}
	return snapshot.KindHTTPRoute
}
