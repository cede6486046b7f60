package enrol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/vishvananda/netlink"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/internal/leakcheck"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// 10.233.0.0/16 belongs to these tests alone in this repository, and each
// test that makes pod namespaces claims it on the machine
// (sandbox.ClaimAddrs), so that no concurrent test, nor a run of these from
// another checkout, makes a pod address ambiguous.
var (
	plan = netip.MustParsePrefix("10.233.0.0/16")
	ipA  = netip.MustParseAddr("10.233.0.1")
	ipB  = netip.MustParseAddr("10.233.0.2")
	ipC  = netip.MustParseAddr("10.233.0.3")
)

// waitFor only keeps a broken test from hanging; no result depends on it.
const waitFor = 10 * time.Second

// recorder is the datapath: it keeps the last enrolment map.
type recorder struct {
	mu     sync.Mutex
	writes int
	last   map[uint64]datapath.Proxy
	// failures is how many of the next writes fail, as a map update may.
	failures int
}

func (r *recorder) SetEnrolments(want map[uint64]datapath.Proxy) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failures > 0 {
		r.failures--
		return errors.New("update enrolments: cannot allocate memory")
	}
	r.writes++
	r.last = maps.Clone(want)
	return nil
}

func (r *recorder) failNext() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures++
}

func (r *recorder) get() (map[uint64]datapath.Proxy, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.last), r.writes
}

// server is the proxy for in-pod listeners: it accepts and closes, and
// notes whose each connection was.
type server struct {
	mu    sync.Mutex
	pods  map[string]snapshot.ObjectRef // by listener address
	calls int
	// clients has, for every connection accepted, the pod it was served as
	// ("" for by address: Serve), in order.
	clients []string
	// failFirst makes the first ServePod fail at once, as a listener
	// whose accept fails would.
	failFirst bool
}

func (s *server) ServePod(l net.Listener, pod snapshot.ObjectRef) error {
	s.mu.Lock()
	s.pods[l.Addr().String()] = pod
	s.calls++
	fail := s.failFirst && s.calls == 1
	s.mu.Unlock()
	if fail {
		return errors.New("accept: too many open files")
	}
	return s.accept(l, pod.String())
}

func (s *server) Serve(l net.Listener) error {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	return s.accept(l, "")
}

func (s *server) accept(l net.Listener, client string) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.clients = append(s.clients, client)
		s.mu.Unlock()
		c.Close()
	}
}

// servedAs dials addr from ns and returns the client the server's
// listener served the connection as.
func (s *server) servedAs(t *testing.T, ns *sandbox.NetNS, addr string) string {
	t.Helper()
	s.mu.Lock()
	before := len(s.clients)
	s.mu.Unlock()
	c, err := ns.Dial(nil, "tcp", addr)
	if err != nil {
		t.Fatalf("dial the in-pod listener %s: %v", addr, err)
	}
	c.Close()
	var got string
	eventually(t, "the connection to "+addr+" accepted", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.clients) > before {
			got = s.clients[before]
			return true
		}
		return false
	})
	return got
}

// podNS makes a pod netns holding ips on lo.
func podNS(t *testing.T, ips ...netip.Addr) (*sandbox.NetNS, uint64) {
	t.Helper()
	ns := sandbox.NewNetNS(t)
	for _, ip := range ips {
		ns.AddAddr(t, "lo", netip.PrefixFrom(ip, 32))
	}
	cookie, err := ns.Cookie()
	if err != nil {
		t.Fatal(err)
	}
	return ns, cookie
}

func workload(name string, enrolled bool, ips ...netip.Addr) snapshot.Workload {
	return snapshot.Workload{Pod: snapshot.ObjectRef{Namespace: "app", Name: name}, UID: name + "-uid", IPs: ips, Enrolled: enrolled}
}

func snap(t *testing.T, ws ...snapshot.Workload) *snapshot.Snapshot {
	t.Helper()
	s, err := snapshot.New(1, nil, nil, ws)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var nodeProxy = datapath.Proxy{NetNSCookie: 1, V4: netip.MustParseAddrPort("10.233.255.1:15001")}

func newEnroller(t *testing.T, cfg Config, dp Enrolments, srv Server) *Enroller {
	t.Helper()
	e, err := New(cfg, dp, srv, slog.New(slog.NewTextHandler(t.Output(), nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		e.Close()
	})
	return e
}

// eventually polls cond until it holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !within(cond) {
		t.Fatalf("%s: not within %s", what, waitFor)
	}
}

