package h2drain

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/metricsum"
	"github.com/sockmesh/sockmesh/test/pki"
	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstreamtls"
)

var (
	epA = netip.MustParseAddrPort("10.1.0.1:8080")
	epB = netip.MustParseAddrPort("10.1.0.2:8080")
	epC = netip.MustParseAddrPort("10.1.0.3:8080")
)

// counts records the connections asked to go away, by reason, and each
// connection's GOAWAY as its app reads it.
type counts struct {
	mu    sync.Mutex
	asked map[Reason]int
	read  chan *Conn
}

func (k *counts) add(_ snapshot.BackendRef, why Reason) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.asked[why]++
}

// wantAsked waits until n connections were counted as asked for why,
// and fails if more were.
func (k *counts) wantAsked(t *testing.T, why Reason, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		k.mu.Lock()
		got := k.asked[why]
		k.mu.Unlock()
		if got == n {
			return
		}
		if got > n || time.Now().After(deadline) {
			t.Fatalf("%d asked for %s, want %d", got, why, n)
		}
	}
}

// relayed registers n connections to ep whose backend has sent its
// SETTINGS and a first answer; each GOAWAY their apps read is sent to
// k.read.
func relayed(t *testing.T, r *Registry, k *counts, ref snapshot.BackendRef, ep netip.AddrPort, n int) []*Conn {
	return relayedOver(t, r, k, ref, ep, n, upstreamtls.Held{})
}

// relayedOver is relayed for connections over TLS held.
func relayedOver(t testing.TB, r *Registry, k *counts, ref snapshot.BackendRef, ep netip.AddrPort, n int, held upstreamtls.Held) []*Conn {
	var settings bytes.Buffer
	fw := http2.NewFramer(&settings, nil)
	fw.WriteSettings()
	fw.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("h"), EndHeaders: true})
	var cs []*Conn
	for range n {
		a, b := net.Pipe()
		c := NewConn(a)
		t.Cleanup(func() { r.Remove(ref, c); a.Close(); b.Close() })
		go func() {
			fr := http2.NewFramer(nil, b)
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					return
				}
				if _, ok := f.(*http2.GoAwayFrame); ok {
					k.read <- c
				}
			}
		}()
		if _, err := c.Write(settings.Bytes()); err != nil {
			t.Fatal(err)
		}
		r.Add(ref, ep, c, held)
		cs = append(cs, c)
	}
	return cs
}

func newRegistry(spread time.Duration) (*Registry, *counts) {
	k := &counts{asked: make(map[Reason]int), read: make(chan *Conn, 100)}
	return NewRegistry(spread, k.add, nil, nil), k
}

// wantRead waits for n GOAWAYs read by apps and returns their connections.
func wantRead(t *testing.T, k *counts, n int) map[*Conn]bool {
	t.Helper()
	got := make(map[*Conn]bool)
	for range n {
		select {
		case c := <-k.read:
			got[c] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("%d GOAWAYs read, want %d", len(got), n)
		}
	}
	return got
}

// leaving counts the registered connections of ref asked to go away (or
// about to be).
func leaving(r *Registry, ref snapshot.BackendRef) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.conns[ref] {
		if e.leaving {
			n++
		}
	}
	return n
}

// newCA returns a CA valid for a day.
func newCA(t testing.TB) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// origination returns the TLS settings of a backend web.test trusting roots.
func origination(t testing.TB, roots ...*pki.CA) *upstreamtls.Origination {
	t.Helper()
	s := &snapshot.TLS{ServerName: "web.test"}
	for _, ca := range roots {
		s.RootsPEM += string(ca.CertPEM)
	}
	o, err := upstreamtls.New(s, upstreamtls.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// heldUntil returns the TLS of a connection, made trusting ca, to a
// backend whose certificate from ca expires at until.
func heldUntil(t testing.TB, ca *pki.CA, until time.Time) upstreamtls.Held {
	t.Helper()
	leaf, err := ca.Issue(pki.LeafOptions{DNSNames: []string{"web.test"}, NotAfter: until})
	if err != nil {
		t.Fatal(err)
	}
	o := origination(t, ca)
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		defer b.Close()
		tls.Server(b, &tls.Config{Certificates: []tls.Certificate{leaf.TLS}}).Handshake()
	}()
	c := tls.Client(a, o.Config(epA, nil))
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	return o.Hold(c.ConnectionState(), nil)
}

var web = snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: "web", Port: 80}

