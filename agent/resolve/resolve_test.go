package resolve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/sockmesh/sockmesh/test/dnsserver"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// waitFor waits on r.Changed until the answers satisfy ok.
func waitFor(t *testing.T, r *Resolver, what string, ok func(map[string][]netip.Addr) bool) map[string][]netip.Addr {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		a := r.Answers()
		if ok(a) {
			return a
		}
		select {
		case <-r.Changed():
		case <-timeout:
			t.Fatalf("timed out waiting for %s; answers %v", what, a)
		}
	}
}

func start(t *testing.T, cfg Config) *Resolver {
	t.Helper()
	r, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return r
}

// TestResolverAgainstDNSServer resolves through a real DNS server on
// loopback: both families, a CNAME, a missing name, a change of address and
// a dropped hostname.
func TestResolverAgainstDNSServer(t *testing.T) {
	dns := dnsserver.Start(t)
	dns.NegativeTTL = 1
	dns.Set("api.example.test", 1, addrs("192.0.2.10", "2001:db8::10")...)
	dns.SetCNAME("alias.example.test", "api.example.test", 1)
	dns.Set("v6only.example.test", 1, addrs("2001:db8::20")...)

	r := start(t, Config{Servers: []string{dns.Addr}, MinInterval: 20 * time.Millisecond, MaxInterval: 100 * time.Millisecond})
	r.SetHostnames([]string{"api.example.test", "alias.example.test", "v6only.example.test", "gone.example.test"})

	got := waitFor(t, r, "four answers", func(a map[string][]netip.Addr) bool { return len(a) == 4 })
	for host, want := range map[string][]netip.Addr{
		"api.example.test":    addrs("192.0.2.10", "2001:db8::10"),
		"alias.example.test":  addrs("192.0.2.10", "2001:db8::10"),
		"v6only.example.test": addrs("2001:db8::20"),
		"gone.example.test":   nil,
	} {
		if !slices.Equal(got[host], want) {
			t.Errorf("Answers()[%q] = %v, want %v", host, got[host], want)
		}
	}

	dns.Set("api.example.test", 1, addrs("192.0.2.11")...)
	waitFor(t, r, "the new address", func(a map[string][]netip.Addr) bool {
		return slices.Equal(a["api.example.test"], addrs("192.0.2.11")) &&
			slices.Equal(a["alias.example.test"], addrs("192.0.2.11"))
	})

	dns.Set("gone.example.test", 1, addrs("198.51.100.1")...)
	waitFor(t, r, "the name that appeared", func(a map[string][]netip.Addr) bool {
		return slices.Equal(a["gone.example.test"], addrs("198.51.100.1"))
	})

	r.SetHostnames([]string{"api.example.test"})
	got = r.Answers()
	if _, ok := got["alias.example.test"]; ok || len(got) != 1 {
		t.Errorf("after dropping hostnames, Answers() = %v, want only api.example.test", got)
	}
}

// TestResolverTCPFallback: a truncated UDP reply is retried over TCP.
func TestResolverTCPFallback(t *testing.T) {
	dns := dnsserver.Start(t)
	dns.TruncateUDP = true
	dns.Set("big.example.test", 30, addrs("192.0.2.1", "192.0.2.2", "192.0.2.3")...)
	r := start(t, Config{Servers: []string{dns.Addr}})
	r.SetHostnames([]string{"big.example.test"})
	got := waitFor(t, r, "an answer", func(a map[string][]netip.Addr) bool { return len(a) == 1 })
	if want := addrs("192.0.2.1", "192.0.2.2", "192.0.2.3"); !slices.Equal(got["big.example.test"], want) {
		t.Errorf("answer = %v, want %v", got["big.example.test"], want)
	}
	if total, tcp := dns.Queries("big.example.test"); tcp == 0 || tcp*2 != total {
		t.Errorf("queries = %d, over tcp %d; want every query retried over tcp", total, tcp)
	}
}