// within reports whether cond became true within waitFor.
func within(cond func() bool) bool {
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

func states(e *Enroller) map[string]State {
	out := map[string]State{}
	for _, p := range e.Pods() {
		out[p.Pod.Name] = p.State
	}
	return out
}

func TestNodeIPMode(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	_, cookieA := podNS(t, ipA)
	_, cookieB := podNS(t, ipB)
	rec := &recorder{}
	e := newEnroller(t, Config{NodeProxy: nodeProxy, Retry: 10 * time.Millisecond}, rec, nil)

	err := e.Update(snap(t,
		workload("a", true, ipA),
		workload("b", true, netip.MustParseAddr("fd00:233::99"), ipB), // the first IP is nowhere
		workload("opted-out", false, ipC),
		workload("later", true, ipC), // no netns holds it yet
	))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := rec.get()
	if want := map[uint64]datapath.Proxy{cookieA: nodeProxy, cookieB: nodeProxy}; !maps.Equal(got, want) {
		t.Errorf("enrolments = %v, want %v", got, want)
	}
	if want := map[string]State{"a": Enrolled, "b": Enrolled, "later": Pending}; !maps.Equal(states(e), want) {
		t.Errorf("pod states = %v, want %v (not enrolled workloads are not listed)", states(e), want)
	}

	// The pending pod's netns appears after its Pod object: a retry finds it.
	_, cookieC := podNS(t, ipC)
	eventually(t, "the late netns enrolled", func() bool {
		got, _ := rec.get()
		return got[cookieC] == nodeProxy && len(got) == 3
	})
	for _, p := range e.Pods() {
		if p.Pod.Name == "later" && (p.State != Enrolled || p.NetNSCookie != cookieC || p.Proxy != nodeProxy || p.NetNS == "") {
			t.Errorf("pod later = %+v, want Enrolled in netns %d", p, cookieC)
		}
	}

	// Pods go: their enrolments go.
	if err := e.Update(snap(t, workload("a", true, ipA))); err != nil {
		t.Fatal(err)
	}
	if got, _ := rec.get(); !maps.Equal(got, map[uint64]datapath.Proxy{cookieA: nodeProxy}) {
		t.Errorf("enrolments after pods left = %v, want only %d", got, cookieA)
	}
}

// TestFailedWriteRetried: when writing the enrolments fails after a retry
// found a pod's netns, they are written at the next retry. The pod counts
// as Enrolled already; waiting for the next Snapshot or verify left it
// uncaptured meanwhile.
func TestFailedWriteRetried(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	rec := &recorder{}
	e := newEnroller(t, Config{NodeProxy: nodeProxy, Retry: 10 * time.Millisecond, Verify: time.Hour}, rec, nil)
	if err := e.Update(snap(t, workload("later", true, ipA))); err != nil {
		t.Fatal(err)
	}
	rec.failNext()
	_, cookie := podNS(t, ipA)
	eventually(t, "the enrolment written after a failed write", func() bool {
		got, _ := rec.get()
		return got[cookie] == nodeProxy
	})
}

// TestFailedWriteRetriedWithoutScan: with every pod's namespace found, a
// retry of a failed write of the enrolment map writes it again and scans
// nothing: a scan looks through every namespace on the node, for pods not
// found yet, and there are none.
func TestFailedWriteRetriedWithoutScan(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	_, cookie := podNS(t, ipA)
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		rec.failNext()
		e := runEnroller(t, Config{NodeProxy: nodeProxy, Retry: time.Second, Verify: time.Hour}, rec)
		if err := e.Update(snap(t, workload("a", true, ipA))); err == nil {
			t.Fatal("Update wrote the enrolments, want its write to fail")
		}
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		if got, writes := rec.get(); writes != 1 || got[cookie] != nodeProxy {
			t.Errorf("after the retry: %d writes, enrolments %v; want 1 write enrolling netns %d", writes, got, cookie)
		}
		if got := counter(t, e.m.scans); got != 1 {
			t.Errorf("%v scans, want 1 (at Update, which found the pod)", got)
		}
	})
}

