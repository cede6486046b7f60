package relay

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// backendCert returns a test CA and a certificate it issued for "backend".
func backendCert(t *testing.T) (*pki.CA, *pki.Leaf) {
	t.Helper()
	ca, err := pki.NewCA("relay test")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{DNSNames: []string{"backend"}})
	if err != nil {
		t.Fatal(err)
	}
	return ca, leaf
}

// proxySides are the ways the proxy's own ends of a relay come: raw system
// calls (sockio, the proxy's TCP connections: the copy waits without a
// buffer) and plain net.Conns (the copy holds its buffer).
var proxySides = []struct {
	name string
	wrap func(net.Conn) net.Conn
}{
	{"sockio", func(c net.Conn) net.Conn { return sockio.Wrap(c.(*net.TCPConn)) }},
	{"net", func(c net.Conn) net.Conn { return c }},
}

// TestRelayHalfClose: the app half-closes after its request; the relay
// passes the end on, the backend still answers, and the app reads the whole
// answer before its end.
func TestRelayHalfClose(t *testing.T) {
	for _, side := range proxySides {
		t.Run(side.name, func(t *testing.T) { testRelayHalfClose(t, side.wrap) })
	}
}

func testRelayHalfClose(t *testing.T, wrap func(net.Conn) net.Conn) {
	app, proxyIn := tcpserve.Pair(t)
	proxyOut, backend := tcpserve.Pair(t)
	defer app.Close()
	defer backend.Close()
	done := make(chan Result)
	go func() { done <- Relay(wrap(proxyIn), wrap(proxyOut), NewPool(), nil) }()

	req := bytes.Repeat([]byte("q"), 3*BufferSize+7)
	go func() {
		app.Write(req)
		app.CloseWrite()
	}()
	got, err := io.ReadAll(backend) // ends only if the half-close arrived
	if err != nil || !bytes.Equal(got, req) {
		t.Fatalf("backend read %d bytes, %v; want %d", len(got), err, len(req))
	}
	answer := bytes.Repeat([]byte("a"), BufferSize+1)
	backend.Write(answer)
	backend.CloseWrite()
	got, err = io.ReadAll(app)
	if err != nil || !bytes.Equal(got, answer) {
		t.Fatalf("app read %d bytes, %v; want %d", len(got), err, len(answer))
	}
	res := <-done
	if res.AToB != int64(len(req)) || res.BToA != int64(len(answer)) || res.Err != nil {
		t.Errorf("Relay = %+v", res)
	}
}

// TestRelayErrorClosesBoth: when one side resets, the other is reset too
// rather than left waiting, or ended cleanly as if it had everything; the
// reset is the relay's error.
func TestRelayErrorClosesBoth(t *testing.T) {
	for _, side := range proxySides {
		t.Run(side.name, func(t *testing.T) { testRelayErrorClosesBoth(t, side.wrap) })
	}
}

func testRelayErrorClosesBoth(t *testing.T, wrap func(net.Conn) net.Conn) {
	app, proxyIn := tcpserve.Pair(t)
	proxyOut, backend := tcpserve.Pair(t)
	defer app.Close()
	done := make(chan Result)
	go func() { done <- Relay(wrap(proxyIn), wrap(proxyOut), NewPool(), nil) }()
	backend.SetLinger(0)
	backend.Close()
	app.SetReadDeadline(time.Now().Add(10 * time.Second)) // a hang guard
	if _, err := io.ReadAll(app); !errors.Is(err, unix.ECONNRESET) {
		t.Errorf("app read ended with %v; want a reset", err)
	}
	if res := <-done; !errors.Is(res.Err, unix.ECONNRESET) {
		t.Errorf("Relay = %+v; want the backend's reset as Err", res)
	}
}

