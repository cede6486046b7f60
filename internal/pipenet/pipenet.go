package pipenet

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// Net is a network of Listeners; it is also a dialer (dial.Dialer). The
// zero value is an empty network.
type Net struct {
	mu sync.Mutex
	ls map[netip.AddrPort]*Listener
}

// Listener is a net.Listener at an address of a Net.
type Listener struct {
	addr  netip.AddrPort
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// Listen makes the listener at a, in place of any there before.
func (n *Net) Listen(a netip.AddrPort) *Listener {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ls == nil {
		n.ls = map[netip.AddrPort]*Listener{}
	}
	l := &Listener{addr: a, conns: make(chan net.Conn), done: make(chan struct{})}
	n.ls[a] = l
	return l
}

// Dial connects to the listener at ep.Addr; none, or a closed one, is a
// refused connection.
func (n *Net) Dial(ctx context.Context, ep snapshot.Endpoint) (net.Conn, error) {
	n.mu.Lock()
	l := n.ls[ep.Addr]
	n.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("dial %s: %w", ep.Addr, syscall.ECONNREFUSED)
	}
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("dial %s: %w", ep.Addr, syscall.ECONNREFUSED)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *Listener) Addr() net.Addr { return net.TCPAddrFromAddrPort(l.addr) }

// Buffered returns l whose connections take writes without waiting for
// the peer to read them, as a socket's buffer does: over net.Pipe, a TLS
// client that refuses the server's certificate writes its alert while the
// server still writes the rest of its flight, and both ends of HTTP/2
// write their preface before they read; each would wait for the other.
func Buffered(l net.Listener) net.Listener { return bufferedListener{l} }

type bufferedListener struct{ net.Listener }

func (l bufferedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	b := &bufferedConn{Conn: c, writes: make(chan []byte, 64)}
	go b.flush()
	return b, nil
}

type bufferedConn struct {
	net.Conn
	mu     sync.Mutex
	closed bool
	writes chan []byte
}

func (b *bufferedConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, net.ErrClosed
	}
	b.writes <- bytes.Clone(p)
	return len(p), nil
}

// Close closes the connection once what was written has gone out, or
// the peer closed its end.
func (b *bufferedConn) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		close(b.writes)
	}
	return nil
}

func (b *bufferedConn) flush() {
	defer b.Conn.Close()
	for p := range b.writes {
		if _, err := b.Conn.Write(p); err != nil {
			b.Conn.Close() // the writes left fail at once
		}
	}
}
