package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/retrybudget"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstreamtls"
)

// Config bounds the pools. The zero value is usable.
type Config struct {
	// TLS holds the proxy-wide TLS inputs (system pool override, session
	// cache size).
	TLS upstreamtls.Options
	// MaxIdleConnsPerEndpoint bounds the keep-alive connections kept idle
	// per endpoint and wire (HTTP/1.1: past 10 s, pool.Config.MaxIdle); 0
	// means 64.
	MaxIdleConnsPerEndpoint int
	// MaxConnsPerEndpoint bounds the HTTP/1.1 connections per endpoint and
	// wire (requests wait for one beyond it, and one freed goes to the
	// waiting client that holds the fewest: WithClient), one client's to
	// its share of them (ClientShare); 0 means 1024.
	// net/http's HTTP/2 Transport, given it as MaxConnsPerHost, dials
	// another connection whenever those open have no stream to spare, past
	// it too (its count forgets a connection found full): a request waits
	// for a stream only on a new connection it took before the backend's
	// SETTINGS said how many streams it takes (ConnWait).
	MaxConnsPerEndpoint int
	// ClientShare is the fraction of MaxConnsPerEndpoint HTTP/1.1
	// connections one client may hold (pool.Config.ClientShare); 0 means
	// 7/8, all but an eighth.
	ClientShare float64
	// ConnWait bounds how long a request waits for one of an endpoint's
	// MaxConnsPerEndpoint HTTP/1.1 connections to come free, or, over
	// HTTP/2, for a stream on the connection the Transport gave it, before
	// it fails (ReasonPoolBusy); 0 means 10 s, as long as HandshakeTimeout
	// lets a new connection take: either way a request gets a connection,
	// or a 503, within that.
	ConnWait time.Duration
	// IdleConnTimeout closes pooled connections idle this long; 0 means 90 s.
	IdleConnTimeout time.Duration
	// H2PingAfter is how long an HTTP/2 connection to a backend may go
	// without a frame from it before the proxy pings it; without an answer
	// within H2PingTimeout the connection closes and its requests fail
	// (502), where a backend frozen or gone with its node would otherwise
	// hold them until the app gives up; a WebSocket's extended CONNECT
	// (h2connect) is pinged alike. 0 means 5 min and 15 s: gRPC
	// servers (grpc-go, gRPC core, Java) by default take a ping sooner than
	// 5 min after the last, with no frame of theirs between, as a strike,
	// and close the connection at the third (GOAWAY ENHANCE_YOUR_CALM
	// "too_many_pings"), with the calls on it: a stream idle between
	// events broke after three pings.
	H2PingAfter, H2PingTimeout time.Duration
	// EjectFor is how long an endpoint whose connect failed for want of it
	// (refused, unreachable, timed out, no TLS handshake within
	// HandshakeTimeout, or one it broke off) is passed over, doubling with
	// each failed probe up to EjectMax (balance.Health); 0 means 1 s and
	// 30 s.
	EjectFor, EjectMax time.Duration
	// EndpointBack, unless nil, is called on a goroutine of its own
	// whenever an ejected endpoint may take connections again: its
	// ejection ends, a probe waited for is handed back or expires, or a
	// connect to it succeeds (balance.NewHealth).
	EndpointBack func()
	// StreamResent, unless nil, is called each time a request over HTTP/2
	// goes again, its stream refused (MaxResends).
	StreamResent func()
	// HandshakeTimeout bounds a TLS handshake with an endpoint, and the
	// wait for an HTTP/2 endpoint's SETTINGS on a WebSocket's connection
	// (h2connect); 0 means 10 s.
	HandshakeTimeout time.Duration
	// Panics reports the panics recovered in the goroutines the
	// transports run: a request body's writer, and the dials net/http's
	// Transport makes on goroutines of its own (TLS verification is ours).
	Panics *contain.Reporter
}

// Wire is the HTTP version toward the backend.
type Wire uint8

const (
	// WireH1 is HTTP/1.1 (ALPN http/1.1 over TLS).
	WireH1 Wire = iota
	// WireH2 is HTTP/2: ALPN h2 over TLS, prior knowledge (h2c) without.
	WireH2
	// WireNegotiate offers h2 and http/1.1 by ALPN (TLS only).
	WireNegotiate
	wireCount
)

