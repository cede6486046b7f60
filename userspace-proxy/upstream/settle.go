package upstream

// A TLS 1.3 backend judges the client certificate it asked for after the
// proxy's side of the handshake has ended: the client's Certificate,
// CertificateVerify and Finished are its last handshake messages, and it
// may send data at once (RFC 8446 §2, §4.4). A backend that refuses the
// certificate, or the proxy's lack of one (bad_certificate, unknown_ca,
// certificate_required: §6.2), says so with an alert after Handshake
// returned, which the proxy reads as the first read's error — or, when
// the backend reset the connection (it closed it with the proxy's last
// handshake messages unread) before the proxy wrote, meets first as that
// write's broken pipe or reset, with the alert still queued to be read.
// Settle turns either into the handshake's failure, whichever comes
// first; such a handshake counts once settled. A close without an alert
// (a FIN, a reset with nothing queued) settles it full, its error left as
// it came (upstream_error): TLS stacks refuse a certificate with an alert
// (Go's, OpenSSL's, BoringSSL's; RFC 8446 §6.2), and a backend that
// closes instead — nginx's stream module refusing a certificate it checks
// after its handshake, or one restarting — cannot be told from an
// ordinary close, and closes so under TLS 1.2 too, where the handshake
// counted full as it ended. TLS 1.2 backends judge the certificate
// within the handshake, and handshakes whose server asked for none have
// nothing judged after them: they count as they end, and nothing here
// waits, reads or times anything.

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// errRefused is wrapped, with errHandshake and the backend's alert, by the
// error of a handshake refused after its end (Settle).
var errRefused = errors.New("refused by the backend after its end")

// judgement is a TLS 1.3 handshake with an endpoint that asked for a
// client certificate, which it judges after the handshake: settled once,
// by the first outcome Settle is given, and told to every later one.
type judgement struct {
	w       *wireState
	ep      netip.AddrPort
	once    sync.Once
	settled atomic.Bool
	// refusal is the handshake's error once the endpoint refused it.
	refusal error
}

// Settle returns err, the outcome of a read of c, a connection to an
// endpoint of a Backend (Dial, GetH1) — nil when it returned bytes — or
// of a write to it that failed. When c's TLS 1.3 handshake awaits the
// backend's judgement of the client certificate it asked for, the first
// outcome settles and counts it: failed when err is the backend's alert,
// or a write's broken pipe or reset with the alert queued behind it;
// otherwise full. From then on, Settle returns for c's refused handshake
// an error that Classify takes for tls_handshake and that names the
// alert, whatever err (a concurrent settler's outcome is waited for);
// else err. For other connections it costs a type check and a pointer
// load.
func Settle(c net.Conn, err error) error {
	j := judgementOf(c)
	if j == nil {
		return err
	}
	j.once.Do(func() { j.settle(c.(*tls.Conn), err) })
	if j.refusal != nil {
		return j.refusal
	}
	return err
}

// settle judges the handshake by err (Settle).
func (j *judgement) settle(tc *tls.Conn, err error) {
	defer j.settled.Store(true)
	m := j.w.p.m
	if !isRemoteAlert(err) && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		// A write the backend's reset broke (the proxy never shuts its
		// side before its first read). Linux reads a reset socket's
		// queued bytes before its error and never waits on it: the alert
		// sent ahead of the reset is there, or nothing is. A concurrent
		// reader that took it first left it as tls.Conn's error.
		if _, rerr := tc.Read(make([]byte, 1)); isRemoteAlert(rerr) {
			err = rerr
		}
	}
	if !isRemoteAlert(err) {
		m.handshakesFull.Inc()
		return
	}
	m.handshakes.WithLabelValues("failed").Inc()
	j.refusal = fmt.Errorf("%w to %s (%s): %w: %w", errHandshake, j.ep, j.w.tls.Settings().ServerName, errRefused, err)
}

// closed settles the handshake of a connection closed before anything
// else settled it (the app left, say): nothing said it was refused.
func (j *judgement) closed() {
	j.once.Do(func() {
		j.settled.Store(true)
		j.w.p.m.handshakesFull.Inc()
	})
}

// judgementOf returns the judgement of c's handshake, or nil when it has
// none: cleartext, TLS 1.2, no certificate asked for (resumed ones ask
// for none).
func judgementOf(c net.Conn) *judgement {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil
	}
	if t := trackedUnder(tc.NetConn()); t != nil {
		return t.judgement
	}
	return nil
}

// refused reports whether err is a handshake refused after its end.
func refused(err error) bool { return errors.Is(err, errRefused) }

// trackedUnder returns the trackedConn under c's wrappers, or nil.
func trackedUnder(c net.Conn) *trackedConn {
	for {
		if t, ok := c.(*trackedConn); ok {
			return t
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
}

// ForRelay returns c, a connection Dial returned, as a relay is to use
// it: when c's handshake awaits the backend's judgement, in a wrapper
// whose first read settles it (Settle). Refused then tells, once the
// relay ended, whether the backend refused it. The wrapper passes reads
// through (sockio.PooledReader) and exposes c as NetConn, so a relay
// reads c's TLS as it would c's.
func ForRelay(c net.Conn) net.Conn {
	if j := judgementOf(c); j == nil || j.settled.Load() {
		return c
	}
	return &relayedConn{Conn: c}
}

// Refused returns the handshake error of c, a connection ForRelay
// returned, when its backend refused its handshake after its end; nil
// otherwise.
func Refused(c net.Conn) error {
	if rc, ok := c.(*relayedConn); ok {
		return rc.refused
	}
	return nil
}

// relayedConn is ForRelay's wrapper. Only its first read settles: a
// relay's write that fails leaves the connection to the relay's read of
// it, which then meets the alert.
type relayedConn struct {
	net.Conn
	read    bool // the relay's reader alone reads
	refused error
}

func (c *relayedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.read {
		return n, err
	}
	c.read = true
	if n > 0 {
		Settle(c.Conn, nil) // the backend's first bytes: it took the certificate
		return n, err
	}
	if err = Settle(c.Conn, err); refused(err) {
		c.refused = err
	}
	return n, err
}

// NetConn returns the TLS connection underneath.
func (c *relayedConn) NetConn() net.Conn { return c.Conn }

// ReadPooled reads through c's Read: a relay asks only those beneath TLS
// (sockio.Pooled), and takes c for a wrapper it can see through.
func (c *relayedConn) ReadPooled(bufs sockio.Buffers) (*[]byte, int, error) {
	return sockio.ReadInto(c, bufs)
}
