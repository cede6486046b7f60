package httpapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/explain"
	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/test/pki"
)

// testSources is an agent with one captured Service (app/secure, whose
// XBackend presents a client certificate) and one enrolled pod (app/client,
// netns cookie 1).
func testSources(t *testing.T) *introspect.Sources {
	t.Helper()
	be := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "app", Name: "secure", Port: 80}
	snap, err := snapshot.New(3, []snapshot.Frontend{{
		Service: snapshot.ObjectRef{Namespace: "app", Name: "secure"}, Port: 80, FailurePolicy: snapshot.FailClosed,
		Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.11")}, Backend: be,
	}}, []snapshot.Backend{{Ref: be, TLS: &snapshot.TLS{Mode: snapshot.TLSMutual, ServerName: "secure",
		ClientCertificatePEM: "cert", ClientKeyPEM: "-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n"}}},
		[]snapshot.Workload{{Pod: snapshot.ObjectRef{Namespace: "app", Name: "client"}, Enrolled: true}})
	if err != nil {
		t.Fatal(err)
	}
	cat := introspect.NewCatalog()
	active := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sockmesh_proxy_active_connections", Help: "h"}, []string{"path"})
	active.WithLabelValues("l4_tls").Set(2)
	active.WithLabelValues("http1").Set(1)
	ejected := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sockmesh_proxy_upstream_endpoints_ejected", Help: "h"})
	ejected.Set(1)
	cat.MustRegister(active, ejected)
	return &introspect.Sources{
		Node: "n1", Mode: "node-ip", Version: "v1", Metrics: cat,
		Applied: func() (*snapshot.Snapshot, time.Time) { return snap, time.Unix(100, 0) },
		Pods: func() []enrol.Pod {
			return []enrol.Pod{
				{Pod: snapshot.ObjectRef{Namespace: "app", Name: "client"}, State: enrol.Enrolled, NetNSCookie: 1},
				{Pod: snapshot.ObjectRef{Namespace: "app", Name: "late"}, State: enrol.Pending, Reason: "not found"},
			}
		},
		Ready:    func() error { return nil },
		Datapath: fakeDatapath{},
		Events:   introspect.NewEvents(0),
	}
}

// fakeDatapath is a datapath of fixed contents; the kernel's side is
// tested in datapath and, end to end, in cmd/sockmeshctl.
type fakeDatapath struct{}

func (fakeDatapath) Services() ([]datapath.Service, error) {
	return []datapath.Service{{Addr: netip.MustParseAddrPort("10.96.0.10:443")}}, nil
}
func (fakeDatapath) Enrolments() (map[uint64]datapath.Proxy, error) {
	return map[uint64]datapath.Proxy{7: {NetNSCookie: 1, V4: netip.MustParseAddrPort("10.0.0.1:15001")}}, nil
}
func (fakeDatapath) Counters() (map[datapath.Decision]uint64, error) {
	return map[datapath.Decision]uint64{datapath.Redirected: 3}, nil
}
func (fakeDatapath) Conflicts() ([]datapath.Attached, error) { return nil, nil }
func (fakeDatapath) State() (datapath.State, error) {
	return datapath.State{PinDir: "/sys/fs/bpf/sockmesh", Hooks: []datapath.Hook{{Name: "connect4", ProgramID: 12, Attached: true}}}, nil
}
func (fakeDatapath) PairCounter(netns uint64, addr netip.AddrPort) (map[datapath.Decision]uint64, error) {
	return map[datapath.Decision]uint64{datapath.Redirected: netns}, nil
}
func (fakeDatapath) PairCounters() ([]datapath.PairCounters, error) {
	return []datapath.PairCounters{
		{NetNSCookie: 9, Service: netip.MustParseAddrPort("10.96.0.99:80"), Counts: map[datapath.Decision]uint64{datapath.DeniedNoProxy: 1}},
		{NetNSCookie: 1, Service: netip.MustParseAddrPort("10.96.0.11:80"), Counts: map[datapath.Decision]uint64{datapath.Redirected: 4}},
	}, nil
}

