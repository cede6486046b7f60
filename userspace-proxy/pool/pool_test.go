package pool

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
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
	c1, _ := p.Get(context.Background(), ep, Client{}, d.dial)
	c2, _ := p.Get(context.Background(), ep, Client{}, d.dial)
	if c1.Reused() || c2.Reused() {
		t.Fatal("fresh connections report reuse")
	}
	p.Put(c1)
	p.Put(c2)
	if got, _ := p.Get(context.Background(), ep, Client{}, d.dial); got != c2 || !got.Reused() {
		t.Errorf("Get = %p (reused %v), want the last put, %p", got, got.Reused(), c2)
	}
	if open, idle := p.Stats(ep); open != 2 || idle != 1 || d.dials.Load() != 2 {
		t.Errorf("open %d idle %d dials %d; want 2, 1, 2", open, idle, d.dials.Load())
	}
}

// TestEndedContextGetsNone: a Get whose context has already ended takes
// no connection, not even an idle one, and dials none; the idle one stays.
func TestEndedContextGetsNone(t *testing.T) {
	p := New(Config{})
	d := newPipeDialer()
	c, _ := p.Get(context.Background(), ep, Client{}, d.dial)
	p.Put(c)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got, err := p.Get(ctx, ep, Client{}, d.dial); got != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Get under an ended context = %p, %v; want none, context.Canceled", got, err)
	}
	if open, idle := p.Stats(ep); open != 1 || idle != 1 || d.dials.Load() != 1 {
		t.Errorf("open %d idle %d dials %d; want 1, 1, 1", open, idle, d.dials.Load())
	}
}

// TestMaxIdle: connections a burst opened beyond MaxIdle wait for reuse,
// so the next burst dials none; after trimAfter idle those beyond MaxIdle
// close, least recently used first (their peers see the end), and free
// their slots, while the newest MaxIdle stay — also when a burst comes
// while the sweep waits only for a trimmed connection's expiry.
func TestMaxIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := New(Config{MaxIdle: 1})
		d := newPipeDialer()
		burst := func() []*Conn {
			cs := make([]*Conn, 3)
			for i := range cs {
				cs[i], _ = p.Get(context.Background(), ep, Client{}, d.dial)
			}
			for _, c := range cs {
				p.Put(c)
			}
			return cs
		}
		first := burst()
		peers := []net.Conn{<-d.peers, <-d.peers, <-d.peers} // first's, in order
		second := burst()                                    // LIFO: first[2], first[1], first[0]
		if n := d.dials.Load(); n != 3 {
			t.Fatalf("two bursts of 3 requests dialed %d connections, want 3", n)
		}
		if second[2] != first[0] {
			t.Fatalf("second burst took %p last, want %p", second[2], first[0])
		}
		time.Sleep(trimAfter - time.Second)
		synctest.Wait()
		if open, idle := p.Stats(ep); open != 3 || idle != 3 {
			t.Fatalf("before trimAfter: open %d idle %d; want 3, 3", open, idle)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		for _, i := range []int{1, 2} {
			if _, err := peers[i].Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("peer of surplus connection %d read %v, want EOF", i, err)
			}
		}
		if open, idle := p.Stats(ep); open != 1 || idle != 1 {
			t.Errorf("after trimAfter: open %d idle %d; want 1, 1", open, idle)
		}
		if c, err := p.Get(context.Background(), ep, Client{}, noDial); err != nil || c != first[0] {
			t.Fatalf("Get = %p, %v; want the connection put back last, %p", c, err, first[0])
		} else {
			p.Put(c)
		}
		time.Sleep(trimAfter + time.Second) // first[0] trimmed: the sweep waits for its expiry
		synctest.Wait()
		burst()
		time.Sleep(trimAfter + time.Second)
		synctest.Wait()
		if open, idle := p.Stats(ep); open != 1 || idle != 1 || d.dials.Load() != 5 {
			t.Errorf("after a second burst and trimAfter: open %d idle %d dials %d; want 1, 1, 5", open, idle, d.dials.Load())
		}
	})
}

