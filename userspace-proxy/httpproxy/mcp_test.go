package httpproxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// mcpServer is a stateful MCP server (streamable HTTP): a request without
// an Mcp-Session-Id starts a session, one with an ID it does not know is
// answered 404 (as the MCP spec says), a GET opens an SSE stream, a DELETE
// ends the session. Every answer's body is "<name> <the ID received>".
func mcpServer(t *testing.T, name string) snapshot.Endpoint {
	return startBackend(t, mcpHandler(name))
}

func mcpHandler(name string) http.Handler {
	var mu sync.Mutex
	sessions := map[string]bool{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Mcp-Session-Id")
		mu.Lock()
		defer mu.Unlock()
		switch {
		case id == "":
			id = fmt.Sprintf("%s-session-%d", name, len(sessions))
			sessions[id] = true
		case !sessions[id]:
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, "%s %s", name, id)
			return
		case r.Method == http.MethodDelete:
			delete(sessions, id)
		case r.Method == http.MethodGet:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: %s %s\n\n", name, id)
			return
		}
		w.Header().Set("Mcp-Session-Id", id)
		fmt.Fprintf(w, "%s %s", name, id)
	})
}

// mcpDo sends an MCP request of method through c, with the session ID id
// unless empty and header's fields (name, value, ...), and returns the
// answer and its whole body.
func mcpDo(t *testing.T, c *http.Client, method, id string, header ...string) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("{}") // JSON-RPC; a GET or DELETE has none
	}
	req, err := http.NewRequest(method, "http://echo.b.svc/mcp", body)
	if err != nil {
		t.Fatal(err)
	}
	if id != "" {
		req.Header.Set("Mcp-Session-Id", id)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %q: %v", method, id, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s %q: read body: %v", method, id, err)
	}
	return resp, string(b)
}

// TestMCPSessionAffinity: the requests of an MCP session (POSTs, the GET
// of its SSE stream, the DELETE that ends it) reach the replica that
// issued it, whose ID the app gets prefixed with the endpoint's token and
// the backend gets back as it issued it; an ID without the prefix, or with
// a lookalike of it, goes as it is, and one whose endpoint is gone goes
// elsewhere, answered 404.
func TestMCPSessionAffinity(t *testing.T) {
	for _, app := range []string{"h1", "h2c"} {
		t.Run(app, func(t *testing.T) {
			eps := []snapshot.Endpoint{mcpServer(t, "a"), mcpServer(t, "b"), mcpServer(t, "c")}
			be := snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: eps}
			f := newFixture(t, Config{}, be)
			c := f.appClient(app)
			do := func(method, id string) (*http.Response, string) {
				t.Helper()
				return mcpDo(t, c, method, id)
			}

			resp, body := do(http.MethodPost, "") // initialize
			issuer, issued, _ := strings.Cut(body, " ")
			id := resp.Header.Get("Mcp-Session-Id")
			if tok, v, ok := strings.Cut(id, "."); !ok || v != issued || len(tok) != 24 {
				t.Errorf("initialize: app got Mcp-Session-Id %q for the backend's %q, want <token>.%s", id, issued, issued)
			}
			want := issuer + " " + issued
			for _, method := range []string{"POST", "POST", "POST", "POST", "GET", "POST", "DELETE"} {
				resp, body := do(method, id)
				if resp.StatusCode != http.StatusOK || strings.TrimSpace(strings.TrimPrefix(body, "data: ")) != want {
					t.Errorf("%s with the session: %d %q, want 200 %q", method, resp.StatusCode, body, want)
				}
				if got := resp.Header.Get("Mcp-Session-Id"); method == "POST" && got != id {
					t.Errorf("%s with the session: app got Mcp-Session-Id %q, want %q", method, got, id)
				}
			}

			// Without the prefix, or with one that only looks like it (no
			// sum, or the sum of another ID): as it is, to whichever
			// endpoint.
			prefix, _, _ := strings.Cut(id, ".")
			for _, own := range []string{"client-made", "0123456789abcdeX.x", "0123456789abcdef.x", prefix + ".forged"} {
				if _, body := do(http.MethodPost, own); !strings.HasSuffix(body, " "+own) {
					t.Errorf("POST with %q: backend got %q, want it unchanged", own, body)
				}
			}

			// The issuing endpoint gone: the request goes to another,
			// which does not know the session.
			resp, body = do(http.MethodPost, "") // a new session
			issuer, issued, _ = strings.Cut(body, " ")
			id = resp.Header.Get("Mcp-Session-Id")
			var rest []snapshot.Endpoint
			for i, name := range []string{"a", "b", "c"} {
				if name != issuer {
					rest = append(rest, eps[i])
				}
			}
			f.update(2, snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: rest})
			resp, body = do(http.MethodPost, id)
			if other, got, _ := strings.Cut(body, " "); resp.StatusCode != http.StatusNotFound || other == issuer || got != issued {
				t.Errorf("POST with a session of an endpoint gone: %d %q, want 404 from another endpoint, which got %q", resp.StatusCode, body, issued)
			}
		})
	}
}

