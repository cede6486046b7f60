package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/h2drain"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstreamtls"
)

// h2pool is net/http's HTTP/2 Transport of a wire (transport) and the
// connections it dialed. When the backend's TLS settings change, the new
// wire takes it over (adopt), its connections that the new settings still
// verify with it.
type h2pool struct {
	t *http.Transport
	m *metrics
	// owner is the wire under whose settings its connections are dialed.
	owner atomic.Pointer[wireState]
	mu    sync.Mutex
	// conns are its open connections, true once asked away.
	conns map[*h2Conn]bool
	// dialing is the dial under way to each address that the Transport's
	// other dials to it wait for (dialOnce).
	dialing map[string]*h2Dial
}

// h2Dial is a dial of an h2pool's Transport under way; when done closes,
// err is set, or gone is its connection's (h2Conn.gone).
type h2Dial struct {
	done chan struct{}
	err  error
	gone <-chan struct{}
	// ctx is the dial's (dialCtx), which end ends once no request waits
	// for it (leave); waiting counts those that do, under h2pool.mu.
	ctx     context.Context
	end     context.CancelCauseFunc
	waiting int
	// ended is set when ctx had ended as the dial returned: it failed
	// for none of the endpoint's doing.
	ended bool
}

// dialCtx is an h2Dial's context: the Transport's, whose values are the
// request's, and which CloseIdleConnections ends — the Transport dials
// apart from the request's context, for later requests — ended besides
// once no request waits for the dial (leave) with the error of the last
// one's context, which Err returns: a connect or handshake a route's
// timeout ended counts as route_timeout, one the app left as canceled
// (endedBy), as on the HTTP/1.1 wire, not as the endpoint's failure 10 s
// on (HandshakeTimeout), which ejected it.
type dialCtx struct{ context.Context }

func (c dialCtx) Err() error {
	switch {
	case c.Context.Err() == nil:
		return nil
	case errors.Is(context.Cause(c.Context), context.DeadlineExceeded):
		return context.DeadlineExceeded
	}
	return context.Canceled
}

// errDialShared ends a dial the Transport made for a request that a
// connection another dial made has served: the Transport drops it.
var errDialShared = errors.New("upstream: a connection dialed for another request served this one")

// h2Conn is a connection of an h2pool, with its TLS (the zero Held when
// cleartext) and the GOAWAY that sets it aside (h2drain.Upstream).
type h2Conn struct {
	*h2drain.Upstream
	pool *h2pool
	// gone closes with it.
	gone chan struct{}
	// waits bounds its requests' waits for a stream.
	waits streamWaits
	// held, and expiry, which sets it aside when held's trust ends, are
	// under pool.mu.
	held   upstreamtls.Held
	expiry *time.Timer
}

func (c *h2Conn) Close() error {
	c.pool.mu.Lock()
	if _, open := c.pool.conns[c]; open {
		delete(c.pool.conns, c)
		close(c.gone)
	}
	if c.expiry != nil {
		c.expiry.Stop()
	}
	c.pool.mu.Unlock()
	return c.Upstream.Close()
}

// checked is c's connection under its GOAWAY (dialH2's).
func (c *h2Conn) checked() *h2Checked { return c.Upstream.Conn.(*h2Checked) }

// h2TLSConn is an h2Conn over TLS: the Transport reads its
// ConnectionState to learn that it speaks h2.
type h2TLSConn struct{ *h2Conn }

func (c h2TLSConn) ConnectionState() tls.ConnectionState {
	return c.checked().Conn.(*tls.Conn).ConnectionState()
}

// pool is the h2pool whose Transport is net/http's for HTTP/2 (wire
// WireH2, or WireNegotiate for the h2 side of negotiated): it speaks
// HTTP/2 only, as its connections refuse any other protocol (dialH2).
func (w *wireState) pool(wire Wire) *h2pool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if hp := w.transports[wire]; hp != nil {
		return hp
	}
	cfg := w.p.cfg
	t := &http.Transport{
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: cfg.MaxIdleConnsPerEndpoint,
		MaxConnsPerHost:     cfg.MaxConnsPerEndpoint,
		IdleConnTimeout:     cfg.IdleConnTimeout,
		// A proxy must not add Accept-Encoding nor decode bodies.
		DisableCompression: true,
		WriteBufferSize:    32 << 10,
		ReadBufferSize:     32 << 10,
		// A request that expects 100 Continue sends its body when the
		// backend asks for it, as the HTTP/1.1 wire does.
		ExpectContinueTimeout: ExpectContinueTimeout,
		// As the HTTP/1.1 pool bounds heads (pool.Config.MaxHeadBytes).
		MaxResponseHeaderBytes: http.DefaultMaxHeaderBytes,
		HTTP2:                  &http.HTTP2Config{SendPingTimeout: cfg.H2PingAfter, PingTimeout: cfg.H2PingTimeout},
		Protocols:              new(http.Protocols),
	}
	hp := &h2pool{t: t, m: w.p.m, conns: make(map[*h2Conn]bool), dialing: make(map[string]*h2Dial)}
	hp.owner.Store(w)
	dialFn := func(ctx context.Context, _, addr string) (c net.Conn, err error) {
		defer cfg.Panics.Recover("dial", &err, nil)
		picked, err := endpointFor(ctx, addr)
		if err != nil {
			return nil, err
		}
		try := ctx.Value(connTryKey{}).(*connTry) // h2Transport.RoundTrip's
		return hp.dialOnce(ctx, addr, try, func(ctx context.Context) (*h2Conn, error) {
			if try.c == picked {
				try.Store(true) // this dial settles or hands back the probe
			}
			by := hp.owner.Load()
			c, err := by.dialH2(ctx, picked, wire)
			if err != nil {
				return nil, err
			}
			return hp.add(by, wire, c), nil
		})
	}
	if w.tls != nil {
		t.DialTLSContext = dialFn
		t.Protocols.SetHTTP2(true)
	} else {
		t.DialContext = dialFn
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	w.transports[wire] = hp
	return hp
}

