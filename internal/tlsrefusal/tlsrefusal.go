package tlsrefusal

import (
	"context"
	"crypto/tls"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// Refusal orders the server's reset of each refused connection and the
// client's first write after its TLS 1.3 handshake.
type Refusal struct {
	// BackendFirst: the server resets before that write; else after it.
	BackendFirst bool
	// Silent: the server judges no certificate in its handshake, though it
	// asks for one (tls.RequestClientCert), and once its handshake ended,
	// under TLS 1.3 or 1.2, closes each connection in the order above
	// without an alert, whatever it got: as nginx's stream module refuses a
	// certificate it checks after the handshake, or any backend closes a
	// connection before its first word (a restart).
	Silent bool
	// FIN: a Silent server closes with a close_notify and a FIN rather
	// than a reset, and the client's write waits for that FIN. Only with
	// BackendFirst: once the client wrote, a close with its bytes unread
	// resets.
	FIN   bool
	mu    sync.Mutex
	steps map[string]*step // by the client's address, from its connect until its server takes it
}

// step is one connection's: wrote closes once the client's first write
// went, reset once the server reset the connection (or, FIN, closed it).
type step struct {
	wrote, reset         chan struct{}
	wroteOnce, resetOnce sync.Once
}

func newStep() *step { return &step{wrote: make(chan struct{}), reset: make(chan struct{})} }

// dialed records the step of a connection the Dialer opened from client,
// before its ClientHello: an earlier connection's from the same address,
// one its server never took (which a reset leaves free at once), goes.
func (r *Refusal) dialed(client net.Addr) *step {
	s := newStep()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.steps == nil {
		r.steps = make(map[string]*step)
	}
	r.steps[client.String()] = s
	return s
}

// taken takes out the step of the connection the server accepted from
// client, once its handshake ended; one of its own for a client that did
// not come through the Dialer. (Paired by who came first, a connection
// that one side never reached left its step to the next from its port,
// whose client then waited on a server that had gone on.)
func (r *Refusal) taken(client net.Addr) *step {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := client.String()
	if s := r.steps[k]; s != nil {
		delete(r.steps, k)
		return s
	}
	return newStep()
}

func (s *step) written() { s.wroteOnce.Do(func() { close(s.wrote) }) }
func (s *step) resets()  { s.resetOnce.Do(func() { close(s.reset) }) }

// Serve serves TLS with cfg, which must require a client certificate, on a
// loopback listener until t ends, and returns its address. A handshake
// cfg refuses has sent its alert; the server then resets the connection,
// in r's order. A client it accepts gets its connection closed at once,
// unless r is Silent.
func (r *Refusal) Serve(t testing.TB, cfg *tls.Config) netip.AddrPort {
	t.Helper()
	if r.FIN && !r.BackendFirst {
		t.Fatal("tlsrefusal: a FIN needs BackendFirst: after the client wrote, the close resets")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if r.Silent {
		cfg = cfg.Clone()
		cfg.ClientAuth = tls.RequestClientCert
	}
	done := make(chan struct{})
	tcpserve.Serve(t, ln, func(c net.Conn) {
		tc := tls.Server(c, cfg)
		err := tc.Handshake()
		s := r.taken(c.RemoteAddr())
		defer s.resets() // however it ends, a client waiting for it goes on
		switch {
		case err == nil && !r.Silent:
			return
		case err != nil && tc.ConnectionState().Version < tls.VersionTLS13:
			c.Close() // the client's handshake failed: it writes nothing
			return
		}
		if !r.BackendFirst {
			select { // a client that closed unwritten holds it to the test's end
			case <-s.wrote:
			case <-done:
			}
		}
		if r.FIN {
			tc.Close()
		} else {
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	})
	// After tcpserve's, so that it runs first: tcpserve's waits for the
	// handlers.
	t.Cleanup(func() { close(done) })
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// Dialer returns d with its connections' first write after a TLS 1.3
// handshake ordered by r.
func (r *Refusal) Dialer(d dial.Dialer) dial.Dialer { return dialer{d, r} }

type dialer struct {
	d dial.Dialer
	r *Refusal
}

func (d dialer) Dial(ctx context.Context, ep snapshot.Endpoint) (net.Conn, error) {
	c, err := d.d.Dial(ctx, ep)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, r: d.r, s: d.r.dialed(c.LocalAddr())}, nil
}

// conn is a connection of the Dialer's. The write it orders is the second
// after its first read: its first is the ClientHello, the server's flight
// is read, and crypto/tls writes the client's (Certificate,
// CertificateVerify, Finished) at once; what follows is the caller's.
type conn struct {
	net.Conn
	r      *Refusal
	s      *step
	read   atomic.Bool
	mu     sync.Mutex
	writes int // after the first read
}

func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.read.Store(true)
	}
	return n, err
}

func (c *conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.read.Load() {
		c.writes++
	}
	if c.writes != 2 {
		return c.Conn.Write(p)
	}
	if c.r.BackendFirst {
		<-c.s.reset
		c.awaitClose()
		return c.Conn.Write(p)
	}
	defer c.s.written()
	return c.Conn.Write(p)
}

// awaitClose waits, at most 10 s, until the server's close has reached
// the socket — its reset closed it, or its FIN half-closed it: loopback
// delivers them before the server's close returns, but no call says so —
// or the client closed it (its reader met the reset first).
func (c *conn) awaitClose() {
	tc := sockio.TCP(c.Conn)
	if tc == nil {
		return
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		closed := false
		err := raw.Control(func(fd uintptr) {
			info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
			closed = err != nil || info.State == unix.BPF_TCP_CLOSE || info.State == unix.BPF_TCP_CLOSE_WAIT
		})
		if closed || err != nil {
			return
		}
	}
}

// NetConn returns the connection underneath, as crypto/tls's does.
func (c *conn) NetConn() net.Conn { return c.Conn }
