package balance

import (
	"math"
	"net/netip"
	"slices"
	"time"
)

// Tried holds the endpoints a connection's or request's tries went to, or
// failed to connect to: its next try goes to another while there is one
// (Picker.Untried). Ejection (Health) keeps out only an endpoint whose
// failed connect counted — not one whose connect began before another
// connect to it succeeded, nor one this node failed (out of ports or
// descriptors), nor one that answered a status a rule retries — and the
// Picker's next turn, or a pinned client's, may be any of them.
type Tried []netip.AddrPort

// Add records that a try went to ep, once.
func (t *Tried) Add(ep netip.AddrPort) {
	if !slices.Contains(*t, ep) {
		*t = append(*t, ep)
	}
}

// Untried returns the endpoint pick (one of p's picks) hands out that is
// not in t: pick is asked once per endpoint of p at most, and each answer
// passed over hands back a probe it took (Unused). When pick hands out
// only tried ones — all were, or the rest are ejected or in a tier after
// one that takes — its last answer serves; nil when pick hands out none.
func (p *Picker) Untried(t Tried, pick func() *Choice) *Choice {
	n := pick()
	for i := 1; i < p.Len() && n != nil && slices.Contains(t, n.Endpoint.Addr); i++ {
		p.Unused(n)
		n = pick()
	}
	return n
}

// FailoverClient is the endpoint for client's next try after its tries to
// those in t failed to connect: one not in t while there is one (Untried
// over Pick's turns), to which client is then pinned under p's Affinity,
// as PickClient pins it — its last connection went there. PickClient
// would hand out the pinned endpoint again for as long as it is not
// ejected.
func (p *Picker) FailoverClient(client ClientKey, t Tried) *Choice {
	c := p.Untried(t, p.Pick)
	if c != nil && p.affinity != nil && client != (ClientKey{}) {
		p.affinity.set(client, c.Endpoint.Addr, time.Now())
	}
	return c
}

// FewestUntried is PickFewest for a try after those to the endpoints in t
// failed to connect: an endpoint in t counts as carrying more load than
// any other, so that one not in t takes the try while its tier has one
// (and, every endpoint ejected, Pick's turns go past those in t: Untried).
func (p *Picker) FewestUntried(load func(netip.AddrPort) int, t Tried) *Choice {
	untried := func(ep netip.AddrPort) int {
		if slices.Contains(t, ep) {
			return math.MaxInt
		}
		return load(ep)
	}
	return p.Untried(t, func() *Choice { return p.PickFewest(untried) })
}
