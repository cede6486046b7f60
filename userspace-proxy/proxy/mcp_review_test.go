package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/pipenet"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// mcpEvents are the writes of an MCP server's event stream in
// TestMCPStreamLockstep: an event, one larger than any copy buffer, an
// event cut in two writes, a comment kept as a heartbeat, a lone line end.
var mcpEvents = [][]byte{
	[]byte("id: 8\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"),
	append(append([]byte("id: 9\ndata: "), bytes.Repeat([]byte("x"), 100<<10)...), "\n\n"...),
	[]byte("id: 10\ndata: {\"par"),
	[]byte("tial\":true}\n\n"),
	[]byte(": ping\n\n"),
	[]byte("\n"),
}

// mcpLockstep is an MCP server (streamable HTTP) whose GET stream sends
// each of mcpEvents only once the test has read the one before (step): a
// write the proxy held back hangs the test. It issues session "s-1" to the
// initialize POST and answers DELETE of it 204; a GET must come with that
// session, as the server issued it, and Last-Event-ID 7; /cut streams an
// event's start, then breaks its connection.
type mcpLockstep struct {
	step chan struct{}
}

func (s *mcpLockstep) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Mcp-Session-Id", "s-1")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
		return
	}
	if got := r.Header.Get("Mcp-Session-Id"); got != "s-1" {
		http.Error(w, "session "+got, http.StatusNotFound)
		return
	}
	switch {
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
		return
	case r.Header.Get("Last-Event-ID") != "7":
		http.Error(w, "Last-Event-ID "+r.Header.Get("Last-Event-ID"), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Wire", r.Proto)
	rc := http.NewResponseController(w)
	if r.URL.Path == "/cut" {
		w.Write(mcpEvents[2])
		rc.Flush()
		<-s.step
		panic(http.ErrAbortHandler) // the connection (HTTP/2: the stream) breaks mid-event
	}
	for _, ev := range mcpEvents {
		if _, err := w.Write(ev); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
		select {
		case <-s.step:
		case <-r.Context().Done():
			return
		}
	}
}

// TestMCPStreamLockstep: an MCP session through the proxy as an MCP client
// runs it, from HTTP/1.1 apps (fast path and net/http's) and h2c apps, to
// a cleartext MCP server (HTTP/1.1) and servers over TLS, offered h2 and
// http/1.1 by every app — one that speaks both (h2 then: an HTTP/1.1
// app's went over HTTP/1.1 before, each open stream holding a
// connection), one that speaks h2 alone (an HTTP/1.1 app's handshake
// failed before), one that speaks HTTP/1.1 alone (HTTP/1.1 then) — and to
// one whose TLS policy offers h2 alone (h2 for every app): the
// initialize's session ID comes back prefixed, the GET of the session's
// stream reaches the server with the ID it issued and Last-Event-ID, each
// write of the stream reaches the app before the server makes the next
// (an event cut in two, a heartbeat, a lone line end included), the stream
// ends cleanly when the server ends it and visibly broken when the server
// breaks it mid-event, and DELETE ends the session at the server.
func TestMCPStreamLockstep(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			m := &mesh{t: t}
			servers := map[string]*mcpLockstep{}
			vips := map[string]netip.AddrPort{}
			for i, name := range []string{"clear", "tls", "tls-h2", "h2-server", "h1-server"} {
				srv := &mcpLockstep{step: make(chan struct{})}
				servers[name] = srv
				hs := &http.Server{Handler: srv, Protocols: new(http.Protocols)}
				hs.Protocols.SetHTTP1(name != "h2-server")
				be := snapshot.Backend{Protocol: snapshot.ProtocolMCP}
				if name != "clear" {
					hs.TLSConfig = serverTLS(e.pki.server)
					hs.TLSConfig.NextProtos = []string{"h2", "http/1.1"}
					hs.Protocols.SetHTTP2(name != "h1-server")
					be.TLS = tlsPolicy(e)
				}
				switch name {
				case "h2-server":
					hs.TLSConfig.NextProtos = []string{"h2"}
				case "h1-server":
					hs.TLSConfig.NextProtos = []string{"http/1.1"}
				}
				if name == "tls-h2" {
					// A TLS policy that offers h2 alone: every app's
					// requests go over HTTP/2, an HTTP/1.1 app's too.
					be.TLS.ALPN = []string{"h2"}
				}
				be.Endpoints = endpoints(serveLocal(t, hs))
				vips[name] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 48, byte(i + 1)}), 80)
				m.frontend(name, vips[name], m.backend(name, be), nil)
			}
			e.p.Update(m.snapshot(1))
			for name, dst := range vips {
				t.Run(name, func(t *testing.T) {
					wire := "HTTP/2.0" // ALPN offers both, or h2 alone
					if name == "clear" || name == "h1-server" {
						wire = "HTTP/1.1"
					}
					mcpSession(t, e.client(dst, k.h2c), "http://"+name+".b.svc", servers[name], wire)
				})
			}
		})
	}
}