// TestMaxOpenWaits: at MaxOpen, Get waits; a Put hands the connection over,
// a Discard hands over the slot (the waiter dials), and a waiter whose
// context ends gives up without leaking a slot.
func TestMaxOpenWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := New(Config{MaxOpen: 1})
		d := newPipeDialer()
		c1, _ := p.Get(context.Background(), ep, Client{}, d.dial)
		got := make(chan *Conn)
		go func() {
			c, _ := p.Get(context.Background(), ep, Client{}, d.dial)
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
			c, _ := p.Get(context.Background(), ep, Client{}, d.dial)
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
			_, err := p.Get(ctx, ep, Client{}, d.dial)
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

// TestMaxWait: a Get beyond MaxOpen waits MaxWait at most, then fails
// with ErrBusy and leaves the queue: the connection put back later goes
// to the next caller, and the endpoint's count is as before.
func TestMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := New(Config{MaxOpen: 1, MaxWait: 3 * time.Second})
		d := newPipeDialer()
		c1, _ := p.Get(context.Background(), ep, Client{}, d.dial)
		start := time.Now()
		if _, err := p.Get(context.Background(), ep, Client{}, d.dial); !errors.Is(err, ErrBusy) {
			t.Fatalf("Get with every connection in use = %v, want ErrBusy", err)
		}
		if waited := time.Since(start); waited != 3*time.Second {
			t.Errorf("Get failed after %v, want MaxWait (3s)", waited)
		}
		p.Put(c1)
		if c, err := p.Get(context.Background(), ep, Client{}, d.dial); c != c1 || err != nil {
			t.Errorf("Get after the connection came back = %p, %v; want it", c, err)
		}
		if open, _ := p.Stats(ep); open != 1 {
			t.Errorf("open = %d, want 1", open)
		}
	})
}

// TestWaitersTakeTurns: what an endpoint at MaxOpen frees goes to the
// waiting client that holds the fewest of its connections, the one that
// waited longest among those holding as few: one client holding them all
// with more Gets queued does not hold up another's past the first
// release, and a client's own Gets are served in the order they came.
func TestWaitersTakeTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := New(Config{MaxOpen: 3})
		d := newPipeDialer()
		hog, other := Client{Addr: netip.MustParseAddr("10.1.0.1")}, Client{Namespace: "b", Name: "other"}
		var held []*Conn
		for range 3 {
			c, _ := p.Get(context.Background(), ep, hog, d.dial)
			held = append(held, c)
		}
		type handed struct {
			who string
			c   *Conn
		}
		got := make(chan handed, 6)
		wait := func(who string, client Client) {
			go func() {
				c, err := p.Get(context.Background(), ep, client, d.dial)
				if err != nil {
					t.Errorf("%s: Get = %v", who, err)
				}
				got <- handed{who, c}
			}()
			synctest.Wait() // queued in this order
		}
		for _, who := range []string{"hog 1", "hog 2", "hog 3"} {
			wait(who, hog)
		}
		wait("other 1", other)
		wait("other 2", other)
		// The connections go back in the order they were handed out,
		// each to want; noted: how many hog and other hold once it is
		// back, before it goes on.
		for i, want := range []string{
			"other 1", // 2, 0
			"hog 1",   // 1, 1: hog 1 came first
			"hog 2",   // 1, 1: hog 2 came before other 2
			"other 2", // 2, 0: other 1 gave its back
			"hog 3",   // 1, 1: hog 3 alone waits
		} {
			p.Put(held[0])
			h := <-got
			if h.who != want {
				t.Errorf("release %d went to %s, want %s", i+1, h.who, want)
			}
			held = append(held[1:], h.c)
		}
		if open, _ := p.Stats(ep); open != 3 || d.dials.Load() != 3 {
			t.Errorf("open %d, dials %d; want 3, 3 (every release handed over)", open, d.dials.Load())
		}
	})
}