// startServer serves src on a socket in a temporary directory.
func startServer(t *testing.T, cfg Config, src *introspect.Sources, reg prometheus.Registerer) *Server {
	t.Helper()
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(t.TempDir(), "run", "agent.sock")
	}
	s, err := NewServer(cfg, src, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	return s
}

// serve serves s until the test ends.
func serve(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

func unixClient(socket string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}
}

// get fetches path and decodes its JSON into v; it returns the status code.
func get(t *testing.T, c *http.Client, base, path string, v any) int {
	t.Helper()
	resp, err := c.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("GET %s: decode %q: %v", path, body, err)
		}
	}
	return resp.StatusCode
}

func TestServer(t *testing.T) {
	src := testSources(t)
	s := startServer(t, Config{}, src, src.Metrics)
	socket, tcp := s.Addrs()
	if tcp != nil {
		t.Errorf("TCP listener %v without Listen", tcp)
	}
	if fi, err := os.Stat(socket); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %s: %v, %v; want a socket, mode 0600", socket, fi.Mode(), err)
	}
	c, base := unixClient(socket), "http://agent"

	var st introspect.Status
	if code := get(t, c, base, PathStatus, &st); code != http.StatusOK {
		t.Fatalf("status: %d", code)
	}
	if st.Node != "n1" || !st.Ready || st.Snapshot.Version != 3 || st.Snapshot.Frontends != 1 || st.Pods.Enrolled != 1 ||
		st.Pods.Pending != 1 || len(st.Pods.Unsettled) != 1 || st.Proxy.ActiveConnections["l4_tls"] != 2 || st.Proxy.EjectedEndpoints != 1 ||
		len(st.Datapath.State.Hooks) != 1 || st.Datapath.Counters[datapath.Redirected] != 3 {
		t.Errorf("status = %+v", st)
	}

	var snap SnapshotResponse
	get(t, c, base, PathSnapshot, &snap)
	if snap.Snapshot == nil || snap.Snapshot.Backends[0].TLS.ClientKeyPEM != "<redacted>" || !snap.AppliedAt.Equal(time.Unix(100, 0)) {
		t.Errorf("snapshot = %+v, want the key redacted", snap)
	}

	var counters introspect.Counters
	get(t, c, base, PathCounters, &counters)
	if len(counters.Pairs) != 2 || counters.Pairs[0].Pod == nil || counters.Pairs[0].Pod.Name != "client" ||
		counters.Pairs[0].Service == nil || counters.Pairs[0].Service.Name != "secure" || counters.Pairs[1].Pod != nil ||
		counters.Pairs[0].Counts[datapath.Redirected] != 4 {
		t.Errorf("counters = %+v, want the known pair named first, the unknown one last", counters)
	}

	q := explain.Query{Pod: snapshot.ObjectRef{Namespace: "app", Name: "client"}, Port: 80,
		Service: &snapshot.ObjectRef{Namespace: "app", Name: "secure"}}
	var e explain.Explanation
	if code := get(t, c, base, PathExplain+"?"+url.Values(Values(q)).Encode(), &e); code != http.StatusOK {
		t.Fatalf("explain: %d", code)
	}
	if e.Verdict != explain.Redirected || e.Counters.Decisions[datapath.Redirected] != 1 || e.Backend.TLS.Mode != snapshot.TLSMutual {
		t.Errorf("explain = %+v", e)
	}
	var bad ErrorResponse
	if code := get(t, c, base, PathExplain+"?pod=client&port=80", &bad); code != http.StatusBadRequest || !strings.Contains(bad.Error, "namespace/name") {
		t.Errorf("explain without a namespace: %d %q, want 400 naming the form", code, bad.Error)
	}

	resp, err := c.Post(base+PathStatus, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST %s = %d, want 405: the API is read-only", PathStatus, resp.StatusCode)
	}

	resp, err = c.Get(base + PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(text), `sockmesh_proxy_active_connections{path="l4_tls"} 2`) ||
		!strings.Contains(string(text), `sockmesh_introspect_requests_total{code="200",endpoint="/v1/status"} 1`) {
		t.Errorf("metrics:\n%s", text)
	}
	var infos []introspect.MetricInfo
	get(t, c, base, PathCatalog, &infos)
	i := slices.IndexFunc(infos, func(m introspect.MetricInfo) bool { return m.Name == "sockmesh_introspect_requests_total" })
	if i < 0 || infos[i].Type != "counter" || !slices.Equal(infos[i].Labels, []string{"endpoint", "code"}) {
		t.Errorf("catalog = %+v", infos)
	}

	// Closing removes the socket.
	s.Close()
	if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Close: %v, want it removed", err)
	}
}