// ALPN lists the protocols a TLS connection offers for w.
func (w Wire) ALPN() []string {
	switch w {
	case WireH2:
		return alpnH2
	case WireNegotiate:
		return alpnBoth
	}
	return alpnH1
}

var (
	alpnH1   = []string{upstreamtls.ALPNHTTP11}
	alpnH2   = []string{upstreamtls.ALPNH2}
	alpnBoth = []string{upstreamtls.ALPNH2, upstreamtls.ALPNHTTP11}
)

// Pools builds a Set per snapshot; one per proxy.
type Pools struct {
	cfg    Config
	dialer dial.Dialer
	log    *slog.Logger
	m      *metrics
	health *balance.Health // across snapshots: an endpoint is a pod's
	// series are the backends (namespace, name) with metric series;
	// Build forgets those gone from its snapshot (forgetSeries), and
	// current are its snapshot's. seriesMu guards both and the open
	// connections gauges' series (open).
	seriesMu sync.Mutex
	series   map[[2]string]bool
	current  map[[2]string]bool
	// retired are the wires Build replaced or dropped that still have
	// connections open.
	retired []*wireState
}

// New returns Pools dialing through d.
func New(cfg Config, d dial.Dialer, log *slog.Logger, reg prometheus.Registerer) (*Pools, error) {
	if cfg.MaxIdleConnsPerEndpoint == 0 {
		cfg.MaxIdleConnsPerEndpoint = 64
	}
	if cfg.MaxConnsPerEndpoint == 0 {
		cfg.MaxConnsPerEndpoint = 1024
	}
	if cfg.IdleConnTimeout == 0 {
		cfg.IdleConnTimeout = 90 * time.Second
	}
	if cfg.H2PingAfter == 0 {
		cfg.H2PingAfter = 5 * time.Minute
	}
	if cfg.H2PingTimeout == 0 {
		cfg.H2PingTimeout = 15 * time.Second
	}
	if cfg.EjectFor == 0 {
		cfg.EjectFor = time.Second
	}
	if cfg.EjectMax == 0 {
		cfg.EjectMax = 30 * time.Second
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.ConnWait == 0 {
		cfg.ConnWait = 10 * time.Second
	}
	health := balance.NewHealth(cfg.EjectFor, cfg.EjectMax, cfg.EndpointBack)
	m, err := newMetrics(reg, health)
	if err != nil {
		return nil, err
	}
	return &Pools{cfg: cfg, dialer: d, log: log, m: m, health: health, series: make(map[[2]string]bool)}, nil
}

// Set is the upstream side of one snapshot.
type Set struct {
	byRef map[snapshot.BackendRef]*Backend
}

// Backend is one snapshot backend's upstream state.
type Backend struct {
	// Spec is the snapshot's backend; never modified.
	Spec *snapshot.Backend
	// Picker chooses among Spec's ready endpoints.
	Picker *balance.Picker
	// Budget is Spec's retry budget, kept across snapshots while the
	// constraint is unchanged; nil when the backend has none.
	Budget *retrybudget.Budget
	// Err is non-nil (a *FailClosedError) when the backend must fail closed.
	Err error
	// Authority is the Host an ExternalHostname backend's requests carry
	// (the app addressed the Service, whose name the external host does
	// not know); "" for other backends, whose requests keep the app's.
	Authority string
	w         *wireState
	// affinity pins clients to endpoints (the Service's sessionAffinity
	// ClientIP), kept across snapshots while its timeout is; nil without.
	affinity *balance.Affinity
	// reported is set by the first FirstFailure call.
	reported atomic.Bool
}

// authority is spec's Authority: an ExternalHostname backend's name, with
// its port unless that is the scheme's default (RFC 9110 §7.2: a Host
// without a port means the default, so a virtual host on 8443 would
// not be found).
func authority(spec *snapshot.Backend) string {
	if spec.Hostname == "" {
		return ""
	}
	def := uint16(80)
	if spec.TLS != nil {
		def = 443
	}
	if spec.Ref.Port == def {
		return spec.Hostname
	}
	return net.JoinHostPort(spec.Hostname, strconv.Itoa(int(spec.Ref.Port)))
}

// FirstFailure reports true once per Backend (hence once per snapshot): the
// caller logs a fail-closed backend loudly the first time only.
func (b *Backend) FirstFailure() bool { return b.reported.CompareAndSwap(false, true) }

// wireState is what survives a snapshot swap when protocol and TLS settings
// are unchanged: the TLS configs with their session caches and the pools.
type wireState struct {
	p        *Pools
	protocol snapshot.Protocol
	tls      *upstreamtls.Origination // nil: cleartext
	labels   [2]string                // namespace, backend name
	// roundTrips counts its HTTP/2 requests under way in the Transport;
	// retired is set once a Build replaced or dropped it; replaced,
	// before it, when its backend's settings changed (setAside).
	roundTrips atomic.Int64
	retired    atomic.Bool
	replaced   bool
	// h1 pools the HTTP/1.1 connections (GetH1, h1Transport); transports
	// hold net/http's, for HTTP/2 (WireH2, and WireNegotiate's h2 side).
	h1         *pool.Pool
	mu         sync.Mutex
	transports [wireCount]*h2pool
	// declinedH2 is when an endpoint last answered an offer of h2 with
	// HTTP/1.1 (unix nanoseconds; 0: never); see SpeaksH1Only. declinedH1
	// is when one last refused an offer of http/1.1 alone for want of a
	// common protocol; see SpeaksH2Only.
	declinedH2, declinedH1 atomic.Int64
	// noXConnect remembers the endpoints whose SETTINGS refused a
	// WebSocket's extended CONNECT (webSocketH2).
	noXConnect refusals
}

// h1OnlyFor is how long a backend whose endpoint answered an offer of h2
// with HTTP/1.1 is taken to speak HTTP/1.1 only, and one whose endpoint
// refused http/1.1 alone h2 only. Learning it again costs an app's
// connection a TLS handshake; asking again after a while notices a
// backend that came to speak the other.
const h1OnlyFor = time.Minute

// Build returns the Set for s, keeping prev's pools for backends whose wire
// is unchanged (and their retry budgets while their constraint is) and
// closing the idle connections of the others, and of those an earlier
// Build replaced whose connections came back since. prev may be nil. Calls must
// not overlap (the proxy serialises its updates).
func (p *Pools) Build(s *snapshot.Snapshot, prev *Set) *Set {
	log := p.log.With("snapshot_version", s.Version)
	set := &Set{byRef: make(map[snapshot.BackendRef]*Backend, len(s.Backends))}
	p.health.Retain(readyIn(s))
	kept := make(map[*wireState]bool)
	for i := range s.Backends {
		spec := &s.Backends[i]
		var prevBudget *retrybudget.Budget
		var prevAffinity *balance.Affinity
		if old := prev.Get(spec.Ref); old != nil {
			prevBudget, prevAffinity = old.Budget, old.affinity
		}
		aff := balance.CarryAffinity(prevAffinity, spec.ClientIPAffinitySeconds)
		b := &Backend{Spec: spec, Picker: balance.New(spec, p.health, aff), affinity: aff, Authority: authority(spec)}
		set.byRef[spec.Ref] = b
		b.Budget = retrybudget.Carry(prevBudget, spec.RetryConstraint, time.Now())
		if spec.Invalid != nil {
			b.Err = &FailClosedError{Policy: spec.Invalid.Policy, Reason: spec.Invalid.Reason, Message: spec.Invalid.Message}
			continue
		}
		if old := prev.Get(spec.Ref); old != nil && old.w != nil && old.w.protocol == spec.Protocol &&
			upstreamtls.Equal(old.Spec.TLS, spec.TLS) {
			b.w = old.w
			kept[old.w] = true
			if b.w.tls != nil {
				b.w.tls.Retain(endpointOf(spec))
			}
			continue
		}
		w := &wireState{p: p, protocol: spec.Protocol, labels: [2]string{spec.Ref.Namespace, spec.Ref.Name}}
		p.open(w.labels, 0)
		p.m.ejections.WithLabelValues(w.labels[0], w.labels[1])
		if spec.TLS != nil {
			o, err := upstreamtls.New(spec.TLS, p.cfg.TLS)
			if err != nil {
				// translate should have marked it Invalid; fail closed anyway.
				log.Warn("upstream tls settings rejected", "backend", spec.Ref.String(), "policy", spec.TLS.Policy.String(), "err", err)
				b.Err = &FailClosedError{Policy: spec.TLS.Policy, Reason: "Invalid", Message: err.Error()}
				continue
			}
			w.tls = o
		}
		w.h1 = pool.New(pool.Config{MaxIdle: p.cfg.MaxIdleConnsPerEndpoint, MaxOpen: p.cfg.MaxConnsPerEndpoint, ClientShare: p.cfg.ClientShare, MaxWait: p.cfg.ConnWait, IdleTimeout: p.cfg.IdleConnTimeout,
			Dropped: func(why pool.DropReason) { p.m.poolDropped[why].Inc() }, AtShare: p.m.poolBusyAtShare.Inc})
		if old := prev.Get(spec.Ref); old != nil && old.w != nil {
			// New TLS settings or protocol: TLS sessions of the old ones
			// are not reused, nor the connections the new ones would not
			// have made: idle HTTP/1.1 ones (keeps), net/http's HTTP/2 ones
			// (adopt; without TLS both ways, closeIdle below). Old's
			// HTTP/1.1 connections in use count against the new pool's
			// bounds until they come back (HandOver).
			k := w.keeping(old.w).Keeper() // one for all of old's connections
			old.w.h1.HandOver(w.h1, w.keeps(old.w, k))
			w.adopt(old.w, k)
			log.Info("upstream pools replaced", "backend", spec.Ref.String())
		}
		b.w = w
	}
	if prev != nil {
		for ref, old := range prev.byRef {
			if old.w != nil && !kept[old.w] {
				old.w.setAside(set.Get(ref) != nil)
				p.retired = append(p.retired, old.w)
			}
		}
	}
	// A retired wire's connections in use at the swap come back after it:
	// its HTTP/1.1 pool closes them as they do, and its HTTP/2 ones, set
	// aside above, close as their last request ends (net/http's Transport
	// kept them until its idle timeout, 90 s, after it: a set per snapshot
	// that changed the backend's settings under traffic). Each Build closes
	// those idle by then that no GOAWAY reached (none goes before the
	// backend's first answer), until none is left and no request is under
	// way; a request that starts later closes its connection itself
	// (h2Transport).
	p.retired = slices.DeleteFunc(p.retired, func(w *wireState) bool {
		w.closeIdle()
		return !w.holdsH2() && w.roundTrips.Load() == 0
	})
	p.forgetSeries(set)
	return set
}

// forgetSeries drops the metric series of the backends set does not have:
// the node's proxy outlives many Services, and each kept its series for
// the agent's life. A backend's open connections gauge stays while
// connections to it are open (relays keep their snapshot), until a later
// Build finds none.
func (p *Pools) forgetSeries(set *Set) {
	current := make(map[[2]string]bool, len(set.byRef))
	for ref := range set.byRef {
		current[[2]string{ref.Namespace, ref.Name}] = true
	}
	p.seriesMu.Lock()
	defer p.seriesMu.Unlock()
	p.current = current
	for l := range p.series {
		if current[l] {
			continue
		}
		p.m.ejections.DeleteLabelValues(l[0], l[1])
		var open dto.Metric
		if p.m.open.WithLabelValues(l[0], l[1]).Write(&open) == nil && open.GetGauge().GetValue() == 0 {
			p.m.open.DeleteLabelValues(l[0], l[1])
			delete(p.series, l)
		}
	}
}

// open adds n to the open connections gauge of the backend of labels and
// returns it: made again when a Build dropped it (forgetSeries), as a wire
// retired with its backend still connects for a request under way on an
// older snapshot (counted on the dropped gauge, such a connection was
// exported nowhere), and added to under seriesMu, so that forgetSeries
// drops none that counts a connection.
func (p *Pools) open(labels [2]string, n float64) prometheus.Gauge {
	p.seriesMu.Lock()
	defer p.seriesMu.Unlock()
	g := p.m.open.WithLabelValues(labels[0], labels[1])
	g.Add(n)
	p.series[labels] = true
	return g
}

// ejection counts an ejection a wire of the backend of labels found on the
// series the backend has now: a retired wire's counted on the one a Build
// dropped (exported nowhere), also once its backend was back. While the
// last Build's snapshot does not have the backend, it counts nothing, as
// requests and GOAWAYs of a gone backend do not (docs/metrics.md).
func (p *Pools) ejection(labels [2]string) {
	p.seriesMu.Lock()
	defer p.seriesMu.Unlock()
	if p.current[labels] {
		p.m.ejections.WithLabelValues(labels[0], labels[1]).Inc()
	}
}

// CloseIdle closes the idle upstream connections of every backend in s (the
// proxy is shutting down).
func (s *Set) CloseIdle() {
	if s == nil {
		return
	}
	for _, b := range s.byRef {
		if b.w != nil {
			b.w.closeIdle()
		}
	}
}

// Get returns the backend for ref, or nil. A nil Set has no backends.
func (s *Set) Get(ref snapshot.BackendRef) *Backend {
	if s == nil {
		return nil
	}
	return s.byRef[ref]
}

// SameWire reports whether b speaks to its endpoints as old did: the same
// protocol and TLS settings (hence the same pools), neither failing closed.
func (b *Backend) SameWire(old *Backend) bool {
	return old != nil && b.w != nil && b.w == old.w
}

// Rekeyed returns, when b's wire replaced old's (SameWire is false), the
// TLS settings under which a connection old's made may stay
// (upstreamtls.Keeper.Keep); nil when none may: b fails closed, is
// cleartext, or speaks another protocol.
func (b *Backend) Rekeyed(old *Backend) *upstreamtls.Origination {
	if old == nil {
		return nil
	}
	return b.w.keeping(old.w)
}

// keeping is Rekeyed for wires.
func (w *wireState) keeping(old *wireState) *upstreamtls.Origination {
	if w == nil || old == nil || w.protocol != old.protocol {
		return nil
	}
	return w.tls
}

// keeps reports whether an idle HTTP/1.1 connection of old's pool may
// serve w's requests under k, the Keeper of w's settings, and sets its
// Until under them.
func (w *wireState) keeps(old *wireState, k *upstreamtls.Keeper) func(*pool.Conn) bool {
	return func(c *pool.Conn) bool {
		tc, ok := c.Conn.(*tls.Conn)
		if !ok {
			return false
		}
		h, err := k.Keep(old.tls.Hold(tc.ConnectionState(), alpnH1))
		if err != nil {
			return false
		}
		c.Until = h.Until()
		return true
	}
}

// DeclinedH2 records that an endpoint of b, offered h2 at now, chose
// HTTP/1.1 (or no ALPN).
func (b *Backend) DeclinedH2(now time.Time) {
	if b.w != nil {
		b.w.declinedH2.Store(now.UnixNano())
	}
}

// SpeaksH1Only reports whether an endpoint of b declined h2 less than
// h1OnlyFor before now. It is kept across snapshots while b's wire is,
// and forgotten when its protocol or TLS settings change.
func (b *Backend) SpeaksH1Only(now time.Time) bool {
	if b.w == nil {
		return false
	}
	at := b.w.declinedH2.Load()
	return at != 0 && now.Sub(time.Unix(0, at)) < h1OnlyFor
}

// SpeaksH2Only reports whether an endpoint of b refused an offer of
// http/1.1 alone for want of a common protocol (ErrDeclinedHTTP11) less
// than h1OnlyFor ago: the mirror of SpeaksH1Only, kept and forgotten as
// it is. Per backend, as SpeaksH1Only: its endpoints are replicas of one
// server, and an HTTP/1.1 one among them is still spoken to in HTTP/1.1
// by the negotiation this sends requests to. A backend that never
// refused costs one load (the fast path asks it per request).
func (b *Backend) SpeaksH2Only() bool {
	if b.w == nil {
		return false
	}
	at := b.w.declinedH1.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < h1OnlyFor
}

// TLS reports whether the wire to b is TLS.
func (b *Backend) TLS() bool { return b.w != nil && b.w.tls != nil }

// Dial opens a connection to picked, an endpoint of b, completing the TLS
// handshake offering alpn when b needs TLS.
func (b *Backend) Dial(ctx context.Context, picked *balance.Choice, alpn []string) (net.Conn, error) {
	if b.Err != nil {
		return nil, b.Err
	}
	return b.w.dial(ctx, picked, alpn, false)
}

// DialRaw opens a plain TCP connection to picked, an endpoint of b, for
// apps that already speak TLS themselves (passthrough): no origination,
// whatever b's settings.
func (b *Backend) DialRaw(ctx context.Context, picked *balance.Choice) (net.Conn, error) {
	if b.Err != nil {
		return nil, b.Err
	}
	c, err := b.w.dialTCP(ctx, picked)
	if err != nil {
		return nil, err
	}
	b.w.p.health.OK(picked.Endpoint.Addr)
	return c, nil
}

// RoundTripper returns the pooled transport for wire w; requests' URLs must
// name the endpoint ("http://ip:port", "https://ip:port" when TLS).
// HTTP/1.1 goes over the fast path's pool (h1Transport), HTTP/2 over
// net/http's Transport; negotiating, over the one the backend chose
// (negotiated).
func (b *Backend) RoundTripper(w Wire) http.RoundTripper {
	switch {
	case w == WireNegotiate && b.TLS():
		return negotiated{b}
	case w != WireH2:
		return h1Transport{b} // without TLS nothing negotiates
	}
	return h2Transport{b.w, w}
}

// Multiplexed reports whether requests over w may go over HTTP/2 through
// net/http's Transport (RoundTripper), which sends a stream the backend
// refused again (REFUSED_STREAM, or past a GOAWAY) with the body the
// request's GetBody gives.
func (b *Backend) Multiplexed(w Wire) bool {
	return w == WireH2 || w == WireNegotiate && b.TLS()
}

// Scheme is the URL scheme requests to b use.
func (b *Backend) Scheme() string {
	if b.TLS() {
		return "https"
	}
	return "http"
}

type endpointKey struct{}

type clientKey struct{}

// WithClient attaches c, the app whose requests RoundTripper sends, to a
// context, as GetH1 takes it: an endpoint's HTTP/1.1 connections, shared
// by every pod on the node, go to the client that holds the fewest while
// requests wait for one (pool.Get). Without it, a request counts as the
// zero Client's.
func WithClient(ctx context.Context, c pool.Client) context.Context {
	return &withClient{ctx, c}
}

// withClient is WithClient's context: one allocation per app connection,
// where context.WithValue took a second to box c.
type withClient struct {
	context.Context
	c pool.Client
}

func (w *withClient) Value(key any) any {
	if key == (clientKey{}) {
		return &w.c
	}
	return w.Context.Value(key)
}

// clientOf returns the client WithClient attached to ctx.
func clientOf(ctx context.Context) pool.Client {
	if c, ok := ctx.Value(clientKey{}).(*pool.Client); ok {
		return *c
	}
	return pool.Client{}
}

// WithEndpoint attaches c, the picked endpoint, to a request context so
// the pool dials it with its full identity (node, pod) for dialers that
// need more than the address, and tells the Health of a probe c holds.
func WithEndpoint(ctx context.Context, c *balance.Choice) context.Context {
	return context.WithValue(ctx, endpointKey{}, c)
}

// endpointFor returns the endpoint picked for a request to addr
// (WithEndpoint), or, without one, addr's.
func endpointFor(ctx context.Context, addr string) (*balance.Choice, error) {
	if c, ok := ctx.Value(endpointKey{}).(*balance.Choice); ok && c.Endpoint.Addr.String() == addr {
		return c, nil
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("pool dial %q: %w", addr, err)
	}
	return &balance.Choice{Endpoint: snapshot.Endpoint{Addr: ap, Ready: true}, Host: addr}, nil
}

func (w *wireState) dialTCP(ctx context.Context, c *balance.Choice) (*trackedConn, error) {
	m := w.p.m
	start := time.Now()
	raw, err := w.p.dialer.Dial(ctx, c.Endpoint)
	if err != nil {
		result := string(classifyDial(err))
		switch {
		case ctx.Err() != nil:
			result = endedBy(ctx) // the caller's context ended it, not the endpoint
			w.p.health.Canceled(c)
		case endpointFault(err):
			w.eject(c.Endpoint, start, err)
		default:
			w.p.health.FailedHere(c)
		}
		m.dials.WithLabelValues(result).Inc()
		return nil, &dialError{err: err}
	}
	m.dialsOK.Inc()
	return &trackedConn{Conn: raw, open: w.p.open(w.labels, 1)}, nil
}

// dial opens a connection to picked, with TLS offering alpn when the wire
// needs it. One for net/http's HTTP/2 Transport (forH2), which reads and
// writes it on goroutines of its own, contains panics beneath TLS
// (contain.Conn): on the proxy's own goroutines they are recovered where
// they start.
func (w *wireState) dial(ctx context.Context, picked *balance.Choice, alpn []string, forH2 bool) (net.Conn, error) {
	tcp, err := w.dialTCP(ctx, picked)
	if err != nil {
		return nil, err
	}
	ep := picked.Endpoint
	var c net.Conn = tcp
	if forH2 {
		c = w.p.cfg.Panics.Conn(tcp, "upstream connection")
	}
	if w.tls == nil {
		w.p.health.OK(ep.Addr)
		return c, nil
	}
	m := w.p.m
	tc := tls.Client(c, w.tls.Config(ep.Addr, alpn))
	start := time.Now()
	hctx, cancel := context.WithTimeout(ctx, w.p.cfg.HandshakeTimeout)
	hctx, asked := upstreamtls.WatchCertificateRequest(hctx)
	err = tc.HandshakeContext(hctx)
	cancel()
	m.handshakeSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		c.Close()
		if ctx.Err() != nil {
			// The caller's context ended it (the app left, a route's
			// timeout passed), not the endpoint: Classify tells a
			// cancellation by the error it wraps.
			w.p.health.Canceled(picked)
			m.handshakes.WithLabelValues(endedBy(ctx)).Inc()
			return nil, fmt.Errorf("%w to %s (%s): %w", errHandshake, ep.Addr, w.tls.Settings().ServerName, err)
		}
		if errors.Is(hctx.Err(), context.DeadlineExceeded) {
			// The endpoint's kernel took the connection, but nothing
			// serves it (a frozen process, one not calling accept): as a
			// connect that timed out, nothing went out, and it is ejected.
			m.handshakes.WithLabelValues("timeout").Inc()
			err = fmt.Errorf("tls to %s (%s): no handshake within %v: %w", ep.Addr, w.tls.Settings().ServerName, w.p.cfg.HandshakeTimeout, err)
			w.eject(ep, start, err)
			return nil, &dialError{err: err}
		}
		if upstreamtls.IsVerifyError(err) {
			m.handshakes.WithLabelValues("verify_failed").Inc()
			err = fmt.Errorf("tls to %s (%s): %w", ep.Addr, w.tls.Settings().ServerName, err)
		} else {
			m.handshakes.WithLabelValues("failed").Inc()
			err = fmt.Errorf("%w to %s (%s): %w", errHandshake, ep.Addr, w.tls.Settings().ServerName, err)
			if brokeOff(err) {
				// The endpoint reset or closed the connection before the
				// handshake ended (its pod killed, its TLS listener gone): as a
				// refused connect, nothing went out, another endpoint may
				// serve, and this one is ejected. A certificate that fails
				// verification, or an alert, fails the connection as before:
				// the TLS policy that causes it is most often every
				// endpoint's, so trying others would triple the handshakes
				// of a misconfigured backend and eject every endpoint.
				w.eject(ep, start, err)
				return nil, &dialError{err: err}
			}
		}
		// The endpoint answered the handshake (a certificate, an alert):
		// it takes connections, which is all Health judges, so its
		// ejection ends as for a connect that succeeds, and it is where
		// an endpoint never ejected is — the TLS policy fails its
		// connections. Unsettled, its probe held it out for probeWait,
		// and nothing told what waited for it.
		w.p.health.OK(ep.Addr)
		return nil, err
	}
	w.p.health.OK(ep.Addr)
	switch cs := tc.ConnectionState(); {
	case cs.DidResume:
		m.handshakesResumed.Inc()
	case cs.Version >= tls.VersionTLS13 && asked.Load():
		// The backend judges the certificate it asked for (or its
		// absence) after the handshake: counted once its first word
		// settles it (Settle).
		tcp.judgement = &judgement{w: w, ep: ep.Addr}
	default:
		m.handshakesFull.Inc()
	}
	return tc, nil
}

