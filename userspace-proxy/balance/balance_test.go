package balance

import (
	"net/http"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

func TestPickOnlyReady(t *testing.T) {
	b := &snapshot.Backend{Endpoints: []snapshot.Endpoint{
		{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Ready: true},
		{Addr: netip.MustParseAddrPort("10.0.0.2:80"), Ready: false, Terminating: true},
		{Addr: netip.MustParseAddrPort("10.0.0.3:80"), Ready: true},
	}}
	p := New(b, nil, nil)
	seen := map[string]int{}
	for range 10 {
		seen[p.Pick().Host]++
	}
	if len(seen) != 2 || seen["10.0.0.2:80"] != 0 || seen["10.0.0.1:80"] != 5 {
		t.Errorf("picks = %v, want the two ready endpoints in turn", seen)
	}
	if New(&snapshot.Backend{}, nil, nil).Pick() != nil {
		t.Error("Pick with no endpoint returned one")
	}
}

// TestPickServingTerminating: with no ready endpoint, those still serving
// while they terminate take the requests (KEP-1669, as kube-proxy); one
// ready endpoint ends that.
func TestPickServingTerminating(t *testing.T) {
	old := snapshot.Endpoint{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Serving: true, Terminating: true}
	gone := snapshot.Endpoint{Addr: netip.MustParseAddrPort("10.0.0.2:80"), Terminating: true}
	starting := snapshot.Endpoint{Addr: netip.MustParseAddrPort("10.0.0.3:80")}
	p := New(&snapshot.Backend{Endpoints: []snapshot.Endpoint{old, gone, starting}}, nil, nil)
	if got := picks(p, 4); got[old.Addr.String()] != 4 {
		t.Errorf("no endpoint ready: picks %v, want the serving terminating one only", got)
	}
	starting.Ready, starting.Serving = true, true
	p = New(&snapshot.Backend{Endpoints: []snapshot.Endpoint{old, gone, starting}}, nil, nil)
	if got := picks(p, 4); got[starting.Addr.String()] != 4 {
		t.Errorf("one endpoint ready: picks %v, want it only", got)
	}
	if New(&snapshot.Backend{Endpoints: []snapshot.Endpoint{gone}}, nil, nil).Pick() != nil {
		t.Error("an endpoint neither ready nor serving was picked")
	}
}

func TestHeaderSession(t *testing.T) {
	b := &snapshot.Backend{
		Endpoints: []snapshot.Endpoint{
			{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Ready: true},
			{Addr: netip.MustParseAddrPort("[fd00::1]:80"), Ready: true},
		},
		SessionPersistence: &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "X-Session"},
	}
	p := New(b, nil, nil)
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	now := time.Unix(1_000_000, 0)
	first, pinned, isNew := p.PickRequest(r, ClientKey{}, now, b.SessionPersistence)
	if pinned || !isNew {
		t.Fatalf("first request: pinned %v, new %v; want a new session", pinned, isNew)
	}
	h := http.Header{}
	p.SetSession(h, r, first, now, b.SessionPersistence)
	r.Header.Set("X-Session", h.Get("X-Session"))
	for range 5 {
		if c, pinned, isNew := p.PickRequest(r, ClientKey{}, now, b.SessionPersistence); c != first || !pinned || isNew {
			t.Fatalf("session request went to %s (pinned=%v, new=%v), want %s, pinned", c.Host, pinned, isNew, first.Host)
		}
	}
	r.Header.Set("X-Session", "unknown")
	if _, pinned, isNew := p.PickRequest(r, ClientKey{}, now, b.SessionPersistence); pinned || !isNew {
		t.Errorf("a stale session: pinned %v, new %v; want a new one", pinned, isNew)
	}
}

