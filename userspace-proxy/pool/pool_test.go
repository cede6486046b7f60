package pool

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

var ep = netip.MustParseAddrPort("10.0.0.1:443")

// pipeDialer dials net.Pipe connections and keeps the far ends.
type pipeDialer struct {
	dials atomic.Int32
	peers chan net.Conn
}

func newPipeDialer() *pipeDialer { return &pipeDialer{peers: make(chan net.Conn, 64)} }

func (d *pipeDialer) dial(context.Context) (net.Conn, error) {
	d.dials.Add(1)
	a, b := net.Pipe()
	d.peers <- b
	return a, nil
}

// TestReuseLIFO: a connection put back is the next one handed out (the
// warmest first), marked reused; a fresh one is not.
func TestReuseLIFO(t *testing.T) {
	p := New(Config{})
	d := newPipeDialer()
	c1, _ := p.Get(context.Background(), ep, d.dial)
	c2, _ := p.Get(context.Background(), ep, d.dial)
	if c1.Reused() || c2.Reused() {
		t.Fatal("fresh connections report reuse")
	}
	p.Put(c1)
	p.Put(c2)
	if got, _ := p.Get(context.Background(), ep, d.dial); got != c2 || !got.Reused() {
		t.Errorf("Get = %p (reused %v), want the last put, %p", got, got.Reused(), c2)
	}
	if open, idle := p.Stats(ep); open != 2 || idle != 1 || d.dials.Load() != 2 {
		t.Errorf("open %d idle %d dials %d; want 2, 1, 2", open, idle, d.dials.Load())
	}
}

// TestMaxIdle: beyond MaxIdle, a connection put back is closed (its peer
// sees the end) and its slot freed.
func TestMaxIdle(t *testing.T) {
	p := New(Config{MaxIdle: 1})
	d := newPipeDialer()
	c1, _ := p.Get(context.Background(), ep, d.dial)
	c2, _ := p.Get(context.Background(), ep, d.dial)
	<-d.peers
	peer2 := <-d.peers
	p.Put(c1)
	p.Put(c2)
	if _, err := peer2.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("peer of the surplus connection read %v, want EOF", err)
	}
	if open, idle := p.Stats(ep); open != 1 || idle != 1 {
		t.Errorf("open %d idle %d; want 1, 1", open, idle)
	}
}

// TestMaxOpenWaits: at MaxOpen, Get waits; a Put hands the connection over,
// a Discard hands over the slot (the waiter dials), and a waiter whose
// context ends gives up without leaking a slot.
func TestMaxOpenWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := New(Config{MaxOpen: 1})
		d := newPipeDialer()
		c1, _ := p.Get(context.Background(), ep, d.dial)
		got := make(chan *Conn)
		go func() {
			c, _ := p.Get(context.Background(), ep, d.dial)
			got <- c
		}()
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("Get beyond MaxOpen did not wait")
		default:
		}
		p.Put(c1)
		if c := <-got; c != c1 {
			t.Fatalf("waiter got %p, want the connection put back", c)
		}
		go func() {
			c, _ := p.Get(context.Background(), ep, d.dial)
			got <- c
		}()
		synctest.Wait()
		p.Discard(c1)
		c2 := <-got
		if c2 == c1 || d.dials.Load() != 2 {
			t.Fatalf("after Discard the waiter got %p with %d dials; want a new dial", c2, d.dials.Load())
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error)
		go func() {
			_, err := p.Get(ctx, ep, d.dial)
			errc <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled Get = %v", err)
		}
		p.Discard(c2)
		if open, _ := p.Stats(ep); open != 0 {
			t.Errorf("open = %d after every connection was discarded, want 0", open)
		}
	})
}

// TestDialErrorFreesSlot: a failed dial does not count against MaxOpen.
func TestDialErrorFreesSlot(t *testing.T) {
	p := New(Config{MaxOpen: 1})
	boom := errors.New("refused")
	if _, err := p.Get(context.Background(), ep, func(context.Context) (net.Conn, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("Get = %v, want the dial error", err)
	}
	if open, _ := p.Stats(ep); open != 0 {
		t.Fatalf("open = %d after a failed dial", open)
	}
	d := newPipeDialer()
	if _, err := p.Get(context.Background(), ep, d.dial); err != nil {
		t.Fatalf("Get after a failed dial: %v", err)
	}
}

// TestIdleTimeout: an idle connection is closed when IdleTimeout passes;
// one taken before is not.
func TestIdleTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := New(Config{IdleTimeout: time.Minute})
		d := newPipeDialer()
		c1, _ := p.Get(context.Background(), ep, d.dial)
		c2, _ := p.Get(context.Background(), ep, d.dial)
		peer1, peer2 := <-d.peers, <-d.peers
		p.Put(c1)
		p.Put(c2)
		time.Sleep(30 * time.Second)
		taken, _ := p.Get(context.Background(), ep, d.dial) // c2, before its timer
		time.Sleep(31 * time.Second)
		synctest.Wait()
		if _, err := peer1.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("idle connection's peer read %v, want EOF", err)
		}
		go peer2.Write([]byte("x"))
		if _, err := taken.Read(make([]byte, 1)); err != nil {
			t.Errorf("connection in use was closed: %v", err)
		}
		if open, idle := p.Stats(ep); open != 1 || idle != 0 {
			t.Errorf("open %d idle %d; want 1, 0", open, idle)
		}
	})
}

