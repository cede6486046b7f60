package proxy

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/h2drain"
	"github.com/sockmesh/sockmesh/userspace-proxy/httpproxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/relay"
	"github.com/sockmesh/sockmesh/userspace-proxy/sniff"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstreamtls"
)

// Path is how a connection is served; it is the metric label.
type Path string

const (
	PathPassthrough Path = "passthrough"
	PathL4          Path = "l4"
	PathL4TLS       Path = "l4_tls"
	// PathL7 is net/http's server: HTTP/2 apps, and HTTP/1.x apps when
	// Config.HTTP1TLS is HTTP1TLSL7.
	PathL7 Path = "l7"
	// PathHTTP1 is the HTTP/1 fast path (httpproxy.Handler.ServeHTTP1).
	PathHTTP1 Path = "http1"
)

// ServeConn serves one redirected connection whose original destination is
// origDst. It takes ownership of c, and returns when the connection ends or
// goes on in goroutines of its own: a relay, net/http's server, an HTTP/1
// connection that parked. Those wait with small stacks, where the
// goroutine that accepted, sniffed, dialed and shook hands has grown to
// 8 KiB (test/bench/proxy -idle); Shutdown waits for them too. The accept
// loop calls it after resolving origDst; callers that resolve the
// destination themselves (tests, other listeners) may call it directly. A
// destination the current snapshot does not capture is closed at once. A
// *net.TCPConn is read and written with raw system calls (sockio).
func (p *Proxy) ServeConn(c net.Conn, origDst netip.AddrPort, client Client) {
	if !p.begin() {
		p.reject(c, "shutting_down", nil)
		return
	}
	p.serveConn(c, origDst, client)
}

// serveConn is ServeConn once begin registered the connection with
// Shutdown.
func (p *Proxy) serveConn(c net.Conn, origDst netip.AddrPort, client Client) {
	if tc, ok := c.(*net.TCPConn); ok {
		c = sockio.Wrap(tc)
	}
	cs := &connState{p: p, dst: origDst, client: client}
	defer func() {
		if !cs.handedOff {
			cs.end()
		}
	}()
	defer p.contain(c, origDst)
	v := p.current.Load()
	cs.key = limitKey(v.Snapshot, client)
	if !p.clients.enter(cs.key) {
		p.overLimit(c, cs.key, client)
		return
	}
	cs.entered = true
	fe, ok := v.Snapshot.Frontend(origDst)
	if !ok {
		// Redirected but not (or no longer) captured: relaying to origDst
		// would make the proxy dial a Service address; refuse instead.
		p.reject(c, "not_captured", nil)
		return
	}
	be := v.Backends.Get(fe.Backend)
	timeout := p.cfg.SniffTimeout
	if relaysAsIs(fe, be) {
		// Waiting for the app would only delay a server-first protocol's
		// greeting: what came already still labels the connection.
		timeout = sniff.Now
	}
	kind, sc, err := sniff.Sniff(c, timeout)
	if err != nil {
		p.m.rejected.WithLabelValues("closed_early").Inc()
		c.Close()
		return
	}
	cs.v, cs.fe, cs.be = v, fe, be
	switch path := p.choosePath(kind, fe, be); path {
	case PathL7, PathHTTP1:
		cs.serveHTTP(sc, path, nil)
	default:
		cs.serveL4(sc, path, kind)
	}
}

// overLimit resets a connection of client k, which has as many open as
// it may. On node listeners the log also names the source address.
func (p *Proxy) overLimit(c net.Conn, k clientKey, client Client) {
	if ok, held := p.clients.log.Allow(k, time.Now()); ok {
		attrs := []any{"client", k.String()}
		if client.Pod == nil {
			attrs = append(attrs, "addr", client.Addr.Addr().String())
		}
		p.log.Warn("client at its connection limit; new connection reset", append(attrs, "limit", p.cfg.MaxConnsPerClient, "suppressed", held)...)
	}
	p.reject(c, "client_limit", nil)
}

// contain recovers a panic of the connection's goroutine, as net/http's
// server does for its handlers: one connection's bug must not end the
// node's proxy, and every other pod's connections with it. The connection
// is reset; what it held (an upstream connection, a pool slot) may stay
// held. The goroutines it starts recover their own (package contain).
func (p *Proxy) contain(c net.Conn, origDst netip.AddrPort) {
	r := recover()
	if r == nil {
		return
	}
	p.panics.Report(r, "connection", "orig_dst", origDst.String())
	sockio.Reset(c)
}

