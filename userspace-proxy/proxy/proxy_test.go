package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/metricsum"
	"github.com/sockmesh/sockmesh/internal/syncbuf"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

var vip = netip.MustParseAddrPort("10.96.0.10:80")

func tlsPolicy(e *env) *snapshot.TLS {
	return &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: sniName, RootsPEM: string(e.pki.ca.CertPEM),
		Policy: snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: "b", Name: "echo-tls"}}
}

// serveLoopback runs e's proxy on a loopback listener, whose connections
// have no original destination. end checks that one was rejected as not
// redirected, shuts the proxy down and checks that Serve returned nil.
func serveLoopback(t *testing.T, e *env) (l net.Listener, served chan error, end func()) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served = make(chan error, 1)
	go func() { served <- e.p.Serve(l) }()
	return l, served, func() {
		t.Helper()
		if got := e.counter("sockmesh_proxy_rejected_connections_total", map[string]string{"reason": "not_redirected"}); got != 1 {
			t.Errorf("rejected{not_redirected} = %v, want 1", got)
		}
		if err := e.p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve after Shutdown = %v, want nil", err)
		}
	}
}

// TestAcceptLoopRefusesUnredirected: a plain listener's connections have no
// original destination, so Serve closes them at once and counts them.
func TestAcceptLoopRefusesUnredirected(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	l, _, end := serveLoopback(t, e)
	// The reset may even beat connect's return on loopback; either way the
	// client must get no byte.
	if c, err := net.Dial("tcp", l.Addr().String()); err == nil {
		c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		n, err := c.Read(make([]byte, 1))
		c.Close()
		if n != 0 || err == nil {
			t.Fatalf("read on unredirected connection = %d, %v; want closed", n, err)
		}
	}
	end()
}

// TestAcceptAsksOrigDst: a connection getsockopt has no original
// destination for (here: a plain listener's) is served with the one
// Config.OrigDst gives, the datapath's record in the agent, which answers
// where no getsockopt program runs for the socket's cgroup
// (datapath.TestHandedOverFromAnotherCgroup).
func TestAcceptAsksOrigDst(t *testing.T) {
	checkNoLeaks(t)
	tcpVIP := netip.MustParseAddrPort("10.96.7.2:5432")
	e := newEnv(t, envOptions{origDst: func(syscall.Conn) (netip.AddrPort, error) { return tcpVIP, nil }})
	e.p.Update(buildSnapshot(t, 1, service{name: "db", vip: tcpVIP,
		backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(startTCPEcho(t, nil))}}))
	l, served, _ := serveLoopback(t, e)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "\x00hello")
	buf := make([]byte, len("\x00hello"))
	n, err := io.ReadFull(c, buf)
	c.Close()
	if err != nil || string(buf) != "\x00hello" {
		t.Errorf("echo through the proxy = %q, %v; want %q", buf[:n], err, "\x00hello")
	}
	if err := e.p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve after Shutdown = %v, want nil", err)
	}
}

// TestShutdownWaitsForOrigDst: Shutdown returns only once a connection
// whose original destination Config.OrigDst is still looking up is done
// with it: the agent closes the datapath's maps, which the lookup reads,
// once Shutdown returns. The accept loop registered the connection with
// Shutdown only after the lookup, and the agent's -race run caught a
// lookup reading a map being closed (TestAgentInPod).
func TestShutdownWaitsForOrigDst(t *testing.T) {
	checkNoLeaks(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var looked atomic.Bool
	e := newEnv(t, envOptions{origDst: func(syscall.Conn) (netip.AddrPort, error) {
		close(entered)
		<-release
		looked.Store(true)
		return netip.AddrPort{}, errors.New("no record")
	}})
	l, served, _ := serveLoopback(t, e)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-entered
	done := make(chan error, 1)
	go func() { done <- e.p.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		close(release)
		t.Fatalf("Shutdown returned (%v) while a connection's OrigDst lookup was under way", err)
	case <-time.After(200 * time.Millisecond): // what Shutdown had to wait for
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !looked.Load() {
		t.Error("Shutdown returned before the lookup ended")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve after Shutdown = %v, want nil", err)
	}
}

// TestAcceptWaitsOutShortage: when the process runs out of descriptors,
// Accept fails (EMFILE). Serve used to return then, which stops the node's
// proxy (the agent exits); it now waits, counts, and accepts the waiting
// connection once descriptors are free.
func TestAcceptWaitsOutShortage(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	l, served, end := serveLoopback(t, e)

	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = min(lim.Cur, 1024) // few descriptors to use up
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var fill []*os.File
	release := func() {
		for _, f := range fill {
			f.Close()
		}
		fill = nil
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	defer release()
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				t.Fatal(err)
			}
			break
		}
		fill = append(fill, f)
	}
	fill[len(fill)-1].Close()
	fill = fill[:len(fill)-1]
	c, err := net.Dial("tcp", l.Addr().String()) // takes the last descriptor
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for deadline := time.Now().Add(5 * time.Second); e.counter("sockmesh_proxy_accept_errors_total", nil) < 2; time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-served:
			release()
			t.Fatalf("Serve returned while descriptors were short: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no failed accept counted while the process had no descriptor left")
		}
	}
	release()

	// Accepted now, and, not redirected, closed.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after the shortage = %d, %v; want the connection closed by the proxy", n, err)
	}
	end()
}

// TestConnectionFailureLogThrottled: on the L4 path too, a failure of one
// kind is logged at Warn once per period (10 s by default), the others at
// Debug.
func TestConnectionFailureLogThrottled(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	v := netip.MustParseAddrPort("10.96.5.9:5432")
	e.p.Update(buildSnapshot(t, 1, service{name: "db", vip: v, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP}}))
	for range 3 {
		c, err := e.dial(v)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("\x00binary protocol hello"))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("tcp to a backend without endpoints: read err = %v, want connection reset", err)
		}
		c.Close()
	}
	levels := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
		var line struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if line.Msg == "connection failed" {
			levels[line.Level]++
		}
	}
	if levels["WARN"] != 1 || levels["DEBUG"] != 2 {
		t.Errorf(`"connection failed" lines by level: %v; want WARN 1, DEBUG 2`, levels)
	}
}

// TestNotCapturedRefused: a redirected connection whose destination the
// snapshot does not capture is closed, never relayed to that address.
func TestNotCapturedRefused(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	c, err := e.dial(netip.MustParseAddrPort("10.96.0.99:80"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("read = %d, %v; want closed", n, err)
	}
	if got := e.counter("sockmesh_proxy_rejected_connections_total", map[string]string{"reason": "not_captured"}); got != 1 {
		t.Errorf("rejected{not_captured} = %v, want 1", got)
	}
}

// TestUpstreamTLSValidation covers both outcomes of every validation mode on
// both speeds. A verification failure is a 502 on both: when the L4 path
// cannot complete the handshake before relaying, it hands the HTTP client to
// the L7 path so the app reads an error instead of a reset.
func TestUpstreamTLSValidation(t *testing.T) {
	checkNoLeaks(t)
	type tc struct {
		name   string
		server func(*pkiSet) *tls.Config
		tls    func(*pkiSet, *snapshot.TLS)
		ok     bool
	}
	requireClient := func(s *pkiSet) *tls.Config {
		c := serverTLS(s.server)
		c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, s.ca.Pool()
		return c
	}
	cases := []tc{
		{"roots ok", func(s *pkiSet) *tls.Config { return serverTLS(s.server) }, func(*pkiSet, *snapshot.TLS) {}, true},
		{"roots untrusted server", func(s *pkiSet) *tls.Config { return serverTLS(s.otherSrv) }, func(*pkiSet, *snapshot.TLS) {}, false},
		{"roots wrong hostname", func(s *pkiSet) *tls.Config { return serverTLS(s.server) }, func(_ *pkiSet, p *snapshot.TLS) { p.ServerName = "other.test" }, false},
		{"system roots ok", func(s *pkiSet) *tls.Config { return serverTLS(s.server) }, func(_ *pkiSet, p *snapshot.TLS) { p.RootsPEM, p.SystemRoots = "", true }, true},
		{"system roots untrusted", func(s *pkiSet) *tls.Config { return serverTLS(s.otherSrv) }, func(_ *pkiSet, p *snapshot.TLS) { p.RootsPEM, p.SystemRoots = "", true }, false},
		{"san hostname ok", func(s *pkiSet) *tls.Config { return serverTLS(s.server) }, func(_ *pkiSet, p *snapshot.TLS) {
			p.ServerName = "sni-differs.test"
			p.SubjectAltNames = []snapshot.SubjectAltName{{Type: snapshot.SANHostname, Value: sniName}}
		}, true},
		{"san hostname mismatch", func(s *pkiSet) *tls.Config { return serverTLS(s.server) }, func(_ *pkiSet, p *snapshot.TLS) {
			p.SubjectAltNames = []snapshot.SubjectAltName{{Type: snapshot.SANHostname, Value: "nope.test"}}
		}, false},
		{"san uri ok", func(s *pkiSet) *tls.Config { return serverTLS(s.server) }, func(_ *pkiSet, p *snapshot.TLS) {
			p.SubjectAltNames = []snapshot.SubjectAltName{{Type: snapshot.SANURI, Value: spiffeID}}
		}, true},
		{"san uri mismatch", func(s *pkiSet) *tls.Config { return serverTLS(s.server) }, func(_ *pkiSet, p *snapshot.TLS) {
			p.SubjectAltNames = []snapshot.SubjectAltName{{Type: snapshot.SANURI, Value: "spiffe://cluster.local/ns/b/sa/other"}}
		}, false},
		{"san uri untrusted chain", func(s *pkiSet) *tls.Config { return serverTLS(s.otherSrv) }, func(_ *pkiSet, p *snapshot.TLS) {
			p.SubjectAltNames = []snapshot.SubjectAltName{{Type: snapshot.SANHostname, Value: sniName}}
		}, false},
		{"client cert presented", requireClient, func(s *pkiSet, p *snapshot.TLS) {
			p.Mode, p.ClientCertificatePEM, p.ClientKeyPEM = snapshot.TLSMutual, string(s.client.CertPEM), string(s.client.KeyPEM)
		}, true},
		{"client cert required but not configured", requireClient, func(*pkiSet, *snapshot.TLS) {}, false},
		{"client cert untrusted", requireClient, func(s *pkiSet, p *snapshot.TLS) {
			p.Mode, p.ClientCertificatePEM, p.ClientKeyPEM = snapshot.TLSMutual, string(s.otherClient.CertPEM), string(s.otherClient.KeyPEM)
		}, false},
	}
	for _, path := range []proxy.HTTP1TLSPath{proxy.HTTP1TLSL7, proxy.HTTP1TLSL4, proxy.HTTP1TLSPooled} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("path=%d/%s", path, c.name), func(t *testing.T) {
				e := newEnv(t, envOptions{http1TLS: path, systemRoots: true})
				be := startEcho(t, "echo-0", c.server(e.pki))
				pol := tlsPolicy(e)
				c.tls(e.pki, pol)
				e.p.Update(buildSnapshot(t, 1, service{name: "echo", vip: vip, backend: snapshot.Backend{TLS: pol, Endpoints: endpoints(be.addr)}}))
				cl := e.client(vip, false)
				resp, err := cl.Get("http://echo.b.svc/hello")
				if err != nil && path == proxy.HTTP1TLSL4 && strings.HasPrefix(c.name, "client cert") {
					// TLS 1.3: the backend judges the client's certificate
					// after the proxy's handshake ended, so L4 was already
					// relaying: the app gets a reset, the only signal L4
					// has, and the refusal counts and logs as a failed
					// handshake.
					failures := map[string]string{"path": "l4_tls", "reason": "tls_handshake"}
					if n := e.counterReaches("sockmesh_proxy_connection_failures_total", failures, 1); n != 1 {
						t.Errorf("connection_failures_total%v = %v, want 1", failures, n)
					}
					if logs := e.logs.String(); !strings.Contains(logs, `"reason":"tls_handshake"`) || !strings.Contains(logs, "remote error: tls: ") {
						t.Errorf("no tls_handshake failure naming the backend's alert in the log:\n%s", logs)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				want := http.StatusOK
				if !c.ok {
					want = http.StatusBadGateway
				}
				if resp.StatusCode != want {
					t.Fatalf("status = %d (%s), want %d", resp.StatusCode, body, want)
				}
				if !c.ok {
					if !strings.Contains(e.logs.String(), "tls_verify") && !strings.Contains(e.logs.String(), "tls_handshake") {
						t.Errorf("no tls failure reason in the log:\n%s", e.logs)
					}
					return
				}
				if !bytes.Contains(body, []byte(`"serverName":"`+pol.ServerName+`"`)) {
					t.Errorf("backend saw no SNI %q: %s", pol.ServerName, body)
				}
				if pol.Mode == snapshot.TLSMutual && !bytes.Contains(body, []byte("sockmesh-proxy")) {
					t.Errorf("backend saw no client certificate: %s", body)
				}
				wantPath := map[proxy.HTTP1TLSPath]string{proxy.HTTP1TLSL7: "l7", proxy.HTTP1TLSL4: "l4_tls", proxy.HTTP1TLSPooled: "http1"}[path]
				if got := e.counter("sockmesh_proxy_connections_total", map[string]string{"path": wantPath}); got != 1 {
					t.Errorf("connections{path=%s} = %v, want 1", wantPath, got)
				}
			})
		}
	}
}