// TestClientShare: one client holds at most all but an eighth of an
// endpoint's connections, 7 of 8: its Get beyond waits, though the
// endpoint has room, and fails with ErrBusy after MaxWait, told AtShare,
// while another client's is served at once. What the endpoint frees
// passes over the waiting client at its share, and one of its own put
// back goes to it. Another's Get failing at MaxOpen is not AtShare's.
func TestClientShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var atShare int
		p := New(Config{MaxOpen: 8, MaxWait: 3 * time.Second, AtShare: func() { atShare++ }})
		d := newPipeDialer()
		hog, other := Client{Addr: netip.MustParseAddr("10.1.0.1")}, Client{Namespace: "b", Name: "other"}
		var held []*Conn
		for range 7 {
			c, err := p.Get(context.Background(), ep, hog, d.dial)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		start := time.Now()
		if _, err := p.Get(context.Background(), ep, hog, d.dial); !errors.Is(err, ErrBusy) || time.Since(start) != 3*time.Second {
			t.Fatalf("Get of a client holding 7 of 8 = %v after %v; want ErrBusy after MaxWait (3s)", err, time.Since(start))
		}
		if atShare != 1 {
			t.Errorf("AtShare told %d times, want 1", atShare)
		}
		start = time.Now()
		o, err := p.Get(context.Background(), ep, other, d.dial)
		if err != nil || time.Since(start) != 0 {
			t.Fatalf("another client's Get = %v after %v; want a connection at once", err, time.Since(start))
		}
		got := make(chan *Conn)
		go func() {
			c, _ := p.Get(context.Background(), ep, hog, d.dial)
			got <- c
		}()
		synctest.Wait()
		p.Put(o)
		synctest.Wait()
		select {
		case c := <-got:
			t.Fatalf("a client holding its share was handed %p, put back by another", c)
		default:
		}
		p.Put(held[0])
		if c := <-got; c != held[0] {
			t.Fatalf("the waiting client got %p, want its own put back, %p", c, held[0])
		}
		if open, idle := p.Stats(ep); open != 8 || idle != 1 || d.dials.Load() != 8 {
			t.Errorf("open %d idle %d dials %d; want 8, 1 (the other's), 8", open, idle, d.dials.Load())
		}
		if c, err := p.Get(context.Background(), ep, other, d.dial); c != o || err != nil {
			t.Fatalf("the other's Get = %p, %v; want the idle one, %p", c, err, o)
		}
		if _, err := p.Get(context.Background(), ep, other, d.dial); !errors.Is(err, ErrBusy) || atShare != 1 {
			t.Errorf("Get at MaxOpen = %v, AtShare told %d times; want ErrBusy, 1", err, atShare)
		}
	})
}

// TestClientShareSet: ClientShare sets a client's share: at a half, a
// client holds 4 of 8, its fifth Get waits and fails ErrBusy (told
// AtShare) while another client takes the other 4 at once. Before, the
// share was all but an eighth whatever the agent was told.
func TestClientShareSet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var atShare int
		p := New(Config{MaxOpen: 8, ClientShare: 0.5, MaxWait: time.Second, AtShare: func() { atShare++ }})
		d := newPipeDialer()
		hog, other := Client{Namespace: "a", Name: "hog"}, Client{Namespace: "b", Name: "other"}
		for range 4 {
			if _, err := p.Get(context.Background(), ep, hog, d.dial); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := p.Get(context.Background(), ep, hog, d.dial); !errors.Is(err, ErrBusy) || atShare != 1 {
			t.Fatalf("Get of a client holding 4 of 8 at a half share = %v, AtShare told %d times; want ErrBusy, 1", err, atShare)
		}
		for i := range 4 {
			start := time.Now()
			if _, err := p.Get(context.Background(), ep, other, d.dial); err != nil || time.Since(start) != 0 {
				t.Fatalf("another client's Get %d = %v after %v; want a connection at once", i+1, err, time.Since(start))
			}
		}
	})
}

// TestClientShareOf: a client's share is ClientShare of MaxOpen rounded up,
// all but an eighth unless set, at least one connection and at most all,
// a float's error in the product aside.
func TestClientShareOf(t *testing.T) {
	for _, c := range []struct {
		maxOpen int
		f       float64
		want    int
	}{
		{1024, 0, 896}, {8, 0, 7}, {7, 0, 7}, {1, 0, 1}, {9, -1, 8}, {9, math.NaN(), 8}, // the default, as before
		{1024, 0.875, 896}, {100, 7.0 / 100, 7}, {10, 0.5, 5}, {10, 0.55, 6},
		{1024, 1e-6, 1}, {10, 1, 10}, {10, 2, 10},
	} {
		if got := clientShare(c.maxOpen, c.f); got != c.want {
			t.Errorf("clientShare(%d, %v) = %d, want %d", c.maxOpen, c.f, got, c.want)
		}
	}
}

