package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/h2drain"
	"github.com/sockmesh/sockmesh/userspace-proxy/httpproxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/origdst"
	"github.com/sockmesh/sockmesh/userspace-proxy/relay"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// Config configures a Proxy. The zero value is a working proxy that marks its
// upstream sockets with mark.Proxy (which needs CAP_NET_ADMIN).
type Config struct {
	// Upstream bounds pools and holds the TLS inputs that do not come from
	// the snapshot (a test-controlled system root pool, session cache size).
	Upstream upstream.Config
	// Dial configures the direct dialer (SO_MARK, timeouts); ignored when
	// Dialer is set.
	Dial dial.Config
	// Dialer replaces the direct dialer (e.g. a node-to-node tunnel); nil
	// dials endpoints directly.
	Dialer dial.Dialer
	// SniffTimeout is how long a new connection may stay silent before it is
	// taken for a server-first protocol and relayed as opaque TCP; 0 means
	// 500 ms.
	SniffTimeout time.Duration
	// HTTP1TLS says which path serves HTTP/1.x apps whose backend needs only
	// TLS origination; the zero value is the measured default (see
	// HTTP1TLSPath).
	HTTP1TLS HTTP1TLSPath
	// ReadHeaderTimeout bounds reading a request's headers on the L7 paths;
	// 0 means 30 s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes L7 client connections idle this long; 0 means
	// 5 min.
	IdleTimeout time.Duration
	// AppPingAfter is how long an HTTP/2 app connection may go without a
	// frame from the app before the proxy pings it; without an answer
	// within AppPingTimeout the connection closes and its streams end as
	// the app's leaving (canceled). IdleTimeout closes only connections
	// without streams, and the listeners accept without TCP keep-alive
	// (ListenConfig): a stream left open (a gRPC server stream, a watch,
	// a WebSocket) on a connection whose app vanished without a word
	// would hold its backend side for the proxy's life. 0 means 5 min and
	// 15 s, as toward backends (upstream.Config.H2PingAfter says why no
	// sooner).
	AppPingAfter, AppPingTimeout time.Duration
	// ParkAfter is httpproxy.Config.ParkAfter: how long an HTTP/1 fast-path
	// connection waits for a request before it waits with a smaller stack.
	ParkAfter time.Duration
	// StallTimeout is httpproxy.Config.StallTimeout: how long an app may
	// leave a read of its request body, or a write of its answer, under
	// way with no byte through before the request is ended; 0 means 60 s.
	StallTimeout time.Duration
	// Routing says how GAMMA route rules are executed where a rule leaves
	// it to the proxy (default timeouts, retry backoff, body replay,
	// mirrors); the zero value is httpproxy's documented defaults.
	Routing httpproxy.RoutingConfig
	// FailureLogEvery is how often a failure of one kind (service,
	// backend, path or HTTP, reason) is logged at Warn at most; the others
	// go to Debug and are counted on the next line. 0 means 10 s.
	FailureLogEvery time.Duration
	// MaxConnsPerClient bounds the connections one client has open
	// through the proxy: a pod (on a node listener, the enrolled pod
	// holding the source address, both families together), the node's
	// host network (every enrolled host-network pod), or a source address
	// no enrolled pod holds. Past it, its new connections are reset
	// (rejected, reason client_limit) while other clients are served. 0
	// means no limit.
	MaxConnsPerClient int
	// OrigDst, when set, is asked for the original destination of an
	// accepted connection getsockopt(SO_ORIGINAL_DST) has none for: the
	// agent passes the datapath's record (datapath.Datapath.OrigDst),
	// which answers where no getsockopt program runs for the socket's
	// cgroup (an agent outside its --cgroup; a connection an older
	// agent's listener accepted and handed over as it closed). nil:
	// getsockopt only.
	OrigDst func(syscall.Conn) (netip.AddrPort, error)
	// RebalanceSpread is how long the GOAWAYs that move relayed HTTP/2
	// connections onto a backend's new endpoints, or back from fallback
	// ones, are spread over, so that their clients do not all connect
	// again at once (package h2drain; those new TLS or protocol settings
	// do not keep go at once); 0 means 5 s.
	RebalanceSpread time.Duration
}

// HTTP1TLSPath chooses how HTTP/1.x apps reach a backend that needs TLS
// origination: relayed bytes (L4) or forwarded requests (L7).
type HTTP1TLSPath uint8

