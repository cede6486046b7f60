package upstream

import (
	"context"
	"crypto/tls"
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
}

// h2Conn is a connection of an h2pool, with its TLS (the zero Held when
// cleartext) and the GOAWAY that sets it aside (h2drain.Upstream).
type h2Conn struct {
	*h2drain.Upstream
	pool *h2pool
	// held, and expiry, which sets it aside when held's trust ends, are
	// under pool.mu.
	held   upstreamtls.Held
	expiry *time.Timer
}

func (c *h2Conn) Close() error {
	c.pool.mu.Lock()
	delete(c.pool.conns, c)
	if c.expiry != nil {
		c.expiry.Stop()
	}
	c.pool.mu.Unlock()
	return c.Upstream.Close()
}

// h2TLSConn is an h2Conn over TLS: the Transport reads its
// ConnectionState to learn that it speaks h2.
type h2TLSConn struct{ *h2Conn }

func (c h2TLSConn) ConnectionState() tls.ConnectionState {
	return c.Upstream.Conn.(*tls.Conn).ConnectionState()
}

// transport is net/http's Transport for HTTP/2 (wire WireH2, or
// WireNegotiate for the h2 side of negotiated): it speaks HTTP/2 only, as
// its connections refuse any other protocol (dialH2).
func (w *wireState) transport(wire Wire) *http.Transport {
	w.mu.Lock()
	defer w.mu.Unlock()
	if hp := w.transports[wire]; hp != nil {
		return hp.t
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
	hp := &h2pool{t: t, m: w.p.m, conns: make(map[*h2Conn]bool)}
	hp.owner.Store(w)
	dialFn := func(ctx context.Context, _, addr string) (c net.Conn, err error) {
		defer cfg.Panics.Recover("dial", &err, nil)
		picked, err := endpointFor(ctx, addr)
		if err != nil {
			return nil, err
		}
		if try, ok := ctx.Value(connTryKey{}).(*connTry); ok && try.c == picked {
			try.Store(true) // this dial settles or hands back the probe
		}
		by := hp.owner.Load()
		if c, err = by.dialH2(ctx, picked, wire); err != nil {
			return nil, err
		}
		return hp.add(by, wire, c), nil
	}
	if w.tls != nil {
		t.DialTLSContext = dialFn
		t.Protocols.SetHTTP2(true)
	} else {
		t.DialContext = dialFn
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	w.transports[wire] = hp
	return t
}

// add registers c, which by dialed for hp, and returns it as hp's
// Transport is to use it.
func (hp *h2pool) add(by *wireState, wire Wire, c net.Conn) net.Conn {
	hc := &h2Conn{Upstream: h2drain.NewUpstream(c), pool: hp}
	tc, ok := c.(*tls.Conn)
	if ok {
		hc.held = by.tls.Hold(tc.ConnectionState(), wire.ALPN())
	}
	hp.mu.Lock()
	defer hp.mu.Unlock()
	hp.conns[hc] = false
	if w := hp.owner.Load(); w != by {
		// Taken over while it was dialed: the new settings must keep it.
		hp.keep(hc, w.tls.Keeper())
	} else {
		hp.expireAt(hc)
	}
	if !ok {
		return hc
	}
	return h2TLSConn{hc}
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

// setAside sets aside the connections of w's HTTP/2 Transports once a
// Build retired w: only requests of older snapshots would take them
// again. Those of a backend whose settings changed (replaced) count as
// settings_changed.
func (w *wireState) setAside(replaced bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, hp := range w.transports {
		if hp == nil {
			continue
		}
		hp.mu.Lock()
		for c := range hp.conns {
			if hp.setAside(c, h2drain.ReasonPolicyChanged) && replaced {
				hp.m.poolDropped[pool.DropSettingsChanged].Inc()
			}
		}
		hp.mu.Unlock()
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
