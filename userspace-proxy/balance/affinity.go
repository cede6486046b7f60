package balance

import (
	"net/netip"
	"sync"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// Affinity is a backend's sessionAffinity ClientIP, as kube-proxy applies
// it: a client's connections and requests go to the endpoint its last one
// went to, while it sends one at least every timeout and that endpoint is
// still handed out (ready, not ejected). It outlives snapshots (Carry): a
// new snapshot must not move the clients. The proxy serves one node's
// pods, so it remembers few clients.
type Affinity struct {
	timeout time.Duration
	mu      sync.Mutex
	pinned  map[ClientKey]pin
	sweep   time.Time // when expired pins are next dropped
}

type pin struct {
	ep   netip.AddrPort
	last time.Time
}

// CarryAffinity returns prev when it keeps pins for seconds, a new
// Affinity when seconds changed, and nil when seconds is 0 (no affinity).
func CarryAffinity(prev *Affinity, seconds int32) *Affinity {
	if seconds <= 0 {
		return nil
	}
	d := time.Duration(seconds) * time.Second
	if prev != nil && prev.timeout == d {
		return prev
	}
	return &Affinity{timeout: d, pinned: make(map[ClientKey]pin)}
}

// PickClient is Pick for a connection or request of client under p's
// Affinity, if any: the endpoint client is pinned to while p hands it out,
// it is not ejected (a probe of it out, another's, does not move client:
// Health.ejected) and, if a fallback one, no endpoint of a tier before its
// own may take connections; else the next one, to which client is
// pinned from then on. kube-proxy applies affinity within the endpoints
// topology hints give the node, and the fallback ones are not among them
// once the zone's serve again: kept, a client pinned while its zone was
// down crossed zones for as long as it came back within the timeout
// (hours). When every endpoint is ejected, the client takes turns as Pick
// does: pinned, its connection tried only its own endpoint, again and
// again, while another had come back.
func (p *Picker) PickClient(client ClientKey) *Choice {
	a := p.affinity
	if a == nil || client == (ClientKey{}) {
		return p.Pick()
	}
	now := time.Now()
	if ep, ok := a.lookup(client, now); ok {
		for i := range p.ready {
			if c := &p.ready[i]; c.Endpoint.Addr == ep && !(p.health.Any() && p.health.ejected(ep, now)) && !p.nearerTakes(i, now) {
				a.set(client, ep, now)
				return c
			}
		}
	}
	c := p.Pick()
	if c != nil {
		a.set(client, c.Endpoint.Addr, now)
	}
	return c
}

func (a *Affinity) lookup(client ClientKey, now time.Time) (netip.AddrPort, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, ok := a.pinned[client]
	return p.ep, ok && now.Sub(p.last) < a.timeout
}

func (a *Affinity) set(client ClientKey, ep netip.AddrPort, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pinned[client] = pin{ep: ep, last: now}
	if now.After(a.sweep) {
		for c, p := range a.pinned {
			if now.Sub(p.last) >= a.timeout {
				delete(a.pinned, c)
			}
		}
		a.sweep = now.Add(time.Minute)
	}
}

// ClientKey is a client as the proxy tells clients apart: its pod when
// known — the listener's (in-pod mode, where every connection comes from
// loopback) or the one the snapshot gives the source address (node-IP
// mode) — else its address. A dual-stack pod is one client, pinned to
// one endpoint whichever family it connects over, as the pools count it
// (pool.Client); kube-proxy, keying by address, pins it twice.
type ClientKey struct {
	Pod  snapshot.ObjectRef
	Addr netip.Addr
}

// ClientOf returns the key of the client at addr: its pod as s names it
// (Snapshot.ClientPod, pod being the listener's), else addr.
func ClientOf(s *snapshot.Snapshot, addr netip.AddrPort, pod *snapshot.ObjectRef) ClientKey {
	if p := s.ClientPod(addr.Addr(), pod); p != nil {
		return ClientKey{Pod: *p}
	}
	return ClientKey{Addr: addr.Addr()}
}

func (k ClientKey) String() string {
	if k.Pod != (snapshot.ObjectRef{}) {
		return k.Pod.String()
	}
	return k.Addr.String()
}
