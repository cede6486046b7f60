package upstream

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
)

const sni = "backend.test"

// world is a TLS backend (net/http, TLS 1.3, ALPN h2 and http/1.1) and the
// pools that reach it.
type world struct {
	ca   *pki.CA
	addr netip.AddrPort
	// serverTLS is the backend's certificate, for backends of a test's own.
	serverTLS *tls.Config
	// cert is the certificate the backend serves; a test may renew it.
	cert  atomic.Pointer[tls.Certificate]
	pools *Pools
	reg   *prometheus.Registry
	logs  *bytes.Buffer
	// accepted counts the backend's connections; closed gets a value as
	// each closes (while it has room).
	accepted atomic.Int32
	closed   chan struct{}
}

func newWorld(t testing.TB) *world {
	t.Helper()
	return newWorldServing(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Proto) }), false)
}

// newWorldServing is a world whose backend serves h, over HTTP/1.1 only
// (ALPN http/1.1) when h1Only.
func newWorldServing(t testing.TB, h http.Handler, h1Only bool) *world {
	t.Helper()
	ca, err := pki.NewCA("upstream test ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "backend", DNSNames: []string{sni}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &world{ca: ca, addr: l.Addr().(*net.TCPAddr).AddrPort(), reg: prometheus.NewRegistry(), logs: &bytes.Buffer{}, closed: make(chan struct{}, 16)}
	w.cert.Store(&leaf.TLS)
	w.serverTLS = &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return w.cert.Load(), nil }}
	srv := &http.Server{Handler: h, TLSConfig: w.serverTLS.Clone(), ConnState: func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			w.accepted.Add(1)
		case http.StateClosed:
			select {
			case w.closed <- struct{}{}:
			default:
			}
		}
	}}
	if h1Only {
		srv.TLSConfig.NextProtos = []string{"http/1.1"}
		srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: w.logs}, nil))
	w.pools, err = New(Config{}, dial.NewDirect(dial.Config{Unmarked: true}), log, w.reg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// counter reads the counter of name with a label of value v (its one
// label: result or reason) from the registry.
func (w *world) counter(t *testing.T, name, v string) float64 {
	t.Helper()
	return w.series(t, name, v).GetCounter().GetValue()
}

// series finds the series of name with a label of value v in the
// registry; nil when it has none.
func (w *world) series(t *testing.T, name, v string) *dto.Metric {
	t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == name && l.GetValue() == v {
					return m
				}
			}
		}
	}
	return nil
}

var ref = snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: "echo", Port: 443}

