package proxy_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// The GAMMA tests' world: captured Services with route tables, route
// backends, and client workloads in two namespaces.

// Client workloads: 127.0.0.1 is a/client (a producer-route client),
// 127.0.0.2 is c/consumer (whose namespace has consumer routes);
// 127.0.0.3 is no workload of the node.
var (
	producerClient = netip.MustParseAddr("127.0.0.1")
	consumerClient = netip.MustParseAddr("127.0.0.2")
	unknownClient  = netip.MustParseAddr("127.0.0.3")
)

// mesh builds a snapshot with routes.
type mesh struct {
	t         testing.TB
	frontends []snapshot.Frontend
	backends  []snapshot.Backend
	// workloads are the node's pods besides a/client and c/consumer.
	workloads []snapshot.Workload
}

// backend adds Service b/name port 80 with be's properties, reachable as a
// route backend; it returns its reference.
func (m *mesh) backend(name string, be snapshot.Backend) snapshot.BackendRef {
	return m.backendOn(name, 80, be)
}

// backendOn is backend on port.
func (m *mesh) backendOn(name string, port uint16, be snapshot.Backend) snapshot.BackendRef {
	be.Ref = snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: name, Port: port}
	m.backends = append(m.backends, be)
	return be.Ref
}

// h2cBackend adds the Service name whose one endpoint serves h2c with
// serve (often at the frame level), until the test ends.
func (m *mesh) h2cBackend(name string, serve func(net.Conn)) snapshot.BackendRef {
	l := listenLocal(m.t)
	tcpserve.Serve(m.t, l, serve)
	return m.backend(name, snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(l.Addr().(*net.TCPAddr).AddrPort())})
}

// echoBackend adds backend b/name with one echo server, pod name-0.
func (m *mesh) echoBackend(name string) snapshot.BackendRef {
	m.t.Helper()
	return m.backend(name, snapshot.Backend{Endpoints: endpoints(startEcho(m.t, name+"-0", nil).addr)})
}

// frontend captures Service b/name at vip, whose own backend is own, with
// route table rt (nil: none).
func (m *mesh) frontend(name string, vip netip.AddrPort, own snapshot.BackendRef, rt *snapshot.RouteTable) {
	m.frontends = append(m.frontends, snapshot.Frontend{
		Service: snapshot.ObjectRef{Namespace: "b", Name: name}, Port: vip.Port(),
		Addresses: []netip.Addr{vip.Addr()}, FailurePolicy: snapshot.FailOpen, Backend: own, Routes: rt,
	})
}

func (m *mesh) snapshot(version uint64) *snapshot.Snapshot {
	m.t.Helper()
	s, err := snapshot.New(version, m.frontends, m.backends, append([]snapshot.Workload{
		{Pod: snapshot.ObjectRef{Namespace: "a", Name: "client"}, IPs: []netip.Addr{producerClient}, Enrolled: true},
		{Pod: snapshot.ObjectRef{Namespace: "c", Name: "consumer"}, IPs: []netip.Addr{consumerClient}, Enrolled: true},
	}, m.workloads...))
	if err != nil {
		m.t.Fatal(err)
	}
	return s
}

// rule is one route rule with its matches; routeSet lists matches in rule
// order, which is their precedence.
type rule struct {
	matches []snapshot.RouteMatch
	snapshot.RouteRule
}

func routeSet(kind snapshot.RouteKind, rules ...rule) *snapshot.RouteSet {
	out := &snapshot.RouteSet{Kind: kind}
	for i, r := range rules {
		r.Route = snapshot.ObjectRef{Kind: string(kind), Namespace: "b", Name: "route"}
		r.Index = i
		out.Rules = append(out.Rules, r.RouteRule)
		for _, m := range r.matches {
			m.Rule = i
			out.Matches = append(out.Matches, m)
		}
	}
	return out
}

func producer(rs *snapshot.RouteSet) *snapshot.RouteTable { return &snapshot.RouteTable{Producer: rs} }

func prefixMatch(p string) snapshot.RouteMatch {
	return snapshot.RouteMatch{Path: snapshot.PathMatch{Type: snapshot.PathPrefix, Value: p}}
}

func exactMatch(p string) snapshot.RouteMatch {
	return snapshot.RouteMatch{Path: snapshot.PathMatch{Type: snapshot.PathExact, Value: p}}
}

