package translate

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// shadowedRule is a rule that gets no request on ports: each of its
// matches repeats one of by's ("HTTPRoute namespace/name", or "its rule
// 0" for a rule of its own route), which take precedence.
type shadowedRule struct {
	index int // the rule's index in its route
	label string
	ports []int32
	by    []string
}

// markShadowed records, on the parents that attached each route to port k
// for role, the rules of set that get no request there: each of their
// matches repeats one ranked before it of another rule — of identical
// matches, the older route's, then the first by namespace/name, then the
// earlier rule's (the API's precedence) — and the proxy takes the first
// match that holds. Only identical matches are sure to shadow one
// another: one that covers another (a shorter prefix, a regular
// expression) is left alone. owners holds the route of each set rule.
func markShadowed(k portKey, role string, set snapshot.RouteSet, owners []*routeEval) {
	type tally struct {
		matches, repeated int
		by                []int // the set rules whose matches it repeats
	}
	rules := make([]tally, len(set.Rules))
	first := map[string]int{} // a match's identity → the set rule holding it first
	for _, m := range set.Matches {
		t := &rules[m.Rule]
		t.matches++
		id := matchIdentity(m)
		w, seen := first[id]
		switch {
		case !seen:
			first[id] = m.Rule
		case w != m.Rule:
			t.repeated++
			if !slices.Contains(t.by, w) {
				t.by = append(t.by, w)
			}
		}
	}
	for i, t := range rules {
		if t.matches == 0 || t.repeated < t.matches {
			continue
		}
		rule, e := set.Rules[i], owners[i]
		var by []string
		for _, w := range t.by {
			if owners[w] == e {
				by = append(by, "its "+ruleLabel(set.Rules[w].Index, set.Rules[w].Name))
			} else {
				by = append(by, fmt.Sprintf("%s %s/%s", owners[w].kind, owners[w].ref.Namespace, owners[w].ref.Name))
			}
		}
		for _, po := range e.parentsAt(k, role) {
			po.shadow(rule, k.port, by)
		}
	}
}

// shadow records that rule gets no request on port, as its matches repeat
// by's.
func (po *parentOutcome) shadow(rule snapshot.RouteRule, port int32, by []string) {
	j := slices.IndexFunc(po.shadowed, func(s shadowedRule) bool { return s.index == rule.Index })
	if j < 0 {
		po.shadowed = append(po.shadowed, shadowedRule{index: rule.Index, label: ruleLabel(rule.Index, rule.Name)})
		j = len(po.shadowed) - 1
	}
	s := &po.shadowed[j]
	s.ports = append(s.ports, port)
	for _, b := range by {
		if !slices.Contains(s.by, b) {
			s.by = append(s.by, b)
		}
	}
}

// matchIdentity spells out what a match asks of a request, the same for
// matches that ask the same however written: a PathPrefix's trailing "/"
// (which the proxy ignores), header names' case, the order of header and
// query param matches.
func matchIdentity(m snapshot.RouteMatch) string {
	path := m.Path.Value
	if m.Path.Type == snapshot.PathPrefix {
		path = strings.TrimRight(path, "/")
	}
	byName := func(a, b snapshot.StringMatch) int { return strings.Compare(a.Name, b.Name) }
	headers := slices.Clone(m.Headers)
	for i := range headers {
		headers[i].Name = strings.ToLower(headers[i].Name)
	}
	slices.SortFunc(headers, byName)
	queries := slices.SortedFunc(slices.Values(m.QueryParams), byName)
	return fmt.Sprintf("%s %q %q %q %q", m.Path.Type, path, m.Method, headers, queries)
}

// shadowedMessage is ConditionRulesShadowed's message for po.
func shadowedMessage(po *parentOutcome) string {
	slices.SortFunc(po.shadowed, func(a, b shadowedRule) int { return cmp.Compare(a.index, b.index) })
	var parts []string
	for _, s := range po.shadowed {
		slices.Sort(s.ports) // buildSet ran per port, in map order
		slices.Sort(s.by)
		parts = append(parts, fmt.Sprintf("%s on port(s) %s, repeating %s", s.label, portList(s.ports), strings.Join(s.by, " and ")))
	}
	return "rules that get no request, as each of their matches repeats one that takes precedence " +
		"(of identical matches, the older route's, then the first by namespace/name, then the earlier rule's): " + strings.Join(parts, "; ")
}