const (
	// HTTP1TLSAuto is the measured default, HTTP1TLSPooled. Measured with
	// test/bench/proxy (test/bench/proxy/RESULTS.md; 2 shared cores):
	// against nginx, the pooled fast path serves about 1.0× the requests/s
	// with keep-alive and 100 B or 64 KiB answers (L4 1.0×, net/http
	// 0.6×), and 0.85–0.95× with a connection per request, where L4 served
	// 0.16–0.26× (an L4 connection pays a resumed TLS handshake, the pool
	// reuses a connection) and net/http 0.7×. It also sees each request
	// (metrics, snapshot swaps, 503s).
	HTTP1TLSAuto HTTP1TLSPath = iota
	// HTTP1TLSL4 wraps the app's bytes in TLS, one upstream connection (with
	// session resumption) per client connection.
	HTTP1TLSL4
	// HTTP1TLSL7 forwards requests through net/http's server and Transport,
	// which negotiate h2 with backends that offer it (XBackend HTTP); every
	// HTTP/1.x app that needs L7 then takes that path too. It reads
	// requests as net/http's server does, which settles ambiguous framing
	// (Content-Length with chunked, Transfer-Encoding in HTTP/1.0) instead
	// of refusing it as the fast path does.
	HTTP1TLSL7
	// HTTP1TLSPooled forwards requests on the HTTP/1 fast path
	// (httpproxy.Handler.ServeHTTP1) over pooled HTTP/1.1 upstream
	// connections.
	HTTP1TLSPooled
)

// Client identifies the client side of a redirected connection.
type Client struct {
	// Addr is the client's address as the listener saw it.
	Addr netip.AddrPort
	// Pod is the client pod when the listener knows it (in-pod mode); nil
	// means look it up by Addr in the snapshot (node-IP mode).
	Pod *snapshot.ObjectRef
}

// Proxy serves redirected connections; see the package documentation.
type Proxy struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	pools   *upstream.Pools
	bufs    *relay.Pool
	current atomic.Pointer[httpproxy.View]
	h       *httpproxy.Handler
	srv     *http.Server
	l7      *connListener

	mu      sync.Mutex
	closing bool
	// forced is set once Shutdown reset what was open: a connection
	// tracked after that (its dial was under way) is reset at once.
	forced    bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{} // L4 and passthrough connections
	active    sync.WaitGroup        // running ServeConn calls
	updateMu  sync.Mutex            // serialises Update
	// work hands accepted connections to idle workers; stop ends them.
	work chan accepted
	stop chan struct{}
	// workerIdle ends a worker without one (the package's workerIdle).
	workerIdle time.Duration
	// failures sets the level of "connection failed" lines
	// (connState.fail); panics reports recovered panics (contain).
	failures *upstream.FailureLog
	panics   *contain.Reporter
	clients  *clientConns
	// h2 holds the relayed HTTP/2 connections, to ask them to go away
	// when their endpoint goes, their backend gains endpoints or changes
	// settings, or the proxy shuts down.
	h2 *h2drain.Registry
}