// endedBy is the result a connect or TLS handshake that ctx, the
// caller's context, ended counts as: route_timeout when its deadline
// passed, canceled otherwise. httpproxy bounds a request's connects by its
// route rule's request and backendRequest timeouts (a mirror's and an
// ExternalAuth ask's by theirs) as deadlines, and cancels them when the
// app leaves (or the proxy shuts down): an operator tells a slow backend
// from apps that give up.
func endedBy(ctx context.Context) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return resultRouteTimeout
	}
	return string(ReasonCanceled)
}

// endpointOf reports whether an address is one of spec's endpoints.
func endpointOf(spec *snapshot.Backend) func(netip.AddrPort) bool {
	eps := make(map[netip.AddrPort]bool, len(spec.Endpoints))
	for _, e := range spec.Endpoints {
		eps[e.Addr] = true
	}
	return func(a netip.AddrPort) bool { return eps[a] }
}

// readyIn reports whether an address is an endpoint of a backend of s that
// a Picker may hand out: ready, or serving while it terminates. Health
// calls it under its lock only.
func readyIn(s *snapshot.Snapshot) func(netip.AddrPort) bool {
	var ready map[netip.AddrPort]bool
	return func(ep netip.AddrPort) bool {
		if ready == nil { // only once a connect settles or an endpoint is ejected
			ready = make(map[netip.AddrPort]bool)
			for i := range s.Backends {
				for _, e := range s.Backends[i].Endpoints {
					ready[e.Addr] = ready[e.Addr] || e.Ready || e.Serving && e.Terminating
				}
			}
		}
		return ready[ep]
	}
}