// TestNothingWrittenBeforeUpdate: until the first Snapshot the enrolments
// pinned by the previous agent stay as they are, however often Run ticks.
func TestNothingWrittenBeforeUpdate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		runEnroller(t, Config{NodeProxy: nodeProxy}, rec)
		time.Sleep(time.Hour)
		synctest.Wait()
		if _, writes := rec.get(); writes != 0 {
			t.Errorf("%d enrolment writes before the first Update, want none", writes)
		}
	})
}

// TestRetryBacksOff: a pod whose namespace stays unfound is looked for
// with doubling waits, capped at 16 times Retry: each look scans every
// namespace on the node.
func TestRetryBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		e := runEnroller(t, Config{NodeProxy: nodeProxy, Retry: time.Second, Verify: time.Hour}, rec)
		if err := e.Update(snap(t, workload("nowhere", true, netip.MustParseAddr("10.233.255.254")))); err != nil {
			t.Fatal(err)
		}
		// Scans: at Update, then 1, 3, 7, 15, 31 s later, then every 16 s.
		for _, c := range []struct {
			at    time.Duration
			scans float64
		}{{500 * time.Millisecond, 1}, {2 * time.Second, 2}, {6 * time.Second, 3}, {30 * time.Second, 5}, {63500 * time.Millisecond, 8}} {
			time.Sleep(c.at - time.Since(bubbleStart))
			synctest.Wait()
			if got := counter(t, e.m.scans); got != c.scans {
				t.Errorf("%d scans %s after Update, want %v", int(got), c.at, c.scans)
			}
		}
		// A new Snapshot starts over: a scan now, the next on the first
		// tick a second or more later.
		if err := e.Update(snap(t, workload("nowhere", true, netip.MustParseAddr("10.233.255.254")))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		if got := counter(t, e.m.scans); got != 10 {
			t.Errorf("%d scans 1.5 s after a new Update, want 10", int(got))
		}
	})
}

func TestAmbiguousAddress(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	podNS(t, ipA)
	podNS(t, ipA)
	rec := &recorder{}
	e := newEnroller(t, Config{NodeProxy: nodeProxy}, rec, nil)
	if err := e.Update(snap(t, workload("a", true, ipA))); err != nil {
		t.Fatal(err)
	}
	pods := e.Pods()
	if len(pods) != 1 || pods[0].State != Failed || !strings.Contains(pods[0].Reason, "held by 2 network namespaces") {
		t.Errorf("pods = %+v, want a Failed pod whose reason names the two namespaces", pods)
	}
	if got, _ := rec.get(); len(got) != 0 {
		t.Errorf("enrolments = %v, want none for an ambiguous address", got)
	}
}

func TestReplacedNetns(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	old, _ := podNS(t, ipA)
	rec := &recorder{}
	e := newEnroller(t, Config{NodeProxy: nodeProxy, Retry: 10 * time.Millisecond, Verify: 20 * time.Millisecond}, rec, nil)
	if err := e.Update(snap(t, workload("a", true, ipA))); err != nil {
		t.Fatal(err)
	}
	// The pod's sandbox is replaced: the old netns loses the address (CNI
	// deleted its interface), a new one holds it.
	if err := old.Do(func() error { return delAddr("lo", ipA) }); err != nil {
		t.Fatal(err)
	}
	_, cookieNew := podNS(t, ipA)
	eventually(t, "the pod enrolled in its new netns", func() bool {
		got, _ := rec.get()
		return len(got) == 1 && got[cookieNew] == nodeProxy
	})
}

