package sockio

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/test/pki"
)

// pair returns a wrapped client connection and the server's end of it, on
// loopback.
func pair(t testing.TB) (*Conn, *net.TCPConn) {
	t.Helper()
	c, s := tcpserve.Pair(t)
	w, ok := Wrap(c).(*Conn)
	if !ok {
		t.Fatal("Wrap did not wrap a TCP connection")
	}
	return w, s
}

func TestReadWriteWholeStream(t *testing.T) {
	c, s := pair(t)
	// More than the socket buffers hold: Write must wait for the reader.
	want := make([]byte, 16<<20)
	rand.Read(want)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(s)
		got <- b
	}()
	n, err := c.Write(want)
	if err != nil || n != len(want) {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(want))
	}
	c.CloseWrite()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("peer read %d bytes, not the %d written", len(b), len(want))
	}

	go func() {
		s.Write(want)
		s.CloseWrite()
	}()
	b, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(b, want) {
		t.Fatalf("ReadAll = %d bytes, %v; want the %d the peer wrote", len(b), err, len(want))
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("Read after the end = %d, %v; want 0, EOF", n, err)
	}
}

// TestFullDuplex reads and writes at once, as a relay does: the peer
// echoes, so neither direction can finish alone.
func TestFullDuplex(t *testing.T) {
	c, s := pair(t)
	go io.Copy(s, s)
	want := make([]byte, 16<<20)
	rand.Read(want)
	written := make(chan error, 1)
	go func() {
		_, err := c.Write(want)
		written <- err
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("echo: %v (equal: %v)", err, bytes.Equal(got, want))
	}
	if err := <-written; err != nil {
		t.Fatalf("Write: %v", err)
	}
}

func TestEmptyReadAndWrite(t *testing.T) {
	c, _ := pair(t)
	if n, err := c.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v", n, err)
	}
	if n, err := c.Write(nil); n != 0 || err != nil {
		t.Fatalf("Write(nil) = %d, %v", n, err)
	}
}

func TestReadDeadline(t *testing.T) {
	c, _ := pair(t)
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past its deadline = %v; want os.ErrDeadlineExceeded", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("deadline error %v is not a net.Error timeout", err)
	}
}

func TestCloseUnblocksRead(t *testing.T) {
	c, _ := pair(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		done <- err
	}()
	waitParked(t, "sockio.(*Conn).Read(")
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read on a closed connection = %v; want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a waiting Read")
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close = %v; want net.ErrClosed", err)
	}
}

func TestWriteToResetPeer(t *testing.T) {
	c, s := pair(t)
	s.SetLinger(0)
	s.Close() // an RST
	time.Sleep(20 * time.Millisecond)
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = c.Write([]byte("after the reset"))
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("Write to a reset peer = %v; want ECONNRESET or EPIPE", err)
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "write" {
		t.Fatalf("error %v is not a write *net.OpError", err)
	}
}

// TestReadAfterWriteTookReset: a peer's reset that a write reported is
// still a reset to the reads after it, not the end of the stream (the
// kernel reports it once: those reads found a clean end); a peer's FIN is
// the end of the stream, whether or not c shut its own side first.
func TestReadAfterWriteTookReset(t *testing.T) {
	c, s := pair(t)
	s.SetLinger(0)
	s.Close()
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = c.Write([]byte("after the reset"))
		time.Sleep(time.Millisecond)
	}
	if err == nil {
		t.Fatal("writes to a reset peer succeeded")
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("Read after the failed write = %v; want ECONNRESET", err)
	}
	for _, shutFirst := range []bool{false, true} {
		c, s := pair(t)
		if shutFirst {
			c.CloseWrite()
			io.ReadAll(s)
		}
		s.CloseWrite()
		if got, err := io.ReadAll(c); err != nil || len(got) != 0 {
			t.Errorf("shut first %v: Read after the peer's FIN = %v; want the end of the stream", shutFirst, err)
		}
	}
}

