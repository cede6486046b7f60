package proxy_test

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// BenchmarkRequest measures one small request from an HTTP/1.1 app to a TLS
// backend on each of the proxy's speeds, next to the baseline users would
// write: httputil.ReverseProxy with a TLS transport; with keep-alive, and
// with a new client connection per request. The -routed variants send the
// same request through a GAMMA route (one rule, PathPrefix /, to the same
// backend); the -mcp variant to the same backend declared MCP, with the
// Mcp-Session-Id of a session it issued, as the app holds it (prefixed:
// the proxy parses the request, cuts the prefix and pins the endpoint);
// the -post variant a POST with a 100-byte body (Content-Length) in place
// of the GET. Compare allocs/op and B/op within one run (ns/op includes client and
// backend).
//
//	go test -run '^$' -bench Request -benchmem ./userspace-proxy/proxy/
func BenchmarkRequest(b *testing.B) {
	for _, c := range []struct {
		name              string
		path              proxy.HTTP1TLSPath
		routed, mcp, post bool
	}{{"sockmesh-pooled", proxy.HTTP1TLSPooled, false, false, false}, {"sockmesh-pooled-routed", proxy.HTTP1TLSPooled, true, false, false},
		{"sockmesh-pooled-mcp", proxy.HTTP1TLSPooled, false, true, false}, {"sockmesh-pooled-post", proxy.HTTP1TLSPooled, false, false, true},
		{"sockmesh-l4", proxy.HTTP1TLSL4, false, false, false}, {"sockmesh-l7", proxy.HTTP1TLSL7, false, false, false}, {"sockmesh-l7-routed", proxy.HTTP1TLSL7, true, false, false},
		{"baseline-reverseproxy", 0, false, false, false}} {
		for _, keepAlive := range []bool{true, false} {
			name := c.name + "/keep-alive"
			if !keepAlive {
				name = c.name + "/conn-per-request"
			}
			b.Run(name, func(b *testing.B) {
				e := newEnv(b, envOptions{http1TLS: c.path})
				be := startEcho(b, "bench", serverTLS(e.pki.server))
				spec := snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(be.addr)}
				if c.mcp {
					spec.Protocol = snapshot.ProtocolMCP
				}
				if c.routed {
					m := &mesh{t: b}
					ref := m.backend("echo", spec)
					m.frontend("echo", vip, ref, producer(routeSet(snapshot.KindHTTPRoute,
						rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(ref)}})))
					e.p.Update(m.snapshot(1))
				} else {
					e.p.Update(buildSnapshot(b, 1, service{name: "echo", vip: vip, backend: spec}))
				}
				cl := e.client(vip, false)
				target := "http://echo.b.svc/bytes/100"
				if c.name == "baseline-reverseproxy" {
					target = startReverseProxy(b, e, be)
					cl = &http.Client{Transport: &http.Transport{}}
				}
				method, body := http.MethodGet, []byte(nil)
				if c.post {
					method, body = http.MethodPost, make([]byte, 100)
				}
				req, err := http.NewRequest(method, target, bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				if c.mcp {
					req.Header.Set("Mcp-Session-Id", mcpSessionID(spec, "bench-session"))
				}
				cl.Transport.(*http.Transport).DisableKeepAlives = !keepAlive
				b.ReportAllocs()
				for b.Loop() {
					if c.post {
						req.Body, _ = req.GetBody()
					}
					resp, err := cl.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
	}
}

// mcpSessionID is the Mcp-Session-Id an app holds for the session id that
// be's first endpoint issued: the ID as the proxy's answer carried it
// (balance.Picker.MCPSession).
func mcpSessionID(be snapshot.Backend, id string) string {
	p := balance.New(&be, nil, nil)
	h := http.Header{"Mcp-Session-Id": {id}}
	p.MCPSession(h, p.Pick())
	return h.Get("Mcp-Session-Id")
}

func startReverseProxy(b *testing.B, e *env, be *backend) string {
	target, _ := url.Parse("https://" + be.addr.String())
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{ServerName: sniName, RootCAs: e.pki.ca.Pool(),
		ClientSessionCache: tls.NewLRUClientSessionCache(64)}, MaxIdleConnsPerHost: 64}
	srv := &http.Server{Handler: rp}
	l := listenLocal(b)
	go srv.Serve(l)
	b.Cleanup(func() { srv.Close() })
	return "http://" + l.Addr().String() + "/bytes/100"
}

// BenchmarkH2AppToH1Backend measures an h2c app's new connection and one
// small request to a TLS backend that speaks HTTP/1.1 only (translated by
// the L7 path), with the upstream handshakes each cost.
//
//	go test -run '^$' -bench H2AppToH1Backend -benchmem ./userspace-proxy/proxy/
func BenchmarkH2AppToH1Backend(b *testing.B) {
	e := newEnv(b, envOptions{})
	be := startEchoWith(b, echo.Config{Pod: "bench", TLS: serverTLS(e.pki.server), ALPN: echo.ALPNHTTP1})
	e.p.Update(buildSnapshot(b, 1, service{name: "echo", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(be.addr)}}))
	handshakes := func() float64 {
		return e.counter("sockmesh_proxy_upstream_tls_handshakes_total", map[string]string{"result": "full"}) +
			e.counter("sockmesh_proxy_upstream_tls_handshakes_total", map[string]string{"result": "resumed"})
	}
	cl := e.client(vip, true)
	cl.Transport.(*http.Transport).DisableKeepAlives = true
	b.ReportAllocs()
	before := handshakes()
	for b.Loop() {
		resp, err := cl.Get("http://echo.b.svc/bytes/100")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.ReportMetric((handshakes()-before)/float64(b.N), "handshakes/op")
}
