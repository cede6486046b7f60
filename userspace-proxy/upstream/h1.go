package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstreamtls"
)

// ErrNotHTTP11 is returned by GetH1 when a TLS backend negotiated another
// protocol than http/1.1 (its policy's ALPN list leaves it out).
var ErrNotHTTP11 = errors.New("backend did not negotiate http/1.1")

// ErrDeclinedHTTP11 is wrapped, with the handshake's error (still
// tls_handshake), by GetH1's error when the TLS endpoint refused the
// offer of http/1.1 alone for want of a common protocol (alert
// no_application_protocol, RFC 7301 §3.2): a server speaking h2 alone, as
// rustls-based ones refuse. SpeaksH2Only remembers it for the backend.
// Nothing of a request went out.
var ErrDeclinedHTTP11 = errors.New("backend declined http/1.1")

// GetH1 returns a connection to picked, an endpoint of b, for one
// HTTP/1.1 exchange: an idle one from b's pool, or a new one (over TLS
// with ALPN http/1.1 and session resumption when b needs TLS), for
// client. Hand it back with PutH1 when the exchange left it reusable, else
// DiscardH1 or DetachH1. An error that Is pool.ErrNotHandedOut says no
// connection was dialed or taken: nothing went toward the endpoint.
func (b *Backend) GetH1(ctx context.Context, picked *balance.Choice, client pool.Client) (*pool.Conn, error) {
	if b.Err != nil {
		return nil, b.Err
	}
	w := b.w
	c, err := w.h1.Get(ctx, picked.Endpoint.Addr, client, func(ctx context.Context) (net.Conn, error) {
		return w.dialH1(ctx, picked)
	})
	if err != nil {
		if errors.Is(err, pool.ErrNotHandedOut) {
			// The request waited for a connection (the endpoint had
			// MaxConnsPerEndpoint open) until ctx ended or ConnWait
			// passed: it connected nothing, and a probe it held must not
			// stay out for a caller that gave up.
			w.p.health.Canceled(picked)
		}
		return nil, err
	}
	if c.Reused() {
		w.p.m.poolGets[1].Inc()
		w.p.health.Reused(picked)
		return c, nil
	}
	w.p.m.poolGets[0].Inc()
	// Not reused past its chain's expiry: a certificate (or CA) that
	// expired while the connection idled would fail the next handshake,
	// and the pool served its requests all the same.
	c.Until = b.ValidUntil(c.Conn)
	return c, nil
}

// ValidUntil returns when the trust in c, a connection to an endpoint of
// b, ends (upstreamtls.Origination.ValidUntil); zero when c is cleartext.
func (b *Backend) ValidUntil(c net.Conn) time.Time { return b.Held(c, nil).Until() }

// Held returns the TLS of c, a connection b dialed offering what speaks
// speaks (Dial's alpn); the zero Held when c is cleartext.
func (b *Backend) Held(c net.Conn, speaks []string) upstreamtls.Held {
	if tc, ok := c.(*tls.Conn); ok && b.w != nil && b.w.tls != nil {
		return b.w.tls.Hold(tc.ConnectionState(), speaks)
	}
	return upstreamtls.Held{}
}

// PutH1 returns c to b's pool for the next request.
func (b *Backend) PutH1(c *pool.Conn) { b.w.h1.Put(c) }

// DiscardH1 closes c.
func (b *Backend) DiscardH1(c *pool.Conn) { b.w.h1.Discard(c) }

// DetachH1 takes c out of the pool's accounting and leaves it to the caller
// (a WebSocket relay after 101 Switching Protocols).
func (b *Backend) DetachH1(c *pool.Conn) { b.w.h1.Detach(c) }

func (w *wireState) dialH1(ctx context.Context, picked *balance.Choice) (net.Conn, error) {
	c, err := w.dial(ctx, picked, alpnH1, false)
	if noCommonProtocol(err) {
		w.declinedH1.Store(time.Now().UnixNano())
		return nil, fmt.Errorf("%w: %w", ErrDeclinedHTTP11, err)
	}
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*tls.Conn); ok {
		if p := tc.ConnectionState().NegotiatedProtocol; p != "" && p != upstreamtls.ALPNHTTP11 {
			c.Close()
			return nil, fmt.Errorf("tls to %s: %w (got %q)", picked.Endpoint.Addr, ErrNotHTTP11, p)
		}
	}
	return c, nil
}

// noApplicationProtocol is TLS alert 120 (RFC 7301 §3.2).
const noApplicationProtocol = 120

// noCommonProtocol reports whether err is the backend's TLS alert
// no_application_protocol. crypto/tls returns an alert of an unexported
// type (isRemoteAlert), whose text is AlertError's for the same code:
// the only way to its code.
func noCommonProtocol(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error" &&
		oe.Err != nil && oe.Err.Error() == tls.AlertError(noApplicationProtocol).Error()
}
