package proxy_test

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestH2AppVanished: an HTTP/2 app connection whose app stops answering
// while a stream on it stays open — a long poll not answered yet, an
// answer that never ends (SSE), a WebSocket over extended CONNECT, each
// to an HTTP/1.1 backend — is pinged once the app has sent no frame for
// Config.AppPingAfter, and closed when no ack comes within
// AppPingTimeout; the stream's backend connection is released, and a
// request not answered yet counts as the app's leaving (canceled; one
// answered counts with its status, as for an app that hangs up).
// Before, the proxy's HTTP/2 server sent no ping: IdleTimeout spares
// connections with streams, and the listeners accept without TCP
// keep-alive, so both connections stayed open for the proxy's life.
func TestH2AppVanished(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{appPingAfter: 200 * time.Millisecond})
	// serve starts a backend that answers a request's head with answer
	// (nothing when ""); asked gets a value when a request came, freed
	// when its connection ended: the proxy let it go.
	type backend struct {
		addr         netip.AddrPort
		asked, freed chan struct{}
	}
	serve := func(answer func(*http.Request) string) backend {
		b := backend{asked: make(chan struct{}, 1), freed: make(chan struct{}, 1)}
		b.addr = serveTCP(t, nil, func(c net.Conn) {
			defer func() { b.freed <- struct{}{} }()
			c.SetDeadline(time.Now().Add(hangGuard))
			br := bufio.NewReader(c)
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.WriteString(c, answer(req))
			b.asked <- struct{}{}
			io.Copy(io.Discard, br) // until the proxy closes it
		})
		return b
	}
	poll := serve(func(*http.Request) string { return "" })
	sse := serve(func(*http.Request) string {
		return sseHead
	})
	ws := serve(func(r *http.Request) string {
		h := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		return fmt.Sprintf("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			base64.StdEncoding.EncodeToString(h[:]))
	})
	vPoll, vSSE, vWS := netip.MustParseAddrPort("10.96.4.20:80"), netip.MustParseAddrPort("10.96.4.21:80"), netip.MustParseAddrPort("10.96.4.22:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "poll", vip: vPoll, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(poll.addr)}},
		service{name: "events", vip: vSSE, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(sse.addr)}},
		service{name: "ws", vip: vWS, backend: snapshot.Backend{Protocol: snapshot.ProtocolWS, Endpoints: endpoints(ws.addr)}},
	))
	get := func(authority, path string) [][2]string {
		return [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", path}, {":authority", authority}}
	}
	for _, tc := range []struct {
		name string
		vip  netip.AddrPort
		be   backend
		// fields open the stream, ending the request when end is set;
		// status is the answer's the app waits for ("": none).
		fields [][2]string
		end    bool
		status string
		// counted is the series the request counts in.
		counted string
		labels  map[string]string
	}{
		{"long-poll", vPoll, poll, get("poll.b.svc", "/watch"), true, "", "sockmesh_proxy_request_failures_total", map[string]string{"reason": "canceled"}},
		{"answer-stream", vSSE, sse, get("events.b.svc", "/events"), true, "200", "sockmesh_proxy_requests_total", map[string]string{"service": "events", "code": "200"}},
		{"websocket", vWS, ws, wsConnect("websocket", "ws.b.svc", "/ws"), false, "200", "sockmesh_proxy_requests_total", map[string]string{"service": "ws", "code": "200"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counted := e.counter(tc.counted, tc.labels)
			c := e.appConn(t, tc.vip)
			if tc.status == "" {
				if _, err := sendH2(c, tc.fields, tc.end); err != nil {
					t.Fatal(err)
				}
			} else if s := requestH2(t, c, tc.fields, tc.end); s.status != tc.status {
				t.Fatalf("answered %s, want %s", s.status, tc.status)
			}
			waitFor(t, tc.be.asked, "the backend to get the request")
			// From here the app answers nothing: frames are read, never
			// acked, until the proxy closes the connection.
			fr := http2.NewFramer(io.Discard, c)
			pinged := false
			var err error
			for err == nil {
				var f http2.Frame
				f, err = fr.ReadFrame()
				if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
					pinged = true
				}
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the proxy kept the unanswering app's connection open for %v", hangGuard)
			}
			if !pinged {
				t.Errorf("the connection ended (%v) with no PING from the proxy", err)
			}
			waitFor(t, tc.be.freed, "the backend's connection to be closed after the app's")
			if got := e.counterReaches(tc.counted, tc.labels, counted+1); got != counted+1 {
				t.Errorf("%s%v went from %v to %v, want one more", tc.counted, tc.labels, counted, got)
			}
		})
	}
	eventually(t, func() bool {
		return e.counter("sockmesh_proxy_active_connections", map[string]string{"path": "l7"}) == 0
	},
		"the proxy to forget the closed app connections")
}

// sseHead starts an answer of server-sent events that never ends.
const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\nc\r\ndata: first\n\r\n"