// TestMCPSessionEndpointRefuses: a request whose MCP session names an
// endpoint that refuses the connect goes to another, which answers 404
// (the client starts a new session), also where the backend sets no
// session persistence.
func TestMCPSessionEndpointRefuses(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	issuer := &http.Server{Handler: mcpHandler("a")}
	go issuer.Serve(l)
	t.Cleanup(func() { issuer.Close() })
	eps := []snapshot.Endpoint{{Addr: l.Addr().(*net.TCPAddr).AddrPort(), Ready: true, Serving: true}, mcpServer(t, "b")}
	f := newFixture(t, Config{}, snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: eps})
	c := f.dial()
	var id string
	for id == "" { // round robin: a's turn comes
		c.send("POST /mcp HTTP/1.1\r\nHost: echo.b.svc\r\nContent-Length: 2\r\n\r\n{}")
		resp, body := c.read(http.MethodPost)
		if strings.HasPrefix(body, "a ") {
			id = resp.Header.Get("Mcp-Session-Id")
		}
	}
	issuer.Close() // a's connects are refused from now on
	c.send("POST /mcp HTTP/1.1\r\nHost: echo.b.svc\r\nMcp-Session-Id: " + id + "\r\nContent-Length: 2\r\n\r\n{}")
	if resp, body := c.read(http.MethodPost); resp.StatusCode != http.StatusNotFound || !strings.HasPrefix(body, "b ") {
		t.Errorf("POST with a session of a refusing endpoint: %d %q, want 404 from b", resp.StatusCode, body)
	}
}

// TestMCPSessionOverPersistence: under session persistence, an MCP
// session's requests go to the replica that issued it, whichever endpoint
// the persistence header names, and their answers start no persistence
// session; an initialize, which has no MCP session yet, starts one.
func TestMCPSessionOverPersistence(t *testing.T) {
	sp := &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "X-Session"}
	be := snapshot.Backend{Protocol: snapshot.ProtocolMCP, SessionPersistence: sp,
		Endpoints: []snapshot.Endpoint{mcpServer(t, "a"), mcpServer(t, "b")}}
	f := newFixture(t, Config{}, be)
	c := f.httpClient()
	started := map[string][2]string{} // replica: its MCP session ID, persistence session
	for len(started) < 2 {            // round robin: each replica's turn comes
		resp, body := mcpDo(t, c, http.MethodPost, "")
		issuer, _, _ := strings.Cut(body, " ")
		started[issuer] = [2]string{resp.Header.Get("Mcp-Session-Id"), resp.Header.Get("X-Session")}
		if resp.Header.Get("X-Session") == "" {
			t.Fatalf("initialize answered by %s started no persistence session", issuer)
		}
	}
	for range 4 {
		resp, body := mcpDo(t, c, http.MethodPost, started["a"][0], "X-Session", started["b"][1])
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(body, "a ") || resp.Header.Get("X-Session") != "" {
			t.Errorf("a's MCP session with b's persistence session: %d %q, X-Session %q; want 200 from a, none", resp.StatusCode, body, resp.Header.Get("X-Session"))
		}
	}
}