func (w *world) snapshot(t *testing.T, version uint64, tlsSettings *snapshot.TLS) *snapshot.Snapshot {
	t.Helper()
	s, err := snapshot.New(version, nil, []snapshot.Backend{{
		Ref: ref, TLS: tlsSettings, Endpoints: []snapshot.Endpoint{{Addr: w.addr, Ready: true}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// backendAt builds, with p, a snapshot whose one backend has the endpoint
// addr and the TLS settings pol, and returns that backend; its idle
// connections close when the test ends.
func backendAt(t testing.TB, p *Pools, addr netip.AddrPort, pol *snapshot.TLS) *Backend {
	t.Helper()
	s, err := snapshot.New(1, nil, []snapshot.Backend{{Ref: ref, TLS: pol, Endpoints: []snapshot.Endpoint{{Addr: addr, Ready: true}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	set := p.Build(s, nil)
	t.Cleanup(set.CloseIdle)
	return set.Get(ref)
}

func (w *world) policy() *snapshot.TLS {
	return &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: sni, RootsPEM: string(w.ca.CertPEM)}
}

// exchange sends one request on c and reads its answer to the end, so the
// connection is clean again (and TLS session tickets are taken in).
func exchange(t *testing.T, c net.Conn) string {
	t.Helper()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+sni+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestGetH1Pools: a connection given back is the next one handed out
// (counted as reused), it speaks HTTP/1.1 by ALPN, and its buffers keep
// working across requests.
func TestGetH1Pools(t *testing.T) {
	w := newWorld(t)
	be := w.pools.Build(w.snapshot(t, 1, w.policy()), nil).Get(ref)
	ep := be.Picker.Pick()
	c1, err := be.GetH1(context.Background(), ep, pool.Client{})
	if err != nil {
		t.Fatal(err)
	}
	if p := c1.Conn.(*tls.Conn).ConnectionState().NegotiatedProtocol; p != "http/1.1" {
		t.Fatalf("ALPN = %q, want http/1.1", p)
	}
	for range 3 {
		c1.W.WriteString("GET / HTTP/1.1\r\nHost: " + sni + "\r\n\r\n")
		c1.W.Flush()
		resp, err := http.ReadResponse(c1.R, nil)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != "HTTP/1.1" {
			t.Fatalf("backend saw %q", b)
		}
		be.PutH1(c1)
		c2, err := be.GetH1(context.Background(), ep, pool.Client{})
		if err != nil {
			t.Fatal(err)
		}
		if c2 != c1 {
			t.Fatal("the connection put back was not reused")
		}
	}
	be.DiscardH1(c1)
	if n := w.counter(t, "sockmesh_proxy_upstream_pool_gets_total", "reused"); n != 3 {
		t.Errorf("pool gets{result=reused} = %v, want 3", n)
	}
	if n := w.counter(t, "sockmesh_proxy_upstream_pool_gets_total", "new"); n != 1 {
		t.Errorf("pool gets{result=new} = %v, want 1", n)
	}
}

// TestSessionResumption: the second TLS connection to an endpoint resumes
// the first one's session (the L4 path pays this handshake per client
// connection), and the handshakes metric says so.
func TestSessionResumption(t *testing.T) {
	w := newWorld(t)
	be := w.pools.Build(w.snapshot(t, 1, w.policy()), nil).Get(ref)
	for i := range 3 {
		c, err := be.Dial(context.Background(), be.Picker.Pick(), WireH1.ALPN())
		if err != nil {
			t.Fatal(err)
		}
		exchange(t, c)
		if resumed := c.(*tls.Conn).ConnectionState().DidResume; resumed != (i > 0) {
			t.Errorf("connection %d: DidResume = %v", i, resumed)
		}
		c.Close()
	}
	if got := w.counter(t, "sockmesh_proxy_upstream_tls_handshakes_total", "resumed"); got != 2 {
		t.Errorf("handshakes{result=resumed} = %v, want 2", got)
	}
	if got := w.counter(t, "sockmesh_proxy_upstream_tls_handshakes_total", "full"); got != 1 {
		t.Errorf("handshakes{result=full} = %v, want 1", got)
	}
}

// TestBuildForgetsGoneEndpoints: a snapshot that keeps a backend's TLS
// settings forgets the TLS configs and sessions of the endpoints it no
// longer has: an endpoint that comes back gets a full handshake, where one
// that stayed resumes. Kept, every address a backend ever had held a
// config and a session cache for the agent's life.
func TestBuildForgetsGoneEndpoints(t *testing.T) {
	w := newWorld(t)
	other := netip.MustParseAddrPort("127.0.0.1:1") // never dialed
	build := func(version uint64, prev *Set, eps ...netip.AddrPort) *Set {
		var list []snapshot.Endpoint
		for _, a := range eps {
			list = append(list, snapshot.Endpoint{Addr: a, Ready: true})
		}
		s, err := snapshot.New(version, nil, []snapshot.Backend{{Ref: ref, TLS: w.policy(), Endpoints: list}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return w.pools.Build(s, prev)
	}
	resumes := func(set *Set) bool {
		be := set.Get(ref)
		c, err := be.Dial(context.Background(), &balance.Choice{Endpoint: snapshot.Endpoint{Addr: w.addr, Ready: true}}, WireH1.ALPN())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		exchange(t, c) // takes the session ticket in
		return c.(*tls.Conn).ConnectionState().DidResume
	}
	s1 := build(1, nil, w.addr)
	if resumes(s1) {
		t.Fatal("first connection resumed")
	}
	s2 := build(2, s1, w.addr, other)
	if s2.Get(ref).w != s1.Get(ref).w {
		t.Fatal("same settings: the wire was not kept")
	}
	if !resumes(s2) {
		t.Error("an endpoint that stayed: its session was forgotten")
	}
	s3 := build(3, s2, other)
	s4 := build(4, s3, w.addr, other)
	if resumes(s4) {
		t.Error("an endpoint that left and came back resumed: its TLS config was kept while it was gone")
	}
}

// TestGetH1RefusesOtherProtocols: a policy whose ALPN list leaves out
// http/1.1 gets an h2 connection, which the HTTP/1.1 pool refuses as a
// protocol error (502), never speaking HTTP/1.1 on it.
func TestGetH1RefusesOtherProtocols(t *testing.T) {
	w := newWorld(t)
	pol := w.policy()
	pol.ALPN = []string{"h2"}
	be := w.pools.Build(w.snapshot(t, 1, pol), nil).Get(ref)
	_, err := be.GetH1(context.Background(), be.Picker.Pick(), pool.Client{})
	if !errors.Is(err, ErrNotHTTP11) || Classify(err) != ReasonProtocol || ReasonProtocol.Status() != http.StatusBadGateway {
		t.Fatalf("GetH1 = %v (reason %s), want ErrNotHTTP11 as a protocol error", err, Classify(err))
	}
}

// TestBuildKeepsPools: a new snapshot with the same TLS settings keeps the
// pooled connections; changed settings replace the pools (logged) and
// close the old idle connections.
func TestBuildKeepsPools(t *testing.T) {
	w := newWorld(t)
	s1 := w.pools.Build(w.snapshot(t, 1, w.policy()), nil)
	be1 := s1.Get(ref)
	c, err := be1.GetH1(context.Background(), be1.Picker.Pick(), pool.Client{})
	if err != nil {
		t.Fatal(err)
	}
	exchange(t, c)
	be1.PutH1(c)

	s2 := w.pools.Build(w.snapshot(t, 2, w.policy()), s1)
	be2 := s2.Get(ref)
	if got, err := be2.GetH1(context.Background(), be2.Picker.Pick(), pool.Client{}); err != nil || got != c {
		t.Fatalf("same settings: GetH1 = %p, %v; want the pooled connection", got, err)
	}
	be2.PutH1(c)

	changed := w.policy()
	changed.MaxVersion = tls.VersionTLS12 // below the connection's TLS 1.3
	s3 := w.pools.Build(w.snapshot(t, 3, changed), s2)
	if _, err := c.R.ReadByte(); err == nil {
		t.Error("the old settings' idle connection is still open")
	}
	be3 := s3.Get(ref)
	if got, err := be3.GetH1(context.Background(), be3.Picker.Pick(), pool.Client{}); err != nil || got == c {
		t.Fatalf("changed settings: GetH1 = %p, %v; want a new connection", got, err)
	}
	if !strings.Contains(w.logs.String(), "upstream pools replaced") {
		t.Errorf("no log of the replaced pools:\n%s", w.logs)
	}
}

// TestBuildKeepsWhatStillVerifies: when a backend's TLS settings change,
// an idle HTTP/1.1 connection stays in its pool if the new settings would
// have made it — its certificate verified under them (a CA or a
// subjectAltName added), its TLS version and client certificate theirs —
// and is closed otherwise (the CA or subjectAltName that verified it
// removed, a minimum version above the one it speaks, a rotated client
// certificate). Every idle connection was closed on any change, and each
// next request paid a handshake, for trust that only widened.
func TestBuildKeepsWhatStillVerifies(t *testing.T) {
	w := newWorld(t)
	other, err := pki.NewCA("other ca")
	if err != nil {
		t.Fatal(err)
	}
	clients := make([]*pki.Leaf, 2)
	for i := range clients {
		if clients[i], err = w.ca.Issue(pki.LeafOptions{CommonName: "proxy", Client: true}); err != nil {
			t.Fatal(err)
		}
	}
	sans := func(names ...string) func(*snapshot.TLS) {
		return func(p *snapshot.TLS) {
			p.SubjectAltNames = nil
			for _, n := range names {
				p.SubjectAltNames = append(p.SubjectAltNames, snapshot.SubjectAltName{Type: snapshot.SANHostname, Value: n})
			}
		}
	}
	roots := func(cas ...*pki.CA) func(*snapshot.TLS) {
		return func(p *snapshot.TLS) {
			p.RootsPEM = ""
			for _, ca := range cas {
				p.RootsPEM += string(ca.CertPEM)
			}
		}
	}
	client := func(l *pki.Leaf) func(*snapshot.TLS) {
		return func(p *snapshot.TLS) {
			p.Mode, p.ClientCertificatePEM, p.ClientKeyPEM = snapshot.TLSMutual, string(l.CertPEM), string(l.KeyPEM)
		}
	}
	for _, c := range []struct {
		name     string
		from, to func(*snapshot.TLS)
		kept     bool
	}{
		{"subjectAltName added", sans(sni), sans(sni, "other.test"), true},
		{"subjectAltName it matched removed", sans(sni, "other.test"), sans("other.test"), false},
		{"CA added", roots(w.ca), roots(w.ca, other), true},
		{"CA that verified it removed", roots(w.ca, other), roots(other), false},
		{"min version raised to its own", func(*snapshot.TLS) {}, func(p *snapshot.TLS) { p.MinVersion = tls.VersionTLS13 }, true},
		{"min version raised above its own", func(p *snapshot.TLS) { p.MaxVersion = tls.VersionTLS12 }, func(p *snapshot.TLS) { p.MinVersion = tls.VersionTLS13 }, false},
		{"client certificate rotated", client(clients[0]), client(clients[1]), false},
		{"CA added, same client certificate", client(clients[0]), func(p *snapshot.TLS) { client(clients[0])(p); roots(w.ca, other)(p) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			from, to := w.policy(), w.policy()
			c.from(from)
			c.to(to)
			s1 := w.pools.Build(w.snapshot(t, 1, from), nil)
			be1 := s1.Get(ref)
			conn, err := be1.GetH1(t.Context(), be1.Picker.Pick(), pool.Client{})
			if err != nil {
				t.Fatal(err)
			}
			exchange(t, conn)
			be1.PutH1(conn)
			dropped := w.counter(t, "sockmesh_proxy_upstream_pool_dropped_total", "settings_changed")
			s2 := w.pools.Build(w.snapshot(t, 2, to), s1)
			t.Cleanup(s2.CloseIdle)
			if open, idle := s2.Get(ref).w.h1.Stats(w.addr); open != idle || idle != map[bool]int{true: 1}[c.kept] {
				t.Errorf("new settings' pool: %d open, %d idle; want the connection idle there: %v", open, idle, c.kept)
			}
			if n := w.counter(t, "sockmesh_proxy_upstream_pool_dropped_total", "settings_changed") - dropped; n != map[bool]float64{false: 1}[c.kept] {
				t.Errorf("pool_dropped_total{reason=settings_changed} rose by %v; want 1 if the connection was closed (kept: %v)", n, c.kept)
			}
			if !c.kept {
				if _, err := conn.R.ReadByte(); err == nil {
					t.Error("the connection is still open")
				}
				return
			}
			be2 := s2.Get(ref)
			got, err := be2.GetH1(t.Context(), be2.Picker.Pick(), pool.Client{})
			if err != nil || got != conn {
				t.Fatalf("GetH1 = %p, %v; want the connection from before", got, err)
			}
			exchange(t, got)
			be2.PutH1(got)
		})
	}
}

// TestSpeaksH1Only: a backend that declined h2 is taken to speak HTTP/1.1
// only for h1OnlyFor, across snapshots that keep its wire, and not after
// its TLS settings change.
func TestSpeaksH1Only(t *testing.T) {
	w := newWorld(t)
	s1 := w.pools.Build(w.snapshot(t, 1, w.policy()), nil)
	be1 := s1.Get(ref)
	t0 := time.Now()
	if be1.SpeaksH1Only(t0) {
		t.Fatal("a new backend speaks HTTP/1.1 only")
	}
	be1.DeclinedH2(t0)
	for _, c := range []struct {
		after time.Duration
		want  bool
	}{{0, true}, {h1OnlyFor - time.Second, true}, {h1OnlyFor, false}, {2 * h1OnlyFor, false}} {
		if got := be1.SpeaksH1Only(t0.Add(c.after)); got != c.want {
			t.Errorf("%v after declining: SpeaksH1Only = %v, want %v", c.after, got, c.want)
		}
	}
	s2 := w.pools.Build(w.snapshot(t, 2, w.policy()), s1)
	if !s2.Get(ref).SpeaksH1Only(t0) {
		t.Error("forgotten by a snapshot with the same wire")
	}
	changed := w.policy()
	changed.MinVersion = tls.VersionTLS13
	s3 := w.pools.Build(w.snapshot(t, 3, changed), s2)
	if s3.Get(ref).SpeaksH1Only(t0) {
		t.Error("kept across a change of TLS settings")
	}
}

// TestGetH1DropsExpired: an idle connection is not handed out once the
// certificate chain its handshake verified has expired — its leaf or its
// CA, checked by crypto/tls or against subjectAltNames: the pool closes it
// and dials again, where a new handshake would fail verification. The
// pool handed it out until its idle timeout, so requests went on reaching
// a backend whose certificate no handshake would accept.
func TestGetH1DropsExpired(t *testing.T) {
	for _, c := range []struct {
		expires   string
		leafLives time.Duration // the CA lives a day
		idle      time.Duration
	}{{"leaf", 30 * time.Second, time.Minute}, {"ca", 48 * time.Hour, 25 * time.Hour}} {
		for _, sans := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/subjectAltNames=%v", c.expires, sans), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					ca, err := pki.NewCA("ca")
					if err != nil {
						t.Fatal(err)
					}
					leaf, err := ca.Issue(pki.LeafOptions{DNSNames: []string{sni}, NotAfter: time.Now().Add(c.leafLives)})
					if err != nil {
						t.Fatal(err)
					}
					reg := prometheus.NewRegistry()
					d := &onePipe{cfg: &tls.Config{Certificates: []tls.Certificate{leaf.TLS}}}
					p, err := New(Config{IdleConnTimeout: 2 * c.idle}, d, slog.New(slog.DiscardHandler), reg)
					if err != nil {
						t.Fatal(err)
					}
					pol := &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: sni, RootsPEM: string(ca.CertPEM)}
					if sans {
						pol.SubjectAltNames = []snapshot.SubjectAltName{{Type: snapshot.SANHostname, Value: sni}}
					}
					be := backendAt(t, p, netip.MustParseAddrPort("10.0.0.1:443"), pol)
					ep := be.Picker.Pick()
					first, err := be.GetH1(t.Context(), ep, pool.Client{})
					if err != nil {
						t.Fatal(err)
					}
					exchange(t, first)
					be.PutH1(first)
					time.Sleep(c.idle) // past the expiry, within the idle timeout
					again, err := be.GetH1(t.Context(), ep, pool.Client{})
					if err == nil {
						be.DiscardH1(again)
						t.Fatalf("a connection handed out after its chain expired (the one before: %v)", again == first)
					}
					if !errors.Is(err, syscall.ECONNREFUSED) {
						t.Errorf("GetH1 after the chain expired: %v, want the second dial's refusal", err)
					}
					w := &world{reg: reg}
					if n := w.counter(t, "sockmesh_proxy_upstream_pool_dropped_total", "expired"); n != 1 {
						t.Errorf("pool dropped{reason=expired} = %v, want 1", n)
					}
				})
			})
		}
	}
}

// onePipe connects its first dial over net.Pipe to a TLS server of its
// own, which answers each HTTP/1.1 request with 200 "ok", and refuses the
// others: its goroutines block on channels, which synctest can wait out.
type onePipe struct {
	cfg    *tls.Config
	dialed bool
}

func (d *onePipe) Dial(context.Context, snapshot.Endpoint) (net.Conn, error) {
	if d.dialed {
		return nil, syscall.ECONNREFUSED
	}
	d.dialed = true
	c, s := net.Pipe()
	go func() {
		tc := tls.Server(s, d.cfg)
		defer tc.Close()
		r := bufio.NewReader(tc)
		for {
			if _, err := http.ReadRequest(r); err != nil {
				return
			}
			if _, err := io.WriteString(tc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	}()
	return c, nil
}

// TestConnectionsCountedAfterBackendLeft: a connection a backend's wire
// opens after a snapshot without the backend dropped its
// sockmesh_proxy_upstream_connections series (for a request under way on
// an older snapshot) is counted on the series, made again, which goes
// once the connection closed and a later snapshot came. It was counted on
// the dropped series: exported nowhere while it was open.
func TestConnectionsCountedAfterBackendLeft(t *testing.T) {
	w := newWorld(t)
	s1 := w.pools.Build(w.snapshot(t, 1, w.policy()), nil)
	empty := func(version uint64) *snapshot.Snapshot {
		s, err := snapshot.New(version, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s2 := w.pools.Build(empty(2), s1)
	const name = "sockmesh_proxy_upstream_connections"
	if m := w.series(t, name, ref.Name); m != nil {
		t.Fatalf("%s of a backend gone with no connection open: %v, want none", name, m)
	}
	be := s1.Get(ref)
	c, err := be.Dial(t.Context(), be.Picker.Pick(), alpnH1)
	if err != nil {
		t.Fatal(err)
	}
	if n := w.series(t, name, ref.Name).GetGauge().GetValue(); n != 1 {
		t.Errorf("%s with a connection open to the gone backend = %v, want 1", name, n)
	}
	c.Close()
	w.pools.Build(empty(3), s2)
	if m := w.series(t, name, ref.Name); m != nil {
		t.Errorf("%s after its connection closed and a snapshot came: %v, want none", name, m)
	}
}

// TestEjectionsOfRetiredWire: an ejection a retired wire finds (a request
// under way on an older snapshot) counts on its backend's
// sockmesh_proxy_upstream_endpoint_ejections_total when the backend left
// and came back, and makes no series while it is gone. It counted on the
// series the backend's leaving dropped: exported nowhere.
func TestEjectionsOfRetiredWire(t *testing.T) {
	w := newWorld(t)
	var dead []snapshot.Endpoint // two that refuse connections
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		dead = append(dead, snapshot.Endpoint{Addr: l.Addr().(*net.TCPAddr).AddrPort(), Ready: true})
	}
	other := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: ref.Namespace, Name: "other", Port: 443}
	build := func(version uint64, prev *Set, refs ...snapshot.BackendRef) *Set {
		var bes []snapshot.Backend
		for _, r := range refs {
			bes = append(bes, snapshot.Backend{Ref: r, TLS: w.policy(), Endpoints: dead})
		}
		s, err := snapshot.New(version, nil, bes, nil)
		if err != nil {
			t.Fatal(err)
		}
		return w.pools.Build(s, prev)
	}
	s1 := build(1, nil, ref)
	retired := s1.Get(ref)
	eject := func() {
		t.Helper()
		if _, err := retired.Dial(t.Context(), retired.Picker.Pick(), alpnH1); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial to a closed port: %v, want refused", err)
		}
	}
	const name = "sockmesh_proxy_upstream_endpoint_ejections_total"
	s2 := build(2, s1, other) // the endpoints stay ready: not of ref
	eject()
	if n := w.pools.health.Ejected(time.Now()); n != 1 {
		t.Fatalf("%d endpoints ejected, want 1", n)
	}
	if m := w.series(t, name, ref.Name); m != nil {
		t.Errorf("%s of a backend gone: %v, want none", name, m)
	}
	build(3, s2, ref, other)
	eject()
	if n := w.counter(t, name, ref.Name); n != 1 {
		t.Errorf("%s of a backend back = %v, want 1: its retired wire's ejection", name, n)
	}
}