// pipeDial serves DNS from srv over net.Pipe, so the resolver runs inside a
// synctest bubble; failing, when set, makes every dial fail.
func pipeDial(srv *dnsserver.Server, failing *atomic.Bool) func(context.Context, string, string) (net.Conn, error) {
	return func(_ context.Context, network, _ string) (net.Conn, error) {
		if failing.Load() {
			return nil, errors.New("server unreachable")
		}
		client, server := net.Pipe()
		go func() {
			defer server.Close()
			srv.ServeConn(server, network == "tcp")
		}()
		return client, nil
	}
}

// TestRefreshInterval checks on a fake clock that a hostname is looked up
// again after its TTL, bounded by MinInterval and MaxInterval, that retries
// after failures back off, and that the last good answer outlives an
// outage.
func TestRefreshInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &dnsserver.Server{NegativeTTL: 3600}       // AAAA answers are NODATA: keep them out of the TTL
		srv.Set("short.test", 1, addrs("192.0.2.1")...)   // TTL under MinInterval
		srv.Set("long.test", 3600, addrs("192.0.2.2")...) // TTL over MaxInterval
		srv.Set("mid.test", 20, addrs("192.0.2.3")...)    // TTL in between
		var failing atomic.Bool
		r := start(t, Config{
			Servers:     []string{"192.0.2.53:53"},
			MinInterval: 5 * time.Second,
			MaxInterval: time.Minute,
			Dial:        pipeDial(srv, &failing),
		})
		r.SetHostnames([]string{"short.test", "long.test", "mid.test"})

		// lookups counts lookups of name (A and AAAA are two queries).
		lookups := func(name string) int { n, _ := srv.Queries(name); return n / 2 }
		synctest.Wait()
		for _, name := range []string{"short.test", "long.test", "mid.test"} {
			if n := lookups(name); n != 1 {
				t.Fatalf("at start: %s looked up %d times, want 1", name, n)
			}
		}

		time.Sleep(61 * time.Second)
		synctest.Wait()
		// short: every 5 s (0, 5, ..., 60) = 13; mid: every 20 s (0, 20,
		// 40, 60) = 4; long: every 60 s (0, 60) = 2.
		for name, want := range map[string]int{"short.test": 13, "mid.test": 4, "long.test": 2} {
			if n := lookups(name); n != want {
				t.Errorf("after 61 s: %s looked up %d times, want %d", name, n, want)
			}
		}

		// An outage: dials fail, retries back off 5, 10, 20, 40, 60, 60 s
		// after the failure at 120 s (the next due lookup of long.test),
		// and the last answer stays.
		failing.Store(true)
		time.Sleep(59 * time.Second) // now 120 s
		synctest.Wait()
		if got := r.Answers()["long.test"]; !slices.Equal(got, addrs("192.0.2.2")) {
			t.Errorf("during an outage: answer = %v, want the last good one", got)
		}
		failing.Store(false)
		before := lookups("long.test")
		time.Sleep(4 * time.Second) // 124 s: the first retry (125 s) is not due
		synctest.Wait()
		if n := lookups("long.test"); n != before {
			t.Errorf("retry came before MinInterval: %d lookups, want %d", n, before)
		}
		time.Sleep(2 * time.Second) // 126 s: it was
		synctest.Wait()
		if n := lookups("long.test"); n != before+1 {
			t.Errorf("after the first retry interval: %d lookups, want %d", n, before+1)
		}
	})
}

func TestClampAndBackoff(t *testing.T) {
	const lo, hi = 5 * time.Second, time.Minute
	for _, tc := range []struct {
		ttl, want time.Duration
	}{{0, lo}, {time.Second, lo}, {30 * time.Second, 30 * time.Second}, {time.Hour, hi}} {
		if got := clamp(tc.ttl, lo, hi); got != tc.want {
			t.Errorf("clamp(%s) = %s, want %s", tc.ttl, got, tc.want)
		}
	}
	for n, want := range map[int]time.Duration{1: lo, 2: 10 * time.Second, 3: 20 * time.Second, 4: 40 * time.Second, 5: hi, 50: hi} {
		if got := backoff(n, lo, hi); got != want {
			t.Errorf("backoff(%d) = %s, want %s", n, got, want)
		}
	}
}