// TestHandOverCounts: the connections a replaced pool has in use, and
// those it hands out after, count against its heir's MaxOpen and each
// client's share there until they come back, each one freeing a slot of
// the heir's as it does. Before, the heir started at zero: a client holding
// its share on the old settings took as many again on the new, at once,
// and the endpoint had up to twice MaxOpen.
func TestHandOverCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{MaxOpen: 8, MaxWait: 3 * time.Second}
		old, heir := New(cfg), New(cfg)
		d := newPipeDialer()
		hog, other := Client{Addr: netip.MustParseAddr("10.1.0.1")}, Client{Namespace: "b", Name: "other"}
		var held []*Conn
		for range 7 {
			c, err := old.Get(context.Background(), ep, hog, d.dial)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		old.HandOver(heir, func(*Conn) bool { return true })
		old.Close()
		start := time.Now()
		if c, err := heir.Get(context.Background(), ep, hog, d.dial); !errors.Is(err, ErrBusy) {
			t.Fatalf("heir's Get of a client holding 7 of 8 in the old pool = %p, %v after %v; want ErrBusy after MaxWait", c, err, time.Since(start))
		}
		o, err := heir.Get(context.Background(), ep, other, d.dial)
		if err != nil {
			t.Fatalf("another client's Get = %v; want the eighth connection", err)
		}
		got := make(chan *Conn)
		go func() {
			c, _ := heir.Get(context.Background(), ep, other, d.dial)
			got <- c
		}()
		synctest.Wait()
		select {
		case c := <-got:
			t.Fatalf("a Get beyond MaxOpen, the old pool's 7 and the heir's 1, was handed %p", c)
		default:
		}
		old.Put(held[0]) // closed there: a slot of the heir's comes free
		o2 := <-got
		if o2 == nil || d.dials.Load() != 9 {
			t.Fatalf("the waiting Get got %p after %d dials; want a connection dialed in the slot freed", o2, d.dials.Load())
		}
		if open, _ := heir.Stats(ep); open != 8 {
			t.Errorf("heir: %d open, want 8 (the old pool's 6 in use, the other's 2)", open)
		}
		late, err := old.Get(context.Background(), ep, hog, d.dial) // a request on the old settings
		if err != nil {
			t.Fatal(err)
		}
		if open, _ := heir.Stats(ep); open != 9 {
			t.Errorf("heir after the old pool dialed again: %d open, want 9", open)
		}
		for _, c := range append(held[1:], late) {
			old.Put(c)
		}
		heir.Put(o)
		heir.Put(o2)
		if open, idle := heir.Stats(ep); open != 2 || idle != 2 {
			t.Errorf("heir once every connection came back: %d open, %d idle; want the other's 2, idle", open, idle)
		}
	})
}

// TestHandOverConcurrent: pools handed over twice while clients Get and
// Put on all three at once (run under -race) end with nothing counted but
// their idle connections: every connection the older pools held, counted
// in their heirs, was uncounted there once back, and no lock order
// deadlocks.
func TestHandOverConcurrent(t *testing.T) {
	cfg := Config{MaxOpen: 4}
	pools := []*Pool{New(cfg), New(cfg), New(cfg)}
	dial := func(context.Context) (net.Conn, error) {
		c, _ := net.Pipe()
		return c, nil
	}
	var current, done atomic.Int32 // the pool the next Gets go to; Gets done
	var wg sync.WaitGroup
	for g := range 8 {
		client := Client{Namespace: "ns", Name: strconv.Itoa(g % 3)}
		wg.Go(func() {
			for range 2000 {
				p := pools[current.Load()]
				c, err := p.Get(context.Background(), ep, client, dial)
				if err != nil {
					t.Error(err)
					return
				}
				p.Put(c)
				done.Add(1)
			}
		})
	}
	for i := range 2 {
		for done.Load() < int32(i+1)*4000 { // with Gets under way on pools[i]
			runtime.Gosched()
		}
		pools[i].HandOver(pools[i+1], func(*Conn) bool { return true })
		current.Store(int32(i + 1))
		pools[i].Close()
	}
	wg.Wait()
	for i, p := range pools {
		if open, idle := p.Stats(ep); open != idle {
			t.Errorf("pool %d with every connection back: %d open, %d idle; want only idle ones counted", i, open, idle)
		}
	}
}

// endsAsHanded is a context that ends just as a Get's wait first looks at
// it, and has a connection handed to that Get then: the wait finds both
// at once.
type endsAsHanded struct {
	context.Context
	hand  func()
	ended atomic.Bool
}