// eject passes ep over for a while: its connect, started at start, failed
// for want of it.
func (w *wireState) eject(ep snapshot.Endpoint, start time.Time, err error) {
	d := w.p.health.Failed(ep.Addr, start, time.Now())
	if d == 0 {
		return // already ejected, a stale failure (balance.Health.Failed), or gone from the snapshot
	}
	w.p.ejection(w.labels)
	w.p.log.Warn("endpoint ejected: its connect failed", "endpoint", ep.Addr.String(),
		"backend", w.labels[0]+"/"+w.labels[1], "for", d.String(), "err", err)
}

// endpointFault reports whether a connect failed for want of the endpoint
// (refused, unreachable, no answer in time), rather than of this node
// (out of file descriptors or ports) or of the caller (its context).
func endpointFault(err error) bool {
	var ne net.Error
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTDOWN) ||
		errors.As(err, &ne) && ne.Timeout()
}

// brokeOff reports whether a TLS handshake ended because the endpoint
// reset or closed the connection.
func brokeOff(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

func classifyDial(err error) Reason {
	if r := Classify(&dialError{err: err}); r == ReasonRefused {
		return r
	}
	return ReasonDialFailed
}

// trackedConn keeps the open connections gauge honest, and holds the
// judgement of its TLS handshake (Settle).
type trackedConn struct {
	net.Conn
	open   prometheus.Gauge
	closed atomic.Bool
	// judgement is set, before the connection is handed out, for a
	// handshake its backend judges after it; nil for others.
	judgement *judgement
}

func (c *trackedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Dec()
	}
	if c.judgement != nil {
		c.judgement.closed()
	}
	return c.Conn.Close()
}

// NetConn returns the TCP connection underneath (for half-close).
func (c *trackedConn) NetConn() net.Conn { return c.Conn }

// ReadPooled passes the read to the connection underneath, which must be a
// sockio.PooledReader (a relay's, see sockio.Pooled).
func (c *trackedConn) ReadPooled(bufs sockio.Buffers) (*[]byte, int, error) {
	return c.Conn.(sockio.PooledReader).ReadPooled(bufs)
}

// CloseWrite shuts the write half: net/http's body of a 101 answer
// half-closes the connection it was dialed on only through this method.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