// TestSocketReplaced checks that a second agent takes the socket over and
// that the first, closing later, leaves the second's socket alone.
func TestSocketReplaced(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	src := testSources(t)
	first := startServer(t, Config{Socket: sock}, src, nil)
	src2 := testSources(t)
	src2.Node = "n2"
	startServer(t, Config{Socket: sock}, src2, nil)
	first.Close()
	var st introspect.Status
	if get(t, unixClient(sock), "http://agent", PathStatus, &st); st.Node != "n2" {
		t.Errorf("status from %s after the first agent closed: node %q, want n2", sock, st.Node)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(sock), "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer(Config{Socket: filepath.Join(filepath.Dir(sock), "file")}, src, nil, nil); err == nil {
		t.Error("NewServer over a regular file: no error")
	}
}

func TestAllowPeer(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	tests := []struct {
		name string
		peer *peer
		gid  int
		want int
	}{
		{"root", &peer{uid: 0, gid: 0}, -1, 200},
		{"agent's own user", &peer{uid: 4242, gid: 4242}, -1, 200},
		{"another user", &peer{uid: 1000, gid: 1000}, -1, 403},
		{"member of the group", &peer{uid: 1000, gid: 2000}, 2000, 200},
		{"not a member", &peer{uid: 1000, gid: 1000}, 2000, 403},
		{"no credentials", nil, 2000, 403},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest("GET", "/v1/status", nil)
			if tc.peer != nil {
				r = r.WithContext(context.WithValue(r.Context(), peerKey{}, *tc.peer))
			}
			w := &recorder{header: http.Header{}, code: 200}
			allowPeer(ok, tc.gid, 4242).ServeHTTP(w, r)
			if w.code != tc.want {
				t.Errorf("peer %+v, group %d: %d, want %d (%s)", tc.peer, tc.gid, w.code, tc.want, w.body.String())
			}
		})
	}
}

type recorder struct {
	header http.Header
	code   int
	body   strings.Builder
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(code int)        { r.code = code }

// TestRemote checks the TCP listener: TLS, and a bearer token read from its
// file at each request.
func TestRemote(t *testing.T) {
	ca, err := pki.NewCA("introspection test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "agent", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile, err := leaf.WriteFiles(dir, "agent")
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src := testSources(t)
	if _, err := NewServer(Config{Socket: filepath.Join(dir, "a.sock"), Listen: "127.0.0.1:0"}, src, nil, nil); err == nil {
		t.Error("a TCP listener without TLS and token: no error")
	}
	s := startServer(t, Config{Listen: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile, TokenFile: tokenFile}, src, nil)
	_, addr := s.Addrs()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	status := func(token string) int {
		req, _ := http.NewRequest("GET", "https://"+addr.String()+PathStatus, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		token string
		want  int
	}{{"", 401}, {"wrong", 401}, {"first", 200}} {
		if got := status(tc.token); got != tc.want {
			t.Errorf("token %q: %d, want %d", tc.token, got, tc.want)
		}
	}
	if err := os.WriteFile(tokenFile, []byte("second"), 0o600); err != nil {
		t.Fatal(err)
	}
	if a, b := status("first"), status("second"); a != 401 || b != 200 {
		t.Errorf("after rotation: old token %d, new token %d; want 401, 200", a, b)
	}
	// Cleartext is not served.
	if resp, err := http.Get("http://" + addr.String() + PathStatus); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("cleartext request answered 200")
		}
	}
}