// h1Paths are the L7 paths of an HTTP/1.x app, by name: the fast path
// and net/http's server.
var h1Paths = map[string]proxy.HTTP1TLSPath{"fast": proxy.HTTP1TLSAuto, "nethttp": proxy.HTTP1TLSL7}

// TestH1LongAnswerKeepAlive: on either HTTP/1 path, an answer that
// outlasts a second (an SSE stream) turns TCP keep-alive on for the
// proxy's socket toward the app, whose probes end the wait of an app that
// vanished without a word (the fast path's client watch, net/http's
// background read); quick answers leave it off, as ListenConfig accepted
// it: a connection per request pays no setsockopt. Before, nothing turned
// it on: such an app's answer, and its pooled backend connection, stayed
// open for the proxy's life (on net/http's server until 2026-11-29).
func TestH1LongAnswerKeepAlive(t *testing.T) {
	for name, path := range h1Paths {
		t.Run(name, func(t *testing.T) { testH1LongAnswerKeepAlive(t, path) })
	}
}

func testH1LongAnswerKeepAlive(t *testing.T, path proxy.HTTP1TLSPath) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{registeredDst: true, http1TLS: path})
	be := serveTCP(t, serverTLS(e.pki.server), func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if req.URL.Path != "/events" {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				continue
			}
			io.WriteString(c, sseHead)
			io.Copy(io.Discard, br) // until the proxy closes it
			return
		}
	})
	v := netip.MustParseAddrPort("10.96.4.23:80")
	e.p.Update(buildSnapshot(t, 1, service{name: "events", vip: v, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, TLS: tlsPolicy(e), Endpoints: endpoints(be)}}))
	ln, err := proxy.ListenConfig().Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go e.p.Serve(ln)
	c := dialListener(t, e, ln, v)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /quick HTTP/1.1\r\nHost: events.b.svc\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("quick answer: %v, %v", resp, err)
	} else if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	if keepAlive(t, c) {
		t.Error("a quick answer turned keep-alive on")
	}
	io.WriteString(c, "GET /events HTTP/1.1\r\nHost: events.b.svc\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("event stream: %v, %v", resp, err)
	}
	eventually(t, func() bool { return keepAlive(t, c) }, "keep-alive on the app's connection of a long answer")
}

// TestH1VanishedApp: an app in a netns of the test's own, on either
// HTTP/1 path with an SSE answer under way, vanishes (the netns drops
// every packet): the keep-alive turned on a second into the exchange ends
// the wait on the app (the fast path's client watch, net/http's
// background read), and the exchange's backend connection is closed. The
// test shortens the proxy's socket's probe timing to 1 s, where Go's
// default (15 s, then 9 probes 15 s apart) would take 150 s.
func TestH1VanishedApp(t *testing.T) {
	for name, path := range h1Paths {
		t.Run(name, func(t *testing.T) { testH1VanishedApp(t, path) })
	}
}

func testH1VanishedApp(t *testing.T, path proxy.HTTP1TLSPath) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{http1TLS: path})
	freed := make(chan struct{}, 1)
	be := serveTCP(t, serverTLS(e.pki.server), func(c net.Conn) {
		defer func() { freed <- struct{}{} }()
		c.SetDeadline(time.Now().Add(hangGuard))
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, sseHead)
		io.Copy(io.Discard, br) // until the proxy closes it
	})
	v := netip.MustParseAddrPort("10.96.4.24:80")
	e.p.Update(buildSnapshot(t, 1, service{name: "events", vip: v, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, TLS: tlsPolicy(e), Endpoints: endpoints(be)}}))
	ns := sandbox.NewNetNS(t)
	ln, err := ns.Listen(context.Background(), proxy.ListenConfig(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		if c, err := ln.Accept(); err == nil {
			e.p.ServeConn(c, v, proxy.Client{Addr: c.RemoteAddr().(*net.TCPAddr).AddrPort()})
		}
	}()
	c, err := ns.Dial(&net.Dialer{KeepAlive: -1}, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(hangGuard))
	io.WriteString(c, "GET /events HTTP/1.1\r\nHost: events.b.svc\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("event stream: %v, %v", resp, err)
	}
	eventually(t, func() bool { return keepAlive(t, c) }, "keep-alive on the app's connection of a long answer")
	fd := proxySocket(t, c)
	for _, opt := range []int{unix.TCP_KEEPIDLE, unix.TCP_KEEPINTVL, unix.TCP_KEEPCNT} {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, opt, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"add", "table", "inet", "vanish"}, {"add", "chain", "inet", "vanish", "in", "{ type filter hook input priority 0; policy drop; }"}} {
		if out, err := exec.Command("ip", append([]string{"netns", "exec", ns.Name, "nft"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("nft %v: %v: %s", args, err, out)
		}
	}
	waitFor(t, freed, "the backend's connection to be closed after the app vanished")
}