func TestInPodMode(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	pod, cookie := podNS(t, ipA)
	rec := &recorder{}
	srv := &server{pods: map[string]snapshot.ObjectRef{}}
	e := newEnroller(t, Config{Mode: InPod, PodPort: 15001}, rec, srv)
	if err := e.Update(snap(t, workload("a", true, ipA))); err != nil {
		t.Fatal(err)
	}
	want := datapath.Proxy{NetNSCookie: cookie,
		V4: netip.MustParseAddrPort("127.0.0.1:15001"), V6: netip.MustParseAddrPort("[::1]:15001")}
	if got, _ := rec.get(); !maps.Equal(got, map[uint64]datapath.Proxy{cookie: want}) {
		t.Errorf("enrolments = %v, want the pod's own listeners %+v", got, want)
	}
	for _, addr := range []string{"127.0.0.1:15001", "[::1]:15001"} {
		c, err := pod.Dial(nil, "tcp", addr)
		if err != nil {
			t.Errorf("dial the in-pod listener %s from the pod: %v", addr, err)
			continue
		}
		c.Close()
		eventually(t, "ServePod called for "+addr, func() bool {
			srv.mu.Lock()
			defer srv.mu.Unlock()
			return srv.pods[addr] == snapshot.ObjectRef{Namespace: "app", Name: "a"}
		})
	}

	// The pod goes: its listeners close.
	if err := e.Update(snap(t)); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"127.0.0.1:15001", "[::1]:15001"} {
		if c, err := pod.Dial(nil, "tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
			if c != nil {
				c.Close()
			}
			t.Errorf("dial %s after the pod went: %v, want connection refused", addr, err)
		}
	}
	if got, _ := rec.get(); len(got) != 0 {
		t.Errorf("enrolments after the pod went = %v, want none", got)
	}
}

// TestInPodListenerFails: a listener that stops serving on its own is
// closed and opened again.
func TestInPodListenerFails(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	pod, cookie := podNS(t, ipA)
	rec := &recorder{}
	srv := &server{pods: map[string]snapshot.ObjectRef{}, failFirst: true}
	e := newEnroller(t, Config{Mode: InPod, Retry: 10 * time.Millisecond}, rec, srv)
	if err := e.Update(snap(t, workload("a", true, ipA))); err != nil {
		t.Fatal(err)
	}
	// Both listeners of the namespace are reopened: 2 at first, 2 again.
	eventually(t, "the listeners opened again", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.calls == 4
	})
	eventually(t, "the pod enrolled again", func() bool {
		got, _ := rec.get()
		return len(got) == 1 && got[cookie].V4.IsValid() && states(e)["a"] == Enrolled
	})
	c, err := pod.Dial(nil, "tcp", "127.0.0.1:15001")
	if err != nil {
		t.Fatalf("dial the reopened listener: %v", err)
	}
	c.Close()
}

// TestInPodHostNetwork: the listeners in the network namespace of enrolled
// host-network pods, the node's, which every host process shares, serve
// every connection, either family, as one client of no namespace, the
// node: they named the pod, whose namespace's consumer routes then applied
// to every host process; then they named none, and the proxy counted
// 127.0.0.1 and ::1 as two clients against --max-conns-per-pod.
func TestInPodHostNetwork(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	node, _ := podNS(t, ipA)
	srv := &server{pods: map[string]snapshot.ObjectRef{}}
	e := newEnroller(t, Config{Mode: InPod}, &recorder{}, srv)
	w := workload("host-agent", true, ipA)
	w.HostNetwork = true
	other := workload("host-exporter", true, ipA) // another namespace's
	other.Pod.Namespace, other.HostNetwork = "monitoring", true
	if err := e.Update(snap(t, w, other)); err != nil {
		t.Fatal(err)
	}
	if got := states(e); got["host-agent"] != Enrolled || got["host-exporter"] != Enrolled {
		t.Fatalf("host-network pods %v, want Enrolled", got)
	}
	want := hostNetworkClient()
	if want.Namespace != "" {
		t.Fatalf("the host-network client %v has namespace %q: its consumer routes would apply to every host process", want, want.Namespace)
	}
	for _, addr := range []string{"127.0.0.1:15001", "[::1]:15001"} {
		if got := srv.servedAs(t, node, addr); got != want.String() {
			t.Errorf("a connection in the node's namespace to %s was served as %q, want %q", addr, got, want)
		}
	}
}