// TestProtocols: each protocol row of the issue, through the proxy to a real
// backend, checking what the backend saw.
const noALPN = "(none)"

func TestProtocols(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	tlsBE := startEcho(t, "tls-0", serverTLS(e.pki.server))
	clearBE := startEcho(t, "clear-0", nil)
	h1BE := startEchoWith(t, echo.Config{Pod: "h1-0", TLS: serverTLS(e.pki.server), ALPN: echo.ALPNHTTP1})
	noALPNBE := startEchoWith(t, echo.Config{Pod: "noalpn-0", TLS: serverTLS(e.pki.server), ALPN: echo.ALPNNone})
	pol := tlsPolicy(e)
	vips := map[string]netip.AddrPort{}
	var svcs []service
	add := func(name string, be snapshot.Backend) {
		v := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 1, byte(len(svcs) + 1)}), 80)
		vips[name] = v
		svcs = append(svcs, service{name: name, vip: v, backend: be})
	}
	add("http-tls", snapshot.Backend{Protocol: snapshot.ProtocolHTTP, TLS: pol, Endpoints: endpoints(tlsBE.addr)})
	add("http11-tls", snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, TLS: pol, Endpoints: endpoints(tlsBE.addr)})
	add("http2-tls", snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, TLS: pol, Endpoints: endpoints(tlsBE.addr)})
	add("auto-tls", snapshot.Backend{TLS: pol, Endpoints: endpoints(tlsBE.addr)})
	add("h2c", snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(clearBE.addr)})
	add("auto-clear", snapshot.Backend{Endpoints: endpoints(clearBE.addr)})
	add("auto-tls-h1", snapshot.Backend{TLS: pol, Endpoints: endpoints(h1BE.addr)})
	add("auto-tls-noalpn", snapshot.Backend{TLS: pol, Endpoints: endpoints(noALPNBE.addr)})
	alpnPol := tlsPolicy(e)
	alpnPol.ALPN = []string{"h2", "http/1.1"} // options sockmesh.io/alpn: "h2,http/1.1"
	add("auto-tls-alpn-option", snapshot.Backend{TLS: alpnPol, Endpoints: endpoints(tlsBE.addr)})
	h2Pol := tlsPolicy(e)
	h2Pol.ALPN = []string{"h2"}
	add("auto-tls-alpn-h2", snapshot.Backend{TLS: h2Pol, Endpoints: endpoints(tlsBE.addr)})
	e.p.Update(buildSnapshot(t, 1, svcs...))

	cases := []struct {
		svc       string
		h2cClient bool
		wantProto string
		wantALPN  string // "" = cleartext, noALPN = TLS without ALPN
	}{
		// XBackend HTTP offers both; an HTTP/1.1 app on the default (L4)
		// speed keeps its version with ALPN http/1.1.
		{"http-tls", false, "HTTP/1.1", "http/1.1"},
		{"http-tls", true, "HTTP/2.0", "h2"},
		{"http11-tls", false, "HTTP/1.1", "http/1.1"},
		{"http2-tls", false, "HTTP/2.0", "h2"},
		{"http2-tls", true, "HTTP/2.0", "h2"},
		{"auto-tls", false, "HTTP/1.1", "http/1.1"},
		{"auto-tls", true, "HTTP/2.0", "h2"},
		{"h2c", false, "HTTP/2.0", ""},
		{"h2c", true, "HTTP/2.0", ""},
		{"auto-clear", false, "HTTP/1.1", ""},
		{"auto-clear", true, "HTTP/2.0", ""},
		// A TLS backend that speaks HTTP/1.1 only, by ALPN or by having
		// none: an h2c app's requests are translated.
		{"auto-tls-h1", false, "HTTP/1.1", "http/1.1"},
		{"auto-tls-h1", true, "HTTP/1.1", "http/1.1"},
		{"auto-tls-noalpn", false, "HTTP/1.1", noALPN},
		{"auto-tls-noalpn", true, "HTTP/1.1", noALPN},
		// A policy's ALPN list offers only what the request's wire
		// speaks: offered whole, the backend picked h2 for the fast
		// path's HTTP/1.1 connection, which then failed (502).
		{"auto-tls-alpn-option", false, "HTTP/1.1", "http/1.1"},
		{"auto-tls-alpn-option", true, "HTTP/2.0", "h2"},
		// One that offers h2 alone declares HTTP/2: an HTTP/1.1 app's
		// requests are translated, where its h2 answer failed them.
		{"auto-tls-alpn-h2", false, "HTTP/2.0", "h2"},
		{"auto-tls-alpn-h2", true, "HTTP/2.0", "h2"},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/h2c-client=%v", c.svc, c.h2cClient), func(t *testing.T) {
			code, rep := get(t, e.client(vips[c.svc], c.h2cClient), "http://"+c.svc+".b.svc/p?q=1")
			if code != http.StatusOK {
				t.Fatalf("status %d", code)
			}
			if rep.Proto != c.wantProto || rep.Path != "/p" || rep.RawQuery != "q=1" || rep.Host != c.svc+".b.svc" {
				t.Errorf("backend saw proto %s path %s query %s host %s; want %s /p q=1 %s.b.svc", rep.Proto, rep.Path, rep.RawQuery, rep.Host, c.wantProto, c.svc)
			}
			wantALPN := c.wantALPN
			if wantALPN == noALPN {
				wantALPN = ""
			}
			switch {
			case c.wantALPN == "" && rep.TLS != nil:
				t.Errorf("backend saw TLS, want cleartext")
			case c.wantALPN != "" && (rep.TLS == nil || rep.TLS.NegotiatedProtocol != wantALPN || rep.TLS.ServerName != sniName):
				t.Errorf("backend TLS = %+v, want ALPN %s SNI %s", rep.TLS, c.wantALPN, sniName)
			}
		})
	}
}

// TestExtensionMethodIsHTTP: an HTTP/1.1 connection that starts with a
// method RFC 9110 does not list (WebDAV's PROPFIND) is served as HTTP,
// here translated to the h2c its backend declared. Sniffing knew only the
// listed methods: the request was taken for opaque bytes and relayed as
// HTTP/1.1, past routes and session persistence too.
func TestExtensionMethodIsHTTP(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	be := startEcho(t, "dav-0", nil)
	e.p.Update(buildSnapshot(t, 1, service{name: "dav", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(be.addr)}}))
	req, err := http.NewRequest("PROPFIND", "http://dav.b.svc/calendars/user/home/", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.client(vip, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep echo.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatalf("%s: %v", resp.Status, err)
	}
	if rep.Method != "PROPFIND" || rep.Proto != "HTTP/2.0" {
		t.Errorf("backend saw %s over %s, want PROPFIND over HTTP/2.0 (h2c)", rep.Method, rep.Proto)
	}
}

// TestH2AppLearnsH1OnlyBackend: an h2c app's connections to a TLS backend
// that answers an offer of h2 with HTTP/1.1 (by ALPN or by having none) pay
// the relay's refused attempt once: later connections go straight to the
// translating path, whose pooled upstream connection serves them all.
func TestH2AppLearnsH1OnlyBackend(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	backends := map[string]echo.ALPN{"h1": echo.ALPNHTTP1, "noalpn": echo.ALPNNone}
	var svcs []service
	for name, alpn := range backends {
		be := startEchoWith(t, echo.Config{Pod: name + "-0", TLS: serverTLS(e.pki.server), ALPN: alpn})
		vip := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 1, byte(121 + len(svcs))}), 80)
		svcs = append(svcs, service{name: name, vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(be.addr)}})
	}
	e.p.Update(buildSnapshot(t, 1, svcs...))
	handshakes := func() float64 {
		return e.counter("sockmesh_proxy_upstream_tls_handshakes_total", map[string]string{"result": "full"}) +
			e.counter("sockmesh_proxy_upstream_tls_handshakes_total", map[string]string{"result": "resumed"})
	}
	const conns = 4
	for _, svc := range svcs {
		before := handshakes()
		for i := range conns {
			c := e.client(svc.vip, true) // a connection of its own
			code, rep := get(t, c, "http://"+svc.name+".b.svc/")
			c.CloseIdleConnections()
			if code != http.StatusOK || rep.Proto != "HTTP/1.1" {
				t.Fatalf("%s connection %d: status %d, backend saw %s; want 200 over HTTP/1.1", svc.name, i, code, rep.Proto)
			}
		}
		// One for the relay's attempt, one for the translating path's
		// connection; without the memory, one more per app connection.
		if got := handshakes() - before; got != 2 {
			t.Errorf("%s: %d app connections cost %v upstream handshakes, want 2", svc.name, conns, got)
		}
	}
}