// TestMCPSessionRouteMatch: a route's header match on Mcp-Session-Id sees
// the ID the backend issued, which the route's author knows from their
// server, not the prefix the app's copy carries; the backend still gets
// its own ID. Before, the match met the prefixed ID and failed.
func TestMCPSessionRouteMatch(t *testing.T) {
	be := snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: []snapshot.Endpoint{mcpServer(t, "a")}}
	f := newFixture(t, Config{}, be)
	rule := func(name string) snapshot.RouteRule {
		return snapshot.RouteRule{Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: backendRef}},
			Filters: snapshot.Filters{ResponseHeaders: &snapshot.HeaderModifier{Set: []snapshot.Header{{Name: "X-Rule", Value: name}}}}}
	}
	all := snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/"}
	f.updateRoutes(2, be, &snapshot.RouteTable{Producer: &snapshot.RouteSet{
		Kind: snapshot.KindHTTPRoute,
		Matches: []snapshot.RouteMatch{
			{Rule: 0, Path: all, Headers: []snapshot.StringMatch{{Name: "Mcp-Session-Id", Type: snapshot.MatchRegularExpression, Value: "a-session-[0-9]+"}}},
			{Rule: 1, Path: all},
		},
		Rules: []snapshot.RouteRule{rule("session"), rule("other")},
	}})
	for _, app := range []string{"h1", "h2c"} {
		t.Run(app, func(t *testing.T) {
			c := f.appClient(app)
			resp, body := mcpDo(t, c, http.MethodPost, "") // initialize
			id := resp.Header.Get("Mcp-Session-Id")
			if got := resp.Header.Get("X-Rule"); got != "other" || id == "" {
				t.Fatalf("initialize: rule %q, Mcp-Session-Id %q, want rule other and a session", got, id)
			}
			_, issued, _ := strings.Cut(body, " ")
			resp, body = mcpDo(t, c, http.MethodPost, id)
			if got := resp.Header.Get("X-Rule"); resp.StatusCode != http.StatusOK || got != "session" || body != "a "+issued {
				t.Errorf("POST with %q: %d, rule %q, %q; want 200, rule session, %q", id, resp.StatusCode, got, body, "a "+issued)
			}
		})
	}
}