// TestInPodHostNetworkOneClient: through the real proxy, with
// --max-conns-per-pod 1, a host process holding one connection has the
// next refused whichever family it uses: the node is one client, as on
// node listeners. By address, 127.0.0.1 and ::1 were two, and it had two
// connections.
func TestInPodHostNetworkOneClient(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	node, _ := podNS(t, ipA)
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tcpserve.Serve(t, echo, func(c net.Conn) { io.Copy(c, c) })
	backend := echo.Addr().(*net.TCPAddr).AddrPort()
	svc := netip.MustParseAddrPort("10.96.0.10:80")
	px, err := proxy.New(proxy.Config{
		MaxConnsPerClient: 1,
		// What the datapath would record for a connection to svc that
		// connect4 or connect6 redirected.
		OrigDst: func(syscall.Conn) (netip.AddrPort, error) { return svc, nil },
	}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := px.Shutdown(context.Background()); err != nil {
			t.Errorf("proxy shutdown: %v", err)
		}
	})
	w := workload("host-agent", true, ipA)
	w.HostNetwork = true
	ref := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "app", Name: "db", Port: 80}
	s, err := snapshot.New(1, []snapshot.Frontend{{Service: snapshot.ObjectRef{Namespace: "app", Name: "db"}, Port: 80,
		Addresses: []netip.Addr{svc.Addr()}, FailurePolicy: snapshot.FailClosed, Backend: ref}},
		[]snapshot.Backend{{Ref: ref, Protocol: snapshot.ProtocolTCP,
			Endpoints: []snapshot.Endpoint{{Addr: backend, Ready: true, Serving: true}}}},
		[]snapshot.Workload{w})
	if err != nil {
		t.Fatal(err)
	}
	px.Update(s)
	e := newEnroller(t, Config{Mode: InPod}, &recorder{}, px)
	if err := e.Update(s); err != nil {
		t.Fatal(err)
	}
	if got := states(e)["host-agent"]; got != Enrolled {
		t.Fatalf("host-network pod %s, want Enrolled", got)
	}
	// A leading NUL is no TLS, HTTP/2 or HTTP/1 start: relayed as opaque TCP.
	ping := func(addr string) (net.Conn, error) {
		c, err := node.Dial(nil, "tcp", addr)
		if err != nil {
			return nil, err
		}
		msg := []byte("\x00ping")
		got := make([]byte, len(msg))
		if _, err = c.Write(msg); err == nil {
			_, err = io.ReadFull(c, got)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	held, err := ping("127.0.0.1:15001")
	if err != nil {
		t.Fatalf("the host process's first connection: %v", err)
	}
	defer held.Close()
	if c, err := ping("[::1]:15001"); err == nil {
		c.Close()
		t.Error("the host process's second connection, over IPv6, was served: want it refused, past the one allowed")
	}
}

// TestInPodListenerFollowsPod: a deleted pod still in the Snapshot (a)
// follows its address into the namespace of the pod that now holds it
// (b); when the Snapshot catches up, that namespace's listener serves b,
// not a, whose namespace's routes it applied to b's requests.
func TestInPodListenerFollowsPod(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	old, _ := podNS(t, ipA)
	srv := &server{pods: map[string]snapshot.ObjectRef{}}
	rec := &recorder{}
	e := newEnroller(t, Config{Mode: InPod, Retry: 10 * time.Millisecond, Verify: 20 * time.Millisecond}, rec, srv)
	a := workload("a", true, ipA)
	a.Pod.Namespace = "team-a"
	if err := e.Update(snap(t, a)); err != nil {
		t.Fatal(err)
	}
	// a is deleted: its sandbox loses the address, which b's new one gets
	// before the Snapshot drops a.
	if err := old.Do(func() error { return delAddr("lo", ipA) }); err != nil {
		t.Fatal(err)
	}
	podB, cookieB := podNS(t, ipA)
	eventually(t, "a enrolled in the namespace holding its address", func() bool {
		got, _ := rec.get()
		return len(got) == 1 && got[cookieB].NetNSCookie == cookieB
	})
	if err := e.Update(snap(t, workload("b", true, ipA))); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"127.0.0.1:15001", "[::1]:15001"} {
		if got := srv.servedAs(t, podB, addr); got != "app/b" {
			t.Errorf("a connection from b's namespace to %s was served as %q, want app/b", addr, got)
		}
	}
	if got, _ := rec.get(); len(got) != 1 || got[cookieB].NetNSCookie != cookieB {
		t.Errorf("enrolments = %v, want b's namespace alone", got)
	}
}