// choosePath is the two-speed decision: L7 whenever a request must be looked
// at (GAMMA routes, fail-closed or no-endpoint answers, session
// persistence, a protocol change — including HTTP/2 to a TLS backend that
// lately declined h2 — an ExternalHostname backend's authority) and, by
// default, for HTTP/1.x to a TLS backend (pooled upstream TLS; see
// HTTP1TLSAuto); otherwise bytes are relayed. On a port with routes, what
// is not HTTP — the app's own TLS (passthrough: routes cannot see inside
// it) or other bytes — goes to the frontend's own backend, as routes only
// govern HTTP.
func (p *Proxy) choosePath(kind sniff.Kind, fe *snapshot.Frontend, be *upstream.Backend) Path {
	if kind == sniff.TLS {
		return PathPassthrough
	}
	isHTTP := kind == sniff.HTTP1 || kind == sniff.HTTP2
	if isHTTP && fe.Routes != nil {
		return p.l7For(kind)
	}
	tls := be.Err == nil && be.TLS()
	l4 := PathL4
	if tls {
		l4 = PathL4TLS
	}
	if !isHTTP || be.Spec.Protocol == snapshot.ProtocolTCP {
		return l4
	}
	l7 := p.l7For(kind)
	if be.Err != nil || be.Picker.Len() == 0 || be.Spec.SessionPersistence != nil || be.Spec.Protocol == snapshot.ProtocolMCP {
		return l7 // the app gets a 503 it can read, or a sticky endpoint (an MCP session's too)
	}
	if be.Authority != "" {
		return l7 // an external host gets its own name as authority
	}
	if !acceptsAsIs(be.Spec.Protocol, tls, kind) {
		return l7
	}
	if tls && kind == sniff.HTTP1 && p.cfg.HTTP1TLS != HTTP1TLSL4 {
		return l7
	}
	if tls && kind == sniff.HTTP2 && be.SpeaksH1Only(time.Now()) {
		return l7 // the relay's h2 would be refused again (serveL4)
	}
	return l4
}

// relaysAsIs reports whether a connection to fe is relayed unchanged
// whatever its first bytes are: no routes to look at them, and an opaque
// TCP backend without TLS origination, so an app's own TLS is never wrapped
// again (choosePath picks passthrough or l4 alike).
func relaysAsIs(fe *snapshot.Frontend, be *upstream.Backend) bool {
	return fe.Routes == nil && be.Err == nil && !be.TLS() && be.Spec.Protocol == snapshot.ProtocolTCP
}

// l7For is the L7 path for an app speaking kind: the fast path for HTTP/1.x
// unless configured otherwise, net/http's server for HTTP/2.
func (p *Proxy) l7For(kind sniff.Kind) Path {
	if kind == sniff.HTTP1 && p.cfg.HTTP1TLS != HTTP1TLSL7 {
		return PathHTTP1
	}
	return PathL7
}

// acceptsAsIs reports whether a backend of protocol proto takes the app's
// HTTP version unchanged, so relayed bytes are already the right wire.
func acceptsAsIs(proto snapshot.Protocol, tls bool, kind sniff.Kind) bool {
	switch proto {
	case snapshot.ProtocolHTTP11, snapshot.ProtocolWS, snapshot.ProtocolWSS:
		return kind == sniff.HTTP1
	case snapshot.ProtocolHTTP2, snapshot.ProtocolGRPC:
		return kind == sniff.HTTP2
	case snapshot.ProtocolH2C:
		return kind == sniff.HTTP2 && !tls
	}
	return true // Auto, HTTP: the app's own version is acceptable (MCP never relays: choosePath)
}

// connState is one connection being served.
type connState struct {
	p      *Proxy
	v      *httpproxy.View
	fe     *snapshot.Frontend
	be     *upstream.Backend
	dst    netip.AddrPort
	client Client
	// key is the client the connection counts against, once entered.
	key     clientKey
	entered bool
	// handedOff is set once what serves the connection on (the HTTP
	// paths, a relay) will call end: ServeConn then does not, also when
	// a panic unwinds through it from there.
	handedOff bool
}