func (c *endsAsHanded) Done() <-chan struct{} {
	if !c.ended.Swap(true) {
		c.hand()
	}
	return ended
}

func (c *endsAsHanded) Err() error {
	if c.ended.Load() {
		return context.Canceled
	}
	return nil
}

var ended = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// TestHandedAsContextEnds: a Get waiting beyond MaxOpen that is handed a
// connection just as its context ends returns the context's error, as a
// Get under an ended context does, and the connection goes on (idle,
// here). Its wait sees both ready and takes either, at random: each run
// tries 64 times.
func TestHandedAsContextEnds(t *testing.T) {
	for range 64 {
		p := New(Config{MaxOpen: 1})
		d := newPipeDialer()
		c1, _ := p.Get(context.Background(), ep, Client{}, d.dial)
		ctx := &endsAsHanded{Context: context.Background(), hand: func() { p.Put(c1) }}
		if c, err := p.Get(ctx, ep, Client{}, d.dial); c != nil || !errors.Is(err, context.Canceled) {
			t.Fatalf("Get handed a connection as its context ended = %p, %v; want none, context.Canceled", c, err)
		}
		if open, idle := p.Stats(ep); open != 1 || idle != 1 {
			t.Fatalf("open %d idle %d; want 1, 1 (passed on to the idle list)", open, idle)
		}
	}
}

// TestDialErrorFreesSlot: a failed dial does not count against MaxOpen.
func TestDialErrorFreesSlot(t *testing.T) {
	p := New(Config{MaxOpen: 1})
	boom := errors.New("refused")
	if _, err := p.Get(context.Background(), ep, Client{}, func(context.Context) (net.Conn, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("Get = %v, want the dial error", err)
	}
	if open, _ := p.Stats(ep); open != 0 {
		t.Fatalf("open = %d after a failed dial", open)
	}
	d := newPipeDialer()
	if _, err := p.Get(context.Background(), ep, Client{}, d.dial); err != nil {
		t.Fatalf("Get after a failed dial: %v", err)
	}
}

// twoConns returns a pool whose connections idle a minute at most, two
// connections from it, and their peers.
func twoConns() (p *Pool, c1, c2 *Conn, peer1, peer2 net.Conn) {
	p = New(Config{IdleTimeout: time.Minute})
	d := newPipeDialer()
	c1, _ = p.Get(context.Background(), ep, Client{}, d.dial)
	c2, _ = p.Get(context.Background(), ep, Client{}, d.dial)
	return p, c1, c2, <-d.peers, <-d.peers
}

// noDial is the dialer of a Get that must find an idle connection.
func noDial(context.Context) (net.Conn, error) { return nil, errors.New("dialed: no idle connection") }

// TestIdleTimeout: an idle connection is closed when IdleTimeout passes;
// one taken before is not.
func TestIdleTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, c1, c2, peer1, peer2 := twoConns()
		p.Put(c1)
		p.Put(c2)
		time.Sleep(30 * time.Second)
		taken, _ := p.Get(context.Background(), ep, Client{}, noDial) // c2, before its timer
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

// TestIdleTrim: a connection idle for trimAfter gives its buffers back,
// the one put back later keeps them until its own turn, and a trimmed
// connection handed out again reads and writes as before; expiry is
// unchanged.
func TestIdleTrim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, c1, c2, peer1, peer2 := twoConns()
		// The sweep trims under the pool's lock.
		buffered := func(c *Conn) bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return c.R != nil && c.W != nil
		}
		p.Put(c1)
		time.Sleep(trimAfter / 2)
		p.Put(c2)
		time.Sleep(trimAfter/2 + time.Second)
		synctest.Wait()
		if buffered(c1) || !buffered(c2) {
			t.Fatalf("after %v: first connection buffered %v (want its buffers given back), second %v (want kept)",
				trimAfter+time.Second, buffered(c1), buffered(c2))
		}
		time.Sleep(trimAfter / 2)
		synctest.Wait()
		if buffered(c2) {
			t.Fatal("second connection kept its buffers past trimAfter")
		}
		c, _ := p.Get(context.Background(), ep, Client{}, noDial)
		if c != c2 || c.R == nil || c.W == nil {
			t.Fatalf("Get = %p with buffers %v %v; want the second connection, buffered again", c, c.R != nil, c.W != nil)
		}
		go func() {
			buf := make([]byte, 4)
			io.ReadFull(peer2, buf)
			peer2.Write(append(buf, "pong"...))
		}()
		c.W.WriteString("ping")
		c.W.Flush()
		got := make([]byte, 8)
		if _, err := io.ReadFull(c.R, got); err != nil || string(got) != "pingpong" {
			t.Errorf("through the new buffers: %q, %v", got, err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if _, err := peer1.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("trimmed connection's peer read %v after the idle timeout, want EOF", err)
		}
	})
}