// TestBackendLineBeforeReset: a backend that refuses an upload — it reads
// part of it, writes an error line and resets — has its line reach the app
// before the reset, cleartext or with TLS toward it, though the relay's
// write of the upload fails before it reads the line (and took the
// socket's report of the reset, so that the read after the line finds
// the end of the stream). The failed write
// used to reset the app at once, and the line was lost (in 2 of 8 runs,
// those where the app→backend direction woke first; here it always does).
func TestBackendLineBeforeReset(t *testing.T) {
	ca, leaf := backendCert(t)
	const line = "ERR upload too large\n"
	for _, withTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", withTLS), func(t *testing.T) {
			app, proxyIn := tcpserve.Pair(t)
			proxyOut, backendTCP := tcpserve.Pair(t)
			defer app.Close()
			up, backend := sockio.Wrap(proxyOut), net.Conn(backendTCP)
			if withTLS {
				tc := tls.Client(up, &tls.Config{ServerName: "backend", RootCAs: ca.Pool()})
				ts := tls.Server(backend, &tls.Config{Certificates: []tls.Certificate{leaf.TLS}})
				go ts.Handshake()
				if err := tc.Handshake(); err != nil {
					t.Fatal(err)
				}
				up, backend = tc, ts
			}
			done := make(chan Result)
			go func() {
				done <- Relay(sockio.Wrap(proxyIn), &readAfterFailedWrite{Conn: up, failed: make(chan struct{})}, NewPool(), nil)
			}()
			app.Write(make([]byte, 1024))
			io.ReadFull(backend, make([]byte, 1024))
			io.WriteString(backend, line)
			backendTCP.SetLinger(0)
			backendTCP.Close()
			waitReset(t, proxyOut)
			app.Write([]byte("more of the upload")) // fails on its way to the backend
			app.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(app)
			if string(got) != line || !errors.Is(err, unix.ECONNRESET) {
				t.Errorf("app read %q, %v; want %q, then a reset", got, err, line)
			}
			<-done
		})
	}
}

// readAfterFailedWrite is a stream whose reads wait until a write to it has
// failed: a relay's direction toward it learns of its peer's reset before
// the direction from it reads what came ahead of the reset.
type readAfterFailedWrite struct {
	net.Conn
	failed chan struct{}
	once   sync.Once
}

func (c *readAfterFailedWrite) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		c.once.Do(func() { close(c.failed) })
	}
	return n, err
}

func (c *readAfterFailedWrite) Read(p []byte) (int, error) {
	<-c.failed
	return c.Conn.Read(p)
}

func (c *readAfterFailedWrite) NetConn() net.Conn { return c.Conn }

// TestIdleRelayHoldsNoBuffer: relays between the proxy's TCP connections,
// cleartext or with TLS toward the backend, give their copy buffers back
// once the bytes at hand are moved, and still relay what comes after.
// (They used to hold two of BufferSize each for as long as they lived.)
func TestIdleRelayHoldsNoBuffer(t *testing.T) {
	ca, leaf := backendCert(t)
	for _, withTLS := range []bool{false, true} {
		pool := NewPool()
		type relayed struct{ app, backend net.Conn }
		var rs []relayed
		done := make(chan Result, 8)
		for range cap(done) {
			app, proxyIn := tcpserve.Pair(t)
			proxyOut, backendTCP := tcpserve.Pair(t)
			out, backend := sockio.Wrap(proxyOut), net.Conn(backendTCP)
			if withTLS {
				tc := tls.Client(out, &tls.Config{ServerName: "backend", RootCAs: ca.Pool()})
				ts := tls.Server(backend, &tls.Config{Certificates: []tls.Certificate{leaf.TLS}})
				go ts.Handshake()
				if err := tc.Handshake(); err != nil { // as the proxy's dial does
					t.Fatal(err)
				}
				out, backend = tc, ts
			}
			go func() { done <- Relay(sockio.Wrap(proxyIn), out, pool, nil) }()
			rs = append(rs, relayed{app, backend})
		}
		exchange := func(msg string) {
			t.Helper()
			for _, r := range rs {
				r.app.SetDeadline(time.Now().Add(10 * time.Second))
				r.backend.SetDeadline(time.Now().Add(10 * time.Second))
				io.WriteString(r.app, msg)
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(r.backend, got); err != nil || string(got) != msg {
					t.Fatalf("backend read %q, %v", got, err)
				}
				io.WriteString(r.backend, msg)
				if _, err := io.ReadFull(r.app, got); err != nil || string(got) != msg {
					t.Fatalf("app read %q, %v", got, err)
				}
			}
		}
		idle := func() {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for pool.InUse() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("TLS %v: %d idle relays hold %d copy buffers, want none", withTLS, len(rs), pool.InUse())
				}
				time.Sleep(time.Millisecond)
			}
		}
		exchange("ping")
		idle()
		exchange("pong")
		idle()
		for _, r := range rs {
			r.app.Close()
			r.backend.Close()
		}
		for range rs {
			<-done
		}
	}
}