// end is the connection's end for the proxy: its client's count and
// Shutdown's wait. ServeConn calls it, unless the connection was handed
// off (serveHTTP, serveL4's relay), whose end calls it then.
func (cs *connState) end() {
	if cs.entered {
		cs.p.clients.leave(cs.key)
	}
	cs.p.active.Done()
}

// serveL4 relays bytes to an endpoint: untouched for passthrough and
// cleartext, inside TLS when the backend asks. An invalid backend, no
// endpoint or a failed dial or handshake resets the client: opaque bytes
// have no way to carry an error.
func (cs *connState) serveL4(c *sniff.Conn, path Path, kind sniff.Kind) {
	p := cs.p
	if cs.be.Err != nil {
		cs.fail(c, path, upstream.ReasonInvalidPolicy, cs.be.Err)
		return
	}
	// An opaque TCP backend gets the app's bytes as they come, whatever
	// they look like: no ALPN offers HTTP, and nothing translates them.
	opaque := cs.be.Spec.Protocol == snapshot.ProtocolTCP
	var alpn []string
	if path == PathL4TLS && !opaque {
		switch kind {
		case sniff.HTTP1:
			alpn = upstream.WireH1.ALPN()
		case sniff.HTTP2:
			alpn = httpproxy.WireFor(cs.be, 2, false).ALPN()
		}
	}
	// A relayed HTTP/2 connection carries many requests for long: it goes
	// to the endpoint with the fewest of them (unless clients are pinned),
	// and is asked to move when that endpoint goes, the backend gains
	// endpoints or its settings change (package h2drain).
	relayedH2 := kind == sniff.HTTP2 && !opaque
	var load func(netip.AddrPort) int
	if relayedH2 && cs.be.Spec.ClientIPAffinitySeconds == 0 {
		load = p.h2.Load(cs.be.Spec.Ref)
	}
	up, ep, err := cs.dialAny(path, alpn, load)
	if err != nil && kind == sniff.Opaque && relaysAsIs(cs.fe, cs.be) {
		// ServeConn did not wait for the app's first bytes; without a
		// backend they decide again how it learns of the failure.
		if k, sc, serr := sniff.Sniff(c, p.cfg.SniffTimeout); serr == nil {
			kind, c, path = k, sc, p.choosePath(k, cs.fe, cs.be)
		}
	}
	if err != nil && (kind == sniff.HTTP1 || kind == sniff.HTTP2) {
		// An HTTP client can read an error: let the L7 path answer (it
		// maps the failure to 503 or 502). The connects were its first
		// request's tries, made as its own are: it answers without
		// connecting again (httpproxy.RelayFailure).
		cs.serveHTTP(c, p.l7For(kind), &httpproxy.RelayFailure{Backend: cs.be, Err: err})
		return
	}
	if err != nil {
		cs.fail(c, path, upstream.Classify(err), err)
		return
	}
	if relayedH2 && path == PathL4TLS && !negotiated(up, upstreamtls.ALPNH2) {
		// The backend speaks HTTP/1.1 only (by ALPN or by having none):
		// the L7 path translates the app's HTTP/2, and takes the
		// backend's next HTTP/2 apps directly for a while.
		cs.be.DeclinedH2(time.Now())
		up.Close()
		cs.serveHTTP(c, p.l7For(kind), nil)
		return
	}
	var sent int
	var head []byte
	if relayedH2 {
		// Over TLS too: a terminator may offer h2 by ALPN in front of an
		// HTTP/1.1 server.
		if sent, head, err = checkH2(c, up, p.cfg.SniffTimeout); err != nil {
			// A backend declared HTTP/2 that speaks something else: the
			// L7 path tells the app why, with its first request.
			up.Close()
			cs.serveHTTP(c, p.l7For(kind), &httpproxy.RelayFailure{Backend: cs.be, Err: err})
			return
		}
	}
	var app net.Conn = p.counted(c)
	var untrackH2 func()
	if relayedH2 {
		ref := cs.be.Spec.Ref
		dc := h2drain.NewConn(app)
		p.h2.Add(ref, ep.Addr, dc, cs.be.Held(up, alpn))
		untrackH2 = func() { p.h2.Remove(ref, dc) }
		app = dc
		if now := p.current.Load(); now != cs.v || ep.Fallback > 0 {
			// A snapshot applied while this connection was dialed did
			// not see it, nor, on a fallback endpoint, an endpoint
			// preferred to it that came back meanwhile (endpointBack):
			// measure it now.
			p.h2.Update(func(r snapshot.BackendRef) (h2drain.Endpoints, bool) {
				if r != ref {
					return h2drain.Endpoints{}, false
				}
				return changed(cs.be, now.Backends.Get(r))
			})
		}
	}
	if sent > 0 {
		// Through app, whose frames h2drain follows from the first. The
		// replay holds what the backend took, and a failed write is the
		// relay's to meet.
		io.CopyN(io.Discard, app, int64(sent))
		app.Write(head)
	}
	pm := p.m.byPath[path]
	pm.active.Inc()
	pm.conns.Inc()
	p.trackConn(c, true)
	p.trackConn(up, true)
	cs.handedOff = true
	go cs.relay(c, app, up, path, pm, untrackH2)
}