// TestEndpointGone: the connections to an endpoint no longer handed out
// are asked to go away at once; the others stay.
func TestEndpointGone(t *testing.T) {
	r, k := newRegistry(time.Hour)
	onA := relayed(t, r, k, web, epA, 3)
	relayed(t, r, k, web, epB, 2)
	r.Update(func(snapshot.BackendRef) (Endpoints, bool) { return Endpoints{Addrs: []netip.AddrPort{epB}}, true })
	got := wantRead(t, k, 3)
	for _, c := range onA {
		if !got[c] {
			t.Error("a connection to the gone endpoint got no GOAWAY")
		}
	}
	if n := leaving(r, web); n != 3 {
		t.Errorf("%d connections leaving, want 3", n)
	}
	k.wantAsked(t, ReasonEndpointGone, 3)
}

// TestGoAwayCountedOnceWritten: a GOAWAY counts (asked) once written to
// its connection, not when asked for: one that waits for the end of the
// backend's frame counts when the frame ends, and not at all when the
// relay ends first; nor does one asked for while the relay's write waits
// on an app that is not reading, and the relay ends. Before, each counted
// when asked for. In a synctest bubble, which orders the steps.
func TestGoAwayCountedOnceWritten(t *testing.T) {
	var start, data bytes.Buffer
	fw := http2.NewFramer(&start, nil)
	fw.WriteSettings()
	fw.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("h"), EndHeaders: true})
	http2.NewFramer(&data, nil).WriteData(1, false, []byte("body"))
	gone := func(snapshot.BackendRef) (Endpoints, bool) { return Endpoints{Addrs: []netip.AddrPort{epB}}, true }
	for _, c := range []struct {
		name string
		// appReads is how many frames the app reads (0: all).
		appReads int
		// relayAsking writes the backend's bytes to conn as the relay
		// does, and has r ask conn to go away (epA is gone).
		relayAsking func(r *Registry, conn *Conn)
		want        int
	}{
		{"frame ended", 0, func(r *Registry, conn *Conn) {
			conn.Write(data.Bytes()[:5]) // inside the DATA frame's header
			r.Update(gone)
			synctest.Wait()
			conn.Write(data.Bytes()[5:])
		}, 1},
		{"relay ended inside the frame", 0, func(r *Registry, conn *Conn) {
			conn.Write(data.Bytes()[:5])
			r.Update(gone)
			synctest.Wait()
		}, 0},
		{"relay ended while its write waited", 2, func(r *Registry, conn *Conn) {
			go conn.Write(data.Bytes())
			synctest.Wait() // the write waits on the app, holding conn
			r.Update(gone)  // its GOAWAY waits for the write
		}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, k := newRegistry(time.Hour)
				a, b := net.Pipe()
				go func() {
					fr := http2.NewFramer(nil, b)
					for n := 0; c.appReads == 0 || n < c.appReads; n++ {
						if _, err := fr.ReadFrame(); err != nil {
							return
						}
					}
				}()
				conn := NewConn(a)
				conn.Write(start.Bytes())
				r.Add(web, epA, conn, upstreamtls.Held{})
				c.relayAsking(r, conn)
				// The relay ends: Remove, and the app's connection closes.
				r.Remove(web, conn)
				a.Close()
				b.Close()
				synctest.Wait()
				k.mu.Lock()
				defer k.mu.Unlock()
				if got := k.asked[ReasonEndpointGone]; got != c.want {
					t.Errorf("GOAWAYs counted: %d, want %d", got, c.want)
				}
			})
		})
	}
}

// TestRebalance: when a backend gains endpoints, the connections beyond
// each endpoint's share go (6 on one endpoint, 3 endpoints: 4 go), spread
// in time; a later snapshot that gains nothing moves none, and a sticky
// backend (ClientIP affinity) or one gone from the snapshot none either.
func TestRebalance(t *testing.T) {
	r, k := newRegistry(50 * time.Millisecond)
	onA := relayed(t, r, k, web, epA, 6)
	load := r.Load(web)
	if load(epA) != 6 || load(epB) != 0 {
		t.Fatalf("load %d, %d; want 6 on A, none on B", load(epA), load(epB))
	}
	all := []netip.AddrPort{epA, epB, epC}
	r.Update(func(snapshot.BackendRef) (Endpoints, bool) { return Endpoints{Addrs: all, Gained: true}, true })
	if load(epA) != 2 {
		t.Errorf("load on A %d once four are leaving, want 2", load(epA))
	}
	wantRead(t, k, 4)
	r.Update(func(snapshot.BackendRef) (Endpoints, bool) { return Endpoints{Addrs: all}, true })
	if n := leaving(r, web); n != 4 {
		t.Errorf("%d leaving, want 4", n)
	}
	k.wantAsked(t, ReasonRebalance, 4)
	for _, c := range onA {
		r.Remove(web, c)
	}
	if load(epA) != 0 {
		t.Errorf("load on A %d once all are gone, want 0", load(epA))
	}

	sticky := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: "sticky", Port: 80}
	gone := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: "gone", Port: 80}
	relayed(t, r, k, sticky, epA, 3)
	relayed(t, r, k, gone, epA, 3)
	r.Update(func(ref snapshot.BackendRef) (Endpoints, bool) {
		if ref == gone {
			return Endpoints{}, false
		}
		return Endpoints{Addrs: all, Gained: true, Sticky: ref == sticky}, true
	})
	if leaving(r, sticky) != 0 || leaving(r, gone) != 0 {
		t.Error("a sticky backend's or a gone backend's connections asked to go")
	}
}