// TestBurstKeepsUpstreamConnections: a burst of concurrent requests to
// one endpoint, more than the pool keeps idle past a few seconds, leaves
// its upstream connections to the next burst, which makes no TLS
// handshake: closed as they came back, the connections beyond the pool's
// 64 had to be dialed again, and a load steadily above 64 requests in
// flight dialed for most of its requests.
func TestBurstKeepsUpstreamConnections(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	const inFlight = 100
	// The backend holds each request until the whole burst came: every
	// burst has inFlight upstream connections at once, however slowly a
	// loaded machine starts it (with requests held 300 ms, a first burst
	// once made 98, and the second the 2 it lacked).
	in, out := make(chan struct{}), make(chan struct{})
	be := serveLocal(t, &http.Server{TLSConfig: serverTLS(e.pki.server), ErrorLog: log.New(io.Discard, "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case in <- struct{}{}:
			case <-r.Context().Done():
				return
			}
			select {
			case <-out:
			case <-r.Context().Done():
			}
		})})
	vip := netip.MustParseAddrPort("10.96.1.130:80")
	e.p.Update(buildSnapshot(t, 1, service{name: "burst", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(be)}}))
	handshakes := func() float64 {
		return e.counter("sockmesh_proxy_upstream_tls_handshakes_total", map[string]string{"result": "full"}) +
			e.counter("sockmesh_proxy_upstream_tls_handshakes_total", map[string]string{"result": "resumed"})
	}
	c := e.client(vip, false)
	burst := func() {
		var wg sync.WaitGroup
		for range inFlight {
			wg.Go(func() {
				resp, err := c.Get("http://burst.b.svc/")
				if err != nil {
					t.Error(err)
					return
				}
				defer resp.Body.Close()
				if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
					t.Errorf("status %d, body: %v", resp.StatusCode, err)
				}
			})
		}
		for i := range inFlight {
			select {
			case <-in:
			case <-time.After(hangGuard):
				t.Fatalf("%d of %d requests reached the backend in %v", i, inFlight, hangGuard)
			}
		}
		for range inFlight {
			out <- struct{}{}
		}
		wg.Wait()
		// The proxy gives an exchange's upstream connection back after
		// the app may have read the answer's end, but before it ends the
		// app's connection.
		c.CloseIdleConnections()
		eventually(t, func() bool { return e.counter("sockmesh_proxy_active_connections", nil) == 0 }, "the apps' connections to end")
	}
	burst()
	first := handshakes()
	if first <= 64 {
		t.Fatalf("the first burst made %v upstream connections; the test needs more than the pool's 64 in flight", first)
	}
	burst()
	if got := handshakes() - first; got != 0 {
		t.Errorf("a second burst of %d requests made %v upstream TLS handshakes after the first made %v, want none", inFlight, got, first)
	}
}

// TestExternalHostnameAuthority: an ExternalHostname backend gets its own
// name as the request's authority whatever the app speaks, over TLS and
// cleartext (relayed bytes could not carry the rewrite: such backends
// take the L7 path), with its port when that is not the scheme's default
// (RFC 9110 §7.2): a bare name means 443 or 80, and a virtual host on
// another port would not be found.
func TestExternalHostnameAuthority(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	const external = "api.partner.test"
	tlsBE := startEcho(t, "partner-tls", serverTLS(e.pki.server))
	clearBE := startEcho(t, "partner-clear", nil)
	// The harness takes a backend's port (the XBackend's) from its VIP's.
	cases := []struct {
		vip  netip.AddrPort
		tls  bool
		want string
	}{
		{netip.MustParseAddrPort("10.96.1.101:443"), true, external},
		{netip.MustParseAddrPort("10.96.1.102:80"), false, external},
		{netip.MustParseAddrPort("10.96.1.103:8443"), true, external + ":8443"},
		{netip.MustParseAddrPort("10.96.1.104:443"), false, external + ":443"},
	}
	var svcs []service
	for i, c := range cases {
		be := snapshot.Backend{Hostname: external, Endpoints: endpoints(clearBE.addr)}
		if c.tls {
			be.TLS, be.Endpoints = tlsPolicy(e), endpoints(tlsBE.addr)
		}
		svcs = append(svcs, service{name: fmt.Sprintf("partner-%d", i), vip: c.vip, backend: be})
	}
	e.p.Update(buildSnapshot(t, 1, svcs...))
	for _, c := range cases {
		for _, h2c := range []bool{false, true} {
			code, rep := get(t, e.client(c.vip, h2c), "http://partner.b.svc/p")
			if code != http.StatusOK || rep.Host != c.want {
				t.Errorf("%s (TLS %v) h2c-client=%v: status %d, backend saw host %q; want 200, %s", c.vip, c.tls, h2c, code, rep.Host, c.want)
			}
		}
	}
}

// TestExternalHostnameRouteAuthority: a route rule's URLRewrite hostname
// or RequestHeaderModifier Host is the authority an ExternalHostname
// backend gets, as the API says of the filter; without one the backend
// gets its own name, on every L7 front end — a RequestMirror's
// ExternalHostname backend too (it got its own name whatever the rule
// set). The TLS server name stays the backend's policy's (the handshake
// verifies it).
func TestExternalHostnameRouteAuthority(t *testing.T) {
	checkNoLeaks(t)
	const external, mirrorExternal = "api.partner.test", "shadow.partner.test"
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			m := &mesh{t: t}
			partner := m.backendOn("partner", 443, snapshot.Backend{Hostname: external, TLS: tlsPolicy(e),
				Endpoints: endpoints(startEcho(t, "partner-0", serverTLS(e.pki.server)).addr)})
			shadow := startRecorder(t, nil, nil)
			mirrors := []snapshot.Mirror{{Backend: m.backend("shadow", snapshot.Backend{Hostname: mirrorExternal,
				Endpoints: endpoints(shadow.addr)}), Numerator: 1, Denominator: 1}}
			m.frontend("front", routedVIP, partner, producer(routeSet(snapshot.KindHTTPRoute,
				rule{[]snapshot.RouteMatch{prefixMatch("/rewrite")}, snapshot.RouteRule{Backends: to(partner), Filters: snapshot.Filters{
					Rewrite: &snapshot.Rewrite{Hostname: "rewritten.example"}, Mirrors: mirrors,
				}}},
				rule{[]snapshot.RouteMatch{prefixMatch("/header")}, snapshot.RouteRule{Backends: to(partner), Filters: snapshot.Filters{
					RequestHeaders: &snapshot.HeaderModifier{Set: []snapshot.Header{{Name: "Host", Value: "set.example"}}}, Mirrors: mirrors,
				}}},
				rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(partner), Filters: snapshot.Filters{Mirrors: mirrors}}},
			)))
			e.p.Update(m.snapshot(1))
			c := e.client(routedVIP, k.h2c)
			for _, tc := range []struct{ path, want, mirrorWant string }{
				{"/rewrite", "rewritten.example", "rewritten.example"},
				{"/header", "set.example", "set.example"},
				{"/plain", external, mirrorExternal},
			} {
				if a := send(t, c, newReq(t, http.MethodGet, "http://front.b.svc"+tc.path, nil)); a.status != 200 || a.report.Host != tc.want {
					t.Errorf("%s: status %d, backend saw host %q; want 200, %s", tc.path, a.status, a.report.Host, tc.want)
				}
				if got := <-shadow.seen; got.Path != tc.path || got.Host != tc.mirrorWant {
					t.Errorf("%s: mirror saw %s with host %q, want host %s", tc.path, got.Path, got.Host, tc.mirrorWant)
				}
			}
		})
	}
}

// TestNoUserAgentAdded: an app's request without User-Agent reaches the
// backend without one on the net/http path too (h2c app translated to
// HTTP/1.1, h2c app to an h2 backend), where the Transport would add Go's.
func TestNoUserAgentAdded(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	h1 := startEchoWith(t, echo.Config{Pod: "h1-0", TLS: serverTLS(e.pki.server), ALPN: echo.ALPNHTTP1})
	h2 := startEcho(t, "h2-0", serverTLS(e.pki.server))
	vH1, vH2 := netip.MustParseAddrPort("10.96.1.111:80"), netip.MustParseAddrPort("10.96.1.112:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "h1", vip: vH1, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(h1.addr)}},
		service{name: "h2", vip: vH2, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, TLS: tlsPolicy(e), Endpoints: endpoints(h2.addr),
			SessionPersistence: &snapshot.SessionPersistence{Type: snapshot.SessionHeader, Name: "x-session"}}},
	))
	for _, dst := range []netip.AddrPort{vH1, vH2} {
		req, _ := http.NewRequest(http.MethodGet, "http://app.b.svc/ua", nil)
		req.Header["User-Agent"] = []string{""} // net/http's client then sends none
		resp, err := e.client(dst, true).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var rep echo.Report
		err = json.NewDecoder(resp.Body).Decode(&rep)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || rep.Headers.Get("User-Agent") != "" {
			t.Errorf("%s: status %d, backend saw User-Agent %q (%v); want 200 and none", dst, resp.StatusCode, rep.Headers.Get("User-Agent"), err)
		}
	}
}

// TestGRPC: unary and bidirectional streaming with trailers intact, over h2
// (TLS) and h2c backends, from a gRPC app speaking h2c to the Service.
func TestGRPC(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	tlsBE := startEcho(t, "grpc-tls", serverTLS(e.pki.server))
	clearBE := startEcho(t, "grpc-clear", nil)
	vTLS, vClear := netip.MustParseAddrPort("10.96.2.1:9000"), netip.MustParseAddrPort("10.96.2.2:9000")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "grpc-tls", vip: vTLS, backend: snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: tlsPolicy(e), Endpoints: endpoints(tlsBE.addr)}},
		service{name: "grpc-clear", vip: vClear, backend: snapshot.Backend{Protocol: snapshot.ProtocolGRPC, Endpoints: endpoints(clearBE.addr)}},
	))
	for name, dst := range map[string]netip.AddrPort{"grpc-tls": vTLS, "grpc-clear": vClear} {
		t.Run(name, func(t *testing.T) {
			cc := e.grpcClient(t, name+".b.svc:9000", dst)
			defer cc.Close()
			ctx := context.Background()
			var trailer metadata.MD
			out := new(wrapperspb.BytesValue)
			if err := cc.Invoke(ctx, echo.MethodUnary, wrapperspb.Bytes([]byte("ping")), out, grpc.Trailer(&trailer)); err != nil {
				t.Fatalf("unary: %v", err)
			}
			if string(out.Value) != "ping" || len(trailer.Get(echo.TrailerKey)) != 1 || trailer.Get(echo.TrailerKey)[0] != name {
				t.Errorf("unary = %q trailer %v; want ping, %s=%s", out.Value, trailer, echo.TrailerKey, name)
			}
			// Bidirectional: each reply arrives before the next send, which
			// only works if neither direction is buffered to the end.
			st, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, echo.MethodStream)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 500 {
				msg := fmt.Appendf(nil, "m%d", i)
				if err := st.SendMsg(wrapperspb.Bytes(msg)); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
				got := new(wrapperspb.BytesValue)
				if err := st.RecvMsg(got); err != nil || !bytes.Equal(got.Value, msg) {
					t.Fatalf("recv %d = %q, %v", i, got.Value, err)
				}
			}
			st.CloseSend()
			if err := st.RecvMsg(new(wrapperspb.BytesValue)); err != io.EOF {
				t.Fatalf("end of stream = %v, want EOF", err)
			}
			if st.Trailer().Get(echo.TrailerKey)[0] != name {
				t.Errorf("stream trailer = %v", st.Trailer())
			}
		})
	}
}