// relay relays c (as app: c, or c under a wrapper) and up until both
// directions end, in a goroutine of its own: a relay lasts as long as its
// connection, often idle (a gRPC channel, a database client's pool), and
// waits there with the small stack of a goroutine that never dialed or
// shook hands, where the one that did has grown to 8 KiB
// (test/bench/proxy -idle).
func (cs *connState) relay(c, app, up net.Conn, path Path, pm pathMetrics, untrackH2 func()) {
	p := cs.p
	defer cs.end()
	defer p.contain(c, cs.dst)
	if untrackH2 != nil {
		defer untrackH2()
	}
	defer pm.active.Dec()
	watched := upstream.ForRelay(up)
	relay.Relay(app, watched, p.bufs, p.panics)
	if err := upstream.Refused(watched); err != nil {
		// A TLS 1.3 backend refused the client certificate after the
		// handshake: the relay reset the app, as a handshake that failed
		// before it would have; it counts and logs as one.
		cs.fail(c, path, upstream.Classify(err), err)
	}
	p.trackConn(c, false)
	p.trackConn(up, false)
}

// dialAny dials ready endpoints in turn until one answers, and returns its
// connection and endpoint: a failed connect sent no byte, so another
// endpoint, one the connection has not tried while there is one, may be
// tried (at most three; pick). It fails with the last try's error, as the
// L7 path's tries do: a certificate that failed verification after a
// refused connect is a 502, not both.
func (cs *connState) dialAny(path Path, alpn []string, load func(netip.AddrPort) int) (net.Conn, snapshot.Endpoint, error) {
	var err error
	var tried balance.Tried
	for range min(cs.be.Picker.Len(), 3) {
		choice := cs.pick(load, tried)
		var up net.Conn
		if path == PathPassthrough {
			// The app's own TLS goes through untouched: no origination.
			up, err = cs.be.DialRaw(context.Background(), choice)
		} else {
			up, err = cs.be.Dial(context.Background(), choice, alpn)
		}
		if err == nil {
			return up, choice.Endpoint, nil
		}
		if !upstream.NoConnection(err) {
			break
		}
		tried.Add(choice.Endpoint.Addr)
	}
	if err == nil {
		return nil, snapshot.Endpoint{}, upstream.ErrNoEndpoints
	}
	return nil, snapshot.Endpoint{}, err
}

// pick is the endpoint for the connection's try after its connects to
// those in tried failed (none: its first try). With load, the endpoint
// with the least load (balance.Picker.PickFewest); else its client's
// (PickClient: the endpoint it is pinned to under ClientIP affinity). A
// try after a failed connect goes to an endpoint not in tried while there
// is one, as Envoy's TCP proxy tries other hosts for its connect attempts:
// ejection does not keep every failed one out (balance.Tried), and a
// pinned client's endpoint is handed out again until it is ejected; the
// client is pinned to the endpoint the try goes to.
func (cs *connState) pick(load func(netip.AddrPort) int, tried balance.Tried) *balance.Choice {
	p := cs.be.Picker
	if load != nil {
		return p.FewestUntried(load, tried)
	}
	client := balance.ClientOf(cs.v.Snapshot, cs.client.Addr, cs.client.Pod)
	if len(tried) == 0 {
		return p.PickClient(client)
	}
	return p.FailoverClient(client, tried)
}

func negotiated(c net.Conn, proto string) bool {
	tc, ok := c.(*tls.Conn)
	return ok && tc.ConnectionState().NegotiatedProtocol == proto
}