// TestMCPSession: an MCP backend's session ID names the endpoint that
// issued it, which the requests that send it back go to, its own ID
// restored, until it is ejected; an ID without the prefix, or with one
// MCPSession did not add for it, goes unchanged and names none.
func TestMCPSession(t *testing.T) {
	h := NewHealth(time.Second, time.Second, nil)
	b := &snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: endpoints(3)}
	p := New(b, h, nil)
	issuer := p.Pick()
	answer := http.Header{"Mcp-Session-Id": {"s1"}}
	p.MCPSession(answer, issuer)
	id := answer.Get("Mcp-Session-Id")
	for range 4 {
		req := http.Header{"Mcp-Session-Id": {id}}
		tok := CutMCPSession(req)
		if c, got := p.MCPEndpoint(tok, time.Time{}), req.Get("Mcp-Session-Id"); c != issuer || got != "s1" {
			t.Fatalf("session %q: to %v with %q, want %s with s1", id, c, got, issuer.Host)
		}
	}
	// Lookalikes: the shape of a prefix without its sum, or a prefix that
	// MCPSession gave another ID.
	for _, own := range []string{"s1", "0123456789abcdeX.s1", "." + id, "0123456789abcdef01234567.s1", id[:mcpPrefixLen] + ".s2"} {
		req := http.Header{"Mcp-Session-Id": {own}}
		if tok := CutMCPSession(req); tok != "" || req.Get("Mcp-Session-Id") != own {
			t.Errorf("session %q: endpoint %q, sent as %q; want none, unchanged", own, tok, req.Get("Mcp-Session-Id"))
		}
	}
	tok := CutMCPSession(http.Header{"Mcp-Session-Id": {id}})
	h.Failed(issuer.Endpoint.Addr, time.Now(), time.Now())
	if c := p.MCPEndpoint(tok, time.Time{}); c != nil {
		t.Errorf("session of an ejected endpoint: to %s, want none (picked as any request)", c.Host)
	}
	other := http.Header{"Mcp-Session-Id": {"s1"}}
	http1 := New(&snapshot.Backend{Endpoints: b.Endpoints}, nil, nil)
	http1.MCPSession(other, issuer)
	if got := other.Get("Mcp-Session-Id"); got != "s1" {
		t.Errorf("an HTTP backend's Mcp-Session-Id became %q, want it unchanged", got)
	}
	if c := http1.MCPEndpoint(tok, time.Time{}); c != nil {
		t.Errorf("an HTTP backend kept an MCP session on %s", c.Host)
	}
}

// TestSessionTimeout: a cookie session holds the endpoint's token and its
// start, "token.start", set once: its requests stay pinned, their answers
// set no cookie, until its absolute timeout ends it however busy, and a
// new session starts elsewhere. Before, every answer set the cookie again,
// "token.start.last", for an idle timeout no Gateway API object sets.
func TestSessionTimeout(t *testing.T) {
	sp := &snapshot.SessionPersistence{Type: snapshot.SessionCookie, Name: "s", AbsoluteTimeoutSeconds: 100, Permanent: true}
	p := New(&snapshot.Backend{Endpoints: endpoints(8), SessionPersistence: sp}, nil, nil)
	t0 := time.Unix(1_000_000, 0)
	// request sends a request at now with the current cookie and keeps the
	// cookie its answer sets, checking its value and Max-Age.
	var cookie string
	request := func(now time.Time) (c *Choice, pinned, set bool) {
		t.Helper()
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		if cookie != "" {
			r.Header.Set("Cookie", "s="+cookie)
		}
		c, pinned, set = p.PickRequest(r, ClientKey{}, now, sp)
		if set {
			h := http.Header{}
			p.SetSession(h, r, c, now, sp)
			ck, err := http.ParseSetCookie(h.Get("Set-Cookie"))
			if err != nil {
				t.Fatal(err)
			}
			if want := c.token + "." + strconv.FormatInt(now.Unix(), 10); ck.Value != want || ck.MaxAge != 100 {
				t.Errorf("new session at %v: cookie %q, Max-Age %d; want %q, 100", now.Sub(t0), ck.Value, ck.MaxAge, want)
			}
			cookie = ck.Value
		}
		return c, pinned, set
	}
	first, _, _ := request(t0)
	for at := 9 * time.Second; at < 100*time.Second; at += 9 * time.Second {
		if c, pinned, set := request(t0.Add(at)); c != first || !pinned || set {
			t.Fatalf("at %v: endpoint %s (pinned %v, set again %v), want %s pinned, not set again", at, c.Host, pinned, set, first.Host)
		}
	}
	if c, pinned, set := request(t0.Add(100 * time.Second)); c == first || pinned || !set {
		t.Errorf("at its absolute timeout: endpoint %s (pinned %v, new %v), want a new session elsewhere", c.Host, pinned, set)
	}
}

