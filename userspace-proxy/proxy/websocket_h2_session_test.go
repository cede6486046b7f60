package proxy_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"testing"

	"github.com/coder/websocket"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestWebSocketOverH2Session: a WebSocket to a backend declared h2c with
// session persistence by cookie — the backend's (XBackendTrafficPolicy)
// or its route rule's — whose endpoints take RFC 8441 extended CONNECT,
// or refuse it and take the HTTP/1.1 Upgrade, gets the session cookie
// with its 101 (an HTTP/1.1 app) or 200 (an HTTP/2 app's extended
// CONNECT), and the WebSockets opened with the cookie after it, either
// way, land on the endpoint that answered the first.
func TestWebSocketOverH2Session(t *testing.T) {
	checkNoLeaks(t)
	sp := &snapshot.SessionPersistence{Type: snapshot.SessionCookie, Name: "sm-session"}
	kinds := map[string]func(t *testing.T, pod string) netip.AddrPort{
		"extended-connect": startXConnectPod,
		"fallback": func(t *testing.T, pod string) netip.AddrPort {
			addr, _ := startH2WithoutXConnect(t, pod)
			return addr
		},
	}
	for kind, start := range kinds {
		for _, where := range []string{"backend", "rule"} {
			t.Run(kind+"/"+where, func(t *testing.T) {
				e := newEnv(t, envOptions{})
				m := &mesh{t: t}
				be := snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(start(t, "ws-0"), start(t, "ws-1"))}
				rr := snapshot.RouteRule{}
				if where == "backend" {
					be.SessionPersistence = sp
				} else {
					rr.SessionPersistence = sp
				}
				ref := m.backend("ws-be", be)
				rr.Backends = to(ref)
				m.frontend("ws", vip, ref, producer(routeSet(snapshot.KindHTTPRoute, rule{[]snapshot.RouteMatch{prefixMatch("/")}, rr})))
				e.p.Update(m.snapshot(1))

				pod, cookie := openSessionWS(t, e, nil)
				if cookie == "" {
					t.Fatal("the first WebSocket's 101 carried no sm-session cookie")
				}
				for i := range 8 {
					if got, _ := openSessionWS(t, e, http.Header{"Cookie": {cookie}}); got != pod {
						t.Errorf("WebSocket %d of the session landed on %s, want %s", i, got, pod)
					}
				}
				for i := range 2 {
					st, err := startH2(e.appConn(t, vip), append(wsConnect("websocket", "ws.b.svc", "/ws"), [2]string{"cookie", cookie}), false)
					if err != nil || st.status != "200" {
						t.Fatalf("HTTP/2 app's extended CONNECT %d: %v, %v", i, st, err)
					}
					_, first, err := readWSFrame(st)
					if err != nil {
						t.Fatal(err)
					}
					if got := podOf(t, st.header, first); got != pod {
						t.Errorf("HTTP/2 app's WebSocket %d of the session landed on %s, want %s", i, got, pod)
					}
				}
				// Without the cookie, WebSockets spread: the session, not
				// chance, kept them on one endpoint.
				seen := map[string]bool{}
				for range 16 {
					got, _ := openSessionWS(t, e, nil)
					seen[got] = true
				}
				if len(seen) != 2 {
					t.Errorf("WebSockets without the cookie landed on %v, want both endpoints", seen)
				}
			})
		}
	}
}

// openSessionWS opens a WebSocket by an HTTP/1.1 app's Upgrade with
// header, and returns the endpoint that took it and the sm-session cookie
// its 101 set ("" without one), as a Cookie field's value.
func openSessionWS(t *testing.T, e *env, header http.Header) (pod, cookie string) {
	t.Helper()
	ctx := context.Background()
	c, resp, err := websocket.Dial(ctx, "ws://ws.b.svc/ws", &websocket.DialOptions{HTTPClient: e.client(vip, false), HTTPHeader: header})
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	defer c.CloseNow()
	_, first, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range resp.Header.Values("Set-Cookie") {
		if ck, err := http.ParseSetCookie(sc); err == nil && ck.Name == "sm-session" {
			cookie = ck.Name + "=" + ck.Value
		}
	}
	c.Close(websocket.StatusNormalClosure, "")
	return podOf(t, resp.Header, first), cookie
}

// podOf names the endpoint that answered a WebSocket: its answer's X-Pod
// (startXConnectPod's), or the pod its first message reports (the echo
// server's, behind startH2WithoutXConnect).
func podOf(t *testing.T, header http.Header, first []byte) string {
	t.Helper()
	if p := header.Get("X-Pod"); p != "" {
		return p
	}
	var rep struct{ Pod string }
	if err := json.Unmarshal(first, &rep); err != nil || rep.Pod == "" {
		t.Fatalf("first message %q names no pod: %v", first, err)
	}
	return rep.Pod
}

// startXConnectPod runs startXConnectEcho's h2c server whose answers
// carry X-Pod: pod.
func startXConnectPod(t *testing.T, pod string) netip.AddrPort {
	l := listenLocal(t)
	srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Pod", pod)
		xconnectEcho(w, r)
	})}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).AddrPort()
}
