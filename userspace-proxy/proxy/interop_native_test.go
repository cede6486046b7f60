package proxy_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// Interop with HTTP implementations other than Go's, as production meets
// them: curl (libcurl, nghttp2), nghttp and Node.js as apps, nginx and
// nghttpd as backends, all from Debian (.ci/run installs them). Go's client talking to
// Go's server through a Go proxy shares one HTTP/2 implementation on every
// side; these catch what only another one exposes.

// nginxReport is what the nginx backend answers at /report: how it saw the
// request, one field per '|': version, SNI, ALPN, authority, method, URI,
// client certificate, TLS version; at /tls, the TLS version, cipher suite
// and curve.
const nginxReport = `location = /report { return 200 "$server_protocol|$ssl_server_name|$ssl_alpn_protocol|$host|$request_method|$request_uri|$ssl_client_s_dn|$ssl_protocol\n"; }
location = /tls { return 200 "$ssl_protocol $ssl_cipher $ssl_curve\n"; }`

// TestInteropNative: the proxy's HTTP rows with non-Go apps and backends:
// what the backend saw (version, SNI, ALPN, authority, client certificate,
// TLS version, suite, curve), failing closed on TLS options the backend
// lacks, an app's own TLS passed through, byte-exact large downloads and
// uploads (chunked too), backends that close connections early, and
// answers that come before the request body ends. HTTP/1.x apps take both
// of their paths: the fast path (the default) and net/http's server and
// Transport (HTTP1TLSL7).
func TestInteropNative(t *testing.T) {
	for name, http1 := range map[string]proxy.HTTP1TLSPath{"http1-default": proxy.HTTP1TLSAuto, "http1-nethttp": proxy.HTTP1TLSL7} {
		t.Run(name, func(t *testing.T) { interopNative(t, http1) })
	}
}