// testPKI returns a CA and a leaf it issued for backend.test.
func testPKI(t *testing.T) (*pki.CA, *pki.Leaf) {
	t.Helper()
	ca, err := pki.NewCA("sockio test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{DNSNames: []string{"backend.test"}})
	if err != nil {
		t.Fatal(err)
	}
	return ca, leaf
}

func TestTLSOverConn(t *testing.T) {
	c, s := pair(t)
	ca, leaf := testPKI(t)
	go func() {
		ts := tls.Server(s, &tls.Config{Certificates: []tls.Certificate{leaf.TLS}})
		io.Copy(ts, ts) // echo
		ts.Close()
	}()
	tc := tls.Client(c, &tls.Config{ServerName: "backend.test", RootCAs: ca.Pool()})
	msg := []byte("through TLS over raw system calls")
	if _, err := tc.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(tc, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo = %q, %v", got, err)
	}
	if TCP(tc) != c.TCPConn {
		t.Fatal("TCP did not find the connection under tls.Conn and Conn")
	}
}

// TestResetTLS: Reset of a TLS connection reaches the peer as a reset,
// with no close_notify before it, which the peer would take for a clean
// end of the stream.
func TestResetTLS(t *testing.T) {
	c, s := pair(t)
	ca, leaf := testPKI(t)
	read := make(chan error, 1)
	go func() {
		ts := tls.Server(s, &tls.Config{Certificates: []tls.Certificate{leaf.TLS}})
		_, err := io.Copy(io.Discard, ts) // nil on close_notify
		read <- err
	}()
	tc := tls.Client(c, &tls.Config{ServerName: "backend.test", RootCAs: ca.Pool()})
	if _, err := tc.Write([]byte("cut short")); err != nil {
		t.Fatal(err)
	}
	Reset(tc)
	select {
	case err := <-read:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("peer read ended with %v, want a reset", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("peer saw no end")
	}
}

func TestTCP(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if TCP(a) != nil {
		t.Fatal("TCP found a TCP connection in a pipe")
	}
	c, s := pair(t)
	if TCP(s) != s || TCP(c) != c.TCPConn {
		t.Fatal("TCP did not return the TCP connection itself")
	}
}

// BenchmarkPingPong sends a 100-byte message each way per operation over
// loopback, with net's Read/Write and with Conn's, side by side.
func BenchmarkPingPong(b *testing.B) {
	for _, raw := range []bool{false, true} {
		name := "net"
		if raw {
			name = "sockio"
		}
		b.Run(name, func(b *testing.B) {
			c, s := pair(b)
			var rw io.ReadWriter = c.TCPConn
			if raw {
				rw = c
			}
			go func() {
				buf := make([]byte, 100)
				for {
					if _, err := io.ReadFull(s, buf); err != nil {
						return
					}
					if _, err := s.Write(buf); err != nil {
						return
					}
				}
			}()
			buf := make([]byte, 100)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rw.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(rw, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestNoWait: in NoWait mode a read that finds nothing returns
// ErrWouldBlock at once, one that finds bytes or the end returns them, and
// the mode's end brings back reads that wait.
func TestNoWait(t *testing.T) {
	c, peer := pair(t)
	buf := make([]byte, 8)
	c.NoWait(true)
	if n, err := c.Read(buf); n != 0 || err != ErrWouldBlock {
		t.Fatalf("read of nothing = %d, %v; want ErrWouldBlock", n, err)
	}
	peer.Write([]byte("hi")) // on loopback, there once written
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "hi" {
		t.Fatalf("read = %q, %v; want hi", buf[:n], err)
	}
	c.NoWait(false)
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after NoWait(false) = %v; want it to wait until its deadline", err)
	}
	c.SetReadDeadline(time.Time{})
	peer.Close()
	c.NoWait(true)
	if n, err := c.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read at the end = %d, %v; want EOF", n, err)
	}
}

// countingBuffers lends 8-byte buffers and counts those out.
type countingBuffers struct{ out atomic.Int64 }

func (b *countingBuffers) Get() *[]byte {
	b.out.Add(1)
	p := make([]byte, 8)
	return &p
}

func (b *countingBuffers) Put(*[]byte) { b.out.Add(-1) }

// TestReadPooled: a read takes its buffer only when there are bytes; while
// it waits it holds none; at the end, or without waiting, none is left out.
func TestReadPooled(t *testing.T) {
	c, peer := pair(t)
	bufs := &countingBuffers{}
	type result struct {
		bp  *[]byte
		n   int
		err error
	}
	got := make(chan result)
	go func() {
		bp, n, err := c.ReadPooled(bufs)
		got <- result{bp, n, err}
	}()
	waitParked(t, "sockio.(*Conn).ReadPooled(")
	if out := bufs.out.Load(); out != 0 {
		t.Errorf("a waiting read holds %d buffers, want none", out)
	}
	peer.Write([]byte("0123456789"))
	r := <-got
	if r.err != nil || r.bp == nil || string((*r.bp)[:r.n]) != "01234567" || bufs.out.Load() != 1 {
		t.Fatalf("ReadPooled = %q, %v with %d buffers out; want 8 bytes in the one buffer", (*r.bp)[:r.n], r.err, bufs.out.Load())
	}
	bufs.Put(r.bp)
	if bp, n, err := c.ReadPooled(bufs); err != nil || string((*bp)[:n]) != "89" {
		t.Fatalf("second ReadPooled = %d, %v; want the rest", n, err)
	} else {
		bufs.Put(bp)
	}
	c.NoWait(true)
	if bp, n, err := c.ReadPooled(bufs); bp != nil || n != 0 || err != ErrWouldBlock {
		t.Fatalf("ReadPooled of nothing without waiting = %v, %d, %v; want ErrWouldBlock and no buffer", bp, n, err)
	}
	c.NoWait(false)
	peer.Close()
	if bp, n, err := c.ReadPooled(bufs); bp != nil || n != 0 || err != io.EOF {
		t.Fatalf("ReadPooled at the end = %v, %d, %v; want io.EOF and no buffer", bp, n, err)
	}
	if out := bufs.out.Load(); out != 0 {
		t.Errorf("%d buffers left out", out)
	}
}

// TestAwaitHangup: AwaitHangup waits while the peer is there, bytes it
// sent unread or not, returns once it ends its stream or resets it, and
// leaves what it sent to be read.
func TestAwaitHangup(t *testing.T) {
	c, s := pair(t)
	s.Write([]byte("body"))
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if err := AwaitHangup(c); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("AwaitHangup with the peer there, bytes waiting = %v; want os.ErrDeadlineExceeded", err)
	}
	c.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() { done <- AwaitHangup(c) }()
	s.Write([]byte(" more"))
	s.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("AwaitHangup after the peer's FIN = %v; want nil", err)
		}
	case <-time.After(10 * time.Second): // a hang guard
		t.Fatal("AwaitHangup did not return after the peer's FIN")
	}
	if b, err := io.ReadAll(c); err != nil || string(b) != "body more" {
		t.Fatalf("read after AwaitHangup = %q, %v; want %q", b, err, "body more")
	}

	c, s = pair(t)
	s.Write([]byte("body"))
	s.SetLinger(0)
	s.Close() // a reset
	if err := AwaitHangup(c); err != nil {
		t.Fatalf("AwaitHangup after the peer's reset = %v; want nil", err)
	}

	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	if err := AwaitHangup(p); !errors.Is(err, ErrNotTCP) {
		t.Fatalf("AwaitHangup on a pipe = %v; want ErrNotTCP", err)
	}
}

// TestProgress: a Write that waits for its peer's reads shows the bytes
// the kernel took before it returns, more as the peer reads more; one
// that never waits leaves Progress alone.
func TestProgress(t *testing.T) {
	c, s := pair(t)
	// Small buffers: most of the stream waits for the peer's reads.
	c.SetWriteBuffer(64 << 10)
	s.SetReadBuffer(64 << 10)
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if got := c.Progress(); got != 0 {
		t.Fatalf("Progress after a Write that did not wait = %d, want 0", got)
	}
	if _, err := io.ReadFull(s, make([]byte, 5)); err != nil {
		t.Fatalf("peer read: %v", err)
	}
	const size = 16 << 20
	written := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, size))
		written <- err
	}()
	// The peer reads nothing yet: the Write fills the buffers and waits.
	waitProgress(c, 0)
	first := c.Progress()
	if _, err := io.ReadFull(s, make([]byte, 1<<20)); err != nil {
		t.Fatalf("peer read: %v", err)
	}
	waitProgress(c, first)
	select {
	case err := <-written:
		t.Fatalf("Write returned (%v) before the peer read its stream", err)
	default:
	}
	if _, err := io.ReadFull(s, make([]byte, size-1<<20)); err != nil {
		t.Fatalf("peer read: %v", err)
	}
	if err := <-written; err != nil {
		t.Fatalf("Write: %v", err)
	}
	if got := c.Progress(); got <= first || got > size {
		t.Errorf("Progress after the Write = %d, want more than %d, at most %d", got, first, size)
	}
}

// waitParked waits until a goroutine with fn (a frame of its stack, e.g.
// "sockio.(*Conn).Read(") waits in the netpoller: then a read is under
// way and found nothing to read.
func waitParked(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "[IO wait") && strings.Contains(g, fn) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine in %s waits in the netpoller", fn)
		}
	}
}

// waitProgress waits until c's Progress is past from: a waiting Write
// counts its bytes as it waits again, which it does once the peer stops
// reading and the buffers fill.
func waitProgress(c *Conn, from uint64) {
	for c.Progress() <= from {
		time.Sleep(time.Millisecond)
	}
}