func TestInPodPortTaken(t *testing.T) {
	sandbox.ClaimAddrs(t, plan)
	pod, _ := podNS(t, ipA)
	taken, err := pod.Listen(context.Background(), nil, "tcp", "127.0.0.1:15001")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	rec := &recorder{}
	e := newEnroller(t, Config{Mode: InPod}, rec, &server{pods: map[string]snapshot.ObjectRef{}})
	if err := e.Update(snap(t, workload("a", true, ipA))); err != nil {
		t.Fatal(err)
	}
	pods := e.Pods()
	if len(pods) != 1 || pods[0].State != Failed || !strings.Contains(pods[0].Reason, "address already in use") {
		t.Errorf("pods = %+v, want Failed: the pod's app holds the port", pods)
	}
	if got, _ := rec.get(); len(got) != 0 {
		t.Errorf("enrolments = %v, want none without a listener", got)
	}
}

// TestInPodChurn: 200 pods enrolled at once take one scan of the node's
// namespaces, and once they go, every namespace, listener and serving
// goroutine they held is released: a node's pod churn leaks nothing.
func TestInPodChurn(t *testing.T) {
	const pods = 200
	sandbox.ClaimAddrs(t, plan)
	var ws []snapshot.Workload
	cookies := map[uint64]bool{}
	for i := range pods {
		ip := netip.AddrFrom4([4]byte{10, 233, byte(1 + i/250), byte(1 + i%250)})
		_, cookie := podNS(t, ip)
		cookies[cookie] = true
		ws = append(ws, workload(fmt.Sprintf("churn-%d", i), true, ip))
	}
	fds, goroutines := leakcheck.Census(t), runtime.NumGoroutine()
	rec := &recorder{}
	srv := &server{pods: map[string]snapshot.ObjectRef{}}
	e := newEnroller(t, Config{Mode: InPod, Verify: time.Hour}, rec, srv)
	if err := e.Update(snap(t, ws...)); err != nil {
		t.Fatal(err)
	}
	got, _ := rec.get()
	if len(got) != pods || !maps.EqualFunc(got, cookies, func(p datapath.Proxy, _ bool) bool { return p.V4.IsValid() }) {
		t.Errorf("%d enrolments, want one with a listener for each of the %d pods' namespaces", len(got), pods)
	}
	if n := counter(t, e.m.scans); n != 1 {
		t.Errorf("%v scans for pods whose namespaces all exist, want 1", n)
	}

	if err := e.Update(snap(t)); err != nil {
		t.Fatal(err)
	}
	if got, _ := rec.get(); len(got) != 0 {
		t.Errorf("%d enrolments after every pod went, want none", len(got))
	}
	// Descriptors by what they refer to, not their number: the race
	// runtime and other goroutines open and close their own meanwhile.
	var extra []string
	if !within(func() bool { extra = leakcheck.Census(t).Beyond(fds); return len(extra) == 0 }) {
		t.Errorf("descriptors opened while the pods were there are still open after they went: %v", extra)
	}
	// Run's goroutine is the one more.
	eventually(t, "the in-pod listeners' goroutines ended", func() bool { return runtime.NumGoroutine() <= goroutines+1 })
}

func TestConfigErrors(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		name string
		cfg  Config
		srv  Server
	}{
		{"node-ip without proxy", Config{Mode: NodeIP}, nil},
		{"in-pod without server", Config{Mode: InPod}, nil},
		{"unknown mode", Config{Mode: "sidecar", NodeProxy: nodeProxy}, nil},
	} {
		if _, err := New(c.cfg, &recorder{}, c.srv, log, nil); err == nil {
			t.Errorf("%s: New succeeded", c.name)
		}
	}
}

// delAddr removes ip/32 from dev in the calling thread's netns.
func delAddr(dev string, ip netip.Addr) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return err
	}
	return netlink.AddrDel(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}})
}

// bubbleStart is when every synctest bubble's clock starts.
var bubbleStart = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// runEnroller runs an Enroller with cfg writing to rec until t ends.
func runEnroller(t *testing.T, cfg Config, rec *recorder) *Enroller {
	t.Helper()
	e, err := New(cfg, rec, nil, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	go e.Run(ctx)
	return e
}
