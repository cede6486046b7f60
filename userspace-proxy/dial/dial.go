package dial

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath/mark"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// Dialer opens a stream to one backend endpoint.
type Dialer interface {
	Dial(ctx context.Context, ep snapshot.Endpoint) (net.Conn, error)
}

// Config configures Direct. The zero value marks sockets with mark.Proxy
// and connects with a 5 s timeout.
type Config struct {
	// Mark is set as SO_MARK on every upstream socket; 0 means mark.Proxy.
	// The datapath skips sockets carrying its mark in the agent's netns,
	// where Direct dials from, which is what keeps the proxy's own
	// connections from being redirected back to itself.
	Mark uint32
	// Unmarked leaves SO_MARK unset (setting it needs CAP_NET_ADMIN, or
	// CAP_NET_RAW since Linux 5.17). Only for tests and setups without
	// capture; a node agent must mark.
	Unmarked bool
	// Timeout bounds the TCP connect; 0 means 5 s.
	Timeout time.Duration
	// KeepAlive is the TCP keep-alive period; 0 keeps Go's default (15 s),
	// negative disables it.
	KeepAlive time.Duration
}

// Direct dials endpoints over TCP from this node.
type Direct struct {
	d net.Dialer
}

// NewDirect returns a Direct dialer.
func NewDirect(c Config) *Direct {
	d := net.Dialer{Timeout: c.Timeout, KeepAlive: c.KeepAlive}
	if d.Timeout == 0 {
		d.Timeout = 5 * time.Second
	}
	if !c.Unmarked {
		m := c.Mark
		if m == 0 {
			m = mark.Proxy
		}
		d.Control = mark.ControlWith(m)
	}
	return &Direct{d: d}
}

// Dial connects to ep.Addr.
func (d *Direct) Dial(ctx context.Context, ep snapshot.Endpoint) (net.Conn, error) {
	c, err := d.d.DialContext(ctx, "tcp", ep.Addr.String())
	if err != nil {
		return nil, fmt.Errorf("dial endpoint %s: %w", ep.Addr, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return sockio.Wrap(tc), nil
	}
	return c, nil
}
