package httpproxy

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/routes"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// View is one snapshot with its upstream side, as the proxy publishes it.
type View struct {
	Snapshot *snapshot.Snapshot
	Backends *upstream.Set
	// Routes is Snapshot's GAMMA route tables compiled
	// (routes.Compile(Snapshot)); nil when no frontend has routes.
	Routes *routes.Table
}

// NewView builds the View of s with its upstream Set, compiling the route
// tables once when a frontend has routes.
func NewView(s *snapshot.Snapshot, backends *upstream.Set) *View {
	v := &View{Snapshot: s, Backends: backends}
	for i := range s.Frontends {
		if s.Frontends[i].Routes != nil {
			v.Routes = routes.Compile(s)
			break
		}
	}
	return v
}

// Target is what the proxy knows about a client connection when its requests
// arrive.
type Target struct {
	// OrigDst is the captured Service address the client connected to.
	OrigDst netip.AddrPort
	// Start is the view the connection was accepted under; Current is the
	// proxy's latest. Each request uses the latest view (so a keep-alive
	// connection follows endpoint changes) and keeps it to its end; if the
	// latest no longer captures OrigDst, the request finishes on Start.
	Start   *View
	Current *atomic.Pointer[View]
	// ClientAddr is the client's address; ClientPod is its pod when the
	// listener knows it (in-pod mode), else nil: logs then find it by
	// address (ClientName), only when they name the client.
	ClientAddr netip.AddrPort
	ClientPod  *snapshot.ObjectRef
	// Ended, when set, is called once the connection has ended, by
	// whichever goroutine serves it then: ServeHTTP1 may return before,
	// having parked it.
	Ended func()
	// Relayed, when set, is how the L4 relay's connects for this
	// connection failed before it was handed here.
	Relayed *RelayFailure
	// Conn, when set, is the app's connection as net/http's server got
	// it: on HTTP/1.x, the stall watch counts the bytes of a write to it
	// under way (writeProgress; the fast path has its own), and ConnState
	// turns TCP keep-alive on for it.
	Conn net.Conn
	// probe turns keep-alive on for Conn once an exchange on net/http's
	// server outlasts watchAfter (ConnState); probed is set once it is on,
	// on either path (keepAlive).
	probe  *time.Timer
	probed atomic.Bool
}

// RelayFailure is how the L4 relay's connects to Backend's endpoints for a
// connection failed: the last one's error. They were its first request's
// tries, made as the L7 path makes its own (another endpoint after one
// that took nothing, upstream.NoConnection; at most three): that request
// answers with Err rather than connect to the same endpoints again, which
// the Picker, every one of them ejected, would hand out anyway, or meet a
// certificate that fails verification once more. Err may
// also be an h2c backend's answer to the app's HTTP/2 preface in another
// protocol (upstream.ErrNotHTTP2): the first request names it, and the
// connection ends after it.
type RelayFailure struct {
	Backend *upstream.Backend
	Err     error
	told    atomic.Bool
}

// relayFailed returns, to the first request only, how the relay's
// connects to be failed (Relayed), or nil: also when the request's be is
// not the relay's (another snapshot made it; its endpoints may have
// changed).
func (t *Target) relayFailed(be *upstream.Backend) error {
	if f := t.Relayed; f != nil && f.Backend == be && f.told.CompareAndSwap(false, true) {
		return f.Err
	}
	return nil
}

// ClientName names a client in logs: its pod when known (given, or the
// workload of s at addr), else its address.
func ClientName(s *snapshot.Snapshot, addr netip.AddrPort, pod *snapshot.ObjectRef) string {
	if pod := s.ClientPod(addr.Addr(), pod); pod != nil {
		return pod.String()
	}
	return addr.Addr().String()
}

// ended calls Ended, if set.
func (t *Target) ended() {
	if t.Ended != nil {
		t.Ended()
	}
}

// keepAlive turns TCP keep-alive on for c, t's app connection, the first
// time it is called: when an exchange outlasts watchAfter. It may then go
// on for hours with no byte either way (SSE, a long poll, an upload its
// backend stopped taking), and an app that vanished without a word (its
// node lost, a cut path) sends no FIN or reset to end it: keep-alive
// probes do. Only then: the listeners accept without keep-alive, which
// costs setsockopts a connection of quick answers does without
// (proxy.ListenConfig).
func (t *Target) keepAlive(c net.Conn) {
	if t.probed.Swap(true) {
		return
	}
	if tc := sockio.TCP(c); tc != nil {
		tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true})
	}
}

// ConnState is net/http's server's ConnState hook for t's connection
// (Conn): as the fast path's client watch does, it turns keep-alive on
// once an exchange outlasts watchAfter (keepAlive). An HTTP/1 connection
// is active from a request's head to the end of its answer, an HTTP/2 one
// while it has a stream open. The server calls it from the
// connection's goroutine, but for StateNew, before that starts.
func (t *Target) ConnState(state http.ConnState) {
	if t.Conn == nil || t.probed.Load() {
		return
	}
	switch {
	case state != http.StateActive:
		if t.probe != nil {
			t.probe.Stop()
		}
	case t.probe == nil:
		t.probe = time.AfterFunc(watchAfter, func() { t.keepAlive(t.Conn) })
	default:
		t.probe.Reset(watchAfter)
	}
}

// nameService gives r, when it names no authority (an HTTP/1.0 request
// without Host), the Service's address, the one the app connected to: RFC
// 9112 §3.3 rebuilds such a request's target URI from the authority the
// connection reached, and the Service's DNS name is not known here.
// Backends would get an empty Host from the fast path and the endpoint's
// address from net/http's.
func (t *Target) nameService(r *http.Request) {
	if r.Host == "" {
		r.Host = t.OrigDst.String()
	}
}

// clientKey is t's client as balance tells clients apart (affinity).
func (t *Target) clientKey() balance.ClientKey {
	return balance.ClientOf(t.Start.Snapshot, t.ClientAddr, t.ClientPod)
}

// poolClient is t's client as the upstream pools share an endpoint's
// connections out: its pod when the listener or the snapshot names it (as
// ClientName does), else its address. By address alone, a dual-stack pod
// in node-IP mode was two clients, with two turns and two shares.
func (t *Target) poolClient() pool.Client {
	if pod := t.Start.Snapshot.ClientPod(t.ClientAddr.Addr(), t.ClientPod); pod != nil {
		return pool.Client{Namespace: pod.Namespace, Name: pod.Name}
	}
	return pool.Client{Addr: t.ClientAddr.Addr()}
}

// client is t's client as a log value, named only if the line is written.
func (t *Target) client() slog.LogValuer { return clientName{t} }

type clientName struct{ t *Target }

func (c clientName) LogValue() slog.Value {
	return slog.StringValue(ClientName(c.t.Start.Snapshot, c.t.ClientAddr, c.t.ClientPod))
}

// view returns the view and frontend a request uses.
func (t *Target) view() (*View, *snapshot.Frontend) {
	if v := t.Current.Load(); v != nil {
		if f, ok := v.Snapshot.Frontend(t.OrigDst); ok {
			return v, f
		}
	}
	f, _ := t.Start.Snapshot.Frontend(t.OrigDst)
	return t.Start, f
}

type targetKey struct{}

// WithTarget returns ctx carrying t, and t's client for the upstream
// pools (upstream.WithClient); the proxy sets it per connection.
func WithTarget(ctx context.Context, t *Target) context.Context {
	return context.WithValue(upstream.WithClient(ctx, t.poolClient()), targetKey{}, t)
}