// dialOnce dials addr for try, a request of hp's Transport, unless a dial
// to addr is under way: net/http's Transport dials once per request
// waiting for a connection, hands the first HTTP/2 one to every request
// waiting then, and closes the others — a cold burst of 150 requests
// opened dozens, over TLS each a handshake. It waits for that dial
// instead: once it connected, until the request has a connection or has
// ended (its wait; the Transport hands the connection over only after the
// dial returns), and ends with errDialShared, which the Transport drops;
// when it failed, with its error, as the request would have. A dial goes
// on while a request waits for it, and ends with the last (leave).
// Streams running out on the connections open still make the Transport
// dial, one at a time: nothing caps them.
func (hp *h2pool) dialOnce(ctx context.Context, addr string, try *connTry, dial func(context.Context) (*h2Conn, error)) (net.Conn, error) {
	got := try.wait()
	for {
		hp.mu.Lock()
		select {
		case <-got:
			hp.mu.Unlock()
			return nil, errDialShared // the Transport was late to start it
		default:
		}
		d := hp.dialing[addr]
		lead := d == nil
		if lead {
			dctx, end := context.WithCancelCause(ctx)
			d = &h2Dial{done: make(chan struct{}), ctx: dialCtx{dctx}, end: end}
			hp.dialing[addr] = d
		}
		d.waiting++
		hp.mu.Unlock()
		if lead {
			return hp.lead(addr, d, try, got, dial)
		}
		select {
		case <-d.done:
		case <-got:
			hp.leave(d, try, got)
			return nil, errDialShared
		case <-ctx.Done():
			hp.leave(d, try, got)
			return nil, ctx.Err()
		}
		switch {
		case d.err == nil:
			select {
			case <-got:
				return nil, errDialShared
			case <-d.gone:
				// Closed before the Transport handed it over (its
				// HTTP/2 preface failed): dial again.
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		case !d.ended:
			return nil, d.err
		}
		// Else it ended with the requests that waited for it, or
		// CloseIdleConnections ended it: not the endpoint's failure.
	}
}

// lead makes d, the dial to addr that try's wait, got, started.
func (hp *h2pool) lead(addr string, d *h2Dial, try *connTry, got <-chan struct{}, dial func(context.Context) (*h2Conn, error)) (net.Conn, error) {
	go func() {
		select {
		case <-got:
			hp.leave(d, try, got)
		case <-d.done:
		}
	}()
	c, err := dial(d.ctx)
	hp.mu.Lock()
	delete(hp.dialing, addr)
	d.err, d.ended = err, d.ctx.Err() != nil
	if err == nil {
		d.gone = c.gone
	}
	hp.mu.Unlock()
	d.end(nil)
	close(d.done)
	if err != nil {
		return nil, err
	}
	return c.transportConn(), nil
}

// leave ends the wait got of try for d: it has a connection, or it
// ended. A dial that no request waits for any more, the last having
// ended, ends with it (dialCtx); one whose requests got connections
// elsewhere goes on, for later ones, bounded by HandshakeTimeout.
func (hp *h2pool) leave(d *h2Dial, try *connTry, got <-chan struct{}) {
	err := try.endedWith(got)
	hp.mu.Lock()
	defer hp.mu.Unlock()
	if d.waiting--; d.waiting == 0 && err != nil {
		d.end(err)
	}
}

// add registers c, which by dialed for hp.
func (hp *h2pool) add(by *wireState, wire Wire, c *h2Checked) *h2Conn {
	hc := &h2Conn{Upstream: h2drain.NewUpstream(c), pool: hp, gone: make(chan struct{})}
	if tc, ok := c.Conn.(*tls.Conn); ok {
		hc.held = by.tls.Hold(tc.ConnectionState(), wire.ALPN())
	}
	hp.mu.Lock()
	defer hp.mu.Unlock()
	hp.conns[hc] = false
	w := hp.owner.Load()
	if w != by {
		// Taken over while it was dialed: the new settings must keep it.
		hp.keep(hc, w.tls.Keeper())
	} else {
		hp.expireAt(hc)
	}
	if w.retired.Load() {
		// Dialed while a Build retired w: its GOAWAYs went to the
		// connections open then.
		w.retire(hp, hc)
	}
	return hc
}

// transportConn returns c as hp's Transport is to use it.
func (c *h2Conn) transportConn() net.Conn {
	if _, ok := c.checked().Conn.(*tls.Conn); ok {
		return h2TLSConn{c}
	}
	return c
}

// adopt takes over old's HTTP/2 Transports, under k, the Keeper of w's
// settings, when both wires are TLS: net/http's Transport holds a
// backend's connections for every request, and trust that only widened
// (a CA added beside the one that verified them) must not make them all
// connect again. Those k does not keep are asked away (h2pool.keep).
// Without k, old keeps them, to be set aside with it.
func (w *wireState) adopt(old *wireState, k *upstreamtls.Keeper) {
	if k == nil || old.tls == nil {
		return
	}
	old.mu.Lock()
	pools := old.transports
	old.transports = [wireCount]*h2pool{}
	old.mu.Unlock()
	for wire, hp := range pools {
		if hp == nil {
			continue
		}
		w.transports[wire] = hp // w is not shared yet
		hp.mu.Lock()
		hp.owner.Store(w)
		for c, leaving := range hp.conns {
			if !leaving {
				hp.keep(c, k)
			}
		}
		hp.mu.Unlock()
	}
}

// keep holds c under k, the Keeper of new settings, its expiry moved to
// where their trust in it ends, or sets it aside. hp.mu is held.
func (hp *h2pool) keep(c *h2Conn, k *upstreamtls.Keeper) {
	h, err := k.Keep(c.held)
	if err != nil {
		if hp.setAside(c, h2drain.ReasonPolicyChanged) {
			hp.m.poolDropped[pool.DropSettingsChanged].Inc()
		}
		return
	}
	c.held = h
	hp.expireAt(c)
}

// expireAt sets c aside when the trust in its TLS ends: net/http's
// Transport would reuse it while requests keep it busy, where no new
// handshake accepts the certificate chain it verified. hp.mu is held.
func (hp *h2pool) expireAt(c *h2Conn) {
	if c.expiry != nil {
		c.expiry.Stop()
	}
	until := c.held.Until()
	if until.IsZero() {
		return // cleartext
	}
	c.expiry = time.AfterFunc(time.Until(until), func() {
		hp.mu.Lock()
		defer hp.mu.Unlock()
		if !time.Now().Before(c.held.Until()) && hp.setAside(c, h2drain.ReasonExpired) {
			hp.m.poolDropped[pool.DropExpired].Inc()
		}
	})
}

// setAside asks c, if open and not asked before, to go away for why: its
// requests under way finish, none starts on it, and it closes once the
// last ends, where the Transport kept it until its idle timeout (90 s)
// after that. It reports whether it asked. hp.mu is held.
func (hp *h2pool) setAside(c *h2Conn, why h2drain.Reason) bool {
	if leaving, open := hp.conns[c]; leaving || !open {
		return false
	}
	hp.conns[c] = true
	if c.expiry != nil {
		c.expiry.Stop()
	}
	return c.GoAway(why)
}

// setAside retires w, and sets aside the connections of its HTTP/2
// Transports: only requests of older snapshots would take them again.
// Those of a backend whose settings changed (replaced) count as
// settings_changed. One dialed after is set aside as it is added.
func (w *wireState) setAside(replaced bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.replaced = replaced
	w.retired.Store(true) // after replaced, which add reads once it sees retired
	for _, hp := range w.transports {
		if hp == nil {
			continue
		}
		hp.mu.Lock()
		for c := range hp.conns {
			w.retire(hp, c)
		}
		hp.mu.Unlock()
	}
}

// retire sets c, a connection of hp, aside once a Build retired w, which
// owns hp. hp.mu is held.
func (w *wireState) retire(hp *h2pool, c *h2Conn) {
	if hp.setAside(c, h2drain.ReasonPolicyChanged) && w.replaced {
		hp.m.poolDropped[pool.DropSettingsChanged].Inc()
	}
}

// holdsH2 reports whether a connection of w's HTTP/2 Transports is open;
// not of those a new wire took over (adopt).
func (w *wireState) holdsH2() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, hp := range w.transports {
		if hp == nil {
			continue
		}
		hp.mu.Lock()
		n := len(hp.conns)
		hp.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}

// closeIdle closes w's idle connections when w is dropped (its backend's
// settings changed or it left the snapshot) or the proxy shuts down.
func (w *wireState) closeIdle() {
	w.h1.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, hp := range w.transports {
		if hp != nil {
			hp.t.CloseIdleConnections()
		}
	}
}
