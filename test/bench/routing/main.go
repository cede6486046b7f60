// Command routing measures what GAMMA routing costs per request in
// sockmesh's proxy: one Service with 1, 100 and 1,000 route rules against
// the same Service without routes, in the same run, in interleaved rounds.
//
// Every configuration is a captured Service address of one proxy (built
// with proxy.New, as the agent does) leading to the same backend, a
// net/http server answering 100 bytes. Rule i matches PathPrefix /svc/<i>
// with a header and a query parameter, as a Service with many tenants
// might; each request matches the last rule, with the route forwarding to
// the Service's own backend, so a routed request does all the work a
// route asks for but travels the same wire. The load generator is a Go
// client in the same process (keep-alive, -conns connections, closed
// loop), speaking HTTP/1.1 (the proxy's fast path) or, with -h2c, HTTP/2
// with prior knowledge (net/http's server); each connection reaches the
// proxy through a listener that hands it over with the Service address as
// its original destination, as the eBPF redirect does.
//
// For each configuration it prints requests/s, p50 and p99 latency
// (medians over rounds), and the medians of the per-round ratios of p50
// and p99 to the configuration without routes, with their min–max.
//
//	go run ./test/bench/routing [-rounds 7] [-duration 3s] [-conns 8] [-h2c]
//
// Measured on the 2-core machine of ../../../../shared/BENCH.md while
// another engineer's benchmark shared its cores (provisional), -rounds 7
// -duration 2s; medians, and ratios to no route as median (min–max) of
// per-round ratios:
//
//	HTTP/1.1 (fast path)  req/s  p50 µs  p99 µs  req/s ÷ none      p50 ÷ none        p99 ÷ none
//	no route              20102  280     4437    1                 1                 1
//	1 rule                17750  334     4508    0.87 (0.85–1.01)  1.14 (1.03–1.23)  1.02 (1.00–1.03)
//	100 rules             18574  314     4492    0.91 (0.78–0.99)  1.12 (1.01–1.31)  1.01 (1.00–1.04)
//	1,000 rules           17440  328     4551    0.87 (0.79–0.92)  1.17 (1.10–1.29)  1.03 (1.01–1.04)
//
//	h2c (-h2c)            req/s  p50 µs  p99 µs  req/s ÷ none      p50 ÷ none        p99 ÷ none
//	no route              18323  348     2208    1                 1                 1
//	1 rule                10400  643     2851    0.58 (0.54–0.76)  1.84 (1.41–1.98)  1.17 (0.95–1.51)
//	100 rules             11020  612     2681    0.62 (0.56–0.71)  1.76 (1.51–1.91)  1.04 (0.94–1.47)
//	1,000 rules           10572  635     2821    0.58 (0.55–0.63)  1.86 (1.72–1.91)  1.12 (0.93–1.52)
//
// Routing costs the same for 1 and 1,000 rules: what a routed request
// pays is parsing and rewriting it, not finding its rule. The h2c gap is
// not the rules either: without routes an h2c client's stream to a
// backend that needs no protocol change takes the L4 relay, while a route
// needs the L7 path (net/http's HTTP/2 server and Transport).
//
// The package userspace-proxy/routes has the decision alone as a Go
// benchmark (BenchmarkDecide): about 0.1–0.6 µs for 1 to 1,000 rules,
// allocation-free.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

func main() {
	rounds := flag.Int("rounds", 5, "interleaved rounds")
	duration := flag.Duration("duration", 3*time.Second, "load per configuration and round")
	conns := flag.Int("conns", 8, "client connections (closed loop)")
	h2c := flag.Bool("h2c", false, "speak HTTP/2 with prior knowledge (net/http's server path) instead of HTTP/1.1 (the fast path)")
	flag.Parse()
	if err := run(*rounds, *duration, *conns, *h2c); err != nil {
		fmt.Fprintln(os.Stderr, "routing bench:", err)
		os.Exit(1)
	}
}

// sizes are the rule counts measured; 0 is the Service without routes.
var sizes = []int{0, 1, 100, 1000}

// result is one configuration's run in one round.
type result struct {
	rps, p50, p99 float64 // p50 and p99 in µs
}

func run(rounds int, duration time.Duration, conns int, h2c bool) error {
	backend, err := startBackend()
	if err != nil {
		return err
	}
	p, err := proxy.New(proxy.Config{Dial: dial.Config{Unmarked: os.Geteuid() != 0}}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		return err
	}
	defer func() {
		// Shutdown waits for connections to end; the clients' idle
		// keep-alive connections would never end by themselves.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Shutdown(ctx)
	}()
	snap, vips, err := buildSnapshot(backend)
	if err != nil {
		return err
	}
	p.Update(snap)
	clients := make([]*http.Client, len(sizes))
	for i, vip := range vips {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		go redirect(p, l, vip)
		clients[i] = newClient(l.Addr().String(), conns, h2c)
		if err := check(clients[i], sizes[i]); err != nil {
			return err
		}
	}
	res := make([][]result, len(sizes))
	for r := range rounds {
		// Rotate the order so that no configuration always runs first.
		for k := range sizes {
			i := (k + r) % len(sizes)
			res[i] = append(res[i], load(clients[i], sizes[i], conns, duration))
		}
	}
	for _, c := range clients {
		c.CloseIdleConnections()
	}
	report(res, h2c, rounds, duration, conns)
	return nil
}

// startBackend runs the backend: 100 bytes per request, HTTP/1.1 and h2c.
func startBackend() (netip.AddrPort, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return netip.AddrPort{}, err
	}
	body := make([]byte, 100)
	srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(body)
	})}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(l)
	return l.Addr().(*net.TCPAddr).AddrPort(), nil
}