// New returns a Proxy serving the empty snapshot until Update.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Proxy, error) {
	if cfg.SniffTimeout == 0 {
		cfg.SniffTimeout = 500 * time.Millisecond
	}
	if cfg.ReadHeaderTimeout == 0 {
		cfg.ReadHeaderTimeout = 30 * time.Second
	}
	if cfg.FailureLogEvery <= 0 {
		cfg.FailureLogEvery = 10 * time.Second
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.AppPingAfter == 0 {
		cfg.AppPingAfter = 5 * time.Minute
	}
	if cfg.AppPingTimeout == 0 {
		cfg.AppPingTimeout = 15 * time.Second
	}
	if cfg.RebalanceSpread == 0 {
		cfg.RebalanceSpread = 5 * time.Second
	}
	log = log.With("component", "proxy")
	bufs := relay.NewPool()
	m, err := newMetrics(reg, bufs)
	if err != nil {
		return nil, err
	}
	panics, err := contain.New(log, reg, cfg.FailureLogEvery)
	if err != nil {
		return nil, err
	}
	d := cfg.Dialer
	if d == nil {
		d = dial.NewDirect(cfg.Dial)
	}
	cfg.Upstream.Panics = panics
	var p *Proxy // set below, before any connect
	var h *httpproxy.Handler
	cfg.Upstream.EndpointBack = func() { p.endpointBack() }
	cfg.Upstream.StreamResent = func() { h.StreamResent() }
	pools, err := upstream.New(cfg.Upstream, d, log, reg)
	if err != nil {
		return nil, err
	}
	h, err = httpproxy.New(httpproxy.Config{Buffers: bufs, ReadHeaderTimeout: cfg.ReadHeaderTimeout, IdleTimeout: cfg.IdleTimeout, ParkAfter: cfg.ParkAfter, StallTimeout: cfg.StallTimeout, Routing: cfg.Routing,
		FailureLogEvery: cfg.FailureLogEvery, Panics: panics}, log, reg)
	if err != nil {
		return nil, err
	}
	p = &Proxy{
		cfg: cfg, log: log, m: m, pools: pools, bufs: bufs, h: h, workerIdle: workerIdle,
		l7:        newConnListener(),
		failures:  upstream.NewFailureLog(cfg.FailureLogEvery),
		panics:    panics,
		clients:   newClientConns(cfg.MaxConnsPerClient, cfg.FailureLogEvery),
		h2:        h2drain.NewRegistry(cfg.RebalanceSpread, m.goAway, func() { p.endpointBack() }, panics),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[net.Conn]struct{}),
		work:      make(chan accepted),
		stop:      make(chan struct{}),
	}
	p.srv = &http.Server{
		Handler:           h,
		Protocols:         new(http.Protocols),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		HTTP2:             &http.HTTP2Config{SendPingTimeout: cfg.AppPingAfter, PingTimeout: cfg.AppPingTimeout},
		// "OPTIONS *" asks the backend's server, as the fast path forwards
		// it: net/http's server would answer it itself, past routes.
		DisableGeneralOptionsHandler: true,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return httpproxy.WithTarget(ctx, c.(*l7Conn).target)
		},
		// TCP keep-alive for a connection once an exchange on it outlasts
		// a second, as on the fast path (ListenConfig).
		ConnState: func(c net.Conn, s http.ConnState) { c.(*l7Conn).target.ConnState(s) },
		ErrorLog:  slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	p.srv.Protocols.SetHTTP1(true)
	p.srv.Protocols.SetUnencryptedHTTP2(true)
	// HTTP2.MaxConcurrentStreams stays net/http's 250: an HTTP/2 app's
	// streams to an HTTP/1.1 backend each hold a pooled connection, but a
	// pod may open MaxConnsPerClient (4096) connections anyway, more than
	// an endpoint's 1024. The stall timeout and the pool's bounded wait
	// bound what either holds; fewer streams would queue gRPC clients
	// that multiplex on one connection.
	p.Update(snapshot.Empty())
	go p.srv.Serve(p.l7)
	if !strings.Contains(os.Getenv("GODEBUG"), "http2xconnect=1") {
		log.Info("websocket over http/2 disabled: start the process with GODEBUG=http2xconnect=1")
	}
	return p, nil
}

// Update makes s the snapshot for new connections and requests. Connections
// already relaying keep the snapshot they started with; each L7 request uses
// the snapshot current when it started. Backends whose protocol and TLS
// settings are unchanged keep their pools and TLS session caches; those
// whose TLS settings changed keep the pooled and relayed connections the
// new settings still verify (upstreamtls.Keeper.Keep).
func (p *Proxy) Update(s *snapshot.Snapshot) {
	p.updateMu.Lock()
	defer p.updateMu.Unlock()
	var prev *upstream.Set
	if v := p.current.Load(); v != nil {
		prev = v.Backends
		p.m.forgetGoAways(v.Snapshot, s)
	}
	set := p.pools.Build(s, prev)
	p.h.Retain(s) // before requests of s's new Services count
	p.current.Store(httpproxy.NewView(s, set))
	p.h2.Update(func(ref snapshot.BackendRef) (h2drain.Endpoints, bool) { return changed(prev.Get(ref), set.Get(ref)) })
	p.m.version.Set(float64(s.Version))
	p.log.Info("snapshot applied", "snapshot_version", s.Version, "frontends", len(s.Frontends), "backends", len(s.Backends))
}