// fault is how faultyDial's server treats one query: pass it to the
// records (RCodeSuccess), answer with another code, or never answer.
type fault struct {
	rcode dnsmessage.RCode
	hang  bool
}

// faultyDial serves DNS from srv over net.Pipe (UDP framing), as pipeDial,
// but treats each query as faultOf says, after delay on the bubble's clock.
// inFlight, when set, counts the queries under way.
func faultyDial(srv *dnsserver.Server, delay time.Duration, inFlight *gauge, faultOf func(name string, qtype dnsmessage.Type) fault) func(context.Context, string, string) (net.Conn, error) {
	return func(_ context.Context, _, _ string) (net.Conn, error) {
		client, server := net.Pipe()
		inFlight.add(1)
		go func() {
			defer server.Close()
			buf := make([]byte, 512)
			n, err := server.Read(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				return
			}
			q, err := p.Question()
			if err != nil {
				return
			}
			time.Sleep(delay)
			f := faultOf(q.Name.String(), q.Type)
			if f.hang {
				io.Copy(io.Discard, server) // until the client gives up
				return
			}
			if f.rcode != dnsmessage.RCodeSuccess {
				b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RCode: f.rcode})
				b.StartQuestions()
				b.Question(q)
				reply, _ := b.Finish()
				server.Write(reply)
				return
			}
			c, s := net.Pipe()
			defer c.Close()
			go srv.ServeConn(s, false)
			c.Write(buf[:n])
			if n, err = c.Read(buf); err == nil {
				server.Write(buf[:n])
			}
		}()
		return &countedConn{Conn: client, g: inFlight}, nil
	}
}

// countedConn takes itself off its gauge when closed.
type countedConn struct {
	net.Conn
	g    *gauge
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.g.add(-1) })
	return c.Conn.Close()
}

// gauge counts up and down and remembers its peak; nil counts nothing.
type gauge struct {
	mu        sync.Mutex
	now, peak int
}

func (g *gauge) add(d int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now += d
	g.peak = max(g.peak, g.now)
}

// lookupsOf reads sockmesh_resolve_lookups_total{result}.
func lookupsOf(t *testing.T, r *Resolver, result string) float64 {
	t.Helper()
	var m dto.Metric
	if err := r.lookups.WithLabelValues(result).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestOutageFailsClosedAfterMaxStale: while the servers do not answer, the
// last good addresses are kept for 5 min (the default MaxStale) past their
// refresh time, then dropped, and they come back with the servers; a name
// whose records are removed (NODATA) is emptied at once, as NXDOMAIN would.
func TestOutageFailsClosedAfterMaxStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &dnsserver.Server{NegativeTTL: 3600}
		srv.Set("api.test", 30, addrs("192.0.2.1", "2001:db8::1")...)
		var down atomic.Bool
		r := start(t, Config{
			Servers:     []string{"192.0.2.53:53"},
			MinInterval: 5 * time.Second,
			MaxInterval: time.Minute,
			Timeout:     time.Second, // a lookup of both types fails in 2 s
			Dial: faultyDial(srv, 0, nil, func(string, dnsmessage.Type) fault {
				return fault{hang: down.Load()}
			}),
		})
		r.SetHostnames([]string{"api.test"})
		synctest.Wait()
		want := addrs("192.0.2.1", "2001:db8::1")
		if got := r.Answers()["api.test"]; !slices.Equal(got, want) {
			t.Fatalf("at start: %v, want %v", got, want)
		}

		// Due again at 30 s; stale from 330 s.
		down.Store(true)
		time.Sleep(329 * time.Second)
		synctest.Wait()
		if got := r.Answers()["api.test"]; !slices.Equal(got, want) {
			t.Errorf("329 s into an outage: %v, want the last good answer %v", got, want)
		}
		if n := lookupsOf(t, r, "timeout"); n == 0 {
			t.Errorf("lookups{result=timeout} = %v, want the outage's lookups counted", n)
		}
		time.Sleep(4 * time.Second) // the retry at 330 s fails too, by 332 s
		synctest.Wait()
		if got := r.Answers()["api.test"]; len(got) != 0 {
			t.Errorf("333 s into an outage: %v, want none (fail closed)", got)
		}

		down.Store(false)
		time.Sleep(61 * time.Second) // the next retry, at most MaxInterval away
		synctest.Wait()
		if got := r.Answers()["api.test"]; !slices.Equal(got, want) {
			t.Errorf("after the outage: %v, want %v", got, want)
		}

		srv.Set("api.test", 30) // no records left
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if got, ok := r.Answers()["api.test"]; !ok || len(got) != 0 {
			t.Errorf("after NODATA: %v (present %v), want an empty answer at once", got, ok)
		}
	})
}