// TestIdleMustBeSilent: a connection on which anything arrived after its
// last answer — the peer's end of stream, or bytes nobody asked for, with
// the answer or however soon after — is not handed out again (real TCP:
// the check peeks at the socket; behind TLS, records that arrived with the
// answer wait in crypto/tls, not in the socket).
func TestIdleMustBeSilent(t *testing.T) {
	ca, err := pki.NewCA("pool test ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "backend", DNSNames: []string{"backend"}})
	if err != nil {
		t.Fatal(err)
	}
	type peerAct struct {
		name string
		do   func(net.Conn)
		why  DropReason
	}
	var cases []struct {
		name         string
		tls, waiting bool
		act          peerAct
	}
	for _, tls := range []bool{false, true} {
		for _, waiting := range []bool{false, true} {
			for _, act := range []peerAct{
				{"closes", func(c net.Conn) { c.Close() }, DropClosed}, // TLS: close_notify too
				{"answers unasked", func(c net.Conn) { io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n") }, DropUnsolicited},
			} {
				name := act.name
				if waiting {
					name += " after the answer was read"
				} else {
					name += " with the answer"
				}
				if tls {
					name = "TLS " + name
				}
				cases = append(cases, struct {
					name         string
					tls, waiting bool
					act          peerAct
				}{name, tls, waiting, act})
			}
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			accepted := make(chan net.Conn, 2)
			go func() {
				for {
					nc, err := l.Accept()
					if err != nil {
						return
					}
					if c.tls {
						tc := tls.Server(nc, &tls.Config{Certificates: []tls.Certificate{leaf.TLS}})
						tc.Handshake() // with the client's, in dial
						nc = tc
					}
					accepted <- nc
				}
			}()
			dial := func(ctx context.Context) (net.Conn, error) {
				var d net.Dialer
				raw, err := d.DialContext(ctx, "tcp", l.Addr().String())
				if err != nil {
					return nil, err
				}
				nc := sockio.Wrap(raw.(*net.TCPConn)) // as the proxy's dial.Direct
				if !c.tls {
					return nc, nil
				}
				tc := tls.Client(nc, &tls.Config{ServerName: "backend", RootCAs: ca.Pool()})
				return tc, tc.HandshakeContext(ctx)
			}
			var dropped []DropReason
			p := New(Config{Dropped: func(why DropReason) { dropped = append(dropped, why) }})
			c1, err := p.Get(context.Background(), ep, Client{}, dial)
			if err != nil {
				t.Fatal(err)
			}
			far := <-accepted
			defer far.Close()
			// An exchange, then back to the pool and out again: a silent
			// connection is reused.
			io.WriteString(far, "answer")
			if _, err := io.ReadFull(c1.R, make([]byte, 6)); err != nil {
				t.Fatal(err)
			}
			p.Put(c1)
			if c, err := p.Get(context.Background(), ep, Client{}, dial); err != nil || c != c1 {
				t.Fatalf("Get = %p, %v; want the silent connection back", c, err)
			}
			// The answer and, in a write (a TLS record) of its own, what
			// the peer does next: at once, so that both have arrived when
			// the answer is read (loopback delivers a write before it
			// returns) and its read may take both, or once the connection
			// is idle in the pool.
			io.WriteString(far, "answer")
			if !c.waiting {
				c.act.do(far)
			}
			if _, err := io.ReadFull(c1.R, make([]byte, 6)); err != nil {
				t.Fatal(err)
			}
			p.Put(c1)
			if c.waiting {
				c.act.do(far)
			}
			c2, err := p.Get(context.Background(), ep, Client{}, dial)
			if err != nil {
				t.Fatal(err)
			}
			if c2 == c1 || c2.Reused() {
				t.Errorf("Get handed out a connection on which the peer had spoken")
			}
			if open, _ := p.Stats(ep); open != 1 {
				t.Errorf("open = %d, want 1 (the noisy one released)", open)
			}
			if len(dropped) != 1 || dropped[0] != c.act.why {
				t.Errorf("dropped for %v, want [%v]", dropped, c.act.why)
			}
			c2.Close()
		})
	}
}

// TestClose: Close closes the idle connections at once, and one in use
// once it is put back: nothing takes it from the pool again. Pooled, it
// stayed open until IdleTimeout (90 s), once for every snapshot that
// changed a backend's TLS settings while a request was under way.
func TestClose(t *testing.T) {
	p := New(Config{})
	d := newPipeDialer()
	c1, _ := p.Get(context.Background(), ep, Client{}, d.dial)
	c2, _ := p.Get(context.Background(), ep, Client{}, d.dial)
	peer1, peer2 := <-d.peers, <-d.peers
	p.Put(c1)
	p.Close()
	if _, err := peer1.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("idle connection's peer read %v, want EOF", err)
	}
	if open, idle := p.Stats(ep); open != 1 || idle != 0 {
		t.Errorf("open %d idle %d; want 1 (in use), 0", open, idle)
	}
	p.Put(c2)
	if open, idle := p.Stats(ep); open != 0 || idle != 0 {
		t.Fatalf("open %d idle %d after Put; want 0, 0", open, idle)
	}
	if _, err := peer2.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the peer of a connection put back after Close read %v, want EOF", err)
	}
}