// TestGRPCFailures: a gRPC app whose request the proxy cannot forward gets
// a gRPC status it can read (UNAVAILABLE) with the reason in its message,
// not an HTTP error page: fail-closed policy, no ready endpoint, and a
// backend certificate that fails verification. requests_total counts it by
// the HTTP status of that trailers-only answer, 200, as the proxy's other
// answers to gRPC (TestRouteExternalAuthGRPCAppOwnAnswers): it counted
// 503 or 502, an answer the app never got.
func TestGRPCFailures(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	impostor := startEcho(t, "impostor", serverTLS(e.pki.otherSrv))
	inv := &snapshot.Invalid{Policy: snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: "b", Name: "broken"}, Reason: "NoValidCACertificate"}
	vInvalid, vNone, vVerify := netip.MustParseAddrPort("10.96.2.11:9000"), netip.MustParseAddrPort("10.96.2.12:9000"), netip.MustParseAddrPort("10.96.2.13:9000")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "invalid", vip: vInvalid, backend: snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: tlsPolicy(e), Invalid: inv, Endpoints: endpoints(impostor.addr)}},
		service{name: "none", vip: vNone, backend: snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: tlsPolicy(e)}},
		service{name: "verify", vip: vVerify, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(impostor.addr)}},
	))
	for name, c := range map[string]struct {
		dst    netip.AddrPort
		reason upstream.Reason
	}{
		"invalid": {vInvalid, upstream.ReasonInvalidPolicy},
		"none":    {vNone, upstream.ReasonNoEndpoints},
		"verify":  {vVerify, upstream.ReasonTLSVerify},
	} {
		t.Run(name, func(t *testing.T) {
			cc := e.grpcClient(t, name+".b.svc:9000", c.dst)
			defer cc.Close()
			err := cc.Invoke(context.Background(), echo.MethodUnary, wrapperspb.Bytes([]byte("ping")), new(wrapperspb.BytesValue))
			if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "sockmesh: "+string(c.reason) {
				t.Errorf("err = %v; want code Unavailable, message sockmesh: %s", err, c.reason)
			}
			svc := map[string]string{"service": name}
			if all, ok := e.counter("sockmesh_proxy_requests_total", svc), e.counter("sockmesh_proxy_requests_total", map[string]string{"service": name, "code": "200"}); all != 1 || ok != 1 {
				t.Errorf("requests_total{service=%q}: %v, %v of them code 200; want 1, 1", name, all, ok)
			}
			if got := e.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": string(c.reason)}); got != 1 {
				t.Errorf("request_failures_total{reason=%q} = %v, want 1", c.reason, got)
			}
		})
	}
}

// TestWebSocket: an HTTP/1.1 Upgrade relayed to ws (cleartext) and wss
// (TLS, ALPN http/1.1) backends, on the fast path and net/http's, and an
// HTTP/2 client's extended CONNECT bridged to an HTTP/1.1 Upgrade. An idle
// WebSocket's relay holds no copy buffer.
func TestWebSocket(t *testing.T) {
	checkNoLeaks(t)
	for name, path := range map[string]proxy.HTTP1TLSPath{"fast": proxy.HTTP1TLSAuto, "nethttp": proxy.HTTP1TLSL7} {
		t.Run(name, func(t *testing.T) { testWebSocket(t, path) })
	}
}

func testWebSocket(t *testing.T, path proxy.HTTP1TLSPath) {
	e := newEnv(t, envOptions{http1TLS: path})
	tlsBE := startEcho(t, "wss-0", serverTLS(e.pki.server))
	clearBE := startEcho(t, "ws-0", nil)
	vWS, vWSS := netip.MustParseAddrPort("10.96.3.1:80"), netip.MustParseAddrPort("10.96.3.2:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "ws", vip: vWS, backend: snapshot.Backend{Protocol: snapshot.ProtocolWS, Endpoints: endpoints(clearBE.addr)}},
		service{name: "wss", vip: vWSS, backend: snapshot.Backend{Protocol: snapshot.ProtocolWSS, TLS: tlsPolicy(e), Endpoints: endpoints(tlsBE.addr)}},
	))
	for name, dst := range map[string]netip.AddrPort{"ws": vWS, "wss": vWSS} {
		t.Run("upgrade/"+name, func(t *testing.T) {
			ctx := context.Background()
			c, _, err := websocket.Dial(ctx, "ws://"+name+".b.svc/ws", &websocket.DialOptions{HTTPClient: e.client(dst, false)})
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			_, first, err := c.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			checkWSReport(t, first, name == "wss")
			for i := range 50 {
				msg := fmt.Appendf(nil, "hello %d", i)
				if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
					t.Fatal(err)
				}
				if _, got, err := c.Read(ctx); err != nil || !bytes.Equal(got, msg) {
					t.Fatalf("echo %d = %q, %v", i, got, err)
				}
			}
			eventually(t, func() bool { return e.counter("sockmesh_proxy_copy_buffers_in_use", nil) == 0 },
				"the idle WebSocket's relay to give its copy buffers back")
			c.Close(websocket.StatusNormalClosure, "")
		})
	}
	t.Run("extended-connect/wss", func(t *testing.T) {
		c, err := e.dial(vWSS)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		st := openH2WS(t, c, "wss.b.svc", "/ws")
		_, first, err := readWSFrame(st)
		if err != nil {
			t.Fatal(err)
		}
		checkWSReport(t, first, true)
		for i := range 20 {
			msg := fmt.Appendf(nil, "over h2 %d", i)
			if err := writeWSFrame(st, wsText, msg); err != nil {
				t.Fatal(err)
			}
			_, got, err := readWSFrame(st)
			if err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("echo %d = %q, %v", i, got, err)
			}
		}
		eventually(t, func() bool { return e.counter("sockmesh_proxy_copy_buffers_in_use", nil) == 0 },
			"the idle WebSocket's relay to give its copy buffers back")
	})
}

// TestWebSocketSession: a WebSocket to a backend with session persistence
// starts a session naming the endpoint that took it, when an HTTP/1.1 app
// opens it by Upgrade (on the fast path and on net/http's server) and when
// an HTTP/2 app opens it by extended CONNECT. The 101 of an Upgrade
// carried no session on either HTTP/1 path.
func TestWebSocketSession(t *testing.T) {
	checkNoLeaks(t)
	for _, path := range []proxy.HTTP1TLSPath{proxy.HTTP1TLSAuto, proxy.HTTP1TLSL7} {
		e := newEnv(t, envOptions{http1TLS: path})
		e.p.Update(buildSnapshot(t, 1, service{name: "ws", vip: vip, backend: snapshot.Backend{
			Protocol: snapshot.ProtocolWS, Endpoints: endpoints(startEcho(t, "ws-0", nil).addr, startEcho(t, "ws-1", nil).addr),
			SessionPersistence: &snapshot.SessionPersistence{Type: snapshot.SessionCookie, Name: "sm-session"},
		}}))
		// Each opens a WebSocket and returns its answer's fields and the
		// backend's first message.
		opens := map[string]func(t *testing.T) (http.Header, io.Reader){
			"upgrade": func(t *testing.T) (http.Header, io.Reader) {
				_, br, resp := rawUpgrade(t, e, vip, "/ws")
				return resp.Header, br
			},
		}
		if path == proxy.HTTP1TLSAuto {
			opens["extended-connect"] = func(t *testing.T) (http.Header, io.Reader) {
				st := openH2WS(t, e.appConn(t, vip), "ws.b.svc", "/ws")
				return st.header, st
			}
		}
		for name, open := range opens {
			t.Run(fmt.Sprint(name, "/path=", path), func(t *testing.T) {
				header, ws := open(t)
				_, first, err := readWSFrame(ws)
				if err != nil {
					t.Fatal(err)
				}
				checkSessionPod(t, e, header, first)
			})
		}
	}
}

// checkSessionPod checks that header, a WebSocket's answer fields, starts
// a session whose requests reach the pod that sent first, the WebSocket's
// first message.
func checkSessionPod(t *testing.T, e *env, header http.Header, first []byte) {
	t.Helper()
	h := http.Header{"Cookie": {}}
	for _, sc := range header.Values("Set-Cookie") {
		if ck, err := http.ParseSetCookie(sc); err == nil && ck.Name == "sm-session" {
			h["Cookie"] = append(h["Cookie"], ck.Name+"="+ck.Value)
		}
	}
	if len(h["Cookie"]) != 1 {
		t.Fatalf("WebSocket answered with fields %v, want one sm-session cookie", header)
	}
	pod := "ws-0"
	if !bytes.Contains(first, []byte(`"pod":"ws-0"`)) {
		pod = "ws-1"
	}
	cl := e.client(vip, false)
	for range 4 {
		req, _ := http.NewRequest(http.MethodGet, "http://ws.b.svc/", nil)
		req.Header = h
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Contains(b, []byte(`"pod":"`+pod+`"`)) {
			t.Errorf("a request in the WebSocket's session reached another pod than %s: %s", pod, b)
		}
	}
}

func checkWSReport(t *testing.T, first []byte, wantTLS bool) {
	t.Helper()
	if !bytes.Contains(first, []byte(`"path":"/ws"`)) {
		t.Errorf("first message is not the backend report: %s", first)
	}
	if got := bytes.Contains(first, []byte(`"negotiatedProtocol":"http/1.1"`)); got != wantTLS {
		t.Errorf("backend TLS with ALPN http/1.1 = %v, want %v: %s", got, wantTLS, first)
	}
}

// TestSSEStreams: an MCP backend's event stream — MCP's streamable HTTP,
// answering a GET or a JSON-RPC POST — reaches the app event by event on
// every L7 path (MCP takes no L4 relay: TestMCPSessionPath): the HTTP/1
// fast path, the net/http path serving h2c apps, translating them for an
// HTTP/1.1-only backend, or serving HTTP/1.1 apps (HTTP1TLSL7), cleartext,
// and GAMMA routes. The
// backend waits an hour after the first event, so it arrives only if
// nothing between buffers.
func TestSSEStreams(t *testing.T) {
	for name, http1 := range map[string]proxy.HTTP1TLSPath{"http1-default": proxy.HTTP1TLSAuto, "http1-nethttp": proxy.HTTP1TLSL7} {
		t.Run(name, func(t *testing.T) {
			checkNoLeaks(t)
			e := newEnv(t, envOptions{http1TLS: http1})
			m := &mesh{t: t}
			mcp := func(name string, cfg echo.Config, tls bool) snapshot.BackendRef {
				cfg.Pod = name + "-0"
				be := snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: endpoints(startEchoWith(t, cfg).addr)}
				if tls {
					be.TLS = tlsPolicy(e)
				}
				return m.backend(name, be)
			}
			h2TLS := mcp("mcp", echo.Config{TLS: serverTLS(e.pki.server)}, true)
			h1TLS := mcp("mcp-h1", echo.Config{TLS: serverTLS(e.pki.server), ALPN: echo.ALPNHTTP1}, true)
			clear := mcp("mcp-clear", echo.Config{}, false)
			vips := map[string]netip.AddrPort{}
			front := func(name string, own snapshot.BackendRef, rt *snapshot.RouteTable) {
				vips[name] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 5, byte(len(vips) + 1)}), 80)
				m.frontend(name, vips[name], own, rt)
			}
			front("mcp", h2TLS, nil)
			front("mcp-h1", h1TLS, nil)
			front("mcp-clear", clear, nil)
			front("mcp-routed", h2TLS, producer(routeSet(snapshot.KindHTTPRoute, rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(h1TLS)}})))
			e.p.Update(m.snapshot(1))
			for name, dst := range vips {
				for _, h2c := range []bool{false, true} {
					for _, method := range []string{http.MethodGet, http.MethodPost} {
						t.Run(fmt.Sprintf("%s/h2c-client=%v/%s", name, h2c, method), func(t *testing.T) {
							firstEvent(t, e.client(dst, h2c), method, "http://"+name+".b.svc/sse?n=2&interval=1h", func() {
								eventually(t, func() bool { return e.counter("sockmesh_proxy_copy_buffers_in_use", nil) == 0 },
									"the waiting stream to hold no copy buffer")
							})
						})
					}
				}
			}
		})
	}
}