// TestTLSRecordsGoOutTogether: what the backend sent over TLS, already
// arrived as many records, reaches the app in one write rather than one
// per record (a bulk answer relayed at 16 KiB a record made four writes to
// the app per 64 KiB, a quarter more of the proxy's CPU).
func TestTLSRecordsGoOutTogether(t *testing.T) {
	ca, leaf := backendCert(t)
	app, proxyIn := tcpserve.Pair(t)
	proxyOut, backend := tcpserve.Pair(t)
	sent := &countedConn{Conn: backend}
	tc := tls.Client(sockio.Wrap(proxyOut), &tls.Config{ServerName: "backend", RootCAs: ca.Pool()})
	// No session tickets: nothing but the answer follows the handshake.
	ts := tls.Server(sent, &tls.Config{Certificates: []tls.Certificate{leaf.TLS}, SessionTicketsDisabled: true})
	shook := make(chan error)
	go func() { shook <- ts.Handshake() }()
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-shook; err != nil {
		t.Fatal(err)
	}
	handshake := sent.written.Load()
	// A fresh TLS connection sends small records (about 1.4 KiB: crypto/tls
	// sizes them to a segment until it has sent 128 KiB).
	answer := bytes.Repeat([]byte("a"), 32<<10)
	if _, err := ts.Write(answer); err != nil {
		t.Fatal(err)
	}
	tcpserve.WaitQueued(t, proxyOut, sent.written.Load()-handshake)

	in := &countedConn{Conn: sockio.Wrap(proxyIn)}
	done := make(chan Result)
	go func() { done <- Relay(in, tc, NewPool(), nil) }()
	app.SetDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(answer))
	if _, err := io.ReadFull(app, got); err != nil || !bytes.Equal(got, answer) {
		t.Fatalf("app read %d bytes, %v", len(got), err)
	}
	if n := in.writes.Load(); n != 1 {
		t.Errorf("the relay wrote the answer to the app in %d writes, want 1", n)
	}
	ts.Close()
	app.Close()
	<-done
}

// countedConn counts the writes to a connection and the bytes they carried.
type countedConn struct {
	net.Conn
	writes, written atomic.Int64
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// waitReset waits until c's peer's reset has closed c.
func waitReset(t *testing.T, c *net.TCPConn) {
	t.Helper()
	tcpserve.WaitSocket(t, c, func(fd int) (bool, error) {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		return err == nil && info.State == unix.BPF_TCP_CLOSE, err
	})
}

// panicWriter panics on its second Write: a bug beneath the relay's a→b
// direction, met once bytes moved.
type panicWriter struct {
	net.Conn
	writes int
}

func (w *panicWriter) Write(p []byte) (int, error) {
	if w.writes++; w.writes > 1 {
		panic("a bug writing")
	}
	return w.Conn.Write(p)
}

func (w *panicWriter) NetConn() net.Conn { return w.Conn }

// TestRelayPanicAToB: a panic in the a→b direction, which runs on the
// caller's goroutine, is recovered as one in b→a is: it is Result.Err and
// both streams are aborted. It used to unwind out of Relay, leaving b open
// and b→a's goroutine waiting on it for as long as the backend stayed
// silent. Result still counts what moved before the panic, and the copy
// buffer the panic met goes back to the pool: it stayed counted in use
// (sockmesh_proxy_copy_buffers_in_use) for the proxy's life, and the
// bytes were not counted.
func TestRelayPanicAToB(t *testing.T) {
	app, proxyIn := tcpserve.Pair(t)
	proxyOut, backend := tcpserve.Pair(t)
	defer app.Close()
	defer backend.Close()
	pool := NewPool()
	done := make(chan any, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				done <- v
			}
		}()
		done <- Relay(sockio.Wrap(proxyIn), &panicWriter{Conn: sockio.Wrap(proxyOut)}, pool, nil)
	}()
	app.Write([]byte("first"))
	if _, err := io.ReadFull(backend, make([]byte, len("first"))); err != nil {
		t.Fatal(err)
	}
	app.Write([]byte("x"))
	got := <-done
	res, ok := got.(Result)
	if !ok {
		t.Fatalf("Relay panicked (%v); want the panic recovered", got)
	}
	if p := (*contain.Panic)(nil); !errors.As(res.Err, &p) {
		t.Errorf("Result.Err = %v, want the panic", res.Err)
	}
	if res.AToB != int64(len("first")) {
		t.Errorf("Result.AToB = %d, want %d: the bytes moved before the panic", res.AToB, len("first"))
	}
	if n := pool.InUse(); n != 0 {
		t.Errorf("the relay holds %d copy buffers once it returned, want none", n)
	}
	if _, err := io.ReadAll(backend); err == nil {
		t.Error("backend's stream ended cleanly, want a reset")
	}
	if _, err := io.ReadAll(app); err == nil {
		t.Error("app's stream ended cleanly, want a reset")
	}
}