// endpointBack asks the relayed HTTP/2 connections on fallback endpoints
// to move back once a preferred endpoint may take them again (its
// ejection over, or a connect to it succeeded): a snapshot's update sees
// only what the snapshot changes.
func (p *Proxy) endpointBack() {
	// Not beside a snapshot's update: measured against the snapshot
	// before it, the connections dialed on it could seem to reach
	// endpoints gone.
	p.updateMu.Lock()
	defer p.updateMu.Unlock()
	set := p.current.Load().Backends
	p.h2.Update(func(ref snapshot.BackendRef) (h2drain.Endpoints, bool) { return changed(nil, set.Get(ref)) })
}

// changed says how a backend's endpoints changed from old to b (either
// may be nil), for the relayed HTTP/2 connections to it; false when b is
// gone from the snapshot.
func changed(old, b *upstream.Backend) (h2drain.Endpoints, bool) {
	if b == nil {
		return h2drain.Endpoints{}, false
	}
	now := time.Now()
	eps := h2drain.Endpoints{Addrs: b.Picker.Addrs(), Sticky: b.Spec.ClientIPAffinitySeconds != 0}
	eps.Standby, eps.Untried = b.Picker.Standby(now)
	if old != nil {
		if eps.Changed = !b.SameWire(old); eps.Changed {
			eps.TLS = b.Rekeyed(old)
		}
		// Gained counts the endpoints that take connections: a fallback
		// one on standby takes none.
		oldStandby, _ := old.Picker.Standby(now)
		before := taking(old.Picker.Addrs(), oldStandby)
		for a := range taking(eps.Addrs, eps.Standby) {
			eps.Gained = eps.Gained || !before[a]
		}
	}
	return eps, true
}

// taking returns the endpoints of addrs not on standby.
func taking(addrs, standby []netip.AddrPort) map[netip.AddrPort]bool {
	t := make(map[netip.AddrPort]bool, len(addrs))
	for _, a := range addrs {
		t[a] = true
	}
	for _, a := range standby {
		delete(t, a)
	}
	return t
}

// ListenConfig is how the proxy's listeners should be made: without TCP
// keep-alive on accepted connections. Go's default costs four setsockopt
// calls per accepted connection (measured with test/bench/proxy: about 4 %
// of the proxy's CPU when clients open a connection per request); the L7
// paths close idle clients themselves (IdleTimeout) and ping HTTP/2 apps
// whose streams stay open (AppPingAfter), both turn keep-alive on for a
// connection once an exchange on it outlasts a second (httpproxy's client
// watch on the fast path, httpproxy.Target.ConnState on net/http's
// server), and relays, which may idle forever (the L4 paths, a WebSocket
// after its 101), turn it on for their own connections (relay.Relay).
func ListenConfig() *net.ListenConfig { return &net.ListenConfig{KeepAlive: -1} }

// Serve accepts redirected connections on l (node-IP mode: the client pod is
// found by source address) until l fails or Shutdown; it returns nil after
// Shutdown.
func (p *Proxy) Serve(l net.Listener) error { return p.serve(l, nil) }

// ServePod is Serve for a listener inside pod's network namespace (in-pod
// mode): every connection on it comes from pod.
func (p *Proxy) ServePod(l net.Listener, pod snapshot.ObjectRef) error { return p.serve(l, &pod) }

func (p *Proxy) serve(l net.Listener, pod *snapshot.ObjectRef) error {
	if !p.track(l) {
		l.Close()
		return nil
	}
	defer p.untrack(l)
	var delay time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if p.isClosing() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if !shortage(err) {
				return fmt.Errorf("accept on %s: %w", l.Addr(), err)
			}
			// Out of descriptors or memory: connections ending will free
			// them, while returning would stop the node's proxy (the agent
			// exits). As net/http's Server, wait and try again.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			p.m.acceptErrors.Inc()
			p.log.Warn("accept failed, retrying", "addr", l.Addr().String(), "err", err, "retry_in", delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-p.stop:
				t.Stop()
			}
			continue
		}
		delay = 0
		p.dispatch(accepted{c, pod})
	}
}