// TestStaleDropped: a connection the peer closed while it sat idle is not
// handed out (real TCP: the check peeks at the socket).
func TestStaleDropped(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", l.Addr().String())
	}
	p := New(Config{})
	c1, err := p.Get(context.Background(), ep, dial)
	if err != nil {
		t.Fatal(err)
	}
	// The check runs for connections idle longer than staleCheckAfter; age
	// this one instead of sleeping.
	age := func() {
		p.mu.Lock()
		c1.idleSince = time.Now().Add(-2 * staleCheckAfter)
		p.mu.Unlock()
	}
	p.Put(c1)
	age()
	if c, err := p.Get(context.Background(), ep, dial); err != nil || c != c1 {
		t.Fatalf("Get = %p, %v; want the old but open connection back", c, err)
	}
	p.Put(c1)
	age()
	(<-accepted).Close()
	// Wait until the FIN has arrived: the socket turns readable.
	rc, err := c1.Conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), make([]byte, 1), syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return !errors.Is(err, syscall.EAGAIN)
	})
	c2, err := p.Get(context.Background(), ep, dial)
	if err != nil {
		t.Fatal(err)
	}
	if c2 == c1 || c2.Reused() {
		t.Errorf("Get handed out the connection the peer closed")
	}
	if open, _ := p.Stats(ep); open != 1 {
		t.Errorf("open = %d, want 1 (the stale one released)", open)
	}
	c2.Close()
}

// TestCloseIdle closes idle connections only.
func TestCloseIdle(t *testing.T) {
	p := New(Config{})
	d := newPipeDialer()
	c1, _ := p.Get(context.Background(), ep, d.dial)
	c2, _ := p.Get(context.Background(), ep, d.dial)
	peer1 := <-d.peers
	p.Put(c1)
	p.CloseIdle()
	if _, err := peer1.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("idle connection's peer read %v, want EOF", err)
	}
	if open, idle := p.Stats(ep); open != 1 || idle != 0 {
		t.Errorf("open %d idle %d; want 1 (in use), 0", open, idle)
	}
	p.Detach(c2)
	if open, _ := p.Stats(ep); open != 0 {
		t.Errorf("open = %d after Detach, want 0", open)
	}
	c2.Close()
}

// TestPutWithUnreadBytes: a connection put back with bytes its caller did
// not read (a body after a HEAD answer) is closed, not pooled: the next
// caller would read them as its answer.
func TestPutWithUnreadBytes(t *testing.T) {
	p := New(Config{})
	d := newPipeDialer()
	c, _ := p.Get(context.Background(), ep, d.dial)
	peer := <-d.peers
	go io.WriteString(peer, "xy")
	if b, err := c.R.ReadByte(); err != nil || b != 'x' {
		t.Fatalf("ReadByte = %q, %v", b, err)
	}
	p.Put(c)
	if _, err := peer.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("peer read %v, want EOF (closed)", err)
	}
	if open, idle := p.Stats(ep); open != 0 || idle != 0 {
		t.Errorf("open %d idle %d; want 0, 0", open, idle)
	}
}

// TestQuiet: Quiet tells a recently used connection whose peer closed it
// from an open one, which Get does not check.
func TestQuiet(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", l.Addr().String())
	}
	p := New(Config{})
	c, err := p.Get(context.Background(), ep, dial)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Discard(c)
	peer, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if !c.Quiet() {
		t.Error("Quiet = false on an open, silent connection")
	}
	peer.Close()
	// Wait until the FIN has arrived, then ask.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.R.Peek(1); err != io.EOF {
		t.Fatalf("peek: %v, want EOF", err)
	}
	if c.Quiet() {
		t.Error("Quiet = true on a connection its peer closed")
	}
}