// TestTLSTruncationResets: a backend's TLS stream that ends without
// close_notify — its TCP FIN at a record boundary, from the backend or
// from something on the path — reaches the app as a reset after the bytes
// that came, never as a clean end (crypto/tls reads both as io.EOF: the
// app took a cut answer for a whole one); one that ends with close_notify
// reaches it as a clean end.
func TestTLSTruncationResets(t *testing.T) {
	ca, leaf := backendCert(t)
	for _, tc := range []struct {
		name        string
		closeNotify bool
		want        error
	}{
		{"close_notify", true, nil},
		{"fin-only", false, unix.ECONNRESET},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app, proxyIn := tcpserve.Pair(t)
			proxyOut, backend := tcpserve.Pair(t)
			defer app.Close()
			defer backend.Close()
			up := tls.Client(sockio.Wrap(proxyOut), &tls.Config{ServerName: "backend", RootCAs: ca.Pool()})
			ts := tls.Server(backend, &tls.Config{Certificates: []tls.Certificate{leaf.TLS}})
			shook := make(chan error)
			go func() { shook <- ts.Handshake() }()
			if err := up.Handshake(); err != nil {
				t.Fatal(err)
			}
			if err := <-shook; err != nil {
				t.Fatal(err)
			}
			done := make(chan Result)
			go func() { done <- Relay(sockio.Wrap(proxyIn), up, NewPool(), nil) }()
			io.WriteString(ts, "partial")
			if tc.closeNotify {
				ts.CloseWrite()
			}
			backend.CloseWrite()
			app.SetDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(app)
			if string(got) != "partial" || !errors.Is(err, tc.want) {
				t.Errorf("app read %q, %v; want partial, then %v", got, err, tc.want)
			}
			app.Close()
			<-done
		})
	}
}

// TestRelayKeepAlive: Relay turns TCP keep-alive on for the app's
// connection (a), which the proxy's listeners accept without it: a relay
// has no idle timeout, and the probes are what finds an app gone without
// a word.
func TestRelayKeepAlive(t *testing.T) {
	app, proxyIn := tcpserve.Pair(t)
	proxyOut, backend := tcpserve.Pair(t)
	defer app.Close()
	defer backend.Close()
	keepAlive := func() int {
		t.Helper()
		raw, err := proxyIn.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		on := -1
		raw.Control(func(fd uintptr) { on, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE) })
		if err != nil {
			t.Fatal(err)
		}
		return on
	}
	proxyIn.SetKeepAlive(false) // as proxy.ListenConfig's listeners accept
	if on := keepAlive(); on != 0 {
		t.Fatalf("SO_KEEPALIVE = %d before the relay, want 0", on)
	}
	done := make(chan Result)
	go func() {
		done <- Relay(&BufferedConn{Conn: sockio.Wrap(proxyIn), R: bufio.NewReader(proxyIn)}, sockio.Wrap(proxyOut), NewPool(), nil)
	}()
	app.Write([]byte("x"))
	if _, err := io.ReadFull(backend, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if on := keepAlive(); on != 1 {
		t.Errorf("SO_KEEPALIVE = %d on the app's connection of a relay, want 1", on)
	}
	app.Close()
	backend.Close()
	<-done
}