// firstEvent asks url for an event stream as an MCP client does and checks
// that its first event arrives.
func firstEvent(t *testing.T, c *http.Client, method, url string, whileOpen func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("status %d, content type %q; want 200 text/event-stream", resp.StatusCode, ct)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "id: 0\n" {
		t.Fatalf("first event line = %q, %v", line, err)
	}
	if whileOpen != nil {
		whileOpen()
	}
}

// TestTCP: opaque bytes with TLS origination, half-close respected both ways.
func TestTCP(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	addr := startTCPEcho(t, serverTLS(e.pki.server))
	clear := startTCPEcho(t, nil)
	vTLS, vClear := netip.MustParseAddrPort("10.96.4.1:5432"), netip.MustParseAddrPort("10.96.4.2:5432")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "db", vip: vTLS, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e), Endpoints: endpoints(addr)}},
		service{name: "raw", vip: vClear, backend: snapshot.Backend{Endpoints: endpoints(clear)}},
	))
	for name, dst := range map[string]netip.AddrPort{"tls": vTLS, "clear": vClear} {
		t.Run(name, func(t *testing.T) {
			c, err := e.dial(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			payload := bytes.Repeat([]byte("opaque\x00\x01"), 100_000)
			go func() {
				c.Write(payload)
				c.(*net.TCPConn).CloseWrite()
			}()
			got, err := io.ReadAll(c)
			if err != nil || !bytes.Equal(got, payload) {
				t.Fatalf("echo: %d bytes, %v; want %d bytes", len(got), err, len(payload))
			}
		})
	}
}

// TestTCPLooksLikeHTTP: an opaque TCP backend with TLS origination gets
// an app's bytes unchanged when they start like HTTP — the HTTP/2 preface,
// an HTTP/1.1 request line — and its TLS handshake offers no ALPN. The
// proxy offered h2 or http/1.1, which a backend that knows its own ALPN
// refuses, and took the HTTP/2 of a backend that negotiated none for an
// HTTP/1.1 backend's: net/http's server answered the app and translated
// its requests.
func TestTCPLooksLikeHTTP(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	cfg := serverTLS(e.pki.server)
	cfg.NextProtos = []string{"x-opaque"} // refuses a handshake that offers only others
	v := netip.MustParseAddrPort("10.96.4.8:5432")
	e.p.Update(buildSnapshot(t, 1, service{name: "db", vip: v, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e),
		Endpoints: endpoints(startTCPEcho(t, cfg))}}))
	for name, payload := range map[string]string{
		"h2-preface": "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00opaque",
		"http1":      "GET / HTTP/1.1\r\nHost: db\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			c := e.appConn(t, v)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, payload)
			c.(*net.TCPConn).CloseWrite()
			if got, err := io.ReadAll(c); err != nil || string(got) != payload {
				t.Fatalf("echo: %q, %v; want %q", got, err, payload)
			}
		})
	}
}

// TestServerFirstProtocol: an app that waits for its server to speak
// first (MySQL's greeting, an SMTP banner) gets the greeting once the
// proxy has waited out its sniff, with TLS origination and without, and
// the connection then carries bytes both ways (the sniff's read deadline
// is gone).
func TestServerFirstProtocol(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{sniffTimeout: 100 * time.Millisecond})
	vTLS, vClear := netip.MustParseAddrPort("10.96.4.3:25"), netip.MustParseAddrPort("10.96.4.4:25")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "mail", vip: vTLS, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e),
			Endpoints: endpoints(serveTCP(t, serverTLS(e.pki.server), greetThenEcho))}},
		service{name: "mail-clear", vip: vClear, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP,
			Endpoints: endpoints(serveTCP(t, nil, greetThenEcho))}},
	))
	for name, dst := range map[string]netip.AddrPort{"tls": vTLS, "clear": vClear} {
		t.Run(name, func(t *testing.T) {
			c, err := e.dial(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			readGreetingThenEcho(t, c)
		})
	}
}

// TestServerFirstHalfClosedApp: an app that sends nothing, shuts its
// sending side and reads what its server says (a banner grab, a client of
// a server that only pushes) gets the server's bytes and end, with TLS
// origination and without, as it would from the server directly. Its FIN
// before any byte was taken for a close: the connection was closed
// unserved (closed_early) and the app read an empty, clean end.
func TestServerFirstHalfClosedApp(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	greet := func(c net.Conn) {
		io.WriteString(c, "220 ready\r\n")
		io.Copy(io.Discard, c)
	}
	vTLS, vClear := netip.MustParseAddrPort("10.96.4.9:25"), netip.MustParseAddrPort("10.96.4.10:25")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "mail", vip: vTLS, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e),
			Endpoints: endpoints(serveTCP(t, serverTLS(e.pki.server), greet))}},
		service{name: "mail-clear", vip: vClear, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP,
			Endpoints: endpoints(serveTCP(t, nil, greet))}},
	))
	for name, dst := range map[string]netip.AddrPort{"tls": vTLS, "clear": vClear} {
		t.Run(name, func(t *testing.T) {
			c := e.appConn(t, dst)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			c.(*net.TCPConn).CloseWrite()
			if got, err := io.ReadAll(c); err != nil || string(got) != "220 ready\r\n" {
				t.Fatalf("app read %q, %v; want the greeting, then the end", got, err)
			}
		})
	}
}

// TestServerFirstGreetingAtOnce: an app of a server-first protocol (an
// SMTP banner, MySQL's greeting) behind an opaque TCP backend without TLS
// origination reads its server's greeting while it has sent nothing, and
// talks on after. The proxy waited for the app's first bytes until the
// sniff timeout (here an hour) before it dialed, though nothing it could
// see would have changed how they are relayed.
func TestServerFirstGreetingAtOnce(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{sniffTimeout: time.Hour})
	vip := netip.MustParseAddrPort("10.96.4.11:25")
	e.p.Update(buildSnapshot(t, 1, service{name: "mail", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP,
		Endpoints: endpoints(serveTCP(t, nil, greetThenEcho))}}))
	readGreetingThenEcho(t, e.appConn(t, vip))
}

// greetThenEcho is a server-first backend (an SMTP banner): it greets,
// then echoes what it reads.
func greetThenEcho(c net.Conn) {
	io.WriteString(c, "220 ready\r\n")
	io.Copy(c, c)
}

// readGreetingThenEcho reads greetThenEcho's greeting on c before sending
// anything, then checks that what it sends comes back.
func readGreetingThenEcho(t *testing.T, c net.Conn) {
	t.Helper()
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || line != "220 ready\r\n" {
		t.Fatalf("app read %q, %v before sending; want the greeting", line, err)
	}
	io.WriteString(c, "HELO app\r\n")
	if line, err := r.ReadString('\n'); err != nil || line != "HELO app\r\n" {
		t.Fatalf("app read %q, %v; want its bytes echoed", line, err)
	}
}

// TestOpaqueTCPLateHTTPAnswered: an HTTP app behind an opaque TCP backend
// that has no endpoint reads a 503, also when its request came after the
// proxy took the connection (on a pipe the proxy cannot read without
// waiting), as it did when the proxy waited for its first bytes.
func TestOpaqueTCPLateHTTPAnswered(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	vip := netip.MustParseAddrPort("10.96.4.12:80")
	e.p.Update(buildSnapshot(t, 1, service{name: "none", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP}}))
	app, s := net.Pipe()
	defer app.Close()
	app.SetDeadline(time.Now().Add(hangGuard))
	go e.p.ServeConn(s, vip, proxy.Client{})
	go io.WriteString(app, "GET / HTTP/1.1\r\nHost: none\r\n\r\n")
	if rep, err := http.ReadResponse(bufio.NewReader(app), nil); err != nil || rep.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("app read %v, %v; want a 503", rep, err)
	}
}

// TestRelayBytesCountedLive: sockmesh_proxy_bytes_total shows what a
// relay moved while it lives, with TLS origination or without; it counted
// a relay's bytes when its connection ended, so a database pool or a
// WebSocket showed nothing for as long as it lasted.
func TestRelayBytesCountedLive(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	vTLS, vClear := netip.MustParseAddrPort("10.96.4.13:5432"), netip.MustParseAddrPort("10.96.4.14:5432")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "db", vip: vTLS, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e),
			Endpoints: endpoints(startTCPEcho(t, serverTLS(e.pki.server)))}},
		service{name: "raw", vip: vClear, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(startTCPEcho(t, nil))}},
	))
	up, down := map[string]string{"direction": "upstream"}, map[string]string{"direction": "downstream"}
	for name, dst := range map[string]netip.AddrPort{"tls": vTLS, "clear": vClear} {
		t.Run(name, func(t *testing.T) {
			wantUp, wantDown := e.counter("sockmesh_proxy_bytes_total", up)+5, e.counter("sockmesh_proxy_bytes_total", down)+5
			c := e.appConn(t, dst)
			io.WriteString(c, "\x00ping")
			if _, err := io.ReadFull(c, make([]byte, 5)); err != nil {
				t.Fatal(err)
			}
			// The proxy counted the app's bytes before it sent them on;
			// the echo's, once written, maybe after the app read them.
			if got := e.counter("sockmesh_proxy_bytes_total", up); got != wantUp {
				t.Errorf("upstream bytes = %v while the relay lives, want %v", got, wantUp)
			}
			if got := e.counterReaches("sockmesh_proxy_bytes_total", down, wantDown); got != wantDown {
				t.Errorf("downstream bytes = %v while the relay lives, want %v", got, wantDown)
			}
		})
	}
}

// TestIdleRelaysHoldNoBuffers: relayed connections that wait — database
// pools, idle gRPC channels — hold no copy buffer (64 KiB a direction
// while they lived, before), with TLS origination or without, and relay
// again when bytes come.
func TestIdleRelaysHoldNoBuffers(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	vTLS, vClear := netip.MustParseAddrPort("10.96.4.3:5432"), netip.MustParseAddrPort("10.96.4.4:5432")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "db", vip: vTLS, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e),
			Endpoints: endpoints(startTCPEcho(t, serverTLS(e.pki.server)))}},
		service{name: "raw", vip: vClear, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(startTCPEcho(t, nil))}},
	))
	var conns []net.Conn
	echo := func(msg string) {
		t.Helper()
		for _, c := range conns {
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, msg)
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
				t.Fatalf("echo: %q, %v; want %q", got, err, msg)
			}
		}
	}
	held := func() float64 { return e.counter("sockmesh_proxy_copy_buffers_in_use", nil) }
	for i := range 20 {
		c, err := e.dial([]netip.AddrPort{vTLS, vClear}[i%2])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for _, msg := range []string{"\x00first", "\x00second"} {
		echo(msg)
		eventually(t, func() bool { return held() == 0 }, "idle relays to give their buffers back")
	}
	if got := e.counter("sockmesh_proxy_active_connections", map[string]string{"path": "l4_tls"}); got != 10 {
		t.Errorf("l4_tls connections = %v, want 10", got)
	}
}

