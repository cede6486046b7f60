package balance

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// FuzzSessionValues sends what a client may send as a session — a
// session header's or cookie's value, an MCP session ID — and checks that
// a request pins only to the endpoint whose token the value starts with,
// that a session SetSession starts pins the next request to its endpoint
// (cookie and header alike), and that CutMCPSessionID takes off exactly
// what MCPSessionID put on.
func FuzzSessionValues(f *testing.F) {
	p := New(&snapshot.Backend{Endpoints: endpoints(3), Protocol: snapshot.ProtocolMCP}, nil, nil)
	c := p.Pick()
	now := time.Unix(1_000_000, 0)
	for _, s := range [][2]string{
		{c.token, "s1"},
		{c.token + ".999990", "a.b"},
		{c.token + ".999990.999999", ""},
		{c.token + ".-9223372036854775808", "x"},
		{c.token + ".9223372036854775807", MCPSessionID("s1", c)},
		{MCPSessionID("s1", c), "s1"},
		{"", "\x00."},
	} {
		f.Add(s[0], s[1])
	}
	sps := []*snapshot.SessionPersistence{
		{Type: snapshot.SessionHeader, Name: "X-Session", AbsoluteTimeoutSeconds: 100},
		{Type: snapshot.SessionCookie, Name: "s", AbsoluteTimeoutSeconds: 100, Permanent: true},
		{Type: snapshot.SessionCookie, Name: "s"},
	}
	f.Fuzz(func(t *testing.T, v, id string) {
		for _, sp := range sps {
			r := sessionRequest(t, sp, v)
			got, pinned, set := p.PickRequest(r, ClientKey{}, now, sp)
			if got == nil {
				t.Fatal("no endpoint picked")
			}
			if pinned && !strings.HasPrefix(sessionOf(r, sp), got.token) {
				t.Fatalf("%s session %q pinned to %s, token %s", sp.Type, v, got.Host, got.token)
			}
			if !set {
				continue
			}
			h := http.Header{}
			p.SetSession(h, r, got, now, sp)
			value := h.Get(sp.Name)
			if sp.Type == snapshot.SessionCookie {
				ck, err := http.ParseSetCookie(h.Get("Set-Cookie"))
				if err != nil {
					t.Fatalf("SetSession wrote a cookie that does not parse: %v", err)
				}
				value = ck.Value
			}
			if again, pinned, _ := p.PickRequest(sessionRequest(t, sp, value), ClientKey{}, now, sp); again != got || !pinned {
				t.Fatalf("%s session %q set after %q does not pin to %s", sp.Type, value, v, got.Host)
			}
		}
		if cut, tok := CutMCPSessionID(v); tok != "" && MCPSessionID(cut, &Choice{token: tok}) != v {
			t.Fatalf("CutMCPSessionID(%q) = %q, %q: not what MCPSessionID puts on", v, cut, tok)
		}
		if cut, tok := CutMCPSessionID(MCPSessionID(id, c)); cut != id || tok != c.token {
			t.Fatalf("CutMCPSessionID(MCPSessionID(%q)) = %q, %q; want the ID and %s", id, cut, tok, c.token)
		}
	})
}

// sessionRequest is a request carrying v as sp's session.
func sessionRequest(t *testing.T, sp *snapshot.SessionPersistence, v string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(http.MethodGet, "/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if sp.Type == snapshot.SessionHeader {
		r.Header.Set(sp.Name, v)
	} else {
		r.Header.Set("Cookie", sp.Name+"="+v)
	}
	return r
}