func interopNative(t *testing.T, http1 proxy.HTTP1TLSPath) {
	curl, nghttp := nativeTool(t, "curl"), nativeTool(t, "nghttp")
	checkNoLeaks(t)
	e := newEnv(t, envOptions{http1TLS: http1})
	www := t.TempDir()
	blob := make([]byte, 4<<20+123)
	rand.Read(blob)
	if err := os.WriteFile(filepath.Join(www, "blob"), blob, 0o644); err != nil {
		t.Fatal(err)
	}
	ngx := startNginx(t, e, www)
	h2TLS := startNghttpd(t, e, www, true)
	h2c := startNghttpd(t, e, www, false)

	mutual := tlsPolicy(e)
	mutual.Mode = snapshot.TLSMutual
	mutual.ClientCertificatePEM, mutual.ClientKeyPEM = string(e.pki.client.CertPEM), string(e.pki.client.KeyPEM)
	tls13 := tlsPolicy(e)
	tls13.MinVersion = tls.VersionTLS13
	// The legacy server offers one TLS 1.2 suite and one key exchange
	// curve; policies naming them (TLS options) reach it, policies naming
	// others do not. P-256 is always listed: in TLS 1.2 the curves also
	// admit the server's ECDSA certificate, which is on P-256.
	legacy := func(suite uint16, curve tls.CurveID) *snapshot.TLS {
		p := tlsPolicy(e)
		p.CipherSuites = []uint16{suite, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305}
		p.Curves = []tls.CurveID{curve, tls.CurveP256}
		return p
	}
	svcs := []service{
		{name: "web", backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(ngx.both)}},
		{name: "web-h1", backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(ngx.h1)}},
		{name: "web-mtls", backend: snapshot.Backend{TLS: mutual, Endpoints: endpoints(ngx.mutual)}},
		{name: "web-tls12", backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(ngx.tls12)}},
		{name: "web-tls12-want13", backend: snapshot.Backend{TLS: tls13, Endpoints: endpoints(ngx.tls12)}},
		{name: "legacy", backend: snapshot.Backend{TLS: legacy(tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.CurveP384), Endpoints: endpoints(ngx.legacy)}},
		{name: "legacy-suite", backend: snapshot.Backend{TLS: legacy(tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.CurveP384), Endpoints: endpoints(ngx.legacy)}},
		{name: "legacy-curve", backend: snapshot.Backend{TLS: legacy(tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.X25519), Endpoints: endpoints(ngx.legacy)}},
		{name: "brief", backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(ngx.brief)}},
		{name: "h2-tls", backend: snapshot.Backend{Protocol: snapshot.ProtocolHTTP2, TLS: tlsPolicy(e), Endpoints: endpoints(h2TLS)}},
		{name: "h2c", backend: snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(h2c)}},
	}
	addr := map[string]string{}
	for i := range svcs {
		svcs[i].vip = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 6, byte(i + 1)}), 80)
		addr[svcs[i].name] = e.listenFor(svcs[i].vip)
	}
	e.p.Update(buildSnapshot(t, 1, svcs...))

	// app is how a client is started: curl over HTTP/1.1 or h2c (prior
	// knowledge), or nghttp (h2c, prior knowledge).
	type app struct {
		name string
		run  func(t *testing.T, svc, path string, extra ...string) []byte
	}
	// curlArgs are a curl request's options: connect to svc's listener,
	// speak HTTP/1.1 or h2c. curl's --next forgets them for the next URL.
	curlArgs := func(h2c bool, svc string) []string {
		args := []string{"-sS", "--fail-with-body", "--max-time", "60", "--connect-to", "::" + addr[svc]}
		if h2c {
			return append(args, "--http2-prior-knowledge")
		}
		return append(args, "--http1.1")
	}
	curlApp := func(h2c bool, more ...string) func(t *testing.T, svc, path string, extra ...string) []byte {
		return func(t *testing.T, svc, path string, extra ...string) []byte {
			args := append(append(append(curlArgs(h2c, svc), more...), extra...), "http://"+svc+".b.svc"+path)
			return runTool(t, curl, args...)
		}
	}
	nghttpApp := func(t *testing.T, svc, path string, extra ...string) []byte {
		args := append([]string{"-H", ":authority: " + svc + ".b.svc", "-t", "60"}, extra...)
		return runTool(t, nghttp, append(args, "http://"+addr[svc]+path)...)
	}
	h1, curlH2C, nghttpH2C := app{"curl-http1.1", curlApp(false)}, app{"curl-h2c", curlApp(true)}, app{"nghttp-h2c", nghttpApp}
	h10 := app{"curl-http1.0", curlApp(false, "--http1.0")} // answers without chunks or keep-alive
	// curl --http2 on http:// asks for Upgrade: h2c, which the proxy
	// declines (the request goes on as HTTP/1.1).
	h2cUpgrade := app{"curl-upgrade-h2c", curlApp(false, "--http2")}
	// nghttp with 4 KiB stream and 16 KiB connection windows: the proxy's
	// HTTP/2 must wait for WINDOW_UPDATEs, not overrun or stall.
	smallWindow := app{"nghttp-h2c-small-window", func(t *testing.T, svc, path string, extra ...string) []byte {
		return nghttpApp(t, svc, path, append([]string{"-w", "12", "-W", "14"}, extra...)...)
	}}

	// What nginx saw (nginxReport).
	for _, c := range []struct {
		app  app
		svc  string
		want string
	}{
		{h1, "web", "HTTP/1.1|echo.test|http/1.1|web.b.svc|GET|/report?q=1||TLSv1.3"},
		{h10, "web", "HTTP/1.1|echo.test|http/1.1|web.b.svc|GET|/report?q=1||TLSv1.3"},
		{h2cUpgrade, "web", "HTTP/1.1|echo.test|http/1.1|web.b.svc|GET|/report?q=1||TLSv1.3"},
		{curlH2C, "web", "HTTP/2.0|echo.test|h2|web.b.svc|GET|/report?q=1||TLSv1.3"},
		{nghttpH2C, "web", "HTTP/2.0|echo.test|h2|web.b.svc|GET|/report?q=1||TLSv1.3"},
		// An HTTP/1.1-only backend: the h2c apps' requests are translated.
		{h1, "web-h1", "HTTP/1.1|echo.test|http/1.1|web-h1.b.svc|GET|/report?q=1||TLSv1.3"},
		{curlH2C, "web-h1", "HTTP/1.1|echo.test|http/1.1|web-h1.b.svc|GET|/report?q=1||TLSv1.3"},
		{nghttpH2C, "web-h1", "HTTP/1.1|echo.test|http/1.1|web-h1.b.svc|GET|/report?q=1||TLSv1.3"},
		{h1, "web-mtls", "HTTP/1.1|echo.test|http/1.1|web-mtls.b.svc|GET|/report?q=1|CN=sockmesh-proxy|TLSv1.3"},
		{curlH2C, "web-mtls", "HTTP/2.0|echo.test|h2|web-mtls.b.svc|GET|/report?q=1|CN=sockmesh-proxy|TLSv1.3"},
		{h1, "web-tls12", "HTTP/1.1|echo.test|http/1.1|web-tls12.b.svc|GET|/report?q=1||TLSv1.2"},
		{curlH2C, "web-tls12", "HTTP/2.0|echo.test|h2|web-tls12.b.svc|GET|/report?q=1||TLSv1.2"},
	} {
		t.Run(fmt.Sprintf("report/%s/%s", c.app.name, c.svc), func(t *testing.T) {
			if got := strings.TrimSpace(string(c.app.run(t, c.svc, "/report?q=1"))); got != c.want {
				t.Errorf("nginx saw %q, want %q", got, c.want)
			}
		})
	}

	// The TLS options reach OpenSSL as set: the legacy server's suite and
	// curve when the policy names them.
	t.Run("tls-options", func(t *testing.T) {
		if got, want := strings.TrimSpace(string(h1.run(t, "legacy", "/tls"))), "TLSv1.2 ECDHE-ECDSA-AES128-GCM-SHA256 secp384r1"; got != want {
			t.Errorf("nginx negotiated %q, want %q", got, want)
		}
	})
	// A policy whose TLS version, suites or curves the backend lacks fails
	// closed, with a 502 naming the reason, for HTTP/1.1 and h2c apps.
	for _, svc := range []string{"web-tls12-want13", "legacy-suite", "legacy-curve"} {
		url := "http://" + svc + ".b.svc/report"
		for name, cmd := range map[string]*exec.Cmd{
			h1.name:        exec.Command(curl, append(curlArgs(false, svc), "-w", "%{http_code}", url)...),
			curlH2C.name:   exec.Command(curl, append(curlArgs(true, svc), "-w", "%{http_code}", url)...),
			nghttpH2C.name: exec.Command(nghttp, "-v", "-t", "60", "http://"+addr[svc]+"/report"),
		} {
			t.Run(fmt.Sprintf("fail-closed/%s/%s", name, svc), func(t *testing.T) {
				out, _ := cmd.Output() // curl fails on a 502
				if !bytes.Contains(out, []byte("sockmesh: tls_handshake")) || !bytes.Contains(out, []byte("502")) || bytes.Contains(out, []byte("|GET|")) {
					t.Errorf("want a 502 naming tls_handshake; got:\n%s", out)
				}
			})
		}
	}

	// An app that speaks TLS itself (curl, OpenSSL, h2 by ALPN) is passed
	// through: nginx sees curl's own SNI, ALPN and TLS version (TLS inside
	// TLS would fail the handshake).
	t.Run("passthrough/curl-https", func(t *testing.T) {
		ca, err := e.pki.ca.WriteFile(t.TempDir(), "ca")
		if err != nil {
			t.Fatal(err)
		}
		out := runTool(t, curl, "-sS", "--fail-with-body", "--max-time", "60", "--cacert", ca, "--connect-to", "::"+addr["web-tls12"],
			"https://"+sniName+"/report")
		if got, want := strings.TrimSpace(string(out)), "HTTP/2.0|echo.test|h2|echo.test|GET|/report||TLSv1.2"; got != want {
			t.Errorf("nginx saw %q, want %q", got, want)
		}
	})

	// A 4 MiB download from nginx and nghttpd, and a 4 MiB upload echoed
	// by nghttpd, byte for byte, on every wire.
	upload := filepath.Join(t.TempDir(), "upload")
	if err := os.WriteFile(upload, blob, 0o600); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(blob)
	for _, a := range []app{h1, curlH2C, nghttpH2C, h10, smallWindow, h2cUpgrade} {
		for _, svc := range []string{"web", "web-h1", "h2-tls", "h2c"} {
			t.Run(fmt.Sprintf("download/%s/%s", a.name, svc), func(t *testing.T) {
				checkBlob(t, a.run(t, svc, "/blob"), want)
			})
		}
		if a.name == h10.name || a.name == smallWindow.name || a.name == h2cUpgrade.name {
			continue
		}
		for _, svc := range []string{"h2-tls", "h2c"} {
			t.Run(fmt.Sprintf("upload/%s/%s", a.name, svc), func(t *testing.T) {
				extra := []string{"--data-binary", "@" + upload}
				if a.name == nghttpH2C.name {
					extra = []string{"-d", upload}
				}
				checkBlob(t, a.run(t, svc, "/echo", extra...), want)
			})
			if a.name == h1.name {
				t.Run(fmt.Sprintf("upload-chunked/%s/%s", a.name, svc), func(t *testing.T) {
					checkBlob(t, a.run(t, svc, "/echo", "-H", "Transfer-Encoding: chunked", "--data-binary", "@"+upload), want)
				})
			}
		}
	}

	// A backend that closes its connections after 3 requests, or 200 ms
	// idle: the pooled connections it closed are never used again, and no
	// request fails for it — not a burst of ten on one app connection, nor
	// a GET or POST (which cannot be sent twice) after the backend closed
	// the idle connection it would have taken. (No curl h2c burst: curl
	// 7.88 sends no second request on an h2c connection, nghttpd's either.)
	for _, a := range []app{h1, nghttpH2C} {
		t.Run("backend-closes/burst/"+a.name, func(t *testing.T) {
			var more []string
			for i := range 9 {
				if a.name == nghttpH2C.name {
					more = append(more, fmt.Sprintf("http://%s/report?%d", addr["brief"], i))
				} else {
					more = append(more, fmt.Sprintf("http://brief.b.svc/report?%d", i))
				}
			}
			out := a.run(t, "brief", "/report?last", more...)
			if n := bytes.Count(out, []byte("|GET|/report?")); n != 10 {
				t.Errorf("%d of 10 answered:\n%s", n, out)
			}
		})
	}
	// 100 concurrent streams on one h2c connection, each to its own
	// request to the HTTP/1.1 backend (the translating path's pool opens
	// what it needs), and relayed to nginx's h2.
	for _, svc := range []string{"web-h1", "web"} {
		t.Run("concurrent-streams/nghttp-h2c/"+svc, func(t *testing.T) {
			var more []string
			for i := range 99 {
				more = append(more, fmt.Sprintf("http://%s/report?%d", addr[svc], i))
			}
			out := nghttpApp(t, svc, "/report?last", more...) // nghttp sends them all at once
			if n := bytes.Count(out, []byte("|GET|/report?")); n != 100 {
				t.Errorf("%d of 100 answered:\n%.2000s", n, out)
			}
		})
	}
	for _, a := range []app{h1, curlH2C, nghttpH2C} {
		for _, post := range []bool{false, true} {
			t.Run(fmt.Sprintf("backend-closes/idle/%s/post=%v", a.name, post), func(t *testing.T) {
				var extra []string
				if post {
					extra = []string{"--data-binary", "x"}
					if a.name == nghttpH2C.name {
						extra = []string{"-d", upload}
					}
				}
				for i := range 2 {
					if i > 0 {
						time.Sleep(500 * time.Millisecond) // nginx closes what idles for 200 ms
					}
					if out := a.run(t, "brief", "/report", extra...); !bytes.Contains(out, []byte("|/report|")) {
						t.Fatalf("request %d: %s", i, out)
					}
				}
			})
		}
	}

	// nginx answers a POST at once, discarding its body. An HTTP/1.1 app
	// then sends another request: on the same connection, or on a new one
	// when the answer said the connection closes (an answer that starts
	// before the request body was read whole does) — never on one that
	// closes unannounced. h2 apps get the early answer and the stream's
	// end (RST_STREAM NO_ERROR, RFC 9113 §8.1) on a connection that goes
	// on serving (nghttp: curl 7.88 takes that reset for an error).
	for _, svc := range []string{"web", "web-h1"} {
		t.Run("early-answer/curl-http1.1/"+svc, func(t *testing.T) {
			args := append(curlArgs(false, svc), "-i", "--data-binary", "@"+upload, "-w", "connects=%{num_connects}\n",
				"http://"+svc+".b.svc/report", "--next")
			args = append(append(args, curlArgs(false, svc)...), "-w", "connects=%{num_connects}\n", "http://"+svc+".b.svc/report?second")
			out := runTool(t, curl, args...)
			reused := bytes.HasSuffix(out, []byte("connects=0\n"))
			told := bytes.Contains(bytes.ToLower(out), []byte("\nconnection: close\r\n"))
			if !bytes.Contains(out, []byte("|POST|/report|")) || !bytes.Contains(out, []byte("|GET|/report?second|")) || !reused && !told {
				t.Errorf("want a POST, then a GET on the same connection or on a new one after Connection: close; curl printed:\n%s", out)
			}
		})
		t.Run("early-answer/nghttp-h2c/"+svc, func(t *testing.T) {
			out := nghttpApp(t, svc, "/report", "-d", upload, "http://"+addr[svc]+"/report?second")
			if !bytes.Contains(out, []byte("|POST|/report|")) || !bytes.Contains(out, []byte("|POST|/report?second|")) {
				t.Errorf("want two POSTs answered on one connection; nghttp printed:\n%s", out)
			}
		})
	}
}