// TestSilentAppRelayHoldsNoBuffer: an app that sends nothing — it waits
// for a server that speaks first, or only — is relayed once the sniff
// times out, and while it stays silent its relay holds no copy buffer, as
// any idle relay: the app's direction read through the sniff's empty
// replay, which took a buffer (64 KiB) for as long as the app did not
// speak.
func TestSilentAppRelayHoldsNoBuffer(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{sniffTimeout: 100 * time.Millisecond})
	be := serveTCP(t, nil, func(c net.Conn) {
		io.WriteString(c, "220 ready\r\n")
		io.Copy(io.Discard, c)
	})
	v := netip.MustParseAddrPort("10.96.4.7:25")
	e.p.Update(buildSnapshot(t, 1, service{name: "push", vip: v, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP,
		Endpoints: endpoints(be)}}))
	c := e.appConn(t, v)
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "220 ready\r\n" {
		t.Fatalf("greeting: %q, %v", line, err)
	}
	eventually(t, func() bool { return e.counter("sockmesh_proxy_copy_buffers_in_use", nil) == 0 }, "the silent app's relay to hold no buffer")
}

// TestClientConnectionLimit: a client at MaxConnsPerClient open
// connections gets its next one reset, counted and logged, while other
// clients — other source addresses on a node listener, other pods on
// in-pod listeners — are served; a connection that ends frees its place.
func TestClientConnectionLimit(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{maxConnsPerClient: 2})
	vip := netip.MustParseAddrPort("10.96.4.5:5432")
	e.p.Update(buildSnapshot(t, 1, service{name: "db", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(startTCPEcho(t, nil))}}))
	podA := &snapshot.ObjectRef{Namespace: "a", Name: "a-0"}
	podB := &snapshot.ObjectRef{Namespace: "a", Name: "b-0"}
	open := func(src netip.Addr, pod *snapshot.ObjectRef) (net.Conn, bool) {
		t.Helper()
		return e.echoFrom(t, vip, src, pod)
	}
	rejected := func() float64 {
		return e.counter("sockmesh_proxy_rejected_connections_total", map[string]string{"reason": "client_limit"})
	}
	first, ok1 := open(producerClient, nil)
	_, ok2 := open(producerClient, nil)
	if !ok1 || !ok2 {
		t.Fatal("connections within the limit not served")
	}
	if _, ok := open(producerClient, nil); ok || rejected() != 1 {
		t.Fatalf("third connection of %s: served %v, rejected %v; want it reset and counted", producerClient, ok, rejected())
	}
	if !strings.Contains(e.logs.String(), `"client":"a/client","addr":"127.0.0.1"`) {
		t.Errorf("no log line names the pod at its limit:\n%s", e.logs.String())
	}
	if _, ok := open(consumerClient, nil); !ok {
		t.Errorf("another client's connection was not served")
	}
	first.Close()
	eventually(t, func() bool {
		_, ok := open(producerClient, nil)
		return ok
	}, "a closed connection to free its place")
	// In-pod listeners count pods, whatever their addresses.
	_, okA1 := open(producerClient, podA)
	_, okA2 := open(consumerClient, podA)
	if _, ok := open(unknownClient, podA); !okA1 || !okA2 || ok {
		t.Errorf("pod a's connections served: %v, %v, %v; want the first two", okA1, okA2, ok)
	}
	if _, ok := open(producerClient, podB); !ok {
		t.Errorf("pod b's connection was not served")
	}
	if !strings.Contains(e.logs.String(), `"client":"a/a-0","limit":2`) {
		t.Errorf("no log line names the in-pod listener's pod at its limit:\n%s", e.logs.String())
	}
}

// TestClientConnectionLimitDualStack: on node listeners a dual-stack pod
// is one client, its IPv4 and IPv6 connections counted together, and so
// are the node's addresses, from which every enrolled host-network pod
// connects; an address no pod holds is still a client of its own.
func TestClientConnectionLimitDualStack(t *testing.T) {
	checkNoLeaks(t)
	vip := netip.MustParseAddrPort("10.96.4.5:5432")
	v4, v6 := netip.MustParseAddr("127.0.0.4"), netip.MustParseAddr("::1")
	pod := func(ns, name string, hostNetwork bool) snapshot.Workload {
		return snapshot.Workload{Pod: snapshot.ObjectRef{Namespace: ns, Name: name}, IPs: []netip.Addr{v4, v6}, HostNetwork: hostNetwork, Enrolled: true}
	}
	for _, tc := range []struct {
		name      string
		workloads []snapshot.Workload
		client    string // as logged
	}{
		{"pod", []snapshot.Workload{pod("d", "dual", false)}, "d/dual"},
		{"host network", []snapshot.Workload{pod("kube-system", "exporter", true), pod("monitoring", "agent", true)}, "host network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{maxConnsPerClient: 2, ipv6: true})
			m := &mesh{t: t, workloads: tc.workloads}
			m.frontend("db", vip, m.backend("db", snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(startTCPEcho(t, nil))}), nil)
			e.p.Update(m.snapshot(1))
			_, ok4 := e.echoFrom(t, vip, v4, nil)
			_, ok6 := e.echoFrom(t, vip, v6, nil)
			if !ok4 || !ok6 {
				t.Fatalf("connections within the limit served: IPv4 %v, IPv6 %v", ok4, ok6)
			}
			for _, src := range []netip.Addr{v6, v4} {
				if _, ok := e.echoFrom(t, vip, src, nil); ok {
					t.Errorf("third connection, from %s: served; want it reset, as %s had two open", src, tc.client)
				}
			}
			if want := fmt.Sprintf(`"client":%q,"addr":"::1"`, tc.client); !strings.Contains(e.logs.String(), want) {
				t.Errorf("no log line has %s:\n%s", want, e.logs.String())
			}
			if _, ok := e.echoFrom(t, vip, unknownClient, nil); !ok {
				t.Errorf("a connection from %s, no pod's address, was not served", unknownClient)
			}
		})
	}
}

// TestNoDoubleTLS: an app that speaks TLS itself is passed through: it
// verifies the backend's certificate end to end, and the backend sees the
// app's own SNI and ALPN (TLS inside TLS would fail the handshake).
func TestNoDoubleTLS(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	be := startEcho(t, "tls-0", serverTLS(e.pki.server))
	e.p.Update(buildSnapshot(t, 1, service{name: "echo", vip: netip.MustParseAddrPort("10.96.0.10:443"), backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(be.addr)}}))
	tr := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := e.dial(netip.MustParseAddrPort("10.96.0.10:443"))
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, &tls.Config{ServerName: sniName, RootCAs: e.pki.ca.Pool(), NextProtos: []string{"http/1.1"}})
			return tc, tc.HandshakeContext(ctx)
		},
	}
	defer tr.CloseIdleConnections()
	code, rep := get(t, &http.Client{Transport: tr}, "https://echo.b.svc/")
	if code != http.StatusOK || rep.TLS == nil || rep.TLS.NegotiatedProtocol != "http/1.1" || len(rep.TLS.PeerCertificates) != 0 {
		t.Fatalf("status %d, backend TLS %+v; want the app's own handshake", code, rep.TLS)
	}
	if got := e.counter("sockmesh_proxy_connections_total", map[string]string{"path": "passthrough"}); got != 1 {
		t.Errorf("passthrough connections = %v, want 1", got)
	}
}

// TestTLSFailureLogNamesPolicy: the log line of a backend certificate that
// fails verification names the policy whose TLS settings failed, on the
// HTTP path and the opaque TCP one, as an invalid policy's line does; it
// named the Service, backend and reason only, and left the operator to
// find the policy.
func TestTLSFailureLogNamesPolicy(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	impostor := startEcho(t, "impostor", serverTLS(e.pki.otherSrv))
	vHTTP, vTCP := netip.MustParseAddrPort("10.96.5.4:443"), netip.MustParseAddrPort("10.96.5.5:443")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "web", vip: vHTTP, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(impostor.addr)}},
		service{name: "db", vip: vTCP, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e), Endpoints: endpoints(impostor.addr)}},
	))
	if code, _ := get(t, e.client(vHTTP, false), "http://web.b.svc/"); code != http.StatusBadGateway {
		t.Errorf("http: status %d, want 502", code)
	}
	c := e.appConn(t, vTCP)
	c.Write([]byte("\x00binary protocol hello"))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("tcp: read err = %v, want connection reset", err)
	}
	for _, msg := range []string{"request failed", "connection failed"} {
		if !slices.ContainsFunc(strings.Split(e.logs.String(), "\n"), func(l string) bool {
			return strings.Contains(l, `"msg":"`+msg+`"`) && strings.Contains(l, `"reason":"tls_verify"`) &&
				strings.Contains(l, `"policy":"BackendTLSPolicy/b/echo-tls"`)
		}) {
			t.Errorf("no %q line with reason tls_verify names the policy:\n%s", msg, e.logs)
		}
	}
}

// TestFailClosed: an invalid policy gives HTTP 503 and a TCP reset with a log
// line naming the policy and reason, and never a cleartext byte to the
// backend (whose listener would otherwise see one).
func TestFailClosed(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	hits := make(chan struct{}, 10)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			hits <- struct{}{}
			c.Close()
		}
	}()
	policy := snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: "b", Name: "broken"}
	inv := &snapshot.Invalid{Policy: policy, Reason: "NoValidCACertificate", Message: "ConfigMap b/ca has no ca.crt"}
	badPEM := tlsPolicy(e)
	badPEM.RootsPEM = "not a certificate"
	vHTTP, vTCP, vPEM := netip.MustParseAddrPort("10.96.5.1:80"), netip.MustParseAddrPort("10.96.5.2:80"), netip.MustParseAddrPort("10.96.5.3:80")
	ep := endpoints(l.Addr().(*net.TCPAddr).AddrPort())
	e.p.Update(buildSnapshot(t, 1,
		service{name: "invalid", vip: vHTTP, backend: snapshot.Backend{TLS: tlsPolicy(e), Invalid: inv, Endpoints: ep}},
		service{name: "invalid-tcp", vip: vTCP, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Invalid: inv, Endpoints: ep}},
		service{name: "bad-pem", vip: vPEM, backend: snapshot.Backend{TLS: badPEM, Endpoints: ep}},
	))
	for _, dst := range []netip.AddrPort{vHTTP, vPEM} {
		for _, h2 := range []bool{false, true} {
			if code, _ := get(t, e.client(dst, h2), "http://x.b.svc/"); code != http.StatusServiceUnavailable {
				t.Errorf("%s h2=%v: status %d, want 503", dst, h2, code)
			}
		}
	}
	c, err := e.dial(vTCP)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("\x00binary protocol hello"))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("tcp to invalid backend: read err = %v, want connection reset", err)
	}
	c.Close()
	logs := e.logs.String()
	for _, want := range []string{`"policy":"BackendTLSPolicy/b/broken"`, `"policy_reason":"NoValidCACertificate"`, `no certificate in the CA bundle`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
	if len(hits) != 0 {
		t.Errorf("backend got %d connections from a fail-closed service", len(hits))
	}
}