// TestMCPSessionWeightedSplit: under a rule that splits by weight, an MCP
// session stays on the backend and replica that issued it, whatever the
// weights, a backendRef drained to weight 0 included, while new sessions
// follow them; a session whose replica is gone, or whose backendRef left
// the rule, goes where the weights say (there, a 404 has the client start
// over). Before, each request was drawn by weight: the session's requests
// went to the other backend, which answered 404; and until the
// eighteenth session a weight of 0 moved them likewise.
func TestMCPSessionWeightedSplit(t *testing.T) {
	canaryRef := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: "canary", Port: 80}
	stable := snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: []snapshot.Endpoint{mcpServer(t, "a1"), mcpServer(t, "a2")}}
	canary := snapshot.Backend{Ref: canaryRef, Protocol: snapshot.ProtocolMCP, Endpoints: []snapshot.Endpoint{mcpServer(t, "b1")}}
	f := newFixture(t, Config{}, stable)
	third := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: "third", Port: 80}
	thirdBe := snapshot.Backend{Ref: third, Protocol: snapshot.ProtocolMCP, Endpoints: []snapshot.Endpoint{mcpServer(t, "c1")}}
	rule := func(version uint64, stable snapshot.Backend, backends ...snapshot.WeightedBackend) {
		f.updateRoutes(version, stable, &snapshot.RouteTable{Producer: &snapshot.RouteSet{
			Kind:    snapshot.KindHTTPRoute,
			Matches: []snapshot.RouteMatch{{Path: snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/"}}},
			Rules:   []snapshot.RouteRule{{Backends: backends}},
		}}, canary, thirdBe)
	}
	split := func(version uint64, stable snapshot.Backend, stableWeight, canaryWeight uint32) {
		rule(version, stable, snapshot.WeightedBackend{Weight: stableWeight, Backend: backendRef},
			snapshot.WeightedBackend{Weight: canaryWeight, Backend: canaryRef})
	}
	// sessionOn checks that a request of the session id reaches issuer,
	// which gets its own ID back.
	sessionOn := func(c *http.Client, id, issuer, issued, when string) {
		t.Helper()
		for _, method := range []string{"POST", "POST", "GET", "POST", "POST"} {
			resp, body := mcpDo(t, c, method, id)
			if resp.StatusCode != http.StatusOK || strings.TrimSpace(strings.TrimPrefix(body, "data: ")) != issuer+" "+issued {
				t.Errorf("%s with the session, %s: %d %q, want 200 from %s", method, when, resp.StatusCode, body, issuer)
			}
		}
	}
	for i, app := range []string{"h1", "h2c"} {
		t.Run(app, func(t *testing.T) {
			c := f.appClient(app)
			version := uint64(10 * (i + 1))
			split(version, stable, 1, 0)
			resp, body := mcpDo(t, c, http.MethodPost, "") // initialize, on stable
			id := resp.Header.Get("Mcp-Session-Id")
			issuer, issued, _ := strings.Cut(body, " ")
			split(version+1, stable, 1, 1000000) // nearly all to the canary
			sessionOn(c, id, issuer, issued, "stable weighing 1 of 1000001")
			if _, body := mcpDo(t, c, http.MethodPost, ""); !strings.HasPrefix(body, "b1 ") {
				t.Errorf("a new session began on %q, want the canary's b1 as the weights say", body)
			}

			// Stable drained to weight 0: its session stays; every new
			// session goes to the canary.
			split(version+2, stable, 0, 1)
			sessionOn(c, id, issuer, issued, "stable weighing 0")
			for range 4 {
				if _, body := mcpDo(t, c, http.MethodPost, ""); !strings.HasPrefix(body, "b1 ") {
					t.Errorf("a new session began on %q with stable weighing 0, want the canary's b1", body)
				}
			}

			// Stable's backendRef gone from the rule (which still splits,
			// so that a session could stay), or its issuing replica gone:
			// the weights pick the canary, which gets the server's own ID.
			rule(version+3, stable, snapshot.WeightedBackend{Weight: 1, Backend: canaryRef},
				snapshot.WeightedBackend{Weight: 0, Backend: third})
			if resp, body := mcpDo(t, c, http.MethodPost, id); resp.StatusCode != http.StatusNotFound || body != "b1 "+issued {
				t.Errorf("POST with a session of a backendRef removed: %d %q, want 404 from b1, which got %q", resp.StatusCode, body, issued)
			}
			rest := stable
			rest.Endpoints = nil
			for j, name := range []string{"a1", "a2"} {
				if name != issuer {
					rest.Endpoints = append(rest.Endpoints, stable.Endpoints[j])
				}
			}
			split(version+4, rest, 0, 1)
			if resp, body := mcpDo(t, c, http.MethodPost, id); resp.StatusCode != http.StatusNotFound || body != "b1 "+issued {
				t.Errorf("POST with a session of a replica gone, its backendRef weighing 0: %d %q, want 404 from b1, which got %q", resp.StatusCode, body, issued)
			}
		})
	}
}

// TestMCPSessionToPlainBackend: a backend that is not MCP — the Service's
// backend no longer says MCP, say — gets the session ID its MCP
// predecessor issued as that one issued it, the prefix sockmesh added cut,
// on the HTTP/1.1 fast path's plain reading (a GET) as on
// net/http's (a DELETE, a POST, h2c): the prefix was never the backend's.
func TestMCPSessionToPlainBackend(t *testing.T) {
	for _, app := range []string{"h1", "h2c"} {
		t.Run(app, func(t *testing.T) {
			f := newFixture(t, Config{}, snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: []snapshot.Endpoint{mcpServer(t, "mcp")}})
			c := f.appClient(app)
			resp, body := mcpDo(t, c, http.MethodPost, "") // initialize
			_, issued, _ := strings.Cut(body, " ")
			id := resp.Header.Get("Mcp-Session-Id")
			if id == issued {
				t.Fatalf("initialize: app got Mcp-Session-Id %q unprefixed", id)
			}
			f.update(2, snapshot.Backend{Endpoints: []snapshot.Endpoint{mcpServer(t, "plain")}})
			for _, method := range []string{http.MethodGet, http.MethodDelete, http.MethodPost} {
				if _, body := mcpDo(t, c, method, id); body != "plain "+issued {
					t.Errorf("%s with %q: backend got %q, want %q", method, id, body, "plain "+issued)
				}
			}
		})
	}
}