// checkBlob compares got with the digest want.
func checkBlob(t *testing.T, got []byte, want [32]byte) {
	t.Helper()
	if sum := sha256.Sum256(got); sum != want {
		t.Errorf("got %d bytes, sha256 %s; want sha256 %s", len(got), hex.EncodeToString(sum[:8]), hex.EncodeToString(want[:8]))
	}
}

// nativeTool returns the path of a Debian tool the interop tests drive, or
// skips (fails in CI, which installs it) without it.
func nativeTool(t *testing.T, bin string) string {
	t.Helper()
	p, err := exec.LookPath(bin)
	if err != nil {
		testenv.SkipOrFail(t, "%s not installed (apt-get install curl nghttp2-client nghttp2-server nginx-light)", bin)
	}
	return p
}

// runTool runs a client to completion and returns its standard output.
func runTool(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes()
}

// listenFor returns the address of a listener whose every connection the
// proxy serves as redirected to dst: for apps the test does not dial
// itself.
func (e *env) listenFor(dst netip.AddrPort) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	// Not tcpserve: ServeConn may return while the connection goes on
	// (a relay, a parked connection); the proxy's Shutdown ends those.
	e.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go e.p.ServeConn(c, dst, proxy.Client{Addr: c.RemoteAddr().(*net.TCPAddr).AddrPort()})
		}
	}()
	return ln.Addr().String()
}