// buildSnapshot captures one Service address per size, each leading to the
// backend, with size rules (none for 0).
func buildSnapshot(backend netip.AddrPort) (*snapshot.Snapshot, []netip.AddrPort, error) {
	var fes []snapshot.Frontend
	var bes []snapshot.Backend
	var vips []netip.AddrPort
	for i, n := range sizes {
		vip := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}), 80)
		ref := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "bench", Name: fmt.Sprintf("svc-%d", n), Port: 80}
		bes = append(bes, snapshot.Backend{Ref: ref, Endpoints: []snapshot.Endpoint{{Addr: backend, Ready: true, Serving: true}}})
		fe := snapshot.Frontend{Service: snapshot.ObjectRef{Namespace: "bench", Name: ref.Name}, Port: 80,
			Addresses: []netip.Addr{vip.Addr()}, FailurePolicy: snapshot.FailOpen, Backend: ref}
		if n > 0 {
			fe.Routes = &snapshot.RouteTable{Producer: ruleSet(n, ref)}
		}
		fes = append(fes, fe)
		vips = append(vips, vip)
	}
	s, err := snapshot.New(1, fes, bes, nil)
	return s, vips, err
}

// ruleSet is n rules: rule i matches PathPrefix /svc/<i>, header
// x-tenant: t and query tenant=t, and forwards to ref.
func ruleSet(n int, ref snapshot.BackendRef) *snapshot.RouteSet {
	rs := &snapshot.RouteSet{Kind: snapshot.KindHTTPRoute}
	for i := range n {
		rs.Rules = append(rs.Rules, snapshot.RouteRule{
			Route:    snapshot.ObjectRef{Kind: string(snapshot.KindHTTPRoute), Namespace: "bench", Name: "tenants"},
			Index:    i,
			Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: ref}},
		})
		rs.Matches = append(rs.Matches, snapshot.RouteMatch{
			Rule:        i,
			Path:        snapshot.PathMatch{Type: snapshot.PathPrefix, Value: fmt.Sprintf("/svc/%d", i)},
			Headers:     []snapshot.StringMatch{{Name: "x-tenant", Type: snapshot.MatchExact, Value: "t"}},
			QueryParams: []snapshot.StringMatch{{Name: "tenant", Type: snapshot.MatchExact, Value: "t"}},
		})
	}
	return rs
}

// redirect hands every connection l accepts to the proxy with vip as its
// original destination.
func redirect(p *proxy.Proxy, l net.Listener, vip netip.AddrPort) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go p.ServeConn(c, vip, proxy.Client{Addr: c.RemoteAddr().(*net.TCPAddr).AddrPort()})
	}
}

func newClient(addr string, conns int, h2c bool) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		DisableCompression:  true,
		Protocols:           new(http.Protocols),
	}
	if h2c {
		tr.Protocols.SetUnencryptedHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// target is the request of configuration n: it matches the last rule.
func target(n int) *http.Request {
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://svc.bench/svc/%d/items/42?page=2&tenant=t", max(n-1, 0)), nil)
	req.Header.Set("X-Tenant", "t")
	return req
}

// check makes sure configuration n answers (a route that sent 404 would
// be measured as fast and wrong).
func check(c *http.Client, n int) error {
	resp, err := c.Do(target(n))
	if err != nil {
		return fmt.Errorf("rules=%d: %w", n, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(b) != 100 {
		return fmt.Errorf("rules=%d: %s, %d bytes", n, resp.Status, len(b))
	}
	return nil
}

// load runs conns closed-loop clients for d and returns the rate and the
// latency percentiles.
func load(c *http.Client, n, conns int, d time.Duration) result {
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for range conns {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 1<<14)
			for time.Now().Before(stop) {
				req := target(n)
				start := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					lat = append(lat, time.Since(start))
				}
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(all)
	if len(all) == 0 {
		return result{}
	}
	us := func(q float64) float64 { return float64(all[int(q*float64(len(all)-1))]) / float64(time.Microsecond) }
	return result{rps: float64(len(all)) / d.Seconds(), p50: us(0.50), p99: us(0.99)}
}

func report(res [][]result, h2c bool, rounds int, d time.Duration, conns int) {
	client := "HTTP/1.1 (fast path)"
	if h2c {
		client = "h2c (net/http server)"
	}
	fmt.Printf("%s, %d rounds of %s, %d connections; medians, ratios to no route as median (min–max) of per-round ratios\n\n", client, rounds, d, conns)
	fmt.Println("| rules | req/s | p50 µs | p99 µs | req/s ÷ none | p50 ÷ none | p99 ÷ none |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for i, n := range sizes {
		name := fmt.Sprint(n)
		if n == 0 {
			name = "none"
		}
		col := func(f func(result) float64) []float64 {
			out := make([]float64, len(res[i]))
			for r, x := range res[i] {
				out[r] = f(x)
			}
			return out
		}
		ratio := func(f func(result) float64) string {
			var rs []float64
			for r := range res[i] {
				if base := f(res[0][r]); base > 0 {
					rs = append(rs, f(res[i][r])/base)
				}
			}
			if len(rs) == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f (%.2f–%.2f)", median(rs), slices.Min(rs), slices.Max(rs))
		}
		fmt.Printf("| %s | %.0f | %.0f | %.0f | %s | %s | %s |\n", name,
			median(col(func(r result) float64 { return r.rps })), median(col(func(r result) float64 { return r.p50 })),
			median(col(func(r result) float64 { return r.p99 })),
			ratio(func(r result) float64 { return r.rps }), ratio(func(r result) float64 { return r.p50 }), ratio(func(r result) float64 { return r.p99 }))
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