// TestOneTypeFailing: a server that fails AAAA queries (SERVFAIL) while it
// answers A ones still gives the A addresses; AAAA addresses it gave before
// are kept for MaxStale, then dropped, the A ones staying.
func TestOneTypeFailing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &dnsserver.Server{NegativeTTL: 3600}
		srv.Set("new.test", 60, addrs("192.0.2.1", "2001:db8::1")...)
		srv.Set("old.test", 60, addrs("192.0.2.2", "2001:db8::2")...)
		var failAAAA atomic.Bool
		failAAAA.Store(true)
		r := start(t, Config{
			Servers:     []string{"192.0.2.53:53"},
			MinInterval: 5 * time.Second,
			MaxInterval: time.Minute,
			Dial: faultyDial(srv, 0, nil, func(name string, qtype dnsmessage.Type) fault {
				if qtype == dnsmessage.TypeAAAA && (name == "new.test." || failAAAA.Load()) {
					return fault{rcode: dnsmessage.RCodeServerFailure}
				}
				return fault{}
			}),
		})
		r.SetHostnames([]string{"new.test"})
		synctest.Wait()
		if got, want := r.Answers()["new.test"], addrs("192.0.2.1"); !slices.Equal(got, want) {
			t.Errorf("AAAA failing from the start: %v, want the A addresses %v", got, want)
		}
		if n := lookupsOf(t, r, "servfail"); n == 0 {
			t.Errorf("lookups{result=servfail} = %v, want the failed lookups counted", n)
		}

		failAAAA.Store(false)
		r.SetHostnames([]string{"new.test", "old.test"})
		synctest.Wait()
		failAAAA.Store(true)
		// old.test's AAAA record was due at 60 s: stale from 360 s.
		time.Sleep(359 * time.Second)
		synctest.Wait()
		if got, want := r.Answers()["old.test"], addrs("192.0.2.2", "2001:db8::2"); !slices.Equal(got, want) {
			t.Errorf("AAAA failing for 299 s: %v, want %v", got, want)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got, want := r.Answers()["old.test"], addrs("192.0.2.2"); !slices.Equal(got, want) {
			t.Errorf("AAAA failing for 301 s: %v, want only the A addresses %v", got, want)
		}
	})
}

// TestManyHostnamesBounded: 200 hostnames set at once are looked up at most
// 64 at a time (the default Config.Parallel), every one of them answered.
func TestManyHostnamesBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &dnsserver.Server{NegativeTTL: 3600}
		var hosts []string
		for i := range 200 {
			h := fmt.Sprintf("h%d.test", i)
			srv.Set(h, 300, netip.AddrFrom4([4]byte{192, 0, byte(2 + i/256), byte(i)}))
			hosts = append(hosts, h)
		}
		var inFlight gauge
		r := start(t, Config{
			Servers: []string{"192.0.2.53:53"},
			Dial:    faultyDial(srv, time.Second, &inFlight, func(string, dnsmessage.Type) fault { return fault{} }),
		})
		r.SetHostnames(hosts)
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := r.Answers(); len(got) != len(hosts) || len(got["h199.test"]) != 1 {
			t.Errorf("%d answers (h199.test: %v), want %d with an address each", len(got), got["h199.test"], len(hosts))
		}
		if inFlight.peak > 64 {
			t.Errorf("%d queries under way at once, want at most 64", inFlight.peak)
		}
	})
}