// nginxBackend is Debian's nginx serving TLS (the test PKI's server
// certificate) on six addresses.
type nginxBackend struct {
	both   netip.AddrPort // HTTP/1.1 and h2 by ALPN
	h1     netip.AddrPort // HTTP/1.1 only
	mutual netip.AddrPort // h2 and HTTP/1.1, client certificate required
	tls12  netip.AddrPort // h2 and HTTP/1.1, TLS 1.2 only
	legacy netip.AddrPort // TLS 1.2 with one suite and one curve (P-384)
	// brief is HTTP/1.1 only and keeps a connection for 3 requests or
	// 200 ms idle, as backends with short keep-alive limits do.
	brief netip.AddrPort
}

// startNginx runs nginx in the foreground with files under www and the
// nginxReport location. Its listening sockets are the test's own, passed
// as nginx passes them to a new binary (the NGINX variable), so no port
// is picked and hoped free.
func startNginx(t *testing.T, e *env, www string) *nginxBackend {
	bin := nativeTool(t, "nginx")
	dir := t.TempDir()
	cert, key, err := e.pki.server.WriteFiles(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := e.pki.ca.WriteFile(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	var files []*os.File
	var addrs []netip.AddrPort
	for range 6 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		f, err := ln.(*net.TCPListener).File()
		ln.Close() // f keeps the socket
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		addrs = append(addrs, ln.Addr().(*net.TCPAddr).AddrPort())
	}
	user := "" // workers read www, under the test's private temp directory
	if os.Geteuid() == 0 {
		user = "user root;"
	}
	conf := fmt.Sprintf(`%[1]s
worker_processes 1;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %[2]s/body; proxy_temp_path %[2]s/proxy; fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi; scgi_temp_path %[2]s/scgi;
  client_max_body_size 64m;
  ssl_certificate %[3]s; ssl_certificate_key %[4]s; ssl_protocols TLSv1.2 TLSv1.3;
  root %[6]s;
  server { listen %[7]s ssl http2; %[8]s }
  server { listen %[9]s ssl; %[8]s }
  server { listen %[10]s ssl http2; ssl_verify_client on; ssl_client_certificate %[5]s; %[8]s }
  server { listen %[11]s ssl http2; ssl_protocols TLSv1.2; %[8]s }
  server { listen %[12]s ssl; ssl_protocols TLSv1.2; ssl_ciphers ECDHE-ECDSA-AES128-GCM-SHA256; ssl_ecdh_curve secp384r1; %[8]s }
  server { listen %[13]s ssl; keepalive_requests 3; keepalive_timeout 200ms; %[8]s }
}
`, user, dir, cert, key, ca, www, addrs[0], nginxReport, addrs[1], addrs[2], addrs[3], addrs[4], addrs[5])
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-g", "daemon off;")
	cmd.ExtraFiles = files
	cmd.Env = append(os.Environ(), "NGINX=3;4;5;6;7;8;")
	startProcess(t, cmd, filepath.Join(dir, "error.log"), addrs...)
	for _, f := range files {
		f.Close()
	}
	return &nginxBackend{both: addrs[0], h1: addrs[1], mutual: addrs[2], tls12: addrs[3], legacy: addrs[4], brief: addrs[5]}
}

// startNghttpd runs nghttp2's server on docroot www: HTTP/2 only, over TLS
// (ALPN h2) or cleartext with prior knowledge, with options extra; it
// echoes POST bodies.
// nghttpd cannot take a listening socket, so it gets a port that was free
// a moment ago, and another should that one have been taken since.
func startNghttpd(t *testing.T, e *env, www string, useTLS bool, extra ...string) netip.AddrPort {
	bin := nativeTool(t, "nghttpd")
	dir := t.TempDir()
	cert, key, err := e.pki.server.WriteFiles(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		addr := closedPort(t)
		args := append(extra, "-a", addr.Addr().String(), "-d", www, "--echo-upload", fmt.Sprint(addr.Port()))
		if useTLS {
			args = append(args, key, cert)
		} else {
			args = append([]string{"--no-tls"}, args...)
		}
		if started(t, exec.Command(bin, args...), filepath.Join(dir, "nghttpd.log"), addr) {
			return addr
		}
		if attempt == 2 {
			t.Fatalf("nghttpd exited at once, three times (log below)")
		}
	}
}

// startProcess starts cmd, its output to log, and waits until it accepts
// connections at addrs; the test's cleanup ends it.
func startProcess(t *testing.T, cmd *exec.Cmd, log string, addrs ...netip.AddrPort) {
	t.Helper()
	if !started(t, cmd, log, addrs...) {
		t.Fatalf("%s did not start", cmd.Path)
	}
}

// started runs cmd as startProcess does and reports whether it came up; a
// process that exits first is reported (false), one that neither exits
// nor listens within 10 s fails t.
func started(t *testing.T, cmd *exec.Cmd, log string, addrs ...netip.AddrPort) bool {
	t.Helper()
	out, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	// A process group of its own, ended whole: nginx's workers outlive a
	// master killed alone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(log)
			t.Logf("%s log:\n%s", filepath.Base(cmd.Path), b)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for _, a := range addrs {
		for {
			c, err := net.DialTimeout("tcp", a.String(), time.Second)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-exited:
				return false
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is not listening on %s after 10s", filepath.Base(cmd.Path), a)
			}
		}
	}
	return true
}