// TestPolicyChanged: when the backend's settings change and keep no
// connection, every connection goes at once, whatever its endpoint:
// spread, their streams went on reaching the backend under settings the
// policy may have withdrawn.
func TestPolicyChanged(t *testing.T) {
	r, k := newRegistry(time.Hour)
	relayed(t, r, k, web, epA, 3)
	relayed(t, r, k, web, epB, 1)
	r.Update(func(snapshot.BackendRef) (Endpoints, bool) {
		return Endpoints{Addrs: []netip.AddrPort{epA, epB}, Changed: true}, true
	})
	wantRead(t, k, 4)
	k.wantAsked(t, ReasonPolicyChanged, 4)
}

// TestPolicyChangedKept: a connection the backend's new TLS settings
// still verify (a CA added beside its own) stays, and their trust in it
// ends, as before, when its certificate expires. Every connection went
// at once on any change of the settings.
func TestPolicyChangedKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, k := newRegistry(time.Hour)
		ca := newCA(t)
		relayedOver(t, r, k, web, epA, 1, heldUntil(t, ca, time.Now().Add(time.Hour)))
		gone := relayedOver(t, r, k, web, epA, 1, heldUntil(t, newCA(t), time.Now().Add(time.Hour)))
		r.Update(func(snapshot.BackendRef) (Endpoints, bool) {
			return Endpoints{Addrs: []netip.AddrPort{epA}, Changed: true, TLS: origination(t, ca, newCA(t))}, true
		})
		if got := wantRead(t, k, 1); !got[gone[0]] {
			t.Error("the connection whose CA the new settings leave out got no GOAWAY")
		}
		k.wantAsked(t, ReasonPolicyChanged, 1)
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		wantRead(t, k, 1)
		k.wantAsked(t, ReasonExpired, 1)
	})
}

// BenchmarkUpdateTLSChanged: an update under new TLS settings that keep
// all of a backend's 1000 connections, which share one certificate chain
// (gRPC channels to one backend), taken under the registry's lock.
func BenchmarkUpdateTLSChanged(b *testing.B) {
	r, k := newRegistry(time.Hour)
	ca := newCA(b)
	relayedOver(b, r, k, web, epA, 1000, heldUntil(b, ca, time.Now().Add(time.Hour)))
	// Two settings in turn: a connection held under the settings of an
	// update is kept without a look.
	settings := [2]*upstreamtls.Origination{origination(b, ca), origination(b, ca, newCA(b))}
	for i := 0; b.Loop(); i++ {
		r.Update(func(snapshot.BackendRef) (Endpoints, bool) {
			return Endpoints{Addrs: []netip.AddrPort{epA}, Changed: true, TLS: settings[i%2]}, true
		})
	}
	if n := leaving(r, web); n != 0 {
		b.Fatalf("%d connections leaving, want none", n)
	}
}

// TestExpired: a connection is asked to go away when the certificate
// chain its TLS handshake verified expires, and only then: its streams
// went on reaching a backend no new handshake accepted, for as long as
// the app kept it.
func TestExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, k := newRegistry(time.Hour)
		ca := newCA(t)
		due := relayedOver(t, r, k, web, epA, 2, heldUntil(t, ca, time.Now().Add(time.Hour)))
		relayedOver(t, r, k, web, epA, 1, heldUntil(t, ca, time.Now().Add(12*time.Hour)))
		relayed(t, r, k, web, epB, 1) // cleartext
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		got := wantRead(t, k, 2)
		for _, c := range due {
			if !got[c] {
				t.Error("a connection whose chain expired got no GOAWAY")
			}
		}
		if n := leaving(r, web); n != 2 {
			t.Errorf("%d connections leaving, want 2", n)
		}
		k.wantAsked(t, ReasonExpired, 2)
	})
}