func (cs *connState) fail(c net.Conn, path Path, reason upstream.Reason, err error) {
	p := cs.p
	lvl, held := p.failures.Level(upstream.FailureKey{Service: cs.fe.Service, Backend: cs.be.Spec.Ref, Path: string(path), Reason: reason}, cs.be, err)
	attrs := []any{"service", cs.fe.Service.String(), "backend", cs.be.Spec.Ref.String(), "orig_dst", cs.dst.String(),
		"client", httpproxy.ClientName(cs.v.Snapshot, cs.client.Addr, cs.client.Pod), "path", string(path), "reason", string(reason), "snapshot_version", cs.v.Snapshot.Version, "err", err}
	for _, a := range upstream.PolicyAttrs(cs.be, reason, err) {
		attrs = append(attrs, a)
	}
	if held > 0 {
		attrs = append(attrs, "suppressed", held)
	}
	p.log.Log(context.Background(), lvl, "connection failed", attrs...)
	// Counted once logged: whoever sees the count finds its line.
	p.m.failed.WithLabelValues(string(path), string(reason)).Inc()
	sockio.Reset(c)
}

// serveHTTP serves c on an L7 path: the fast path in this goroutine, or
// net/http's server, after the relay's failed connects when relayed is
// set. Either may serve c past its return (a fast-path connection that
// parked; net/http's server always); cs ends when c does.
func (cs *connState) serveHTTP(c *sniff.Conn, path Path, relayed *httpproxy.RelayFailure) {
	p := cs.p
	pm := p.m.byPath[path]
	pm.active.Inc()
	pm.conns.Inc()
	// Tracked for Shutdown to force, on both paths: http.Server.Close
	// leaves hijacked connections (WebSocket relays) open.
	p.trackConn(c, true)
	ended := func() {
		pm.active.Dec()
		p.trackConn(c, false)
		cs.end()
	}
	t := &httpproxy.Target{OrigDst: cs.dst, Start: cs.v, Current: &p.current, ClientAddr: cs.client.Addr, ClientPod: cs.client.Pod, Ended: ended, Relayed: relayed, Conn: c}
	cs.handedOff = true // ServeHTTP1, net/http's server or a failed push calls ended
	if path == PathHTTP1 {
		p.h.ServeHTTP1(p.counted(c), t)
		return
	}
	// net/http's server reads and writes c on goroutines of its own
	// (an HTTP/2 connection's frame reader, an HTTP/1.1 connection's
	// background read): contain panics in the proxy's layers beneath.
	lc := &l7Conn{countedConn: *p.counted(p.panics.Conn(c, "app connection")), target: t}
	if !p.l7.push(lc) {
		sockio.Reset(c)
		ended()
	}
}

// countedConn counts the bytes a served connection moves in
// sockmesh_proxy_bytes_total as they move: a relay or WebSocket that lives
// for days shows its traffic meanwhile, not when it ends. A read or write
// moves at most a copy buffer (64 KiB), and the counters add integers
// atomically.
type countedConn struct {
	net.Conn
	rx, tx prometheus.Counter
}

// counted is c counted in the proxy's byte counters.
func (p *Proxy) counted(c net.Conn) *countedConn {
	return &countedConn{Conn: c, rx: p.m.bytesUp, tx: p.m.bytesDown}
}

func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.rx.Add(float64(n))
	return n, err
}

func (c *countedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.tx.Add(float64(n))
	return n, err
}

// NetConn exposes the connection underneath (half-close, reset).
func (c *countedConn) NetConn() net.Conn { return c.Conn }

// ReadPooled is Read for a relay (sockio.Pooled) when the connection
// underneath is a sockio.PooledReader.
func (c *countedConn) ReadPooled(bufs sockio.Buffers) (*[]byte, int, error) {
	bp, n, err := c.Conn.(sockio.PooledReader).ReadPooled(bufs)
	c.rx.Add(float64(n))
	return bp, n, err
}

// l7Conn carries a connection's Target into the HTTP server, whose
// Ended it calls when the server closes the connection.
type l7Conn struct {
	countedConn
	target *httpproxy.Target
	once   sync.Once
}

func (c *l7Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.target.Ended)
	return err
}

// connListener feeds connections the proxy already accepted and classified
// to its http.Server.
type connListener struct {
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *connListener) push(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.closed:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *connListener) Addr() net.Addr { return &net.TCPAddr{} }