// TestInteropNode: Node's HTTP/1.1 client parses answers with llhttp,
// stricter than Go's and curl's parsers. On one keep-alive connection it
// reads every kind of answer the proxy writes for HTTP/1.1 apps — with a
// length, to HEAD, 204, 304, streamed, after a chunked upload, large —
// from the fast path over TLS, through a route, and translated from an
// h2c backend's answers.
func TestInteropNode(t *testing.T) {
	node := nativeTool(t, "node")
	checkNoLeaks(t)
	e := newEnv(t, envOptions{})
	m := &mesh{t: t}
	tlsRef := m.backend("echo-tls", snapshot.Backend{TLS: tlsPolicy(e), Endpoints: endpoints(startEcho(t, "echo-tls-0", serverTLS(e.pki.server)).addr)})
	h2cRef := m.backend("echo-h2c", snapshot.Backend{Protocol: snapshot.ProtocolH2C, Endpoints: endpoints(startEcho(t, "echo-h2c-0", nil).addr)})
	vips := map[string]netip.AddrPort{}
	front := func(name string, own snapshot.BackendRef, rt *snapshot.RouteTable) {
		vips[name] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 9, byte(len(vips) + 1)}), 80)
		m.frontend(name, vips[name], own, rt)
	}
	front("echo-tls", tlsRef, nil)
	front("echo-routed", tlsRef, producer(routeSet(snapshot.KindHTTPRoute, rule{[]snapshot.RouteMatch{prefixMatch("/")}, snapshot.RouteRule{Backends: to(tlsRef)}})))
	front("echo-h2c", h2cRef, nil)
	e.p.Update(m.snapshot(1))
	for svc, dst := range vips {
		t.Run(svc, func(t *testing.T) {
			out := runTool(t, node, filepath.Join("testdata", "interop.js"), e.listenFor(dst), svc+".b.svc")
			var r struct {
				Exchanges []struct {
					Method, Path, Body, Error string
					Status, Bytes             int
				}
				Connections int
			}
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("node printed %q: %v", out, err)
			}
			want := []struct {
				status int
				check  func(bytes int, body string) bool
			}{
				{200, func(n int, _ string) bool { return n == 100 }},
				{200, func(n int, _ string) bool { return n == 0 }}, // HEAD
				{204, func(n int, _ string) bool { return n == 0 }},
				{304, func(n int, _ string) bool { return n == 0 }},
				{200, func(_ int, b string) bool { return strings.Contains(b, "id: 2\n") }},
				{200, func(_ int, b string) bool { return strings.Contains(b, `"bodyBytes":300000`) }},
				{200, func(n int, _ string) bool { return n == 65536 }},
			}
			if len(r.Exchanges) != len(want) || r.Connections != 1 {
				t.Fatalf("%d exchanges on %d connections, want %d on 1: %+v", len(r.Exchanges), r.Connections, len(want), r.Exchanges)
			}
			for i, x := range r.Exchanges {
				if x.Status != want[i].status || !want[i].check(x.Bytes, x.Body) {
					t.Errorf("%s %s: status %d, %d bytes %.200q", x.Method, x.Path, x.Status, x.Bytes, x.Body)
				}
			}
		})
	}
}