// shortage reports an accept error that passes once resources are freed.
func shortage(err error) bool {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// accepted is a connection for a worker.
type accepted struct {
	c   net.Conn
	pod *snapshot.ObjectRef
}

// workerIdle is how long a worker waits for another connection; each
// Proxy takes it when made (tests shorten it: export_test.go).
var workerIdle = 10 * time.Second

// dispatch serves a on an idle worker, or on a new one. Workers outlive
// their connections because a goroutine's stack grows on the way to its
// first TLS record (AES-GCM's frames): measured with a connection per
// request, growing and copying a fresh goroutine's stack cost 8 % of the
// proxy's CPU. A waiting worker keeps its stack until the GC shrinks it.
func (p *Proxy) dispatch(a accepted) {
	select {
	case p.work <- a:
	default:
		go p.worker(a)
	}
}

func (p *Proxy) worker(a accepted) {
	idle := time.NewTimer(p.workerIdle)
	defer idle.Stop()
	for {
		p.accept(a.c, a.pod)
		idle.Reset(p.workerIdle)
		select {
		case a = <-p.work:
		case <-idle.C:
			return
		case <-p.stop:
			return
		}
	}
}

// accept resolves c's original destination and serves it, or closes it at
// once: the proxy is never an open relay. The connection counts for
// Shutdown before the lookup: Config.OrigDst reads the datapath's maps,
// which the agent closes once Shutdown returns.
func (p *Proxy) accept(c net.Conn, pod *snapshot.ObjectRef) {
	if !p.begin() {
		p.reject(c, "shutting_down", nil)
		return
	}
	dst, err := p.origDst(c)
	if err != nil {
		p.active.Done()
		p.reject(c, "not_redirected", err)
		return
	}
	client := Client{Pod: pod}
	if ra, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		client.Addr = ra.AddrPort()
	}
	p.serveConn(c, dst, client)
}

// origDst is c's original destination: the socket's own (iptables
// REDIRECT), else what Config.OrigDst finds.
func (p *Proxy) origDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("not a tcp connection: %T", c)
	}
	dst, err := origdst.Get(tc)
	if errors.Is(err, origdst.ErrNotRedirected) && p.cfg.OrigDst != nil {
		dst, err = p.cfg.OrigDst(tc)
	}
	return dst, err
}

// reject closes c unserved with a reset and counts why.
func (p *Proxy) reject(c net.Conn, reason string, err error) {
	p.m.rejected.WithLabelValues(reason).Inc()
	p.log.Debug("connection rejected", "reason", reason, "remote", c.RemoteAddr().String(), "err", err)
	sockio.Reset(c)
}

// Shutdown stops accepting, lets L7 requests and relays finish (idle
// keep-alive connections close at once), and when ctx ends closes whatever
// is left (the connections it tracks with a reset). It returns ctx's error
// if it had to force.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if !p.closing {
		close(p.stop)
	}
	p.closing = true
	for l := range p.listeners {
		l.Close()
	}
	p.mu.Unlock()
	// Relayed HTTP/2 clients move to the next proxy as their streams end.
	p.h2.GoAwayAll(h2drain.ReasonShutdown)
	defer func() { p.current.Load().Backends.CloseIdle() }()
	p.h.Drain()
	err := p.srv.Shutdown(ctx)
	done := make(chan struct{})
	go func() { p.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		p.mu.Lock()
		p.forced = true
		for c := range p.conns {
			// Reset: closed, a relay's peer would read a clean end of
			// what it cut short. Before net/http's server closes its
			// connections (tracked too): an HTTP/1.0 answer that runs to
			// the close would read as complete.
			sockio.Reset(c)
		}
		p.mu.Unlock()
		p.srv.Close()
		<-done
		err = ctx.Err()
	}
	return err
}

func (p *Proxy) isClosing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closing
}

func (p *Proxy) track(l net.Listener) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return false
	}
	p.listeners[l] = struct{}{}
	return true
}

func (p *Proxy) untrack(l net.Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.listeners, l)
}

// begin registers a ServeConn call; false once shutting down.
func (p *Proxy) begin() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return false
	}
	p.active.Add(1)
	return true
}

// trackConn adds c to the connections Shutdown resets when it forces, or,
// with on false, takes it out. Once Shutdown forced, c is reset at once
// instead: what serves it then (a relay whose dial ended after the resets)
// would otherwise run on, and Shutdown wait for it, for as long as the app
// kept its connection.
func (p *Proxy) trackConn(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.forced:
		sockio.Reset(c)
	case on:
		p.conns[c] = struct{}{}
	default:
		delete(p.conns, c)
	}
}