// mcpSession runs TestMCPStreamLockstep's session against base, whose
// server must see its requests come over wire (HTTP/1.1, HTTP/2.0).
func mcpSession(t *testing.T, c *http.Client, base string, srv *mcpLockstep, wire string) {
	resp, err := c.Post(base+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize"}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	session := resp.Header.Get("Mcp-Session-Id")
	if id, tok := balance.CutMCPSessionID(session); resp.StatusCode != http.StatusOK || id != "s-1" || tok == "" {
		t.Fatalf("initialize: %d, session %q; want 200 and s-1 with the proxy's prefix", resp.StatusCode, session)
	}
	open := func(path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.Header = http.Header{"Accept": {"text/event-stream"}, "Mcp-Session-Id": {session}, "Last-Event-Id": {"7"}}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Wire") != wire {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("GET %s: %d %q over %s: %s; want 200 text/event-stream over %s", path, resp.StatusCode,
				resp.Header.Get("Content-Type"), resp.Header.Get("X-Wire"), b, wire)
		}
		return resp
	}

	resp = open("/mcp")
	for i, ev := range mcpEvents {
		got := make([]byte, len(ev))
		if _, err := io.ReadFull(resp.Body, got); err != nil || !bytes.Equal(got, ev) {
			t.Fatalf("write %d: %.40q, %v; want %.40q", i, got, err, ev)
		}
		srv.step <- struct{}{}
	}
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Errorf("after the last event: %q, %v; want a clean end", rest, err)
	}
	resp.Body.Close()

	resp = open("/cut")
	got := make([]byte, len(mcpEvents[2]))
	if _, err := io.ReadFull(resp.Body, got); err != nil || !bytes.Equal(got, mcpEvents[2]) {
		t.Fatalf("cut stream's start: %q, %v", got, err)
	}
	srv.step <- struct{}{}
	if rest, err := io.ReadAll(resp.Body); err == nil || errors.Is(err, io.EOF) {
		t.Errorf("stream the server broke mid-event ended cleanly after %q; want an error", rest)
	}
	resp.Body.Close()

	req, _ := http.NewRequestWithContext(context.Background(), http.MethodDelete, base+"/mcp", nil)
	req.Header.Set("Mcp-Session-Id", session)
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("DELETE of the session: %d, want 204", resp.StatusCode)
	}
}

// TestMCPQuietStream: an MCP session's event stream that stays quiet for
// hours between events (a server with nothing to notify) is cut by none
// of the proxy's default timeouts — idle connections (the app's, 5 min;
// pooled upstream ones, 90 s), header reads, the stall watch (60 s, which
// waits only on an app that does not read), HTTP/2 pings — on any client
// kind: MCP clients hold the GET open for the session's life, and a
// stream cut would lose the notifications in between (a server need not
// keep them for Last-Event-ID). Time is the synctest bubble's.
func TestMCPQuietStream(t *testing.T) {
	inBubbles(t, testMCPQuietStream)
}

func testMCPQuietStream(t *testing.T, k clientKind) {
	var pn pipenet.Net
	backendAddr := netip.MustParseAddrPort("10.0.0.1:8080")
	more := make(chan struct{})
	servePipe(t, &pn, backendAddr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "id: 1\ndata: first\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-more:
			io.WriteString(w, "id: 2\ndata: hours later\n\n")
		case <-r.Context().Done():
		}
	}))
	p, _ := pipeProxy(t, &pn, proxy.Config{HTTP1TLS: k.path})
	m := &mesh{t: t}
	m.frontend("mcp", routedVIP, m.backend("mcp", snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: endpoints(backendAddr)}), nil)
	p.Update(m.snapshot(1))
	req, _ := http.NewRequest(http.MethodGet, "http://mcp.b.svc/mcp", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := pipeClient(t, p, k.h2c).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "id: 1\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
	time.Sleep(3 * time.Hour)
	synctest.Wait()
	close(more)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "data: first\n\nid: 2\ndata: hours later\n\n" {
		t.Errorf("after 3 h of quiet: %q, %v; want the rest of the stream, then its end", rest, err)
	}
}
