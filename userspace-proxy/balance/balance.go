package balance

import (
	"encoding/hex"
	"hash/fnv"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// Choice is an endpoint a Picker hands out, or keeps sessions on, with what
// requests to it need, computed once.
type Choice struct {
	Endpoint snapshot.Endpoint
	// Host is Endpoint.Addr as "ip:port" (IPv6 in brackets), the URL host
	// the pools key connections by.
	Host  string
	token string
	// probe numbers the probe of Endpoint the pick took (Health.admit), 0
	// if none. The Picker's Choices hold none: a pick that takes one gets
	// a copy, its own, so that a hand-back names the probe, not the
	// endpoint, and costs nothing while no endpoint is ejected.
	probe uint64
}

// Probing reports whether c, picked, holds its endpoint's probe (Health):
// only then is there a probe to hand back (Health.Reused, Canceled,
// FailedHere).
func (c *Choice) Probing() bool { return c.probe != 0 }

// Picker chooses among a backend's ready endpoints.
type Picker struct {
	// ready holds the endpoints handed out; tiers split it: the preferred
	// ones, then the fallback ones level by level
	// (snapshot.Endpoint.Fallback), each tier picked only while every
	// endpoint of those before it is ejected.
	ready []Choice
	tiers [][]Choice
	// draining holds the endpoints serving while they terminate when
	// ready has others: they take no new session, request or connection,
	// but keep the sessions they hold (session), whose state may live
	// there, for the pod's grace period.
	draining []Choice
	// next[i] takes the turns in tiers[i]: one counter would hand a
	// fallback endpoint the same turn every time when the preferred ones'
	// steps are a multiple of their number.
	next []atomic.Uint32
	// panicked takes the turns over ready when every endpoint is passed
	// over (Pick).
	panicked atomic.Uint32
	health   *Health
	affinity *Affinity
	// mcp says the backend speaks MCP, whose session IDs pin requests
	// (PickRequest, MCPSession).
	mcp bool
}

// New returns a Picker over b's ready endpoints, or, when none is ready,
// over those still serving while they terminate (as kube-proxy does, KEP
// 1669: a rollout that replaces a Service's only pod keeps its clients),
// passing over those h has ejected, and pinning clients under a (see
// PickClient); h and a may be nil. Ready endpoints marked Fallback take
// connections only while every one of a lower level is ejected, or when
// none of a lower level is ready. Beside ready ones, those serving while
// they terminate keep only their sessions (session).
func New(b *snapshot.Backend, h *Health, a *Affinity) *Picker {
	p := &Picker{health: h, affinity: a, mcp: b.Protocol == snapshot.ProtocolMCP}
	var ends []int // of the tiers in ready, sliced once ready is whole
	// add appends the endpoints that take as a tier (none if none does).
	add := func(take func(snapshot.Endpoint) bool) {
		from := len(p.ready)
		p.ready = append(p.ready, choices(b.Endpoints, take)...)
		if len(p.ready) > from {
			ends = append(ends, len(p.ready))
		}
	}
	for _, level := range []snapshot.FallbackLevel{0, snapshot.FallbackZone, snapshot.FallbackFar} {
		add(func(ep snapshot.Endpoint) bool { return ep.Ready && ep.Fallback == level })
	}
	if len(p.ready) == 0 {
		add(draining)
	} else {
		p.draining = choices(b.Endpoints, draining)
	}
	from := 0
	for _, end := range ends {
		p.tiers = append(p.tiers, p.ready[from:end])
		from = end
	}
	p.next = make([]atomic.Uint32, len(p.tiers))
	return p
}

// draining reports whether ep serves while it terminates (Ready is false
// then, but for a Service that publishes not-ready addresses).
func draining(ep snapshot.Endpoint) bool { return !ep.Ready && ep.Serving && ep.Terminating }

// choices returns the Choices of the endpoints of eps that take.
func choices(eps []snapshot.Endpoint, take func(snapshot.Endpoint) bool) []Choice {
	var cs []Choice
	for _, ep := range eps {
		if take(ep) {
			cs = append(cs, Choice{Endpoint: ep, Host: ep.Addr.String(), token: token(ep)})
		}
	}
	return cs
}

// Len is the number of endpoints handed out, fallback ones included.
func (p *Picker) Len() int { return len(p.ready) }

// Tries is how many endpoints a request whose connect to first fails may
// try in all, first included: three at most, of those p hands out and
// first, which may be a terminating endpoint its session kept (session).
// Counted among the others alone, a session on a terminating pod that
// refused, beside one ready endpoint, tried nothing else.
func (p *Picker) Tries(first *Choice) int {
	n := len(p.ready)
	for i := range p.draining {
		if &p.draining[i] == first {
			n++
		}
	}
	return min(n, 3)
}

// Addrs returns the endpoints p hands out, fallback ones included.
func (p *Picker) Addrs() []netip.AddrPort {
	a := make([]netip.AddrPort, len(p.ready))
	for i := range p.ready {
		a[i] = p.ready[i].Endpoint.Addr
	}
	return a
}

// Standby returns the endpoints of p's tiers after the first one with an
// endpoint that may take connections at now (is not ejected): they take
// none then. It is nil when every endpoint is ejected, or the last tier is
// the first that may. untried is set when each endpoint of that tier that
// may is only due a probe, its ejection over: whether it serves again,
// only a connect will tell.
func (p *Picker) Standby(now time.Time) (standby []netip.AddrPort, untried bool) {
	for i := range max(len(p.tiers)-1, 0) {
		if takes, untried := p.takes(p.tiers[i], now); takes {
			for _, t := range p.tiers[i+1:] {
				for j := range t {
					standby = append(standby, t[j].Endpoint.Addr)
				}
			}
			return standby, untried
		}
	}
	return nil, false
}

// takes reports whether an endpoint of tier may take connections at now
// and, if so, whether each that may is only due a probe (Standby).
func (p *Picker) takes(tier []Choice, now time.Time) (takes, untried bool) {
	if !p.health.Any() {
		return true, false
	}
	untried = true
	for i := range tier {
		if ok, probe := p.health.state(tier[i].Endpoint.Addr, now); ok {
			takes, untried = true, untried && probe
		}
	}
	return takes, takes && untried
}

// nearerTakes reports whether an endpoint of a tier before the one of
// p.ready[i] may take connections at now.
func (p *Picker) nearerTakes(i int, now time.Time) bool {
	for _, tier := range p.tiers {
		if i < len(tier) {
			return false
		}
		if takes, _ := p.takes(tier, now); takes {
			return true
		}
		i -= len(tier)
	}
	return false
}

// Pick returns the next preferred endpoint not passed over, else the next
// fallback one not passed over, level by level, or nil when there is none
// ready; when all are passed over, the next of them all, every tier's. The
// result is shared (unless it holds a probe): callers must not modify it.
//
// With every endpoint passed over, Pick ignores health and tiers alike, as
// Envoy does when every priority level is in panic: it balances over the
// hosts of all levels, healthy or not, each level's share its number of
// hosts. Requests then find out for themselves which endpoint serves
// again, and the first that reaches one ends its ejection; kept to the
// preferred tier, they met only the endpoints of a zone that may be the
// one down, while another zone's, ejected in the same outage, served
// again unseen until their ejections ran out.
//
// An endpoint is passed over while it is ejected, and also once its
// ejection is over while another pick's probe of it is out (Health): its
// tier's others take its turns and, when none of them takes, the next
// tier does, until a connect settles the probe — one connect, or a probe
// handed back at once when it connects nothing. Envoy lets a host whose
// ejection ended take its full share at once; sent beside the probe, a
// tier's picks would all meet a pod that may still be gone, each paying a
// whole connect timeout (the stampede the single probe is for), and Pick
// cannot wait for the probe's outcome: it must not block, and the probe
// may take a whole connect timeout. The next tier had the picks for the whole ejection; it
// keeps them for the probe's connect more. Pinned clients and sessions
// ride along the probe instead (PickClient, session): moving them costs
// them their endpoint.
func (p *Picker) Pick() *Choice {
	if len(p.tiers) == 0 {
		return nil
	}
	first := p.tiers[0]
	n := uint32(len(first))
	c := &first[p.next[0].Add(1)%n]
	if !p.health.Any() {
		return c
	}
	now := time.Now()
	if a := p.admit(c, now); a != nil {
		return a
	}
	// Each step takes its own turn, so that the endpoints after an
	// ejected one share its requests rather than the next taking them all.
	for i, tier := range p.tiers {
		steps := len(tier)
		if i == 0 {
			steps-- // the first step was taken above
		}
		for range steps {
			if a := p.admit(&tier[p.next[i].Add(1)%uint32(len(tier))], now); a != nil {
				return a
			}
		}
		// Concurrent picks take turns between these, so that two of them
		// may have met one ejected endpoint and missed one that takes:
		// under load, one pick in ten went to an ejected endpoint, or to
		// another zone's, beside a healthy one. Ask each once before
		// passing on.
		if a := p.anyOf(tier, now); a != nil {
			return a
		}
	}
	return &p.ready[p.panicked.Add(1)%uint32(len(p.ready))]
}

// admit returns c when its endpoint may take a connection at now — a
// copy of it that names the probe when it is handed out as one
// (Health.admit) — else nil.
func (p *Picker) admit(c *Choice, now time.Time) *Choice {
	if !p.health.Any() {
		return c
	}
	ok, probe := p.health.admit(c.Endpoint.Addr, now)
	switch {
	case !ok:
		return nil
	case probe != 0:
		held := *c
		held.probe = probe
		return &held
	}
	return c
}

// anyOf returns the first endpoint of tier that may take a connection at
// now, as admit does; nil when none may.
func (p *Picker) anyOf(tier []Choice, now time.Time) *Choice {
	for j := range tier {
		if a := p.admit(&tier[j], now); a != nil {
			return a
		}
	}
	return nil
}

// Unused records that c, picked, took no connection: its request ended
// before it connected (its app left while the proxy read the body it
// keeps). A probe c took is handed back (Health.Canceled): held, it left
// c passed over for probeWait.
func (p *Picker) Unused(c *Choice) { p.health.Canceled(c) }

// PickFewest returns the ready endpoint, not ejected, that carries the
// fewest of the caller's connections (load), taking turns among equals,
// from the preferred ones, else from the fallback ones, level by level;
// when every ready endpoint is ejected, Pick's. It is for connections that
// live long and carry many requests each (relayed HTTP/2): round robin
// over their connects leaves them uneven once endpoints come and go.
func (p *Picker) PickFewest(load func(netip.AddrPort) int) *Choice {
	if len(p.tiers) == 0 {
		return nil
	}
	now := time.Now()
	start := p.next[0].Add(1)
	for _, tier := range p.tiers {
		best := p.fewest(tier, start, load, now)
		if best == nil {
			continue
		}
		if a := p.admit(best, now); a != nil {
			return a
		}
		// A concurrent pick took best's probe between the look and the
		// admit: another endpoint of the tier, not the next tier's (another
		// zone's beside a healthy preferred one).
		if a := p.anyOf(tier, now); a != nil {
			return a
		}
	}
	return p.Pick()
}

// fewest returns the endpoint of tier, not passed over at now, that
// carries the least load, the first from start among equals; nil when
// every one is passed over.
func (p *Picker) fewest(tier []Choice, start uint32, load func(netip.AddrPort) int, now time.Time) *Choice {
	var best *Choice
	least := 0
	for i := range uint32(len(tier)) {
		c := &tier[(start+i)%uint32(len(tier))]
		if p.health.Any() && p.health.passedOver(c.Endpoint.Addr, now) {
			continue
		}
		if l := load(c.Endpoint.Addr); best == nil || l < least {
			best, least = c, l
		}
	}
	return best
}

// ejected reports whether c is ejected at now while another ready endpoint
// (a fallback one too) is not passed over: a session pinned to c then
// moves. A probe of c out does not move it (Health.ejected).
func (p *Picker) ejected(c *Choice, now time.Time) bool {
	if !p.health.Any() || !p.health.ejected(c.Endpoint.Addr, now) {
		return false
	}
	for i := range p.ready {
		if !p.health.passedOver(p.ready[i].Endpoint.Addr, now) {
			return true
		}
	}
	return false
}

// PickRequest returns the endpoint for r, from client, at time now under
// session persistence sp — the backend's own
// (snapshot.Backend.SessionPersistence) or the one a route rule sets in its
// place: the one r's session names when that endpoint still serves (ready,
// or terminating: session), is not ejected (Health) and the session has
// not timed out; otherwise the next one (nil when none is ready). Without
// sp, PickClient's. pinned is true when r's session chose c: the
// request's retries go there too. Only a
// connect to c that fails (nothing reached it) moves it, as it moves any
// other request, and its session then starts on the endpoint that answers.
// setSession is true when the response must carry the session
// (SetSession): a new one. A live session's cookie or header is not sent
// again: it holds nothing that changes while the session lasts.
//
// An MCP session (MCPEndpoint) pins a request before this is asked, sp or
// not: the session's state lives in the server that issued it, and sp's
// cookie or header stays as it is.
func (p *Picker) PickRequest(r *http.Request, client ClientKey, now time.Time, sp *snapshot.SessionPersistence) (c *Choice, pinned, setSession bool) {
	if sp == nil {
		return p.PickClient(client), false, false
	}
	if s, ok := parseSession(sessionOf(r, sp)); ok && !expired(sp, s, now) {
		if c := p.session(s.endpoint, now); c != nil {
			return c, true, false
		}
	}
	c = p.Pick()
	return c, false, c != nil
}

// session returns the endpoint a session names by its token while it
// serves — handed out, or draining beside ready ones — and is not
// ejected, else nil. Its state may live in that pod, and GEP-1619 persists
// a session for as long as its endpoint serves: unlike a ClientIP pin
// (PickClient, which leaves a terminating pod as kube-proxy's does), a
// session stays on a fallback endpoint once a nearer one serves again,
// and on a pod that terminates, through its grace period (a rolling
// update would otherwise end every session of the old pods at once); it
// ends at its absolute timeout.
func (p *Picker) session(tok string, now time.Time) *Choice {
	for _, cs := range [...][]Choice{p.ready, p.draining} {
		for i := range cs {
			if c := &cs[i]; c.token == tok && !p.ejected(c, now) {
				return c
			}
		}
	}
	return nil
}

// mcpSessionHeader is the header of MCP's streamable HTTP transport that carries
// the session ID a server assigns: the client sends it back on every later
// request (POST, the GET of an SSE stream, the DELETE that ends it), and a
// server that does not know it answers 404.
const mcpSessionHeader = "Mcp-Session-Id"

// MCPSession prefixes the MCP session ID in h, the header of an answer of
// any status from c's endpoint, with mcpPrefix and a dot, so that the
// requests that send it back go to c (CutMCPSession, MCPEndpoint) — with
// no state in the proxy, so that a restart keeps sessions where they are.
// MCP allows the dot (session IDs are visible ASCII); a hex prefix never
// holds one. For other backends it does nothing.
func (p *Picker) MCPSession(h http.Header, c *Choice) {
	if !p.mcp {
		return
	}
	if v := h.Get(mcpSessionHeader); v != "" {
		h.Set(mcpSessionHeader, MCPSessionID(v, c))
	}
}

// MCPSessionID is id, an MCP session ID c's endpoint issued, as
// MCPSession passes it on: prefixed with mcpPrefix and a dot. It is for
// callers that hold the field's value rather than a header, and know the
// backend speaks MCP.
func MCPSessionID(id string, c *Choice) string { return mcpPrefix(c.token, id) + "." + id }

// mcpPrefixLen is the length of mcpPrefix: a token and an FNV-32a sum in
// hex.
const mcpPrefixLen = tokenLen + 8

// mcpPrefix is what MCPSession puts before the ID id that the endpoint of
// token tok issued: tok, then a sum of tok and id. The sum tells a prefix
// a proxy added from an ID that only looks like one (a session begun
// before, an ID the client or another proxy made), which must reach the
// backend as it is. It is not signed, as a session cookie's token is not:
// a client that forges one only chooses the replica its own requests go
// to, and the backend still judges the ID.
func mcpPrefix(tok, id string) string {
	h := fnv.New32a()
	h.Write([]byte(tok))
	h.Write([]byte(id))
	return tok + hex.EncodeToString(h.Sum(nil))
}

// CutMCPSession strips the prefix MCPSession added from the MCP session ID
// in h, the header of a request, so that route matches and the backend
// see the ID the backend issued, and returns the token of the endpoint it
// names (MCPEndpoint); "" for an ID without one (a session begun before,
// one the client or another proxy made, whatever it looks like), which
// stays as it is. The endpoint being gone, the backend gets its own ID
// back all the same: its 404 then has the client start a new session, as
// MCP says, and a server that shares sessions between replicas serves it.
func CutMCPSession(h http.Header) string {
	id, tok := CutMCPSessionID(h.Get(mcpSessionHeader))
	if tok != "" {
		h.Set(mcpSessionHeader, id)
	}
	return tok
}

// CutMCPSessionID is CutMCPSession on v, the value of a request's
// Mcp-Session-Id: the ID the backend issued and the token of the endpoint
// that issued it, or v and "" when v carries no prefix MCPSession added.
func CutMCPSessionID(v string) (id, tok string) {
	pre, id, ok := strings.Cut(v, ".")
	if !ok || len(pre) != mcpPrefixLen || mcpPrefix(pre[:tokenLen], id) != pre {
		return v, ""
	}
	return id, pre[:tokenLen]
}

// MCPEndpoint returns the endpoint of an MCP backend that tok
// (CutMCPSession) names while a session would stay there (session); nil
// otherwise, and for other backends.
func (p *Picker) MCPEndpoint(tok string, now time.Time) *Choice {
	if !p.mcp || tok == "" {
		return nil
	}
	if now.IsZero() && p.health.Any() {
		now = time.Now() // ejected reads it; callers pass it for sessions' timeouts only
	}
	return p.session(tok, now)
}

// SetSession adds to h what tells the client its session under sp (as
// given to PickRequest) is pinned to c; r is the request, whose session
// (if still valid for c) keeps its start.
func (p *Picker) SetSession(h http.Header, r *http.Request, c *Choice, now time.Time, sp *snapshot.SessionPersistence) {
	start := now.Unix()
	if s, ok := parseSession(sessionOf(r, sp)); ok && s.endpoint == c.token && !expired(sp, s, now) {
		start = s.start
	}
	v := c.token
	if sp.AbsoluteTimeoutSeconds > 0 {
		v += "." + strconv.FormatInt(start, 10)
	}
	switch sp.Type {
	case snapshot.SessionHeader:
		h.Set(sp.Name, v)
	default: // Cookie is the Gateway API default type
		ck := &http.Cookie{Name: sp.Name, Value: v, Path: sp.CookiePath, HttpOnly: true}
		if ck.Path == "" {
			ck.Path = "/"
		}
		if sp.Permanent && sp.AbsoluteTimeoutSeconds > 0 {
			ck.MaxAge = int(max(1, start+sp.AbsoluteTimeoutSeconds-now.Unix()))
		}
		h.Add("Set-Cookie", ck.String())
	}
}

// session is what a session cookie or header carries: the endpoint's token
// and, when the backend sets an absolute timeout, when the session started
// (Unix seconds): "token" or "token.start". The start is not signed: a
// client that forges it only prolongs its own affinity.
type session struct {
	endpoint string
	start    int64 // 0 when the backend sets no timeout
}

// parseSession reads a session value, also "token.start.last" as builds
// before 2026-11-29 wrote it for an idle timeout no Gateway API object can
// set: its last use is ignored, so those sessions keep their endpoint.
func parseSession(v string) (session, bool) {
	if v == "" {
		return session{}, false
	}
	tok, times, timed := strings.Cut(v, ".")
	if !timed {
		return session{endpoint: tok}, true
	}
	a, last, old := strings.Cut(times, ".")
	start, err := strconv.ParseInt(a, 10, 64)
	if err != nil {
		return session{}, false
	}
	if old {
		if _, err := strconv.ParseInt(last, 10, 64); err != nil {
			return session{}, false
		}
	}
	return session{endpoint: tok, start: start}, true
}

// expired applies the Gateway API's absoluteTimeout: the session ends
// AbsoluteTimeoutSeconds after it started. A session without a start
// predates the timeout (the backend had none): it starts over now that it
// has one.
func expired(sp *snapshot.SessionPersistence, s session, now time.Time) bool {
	return sp.AbsoluteTimeoutSeconds > 0 && (s.start == 0 || now.Unix()-s.start >= sp.AbsoluteTimeoutSeconds)
}

func sessionOf(r *http.Request, sp *snapshot.SessionPersistence) string {
	if sp.Type == snapshot.SessionHeader {
		return r.Header.Get(sp.Name)
	}
	c, err := r.Cookie(sp.Name)
	if err != nil {
		return ""
	}
	return c.Value
}

// tokenLen is the length of a token: an FNV-64a sum in hex.
const tokenLen = 16

// token names an endpoint by an unkeyed sum of its address, the same in
// every proxy, on every node and across restarts, with no state. It hides
// the address from no one who sums a pod range (a /16 takes
// milliseconds): pod addresses are no secret in a cluster.
func token(ep snapshot.Endpoint) string {
	h := fnv.New64a()
	h.Write(ep.Addr.Addr().AsSlice())
	h.Write([]byte(strconv.Itoa(int(ep.Addr.Port()))))
	return hex.EncodeToString(h.Sum(nil))
}