// TestSessionValues: a session value pins while its start is within the
// absolute timeout, "token.start" as SetSession writes it and
// "token.start.last" as builds before wrote it (its last use ignored); one
// without a start, with a malformed one or past the timeout starts anew. A
// session re-issued for its endpoint keeps its start in the new form.
func TestSessionValues(t *testing.T) {
	sp := &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "X-Session", AbsoluteTimeoutSeconds: 100}
	p := New(&snapshot.Backend{Endpoints: endpoints(3), SessionPersistence: sp}, nil, nil)
	home := &p.ready[1]
	t0 := time.Unix(1_000_000, 0)
	now := t0.Add(50 * time.Second)
	start := strconv.FormatInt(t0.Unix(), 10)
	for _, tc := range []struct {
		value string
		pins  bool
	}{
		{home.token + "." + start, true},
		{home.token + "." + start + "." + strconv.FormatInt(now.Unix()-1000, 10), true}, // idle long ago: ignored
		{home.token, false},
		{home.token + ".x", false},
		{home.token + "." + start + ".x", false},
		{home.token + "." + strconv.FormatInt(t0.Unix()-50, 10), false}, // started 100 s ago
	} {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-Session", tc.value)
		if c, pinned, set := p.PickRequest(r, ClientKey{}, now, sp); pinned != tc.pins || set == tc.pins || tc.pins && c != home {
			t.Errorf("session %q: to %s (pinned %v, new %v), want pinned to %s: %v", tc.value, c.Host, pinned, set, home.Host, tc.pins)
		}
		h := http.Header{}
		p.SetSession(h, r, home, now, sp)
		want := home.token + "." + start
		if !tc.pins {
			want = home.token + "." + strconv.FormatInt(now.Unix(), 10)
		}
		if got := h.Get("X-Session"); got != want {
			t.Errorf("session %q re-issued for its endpoint: %q, want %q", tc.value, got, want)
		}
	}
}

// TestSessionTerminating: a session (session persistence's, an MCP
// session's) stays on its endpoint while that serves as it terminates,
// ready endpoints beside it, which alone take new sessions and requests;
// it moves once the endpoint is ejected or serves no more, and a connect
// to it that fails may try the ready one (Tries). Before, it
// moved as soon as the pod began terminating, whose grace period would
// have let it finish.
func TestSessionTerminating(t *testing.T) {
	sp := &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "X-Session"}
	b := &snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: endpoints(2), SessionPersistence: sp}
	before := New(b, nil, nil)
	old := &before.ready[1]
	now := time.Unix(1_000_000, 0)
	r, _ := http.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Mcp-Session-Id", "s1")
	before.SetSession(r.Header, r, old, now, sp)
	before.MCPSession(r.Header, old)
	mcp := CutMCPSession(r.Header.Clone())

	// on checks that p keeps both sessions on old, or moves them (stays
	// false).
	on := func(p *Picker, stays bool, when string) {
		t.Helper()
		if c, pinned, _ := p.PickRequest(r, ClientKey{}, now, sp); pinned != stays || (c.Host == old.Host) != stays {
			t.Errorf("%s: session to %s (pinned %v), want it on %s: %v", when, c.Host, pinned, old.Host, stays)
		}
		if c := p.MCPEndpoint(mcp, time.Time{}); (c != nil && c.Host == old.Host) != stays {
			t.Errorf("%s: MCP session to %v, want it on %s: %v", when, c, old.Host, stays)
		}
	}
	terminating := *b
	terminating.Endpoints = endpoints(2)
	terminating.Endpoints[1] = snapshot.Endpoint{Addr: old.Endpoint.Addr, Serving: true, Terminating: true}
	health := NewHealth(time.Minute, time.Minute, nil)
	p := New(&terminating, health, nil)
	on(p, true, "terminating, serving")
	if kept, other := p.MCPEndpoint(mcp, time.Time{}), p.Pick(); p.Tries(kept) != 2 || p.Tries(other) != 1 {
		t.Errorf("Tries: %d from the terminating endpoint, %d from the ready one; want 2, 1", p.Tries(kept), p.Tries(other))
	}
	if got := picks(p, 4); got[old.Host] != 0 || p.Len() != 1 {
		t.Errorf("terminating beside a ready endpoint: picks %v, Len %d; want none of %s, 1", got, p.Len(), old.Host)
	}
	health.Failed(old.Endpoint.Addr, time.Now(), time.Now()) // MCPEndpoint reads the clock
	on(p, false, "terminating, ejected")

	terminating.Endpoints[1].Serving = false
	on(New(&terminating, nil, nil), false, "terminating, no longer serving")
}

func endpoints(n int) []snapshot.Endpoint {
	eps := make([]snapshot.Endpoint, n)
	for i := range eps {
		eps[i] = snapshot.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), 80), Ready: true}
	}
	return eps
}