// TestUnavailable: no ready endpoints gives 503, WebSocket upgrades
// included; a refused endpoint gives 503.
func TestUnavailable(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	notReady := endpoints(closedPort(t))
	notReady[0].Ready = false
	vNone, vWS, vRefused := netip.MustParseAddrPort("10.96.6.1:80"), netip.MustParseAddrPort("10.96.6.2:80"), netip.MustParseAddrPort("10.96.6.3:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "none", vip: vNone, backend: snapshot.Backend{Endpoints: notReady}},
		service{name: "ws", vip: vWS, backend: snapshot.Backend{Protocol: snapshot.ProtocolWSS, TLS: tlsPolicy(e)}},
		service{name: "refused", vip: vRefused, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP11, Endpoints: endpoints(closedPort(t))}},
	))
	if code, _ := get(t, e.client(vNone, false), "http://none.b.svc/"); code != http.StatusServiceUnavailable {
		t.Errorf("no ready endpoints: %d, want 503", code)
	}
	_, resp, err := websocket.Dial(context.Background(), "ws://ws.b.svc/ws", &websocket.DialOptions{HTTPClient: e.client(vWS, false)})
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("websocket without endpoints: resp %v, err %v; want 503", resp, err)
	}
	if code, _ := get(t, e.client(vRefused, false), "http://refused.b.svc/"); code != http.StatusServiceUnavailable {
		t.Errorf("refused: %d, want 503", code)
	}
	if got := e.counter("sockmesh_proxy_request_failures_total", map[string]string{"reason": "refused"}); got != 1 {
		t.Errorf("failures{refused} = %v, want 1", got)
	}
}

// TestLargeBodies: 8 MiB up and 32 MiB down, streamed both ways, through
// protocol translation (HTTP/1.1 app to an h2 backend) and on the default
// path (HTTP/1.1 app to a TLS backend: pooled HTTP/1.1).
func TestLargeBodies(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	be := startEcho(t, "big-0", serverTLS(e.pki.server))
	vH2, vH1 := netip.MustParseAddrPort("10.96.7.1:80"), netip.MustParseAddrPort("10.96.7.2:80")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "big", vip: vH2, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, TLS: tlsPolicy(e), Endpoints: endpoints(be.addr)}},
		service{name: "big-h1", vip: vH1, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(be.addr)}},
	))
	for name, dst := range map[string]netip.AddrPort{"h2": vH2, "pooled-h1": vH1} {
		t.Run(name, func(t *testing.T) {
			cl := e.client(dst, false)
			up := bytes.Repeat([]byte("0123456789abcdef"), 512<<10)
			sum := sha256.Sum256(up)
			// Chunked (unknown length) to exercise streaming of request bodies.
			resp, err := cl.Post("http://big.b.svc/", "application/octet-stream", io.MultiReader(bytes.NewReader(up)))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !bytes.Contains(body, []byte(hex.EncodeToString(sum[:]))) || !bytes.Contains(body, []byte(`"bodyBytes":8388608`)) {
				t.Errorf("upload: backend report %s", body)
			}
			resp, err = cl.Get("http://big.b.svc/bytes/33554432")
			if err != nil {
				t.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || n != 32<<20 {
				t.Errorf("download: %d bytes, %v; want %d", n, err, 32<<20)
			}
		})
	}
}

// TestSessionPersistence: a cookie pins requests to one of several endpoints.
func TestSessionPersistence(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	var addrs []netip.AddrPort
	for i := range 3 {
		addrs = append(addrs, startEcho(t, fmt.Sprintf("pod-%d", i), nil).addr)
	}
	e.p.Update(buildSnapshot(t, 1, service{name: "sticky", vip: vip, backend: snapshot.Backend{
		Endpoints: endpoints(addrs...), SessionPersistence: &snapshot.SessionPersistence{Type: snapshot.SessionCookie, Name: "sm-session"},
	}}))
	cl := e.client(vip, false)
	resp, err := cl.Get("http://sticky.b.svc/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "sm-session" {
			cookie = c
		}
	}
	if cookie == nil {
		t.Fatalf("no session cookie in %v", resp.Header)
	}
	pods := map[string]bool{}
	for range 9 {
		req, _ := http.NewRequest(http.MethodGet, "http://sticky.b.svc/", nil)
		req.AddCookie(cookie)
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for i := range 3 {
			if bytes.Contains(b, fmt.Appendf(nil, `"pod":"pod-%d"`, i)) {
				pods[fmt.Sprint(i)] = true
			}
		}
	}
	if len(pods) != 1 {
		t.Errorf("requests with one session cookie reached pods %v, want exactly one", pods)
	}
}

// TestSnapshotSwapUnderLoad: clients keep sending while snapshots move the
// Service between two endpoint sets, a's and b's; no request fails. On the
// L7 paths each request uses the latest snapshot, kept-alive connection or
// not (httpproxy.Target): one made wholly while a snapshot was the latest
// reaches that snapshot's endpoint. An L4 relay keeps the endpoint it
// dialed, by design.
func TestSnapshotSwapUnderLoad(t *testing.T) {
	checkNoLeaks(t)
	for _, path := range []proxy.HTTP1TLSPath{proxy.HTTP1TLSL7, proxy.HTTP1TLSL4, proxy.HTTP1TLSPooled} {
		t.Run(fmt.Sprint("path=", path), func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: path})
			a := startEcho(t, "a", serverTLS(e.pki.server))
			b := startEcho(t, "b", serverTLS(e.pki.server))
			// Odd versions send to a, even ones to b.
			podOf := func(v uint64) string { return [2]string{"b", "a"}[v%2] }
			snap := func(v uint64) *snapshot.Snapshot {
				addr := a.addr
				if podOf(v) == "b" {
					addr = b.addr
				}
				return buildSnapshot(t, v, service{name: "echo", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(addr)}})
			}
			// applied is the version the proxy serves and no newer one
			// has begun to replace; 0 while an update is under way. A
			// request that reads the same version as it starts and once
			// its answer is read was routed under that version.
			var applied atomic.Uint64
			e.p.Update(snap(1))
			applied.Store(1)
			var mu sync.Mutex
			answered := sync.NewCond(&mu)
			within := map[uint64]int{} // requests made wholly under each version
			var failures, strays []string
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for range 4 {
				wg.Go(func() {
					cl := e.client(vip, false)
					for {
						select {
						case <-stop:
							return
						default:
						}
						v := applied.Load()
						resp, err := cl.Get("http://echo.b.svc/")
						var body []byte
						if err == nil {
							body, err = io.ReadAll(resp.Body)
							resp.Body.Close()
						}
						mu.Lock()
						switch {
						case err != nil:
							failures = append(failures, err.Error())
						case resp.StatusCode != http.StatusOK:
							failures = append(failures, resp.Status)
						case v != 0 && applied.Load() == v:
							within[v]++
							want := podOf(v)
							if path != proxy.HTTP1TLSL4 && !bytes.Contains(body, fmt.Appendf(nil, `"pod":%q`, want)) {
								strays = append(strays, fmt.Sprintf("version %d (pod %s) answered by: %s", v, want, body))
							}
						}
						mu.Unlock()
						answered.Broadcast()
					}
				})
			}
			for v := uint64(2); v < 40; v++ {
				applied.Store(0)
				e.p.Update(snap(v))
				applied.Store(v)
				// Some requests made wholly under this version before the
				// next. Counting answers alone let clients that ran ahead
				// of a descheduled test goroutine satisfy every later
				// wait at once: the swaps then came back to back, with no
				// request routed while b was the latest.
				mu.Lock()
				for within[v] < 5 && len(failures) == 0 {
					answered.Wait()
				}
				mu.Unlock()
			}
			close(stop)
			wg.Wait()
			if len(failures) > 0 {
				t.Fatalf("%d requests failed during swaps, first: %s", len(failures), failures[0])
			}
			if len(strays) > 0 {
				t.Errorf("%d L7 requests did not follow the swaps, first: %s", len(strays), strays[0])
			}
		})
	}
}

// TestShutdownDrains: an in-flight streamed response finishes before
// Shutdown returns, and new connections are refused afterwards.
func TestShutdownDrains(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	be := startEcho(t, "s", nil)
	// H2C makes an HTTP/1.1 client take the L7 path, whose requests
	// Shutdown can wait for (an L4 relay lasts until ctx ends).
	e.p.Update(buildSnapshot(t, 1, service{name: "s", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(be.addr)}}))
	resp, err := e.client(vip, false).Get("http://s.b.svc/sse?n=20&interval=5ms")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.p.Shutdown(context.Background()) }()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || bytes.Count(b, []byte("id: ")) != 20 {
		t.Fatalf("stream during shutdown: %d events, %v", bytes.Count(b, []byte("id: ")), err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c, err := e.dial(vip); err == nil {
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Errorf("connection after shutdown was served")
		}
		c.Close()
	}
}

// TestShutdownForcedResets: relays that Shutdown cuts when its context
// ends are reset on both sides, cleartext or with TLS toward the backend:
// they used to be closed, and the first side closed read a clean end of
// stream (a FIN; a close_notify), as if the relayed bytes were complete —
// the rest of a close-delimited answer, say. On net/http's path too: an
// HTTP/1.0 app's answer of no stated length runs to the close, and a plain
// close (http.Server.Close, which ran before the resets) completed it.
func TestShutdownForcedResets(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{http1TLS: proxy.HTTP1TLSL7})
	type ended struct {
		name string
		err  error
	}
	backendEnd := make(chan ended, 2)
	// A backend that sends part of an answer, then reads until its end.
	partial := func(name string, tlsCfg *tls.Config) netip.AddrPort {
		return serveTCP(t, tlsCfg, func(c net.Conn) {
			io.WriteString(c, "partial")
			_, err := io.Copy(io.Discard, c)
			backendEnd <- ended{name, err}
		})
	}
	// An answer of no stated length, cut short: part of it, then the
	// backend waits for the end.
	web := serveTCP(t, serverTLS(e.pki.server), func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npartial")
		io.Copy(io.Discard, c)
	})
	vClear, vTLS := netip.MustParseAddrPort("10.96.4.5:5432"), netip.MustParseAddrPort("10.96.4.6:5432")
	e.p.Update(buildSnapshot(t, 1,
		service{name: "web", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(web)}},
		service{name: "clear", vip: vClear, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(partial("clear", nil))}},
		service{name: "tls", vip: vTLS, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: tlsPolicy(e),
			Endpoints: endpoints(partial("tls", serverTLS(e.pki.server)))}},
	))
	apps := map[string]net.Conn{}
	for name, dst := range map[string]netip.AddrPort{"clear": vClear, "tls": vTLS} {
		c := e.appConn(t, dst)
		io.WriteString(c, "hello")
		if _, err := io.ReadFull(c, make([]byte, len("partial"))); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		apps[name] = c
	}
	relays := len(apps)
	app := e.appConn(t, vip)
	io.WriteString(app, "GET / HTTP/1.0\r\nHost: web.b.svc\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(app), &http.Request{Method: http.MethodGet})
	if err != nil {
		t.Fatal(err)
	}
	if resp.ContentLength != -1 || len(resp.TransferEncoding) != 0 {
		t.Fatalf("answer framed by length %d, %v; want it to run to the close", resp.ContentLength, resp.TransferEncoding)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, len("partial"))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.p.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown = %v, want it to force the relays", err)
	}
	for name, c := range apps {
		if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s: app read %v, want a reset", name, err)
		}
	}
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("http/1.0 app read %v, want a reset: a clean end completes the cut answer", err)
	}
	for range relays {
		if b := <-backendEnd; !errors.Is(b.err, syscall.ECONNRESET) {
			t.Errorf("%s: backend read %v, want a reset", b.name, b.err)
		}
	}
}