// to is the backendRefs of a rule sending everything to refs, equally.
func to(refs ...snapshot.BackendRef) []snapshot.WeightedBackend {
	out := make([]snapshot.WeightedBackend, len(refs))
	for i, r := range refs {
		out[i] = snapshot.WeightedBackend{Weight: 1, Backend: r}
	}
	return out
}

func dur(d time.Duration) *snapshot.Duration {
	v := snapshot.Duration(d)
	return &v
}

// clientKind is how an app reaches the proxy: HTTP/1.1 on the fast path,
// HTTP/1.1 through net/http's server, or h2c (net/http's server).
type clientKind struct {
	name string
	path proxy.HTTP1TLSPath
	h2c  bool
}

var clientKinds = []clientKind{
	{"http1-fast", proxy.HTTP1TLSPooled, false},
	{"http1-nethttp", proxy.HTTP1TLSL7, false},
	{"h2c", proxy.HTTP1TLSPooled, true},
}

// http1Kinds are the client kinds that speak HTTP/1.1.
var http1Kinds = clientKinds[:2]

// inBubbles runs test once for each client kind (of kinds; none: every
// one), as a subtest in a synctest bubble of its own, where every duration
// is exact.
func inBubbles(t *testing.T, test func(t *testing.T, k clientKind), kinds ...clientKind) {
	if kinds == nil {
		kinds = clientKinds
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { test(t, k) })
		})
	}
}

// noRedirects makes c return redirects instead of following them.
func noRedirects(c *http.Client) *http.Client {
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

// clientFrom is e.client for connections from src (a loopback address),
// with pod as the in-pod listener's pod when set.
func (e *env) clientFrom(dst netip.AddrPort, src netip.Addr, pod *snapshot.ObjectRef, h2c bool) *http.Client {
	c := e.client(dst, h2c)
	c.Transport.(*http.Transport).DialContext = func(context.Context, string, string) (net.Conn, error) {
		return e.dialFrom(dst, src, pod)
	}
	return c
}

// recorded is a request a recorder backend saw.
type recorded struct {
	// Target is the request target as it came (RequestURI).
	Method, Target, Path, RawQuery, Host string
	Header                               http.Header
	Body                                 []byte
}

// recorder is a backend that records every request and answers as its
// handler says (200 and the body "ok" without one).
type recorder struct {
	addr netip.AddrPort
	mu   sync.Mutex
	reqs []recorded
	seen chan recorded
}

// startRecorder runs a recorder on 127.0.0.1:0, over HTTP/1.1 and h2c, or
// TLS with tlsCfg. answer, when set, answers the n-th (from 1) request
// for its key (the "id" query parameter); it may return false to answer
// 200 "ok".
func startRecorder(t testing.TB, tlsCfg *tls.Config, answer func(w http.ResponseWriter, r *http.Request, n int) bool) *recorder {
	t.Helper()
	rec := &recorder{seen: make(chan recorded, 1024)}
	counts := map[string]int{}
	// DisableGeneralOptionsHandler: the handler records "OPTIONS *" too,
	// which net/http's server would otherwise answer itself.
	srv := &http.Server{Protocols: new(http.Protocols), TLSConfig: tlsCfg, DisableGeneralOptionsHandler: true,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			got := recorded{Method: r.Method, Target: r.RequestURI, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Host: r.Host, Header: r.Header.Clone(), Body: body}
			rec.mu.Lock()
			rec.reqs = append(rec.reqs, got)
			key := r.URL.Query().Get("id")
			counts[key]++
			n := counts[key]
			rec.mu.Unlock()
			select {
			case rec.seen <- got:
			default:
			}
			if answer != nil && answer(w, r, n) {
				return
			}
			io.WriteString(w, "ok")
		})}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	if tlsCfg != nil {
		srv.Protocols.SetHTTP2(true)
	}
	l := listenLocal(t)
	rec.addr = l.Addr().(*net.TCPAddr).AddrPort()
	if tlsCfg != nil {
		go srv.ServeTLS(l, "", "")
	} else {
		go srv.Serve(l)
	}
	t.Cleanup(func() { srv.Close() })
	return rec
}

// count is how many requests with query id the recorder saw.
func (r *recorder) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, q := range r.reqs {
		if v, _ := url.ParseQuery(q.RawQuery); v.Get("id") == id {
			n++
		}
	}
	return n
}