// TestShutdown asks every connection to go, once, and one added after
// (its dial was under way) at once.
func TestShutdown(t *testing.T) {
	r, k := newRegistry(time.Hour)
	relayed(t, r, k, web, epA, 2)
	relayed(t, r, k, web, epB, 1)
	r.GoAwayAll(ReasonShutdown)
	wantRead(t, k, 3)
	r.GoAwayAll(ReasonShutdown)
	select {
	case <-k.read:
		t.Error("a second GOAWAY")
	case <-time.After(100 * time.Millisecond):
	}
	k.wantAsked(t, ReasonShutdown, 3)
	relayed(t, r, k, web, epC, 1)
	wantRead(t, k, 1)
	k.wantAsked(t, ReasonShutdown, 4)
}

// TestStandby: the connections on standby endpoints (fallback ones, while
// a preferred one takes connections) move back within the spread: one
// while the preferred ones are only due a probe (Untried), the others once
// one serves; also when clients come back to their endpoint (Sticky), as
// theirs are pinned back to a preferred one. The others stay.
func TestStandby(t *testing.T) {
	r, k := newRegistry(20 * time.Millisecond)
	relayed(t, r, k, web, epA, 2)
	relayed(t, r, k, web, epC, 3)
	eps := Endpoints{Addrs: []netip.AddrPort{epA, epC}, Standby: []netip.AddrPort{epC}, Untried: true}
	r.Update(func(snapshot.BackendRef) (Endpoints, bool) { return eps, true })
	if n := leaving(r, web); n != 1 {
		t.Errorf("preferred ones untried: %d leaving, want 1", n)
	}
	wantRead(t, k, 1)
	eps.Untried = false
	r.Update(func(snapshot.BackendRef) (Endpoints, bool) { return eps, true })
	wantRead(t, k, 2)
	if n := leaving(r, web); n != 3 {
		t.Errorf("%d leaving, want the 3 on standby", n)
	}
	k.wantAsked(t, ReasonPreferredBack, 3)

	sticky := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: "sticky", Port: 80}
	relayed(t, r, k, sticky, epC, 2)
	r.Update(func(ref snapshot.BackendRef) (Endpoints, bool) {
		return Endpoints{Addrs: eps.Addrs, Standby: eps.Standby, Sticky: ref == sticky}, ref == sticky
	})
	wantRead(t, k, 2)
	if n := leaving(r, sticky); n != 2 {
		t.Errorf("sticky backend: %d leaving, want the 2 on standby", n)
	}
}

// TestStandbyUntriedOnce: while the preferred endpoints are untried, an
// update before the one connection asked back has its GOAWAY (another
// snapshot, another ejection ending on the node) moves no other.
func TestStandbyUntriedOnce(t *testing.T) {
	r, k := newRegistry(time.Hour)
	relayed(t, r, k, web, epA, 1)
	relayed(t, r, k, web, epC, 3)
	eps := Endpoints{Addrs: []netip.AddrPort{epA, epC}, Standby: []netip.AddrPort{epC}, Untried: true}
	for range 2 {
		r.Update(func(snapshot.BackendRef) (Endpoints, bool) { return eps, true })
	}
	if n := leaving(r, web); n != 1 {
		t.Errorf("preferred ones untried, updated twice: %d leaving, want 1", n)
	}
}

// TestRecheckPanicContained: a panic in the recheck a connection asked back
// to untried endpoints schedules is the Registry's goroutine's, reported
// to its Reporter: it does not end the node's proxy.
func TestRecheckPanicContained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		panics, err := contain.New(slog.New(slog.DiscardHandler), reg, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		k := &counts{asked: make(map[Reason]int), read: make(chan *Conn, 100)}
		r := NewRegistry(time.Second, k.add, func() { panic("recheck") }, panics)
		relayed(t, r, k, web, epC, 1)
		r.Update(func(snapshot.BackendRef) (Endpoints, bool) {
			return Endpoints{Addrs: []netip.AddrPort{epA, epC}, Standby: []netip.AddrPort{epC}, Untried: true}, true
		})
		time.Sleep(3 * time.Second) // past the recheck, twice the spread
		synctest.Wait()
		if n := metricsum.Sum(t, reg, "sockmesh_proxy_panics_total", nil); n != 1 {
			t.Errorf("%v panics reported, want the recheck's", n)
		}
	})
}