// TestTrailingDotAndDroppedName: a hostname written with its trailing dot
// resolves as without, and a hostname no longer set is no longer asked for.
func TestTrailingDotAndDroppedName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &dnsserver.Server{NegativeTTL: 3600}
		srv.Set("api.test", 5, addrs("192.0.2.1")...)
		r := start(t, Config{Servers: []string{"192.0.2.53:53"}, Dial: faultyDial(srv, 0, nil, func(string, dnsmessage.Type) fault { return fault{} })})
		r.SetHostnames([]string{"api.test."})
		synctest.Wait()
		if got, want := r.Answers()["api.test."], addrs("192.0.2.1"); !slices.Equal(got, want) {
			t.Errorf("Answers()[api.test.] = %v, want %v", got, want)
		}
		r.SetHostnames(nil)
		synctest.Wait()
		before, _ := srv.Queries("api.test")
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if after, _ := srv.Queries("api.test"); after != before {
			t.Errorf("dropped hostname asked for %d more times", after-before)
		}
		if got := r.Answers(); len(got) != 0 {
			t.Errorf("Answers() = %v after dropping every hostname", got)
		}
	})
}

// TestCNAMEChainTTL: a name behind two CNAMEs resolves to the chain's
// addresses, and is asked for again when the shortest TTL on the chain, a
// CNAME's, runs out.
func TestCNAMEChainTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &dnsserver.Server{NegativeTTL: 3600}
		srv.SetCNAME("www.test", "edge.test", 300)
		srv.SetCNAME("edge.test", "host.test", 10)
		srv.Set("host.test", 300, addrs("192.0.2.7")...)
		r := start(t, Config{Servers: []string{"192.0.2.53:53"}, Dial: faultyDial(srv, 0, nil, func(string, dnsmessage.Type) fault { return fault{} })})
		r.SetHostnames([]string{"www.test"})
		synctest.Wait()
		if got, want := r.Answers()["www.test"], addrs("192.0.2.7"); !slices.Equal(got, want) {
			t.Errorf("Answers()[www.test] = %v, want %v", got, want)
		}
		time.Sleep(25 * time.Second)
		synctest.Wait()
		// At 0, 10 and 20 s; A and AAAA each.
		if n, _ := srv.Queries("www.test"); n != 6 {
			t.Errorf("www.test asked for %d times in 25 s, want 6 (every 10 s, A and AAAA)", n)
		}
	})
}

// TestSetHostnamesConcurrently changes the hostnames from several
// goroutines while lookups run (go test -race): the answers end as the last
// set says.
func TestSetHostnamesConcurrently(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &dnsserver.Server{NegativeTTL: 3600}
		srv.Set("a.test", 5, addrs("192.0.2.1")...)
		srv.Set("b.test", 5, addrs("192.0.2.2")...)
		r := start(t, Config{Servers: []string{"192.0.2.53:53"}, Dial: faultyDial(srv, 100*time.Millisecond, nil, func(string, dnsmessage.Type) fault { return fault{} })})
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				for j := range 50 {
					if (i+j)%2 == 0 {
						r.SetHostnames([]string{"a.test"})
					} else {
						r.SetHostnames([]string{"a.test", "b.test"})
					}
					r.Answers()
					time.Sleep(30 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		r.SetHostnames([]string{"b.test"})
		time.Sleep(time.Second)
		synctest.Wait()
		got := r.Answers()
		if len(got) != 1 || !slices.Equal(got["b.test"], addrs("192.0.2.2")) {
			t.Errorf("Answers() = %v, want only b.test", got)
		}
	})
}