// TestMCPCleartextHTTP11: a cleartext MCP server that speaks HTTP/1.1
// alone, as MCP's SDKs' do, serves HTTP/2 apps as HTTP/1.1 ones: the
// proxy speaks HTTP/1.1 to it. Before, an h2c app's requests went in h2c
// with prior knowledge, which the server did not speak: 502.
func TestMCPCleartextHTTP11(t *testing.T) {
	ep, _ := serveBackend(t, mcpHandler("a"), false)
	be := snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: []snapshot.Endpoint{ep}}
	f := newFixture(t, Config{}, be)
	for _, app := range []string{"h1", "h2c"} {
		t.Run(app, func(t *testing.T) {
			c := f.appClient(app)
			resp, body := mcpDo(t, c, http.MethodPost, "") // initialize
			id := resp.Header.Get("Mcp-Session-Id")
			if resp.StatusCode != http.StatusOK || id == "" {
				t.Fatalf("initialize: %d %q, Mcp-Session-Id %q; want 200 and a session", resp.StatusCode, body, id)
			}
			for _, method := range []string{"POST", "GET", "DELETE"} {
				if resp, body := mcpDo(t, c, method, id); resp.StatusCode != http.StatusOK {
					t.Errorf("%s with the session: %d %q, want 200", method, resp.StatusCode, body)
				}
			}
		})
	}
}

// TestSessionOnTerminatingReplica: a session — an MCP session, or one of
// session persistence (a cookie) — stays on its replica once that begins
// terminating while it still serves, another replica ready, which alone
// takes new sessions: the pod's grace period lets its sessions finish.
// Once it exits, still serving in the snapshot, the session's requests go
// to the other replica. Before, the session's next request went to the
// other replica, which did not know it (404), as soon as the pod began
// terminating: a rolling update ended every session of the old pods at
// once.
func TestSessionOnTerminatingReplica(t *testing.T) {
	cookie := &snapshot.SessionPersistence{Type: snapshot.SessionCookie, Name: "sm-session"}
	for _, kind := range []struct {
		name string
		be   snapshot.Backend
	}{{"mcp", snapshot.Backend{Protocol: snapshot.ProtocolMCP}}, {"cookie", snapshot.Backend{SessionPersistence: cookie}}} {
		for _, app := range []string{"h1", "h2c"} {
			t.Run(kind.name+"/"+app, func(t *testing.T) {
				be := kind.be
				var srvs [2]*http.Server
				be.Endpoints = make([]snapshot.Endpoint, 2)
				be.Endpoints[0], srvs[0] = serveBackend(t, mcpHandler("a"), true)
				be.Endpoints[1], srvs[1] = serveBackend(t, mcpHandler("b"), true)
				f := newFixture(t, Config{}, be)
				c := f.appClient(app)
				resp, body := mcpDo(t, c, http.MethodPost, "") // initialize
				issuer, _, _ := strings.Cut(body, " ")
				id, sent := resp.Header.Get("Mcp-Session-Id"), []string(nil)
				for _, ck := range resp.Cookies() {
					sent = []string{"Cookie", ck.Name + "=" + ck.Value}
				}
				if (sent != nil) != (be.SessionPersistence != nil) {
					t.Fatalf("initialize: cookies %v under session persistence %v", resp.Cookies(), be.SessionPersistence)
				}
				terminating := be
				terminating.Endpoints = slices.Clone(be.Endpoints)
				i := strings.Index("ab", issuer)
				terminating.Endpoints[i].Ready, terminating.Endpoints[i].Terminating = false, true
				f.update(2, terminating)

				for _, method := range []string{"POST", "GET", "POST", "DELETE"} {
					resp, body := mcpDo(t, c, method, id, sent...)
					if got, _, _ := strings.Cut(strings.TrimPrefix(body, "data: "), " "); resp.StatusCode != http.StatusOK || got != issuer {
						t.Errorf("%s with the session, its replica terminating: %d %q, want 200 from %s", method, resp.StatusCode, body, issuer)
					}
				}
				for range 2 {
					if _, body := mcpDo(t, c, http.MethodPost, ""); strings.HasPrefix(body, issuer+" ") {
						t.Errorf("a new session began on %q, the terminating replica", body)
					}
				}

				srvs[i].Close() // its connects are refused from now on
				// Its connections' ends reach the proxy a moment later (an
				// h2c app's requests go on an HTTP/2 one, whose reader
				// notices on its own time): one taken meanwhile fails the
				// request 502, as with any backend that vanishes. The proxy
				// holding none, the step is the connect's refusal.
				f.cur.Load().Backends.CloseIdle()
				if resp, body := mcpDo(t, c, http.MethodPost, id, sent...); resp.StatusCode != http.StatusNotFound || strings.HasPrefix(body, issuer+" ") {
					t.Errorf("POST with the session, its replica gone: %d %q, want 404 from the other replica", resp.StatusCode, body)
				}
			})
		}
	}
}