// TestInteropGoAwayMidStream: nghttp2's clients — curl and nghttp — read
// the GOAWAY the proxy slips in between the frames of a relayed
// connection's event stream (its endpoint stopped being ready while the
// stream was on) and carry the stream to its end: the frame goes where
// a strict HTTP/2 implementation accepts it.
func TestInteropGoAwayMidStream(t *testing.T) {
	const path, events = "/sse?n=40&interval=25ms", 40
	for _, tool := range []string{"curl", "nghttp"} {
		t.Run(tool, func(t *testing.T) {
			bin := nativeTool(t, tool)
			checkNoLeaks(t)
			e := newEnv(t, envOptions{})
			old, next := startEcho(t, "web-old", serverTLS(e.pki.server)), startEcho(t, "web-new", serverTLS(e.pki.server))
			vip := netip.MustParseAddrPort("10.96.9.6:80")
			update := func(version uint64, eps []snapshot.Endpoint) {
				e.p.Update(buildSnapshot(t, version, service{name: "web", vip: vip, backend: snapshot.Backend{TLS: tlsPolicy(e), Endpoints: eps}}))
			}
			update(1, endpoints(old.addr))
			addr := e.listenFor(vip)
			args := []string{"-sS", "--max-time", "60", "--connect-to", "::" + addr, "--http2-prior-knowledge", "http://web.b.svc" + path}
			if tool == "nghttp" {
				args = []string{"-v", "-H", ":authority: web.b.svc", "-t", "60", "http://" + addr + path}
			}
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bin, args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			for deadline := time.Now().Add(10 * time.Second); e.counter("sockmesh_proxy_active_connections", map[string]string{"path": "l4_tls"}) != 1; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					t.Fatalf("%s's connection never relayed", tool)
				}
			}
			time.Sleep(200 * time.Millisecond) // the request is on its way; the stream has 800 ms to go
			update(2, replaced(old.addr, next.addr))
			if err := <-done; err != nil {
				t.Fatalf("%s: %v\n%s%s", tool, err, stdout.Bytes(), stderr.Bytes())
			}
			out := stdout.String()
			if n := strings.Count(out, "data: {"); n != events {
				t.Errorf("%s read %d of %d events:\n%s", tool, n, events, out)
			}
			if tool == "nghttp" && !strings.Contains(out, "last_stream_id=2147483647") {
				t.Errorf("nghttp saw no GOAWAY:\n%s", out)
			}
			if got := e.counter("sockmesh_proxy_goaways_total", map[string]string{"reason": "endpoint_gone"}); got != 1 {
				t.Errorf("goaways counted %v, want 1", got)
			}
		})
	}
}