// TestPutWithUnreadBytes: a connection put back with bytes its caller did
// not read (a body after a HEAD answer) is closed, not pooled: the next
// caller would read them as its answer.
func TestPutWithUnreadBytes(t *testing.T) {
	p := New(Config{})
	d := newPipeDialer()
	c, _ := p.Get(context.Background(), ep, Client{}, d.dial)
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

// TestHeadBound: R reads at most MaxHeadBytes (plus a buffer's read-ahead)
// of a connection until EndHead — an answer whose head does not end there
// fails with ErrHeadTooLarge rather than being buffered whole — and
// without bound after it; each hand-out bounds the next head again.
func TestHeadBound(t *testing.T) {
	const limit, buffer = 1024, 512
	d := newPipeDialer()
	p := New(Config{MaxHeadBytes: limit, BufferSize: buffer})
	get := func() (*Conn, net.Conn) {
		c, err := p.Get(context.Background(), ep, Client{}, d.dial)
		if err != nil {
			t.Fatal(err)
		}
		if c.Reused() {
			return c, nil
		}
		return c, <-d.peers
	}
	answer := func(peer net.Conn, head int, body string) {
		go io.WriteString(peer, "HTTP/1.1 200 OK\r\nX: "+strings.Repeat("h", head)+"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	}

	c, peer := get()
	answer(peer, limit+buffer, "")
	if _, err := http.ReadResponse(c.R, nil); !errors.Is(err, ErrHeadTooLarge) {
		t.Errorf("a head past the bound: %v, want ErrHeadTooLarge", err)
	}
	p.Discard(c)

	c, peer = get()
	big := strings.Repeat("b", 4*limit)
	answer(peer, limit/2, big)
	resp, err := http.ReadResponse(c.R, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.EndHead()
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != big {
		t.Fatalf("a body four times the bound after EndHead: %d bytes, %v", len(b), err)
	}
	p.Put(c)

	c, _ = get()
	answer(peer, limit+buffer, "")
	if _, err := http.ReadResponse(c.R, nil); !errors.Is(err, ErrHeadTooLarge) {
		t.Errorf("a reused connection's head past the bound: %v, want ErrHeadTooLarge", err)
	}
	p.Discard(c)
}

// BenchmarkGetPut: an idle connection taken and put back, the pool's part
// of every request.
func BenchmarkGetPut(b *testing.B) {
	p := New(Config{})
	d := newPipeDialer()
	client := Client{Namespace: "a", Name: "client-7d9f8"}
	c, _ := p.Get(context.Background(), ep, client, d.dial)
	p.Put(c)
	b.ReportAllocs()
	for b.Loop() {
		c, _ := p.Get(context.Background(), ep, client, d.dial)
		p.Put(c)
	}
}