// TestShutdownForcedDialedAfter: a relay whose dial was under way when
// Shutdown forced its way out is reset once dialed, not relayed: started
// after the resets, it went on relaying, and Shutdown waited for it, for
// as long as the app kept its connection (a database client's pool: for
// good).
func TestShutdownForcedDialedAfter(t *testing.T) {
	checkNoLeaks(t)
	g := &gatedDialer{dialing: make(chan struct{}), release: make(chan struct{})}
	e := newEnv(t, envOptions{dialer: func(d dial.Dialer) dial.Dialer { g.d = d; return g }})
	released := false
	release := func() {
		if !released {
			released = true
			close(g.release)
		}
	}
	t.Cleanup(release) // before the env's Shutdown, should the test stop early
	db := netip.MustParseAddrPort("10.96.4.7:5432")
	e.p.Update(buildSnapshot(t, 1, service{name: "db", vip: db, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: endpoints(startTCPEcho(t, nil))}}))
	const msg = "\x00ping\n"
	late := e.appConn(t, db)
	io.WriteString(late, msg)
	<-g.dialing
	// A relay before the Shutdown: its reset says Shutdown forced.
	early := e.appConn(t, db)
	io.WriteString(early, msg)
	if _, err := io.ReadFull(early, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	shut := make(chan error, 1)
	go func() { shut <- e.p.Shutdown(ctx) }()
	if _, err := io.ReadAll(early); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("relay before the Shutdown: app read %v, want a reset", err)
	}
	release()
	select {
	case err := <-shut:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Shutdown = %v, want it to force", err)
		}
	case <-time.After(hangGuard):
		t.Error("Shutdown still waits for a relay dialed after it forced")
		late.Close()
		<-shut
	}
	if _, err := io.ReadAll(late); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("connection dialed after the Shutdown forced: app read %v, want a reset", err)
	}
}

// TestShutdownEndsParked: an HTTP/1.1 keep-alive connection that parked
// (its ServeConn returned when it did) still counts as an active
// connection, and as one of its client's (at a limit of one, the client's
// next connection is reset), is served again, and Shutdown closes it and
// returns without having to force anything.
func TestShutdownEndsParked(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{parkAfter: 20 * time.Millisecond, maxConnsPerClient: 1})
	be := startEcho(t, "tls-0", serverTLS(e.pki.server))
	e.p.Update(buildSnapshot(t, 1, service{name: "web", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(be.addr)}}))
	app := e.appConn(t, vip)
	br := bufio.NewReader(app)
	for i := range 2 {
		fmt.Fprintf(app, "GET /%d HTTP/1.1\r\nHost: web.b.svc\r\n\r\n", i)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("answer %d: %s", i, resp.Status)
		}
		for deadline := time.Now().Add(hangGuard); !parked(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the connection never parked")
			}
		}
		if got := e.counter("sockmesh_proxy_active_connections", map[string]string{"path": "http1"}); got != 1 {
			t.Fatalf("active connections on the fast path, parked: %v, want 1", got)
		}
		if c, err := e.dial(vip); err == nil {
			c.SetDeadline(time.Now().Add(hangGuard))
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: web.b.svc\r\n\r\n")
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil || os.IsTimeout(err) {
				t.Errorf("second connection of a client at its limit of one: %v, %v; want it reset", resp, err)
			}
			c.Close()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := e.p.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with a parked connection: %v", err)
	}
	if n, err := br.ReadByte(); err == nil {
		t.Errorf("parked connection still open after shutdown (read %q)", n)
	}
	if got := e.counter("sockmesh_proxy_active_connections", map[string]string{"path": "http1"}); got != 0 {
		t.Errorf("active connections after shutdown: %v, want 0", got)
	}
}

// parked reports whether an HTTP/1 fast-path connection waits parked, and
// none in ServeConn.
func parked() bool {
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	return strings.Contains(stacks, "httpproxy.(*h1Conn).park(") && !strings.Contains(stacks, "proxy.(*Proxy).ServeConn(")
}

// TestL7NegotiatesH2: on the L7 speed an HTTP/1.1 app's requests to an
// XBackend HTTP backend go out as h2 when the backend offers it (ALPN).
func TestL7NegotiatesH2(t *testing.T) {
	checkNoLeaks(t)
	e := newEnv(t, envOptions{http1TLS: proxy.HTTP1TLSL7})
	be := startEcho(t, "tls-0", serverTLS(e.pki.server))
	e.p.Update(buildSnapshot(t, 1, service{name: "http", vip: vip, backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP, TLS: tlsPolicy(e), Endpoints: endpoints(be.addr)}}))
	code, rep := get(t, e.client(vip, false), "http://http.b.svc/")
	if code != http.StatusOK || rep.Proto != "HTTP/2.0" || rep.TLS == nil || rep.TLS.NegotiatedProtocol != "h2" {
		t.Fatalf("status %d proto %s tls %+v; want h2", code, rep.Proto, rep.TLS)
	}
}

// TestListenConfig: accepted connections carry no TCP keep-alive (four
// setsockopt calls per connection saved; see ListenConfig).
func TestListenConfig(t *testing.T) {
	l, err := proxy.ListenConfig().Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	rc, err := sc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	keepAlive := -1
	rc.Control(func(fd uintptr) {
		keepAlive, err = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
	})
	if err != nil || keepAlive != 0 {
		t.Errorf("SO_KEEPALIVE = %d, %v; want 0", keepAlive, err)
	}
}

// panicDialer panics: a bug on the connection's goroutine.
type panicDialer struct{}

func (panicDialer) Dial(context.Context, snapshot.Endpoint) (net.Conn, error) {
	panic("panicDialer: a bug")
}

// TestPanicContained: a panic while serving one connection resets that
// connection, is counted and logged with its stack, and the proxy goes on
// serving (it used to end the process: the node's proxy, every pod's
// connections).
func TestPanicContained(t *testing.T) {
	checkNoLeaks(t)
	reg := prometheus.NewRegistry()
	logs := &syncbuf.Buffer{}
	p, err := proxy.New(proxy.Config{Dialer: panicDialer{}}, slog.New(slog.NewJSONHandler(logs, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	vTCP, vHTTP := netip.MustParseAddrPort("10.96.6.1:5432"), netip.MustParseAddrPort("10.96.6.2:80")
	ep := endpoints(netip.MustParseAddrPort("10.0.0.1:5432"))
	p.Update(buildSnapshot(t, 1,
		service{name: "db", vip: vTCP, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, Endpoints: ep}},
		service{name: "web", vip: vHTTP, backend: snapshot.Backend{Endpoints: ep}},
	))
	for i, tc := range []struct {
		vip   netip.AddrPort
		hello string
	}{{vTCP, "\x00binary protocol hello"}, {vHTTP, "GET / HTTP/1.1\r\nHost: web\r\n\r\n"}, {vTCP, "\x00again"}} {
		c, s := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.ServeConn(s, tc.vip, proxy.Client{})
		}()
		c.Write([]byte(tc.hello))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Errorf("connection %d: read = %d, %v; want it closed", i, n, err)
		}
		c.Close()
		<-done
		if got := metricsum.Sum(t, reg, "sockmesh_proxy_panics_total", nil); got != float64(i+1) {
			t.Errorf("after connection %d: panics = %v, want %d", i, got, i+1)
		}
	}
	if l := logs.String(); !strings.Contains(l, "panic recovered") || !strings.Contains(l, "panicDialer") ||
		strings.Count(l, "panic recovered") != 1 {
		t.Errorf("want one error line with the panic and its stack (the others held back):\n%s", l)
	}
}

// refusedThenPanic refuses every other dial and panics on the others.
type refusedThenPanic struct{ n *atomic.Int32 }

func (d refusedThenPanic) Dial(context.Context, snapshot.Endpoint) (net.Conn, error) {
	if d.n.Add(1)%2 == 1 {
		return nil, syscall.ECONNREFUSED
	}
	panic("refusedThenPanic: a bug")
}

// TestPanicAfterHandOff: a panic in what a connection was handed to — here
// the fast path, which answers an HTTP client whose relay's dial was
// refused (its first request with that refusal, 503), and whose own dial
// for the next request panics — ends the connection once. The
// connection's end ran twice on the code before (the fast path's, then
// ServeConn's), and the second ended the process ("sync: negative
// WaitGroup counter"); a client's count left twice would let it past
// --max-conns-per-pod.
func TestPanicAfterHandOff(t *testing.T) {
	checkNoLeaks(t)
	reg := prometheus.NewRegistry()
	p, err := proxy.New(proxy.Config{Dialer: refusedThenPanic{new(atomic.Int32)}, MaxConnsPerClient: 1},
		slog.New(slog.NewJSONHandler(io.Discard, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	v := netip.MustParseAddrPort("10.96.6.2:80")
	p.Update(buildSnapshot(t, 1, service{name: "web", vip: v, backend: snapshot.Backend{Endpoints: endpoints(netip.MustParseAddrPort("10.0.0.1:80"))}}))
	client := proxy.Client{Addr: netip.MustParseAddrPort("10.0.9.9:40000")}
	for i := range 3 {
		c, s := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.ServeConn(s, v, client)
		}()
		go c.Write([]byte("GET / HTTP/1.1\r\nHost: web\r\n\r\nGET / HTTP/1.1\r\nHost: web\r\n\r\n"))
		if got, _ := io.ReadAll(c); strings.Count(string(got), "HTTP/1.1 ") != 1 || !strings.HasPrefix(string(got), "HTTP/1.1 503") {
			t.Errorf("connection %d: read %q; want one 503, then the connection closed", i, got)
		}
		c.Close()
		<-done
		if got := metricsum.Sum(t, reg, "sockmesh_proxy_panics_total", nil); got != float64(i+1) {
			t.Errorf("after connection %d: panics = %v, want %d", i, got, i+1)
		}
	}
	// The client's one allowed connection is free again, once: of two
	// connections held open, one waits to be sniffed and the other is
	// reset at once, over the limit.
	var held [2]net.Conn
	ended := make(chan int, 2)
	for i := range held {
		c, s := net.Pipe()
		held[i] = c
		go func() {
			p.ServeConn(s, v, client)
			ended <- i
		}()
	}
	over := <-ended
	if n, err := held[over].Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("connection over the limit: read = %d, %v; want it reset", n, err)
	}
	select {
	case i := <-ended:
		t.Errorf("both held connections ended (%d too): the client's count is off", i)
	default:
	}
	held[0].Close()
	held[1].Close()
	<-ended
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v; want every connection's end counted once", err)
	}
}
