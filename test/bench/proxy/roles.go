package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath/takeover"
	"github.com/sockmesh/sockmesh/internal/gcfloor"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

const (
	backendAddr = "127.0.0.1:8443"
	versusH1    = "127.0.0.1:8081" // target c's listener for HTTP/1.1 clients
	versusH2C   = "127.0.0.1:8082" // and for h2c clients
	sni         = "echo.test"
)

// runBackend serves the echo backend over TLS 1.3 with X25519 only, so Go
// clients (which would pick X25519MLKEM768) and OpenSSL ones compare alike.
func runBackend(dir string) error {
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"))
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", backendAddr)
	if err != nil {
		return err
	}
	s := echo.New(echo.Config{Pod: "bench", TLS: &tls.Config{
		Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS13,
		CurvePreferences: []tls.CurveID{tls.X25519},
	}})
	go waitSignal(func() { s.Close() })
	return ignoreClosed(s.Serve(l))
}

// nginxBackendConf is Debian's nginx as the backend (-backend nginx): the
// echo backend's /bytes/{n} answers as static files, on the same address,
// certificate and TLS settings, with h2 and http/1.1 offered in ALPN. Its
// HTTP/2 costs about what its HTTP/1.1 does, where Go's costs 1.5–1.75×;
// it separates what a proxy costs from what the h2 it keeps to the backend
// costs the backend.
const nginxBackendConf = `worker_processes 2;
user root; # its workers read files from the run's private directory
pid %[1]s/backend/nginx.pid;
error_log %[1]s/backend/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/backend/body;
  proxy_temp_path %[1]s/backend/proxy;
  fastcgi_temp_path %[1]s/backend/fastcgi;
  uwsgi_temp_path %[1]s/backend/uwsgi;
  scgi_temp_path %[1]s/backend/scgi;
  keepalive_requests 1000000;
  default_type application/octet-stream;
  open_file_cache max=16;
  server {
    listen %[2]s ssl http2;
    ssl_certificate %[1]s/server.crt;
    ssl_certificate_key %[1]s/server.key;
    ssl_protocols TLSv1.3;
    ssl_ecdh_curve X25519;
    root %[1]s/backend/www;
  }
}
`

// startNginxBackend writes nginxBackendConf and the files it serves under
// dir/backend, and starts it.
func startNginxBackend(dir string, start func(*exec.Cmd) (*exec.Cmd, error)) (*exec.Cmd, error) {
	www := filepath.Join(dir, "backend", "www", "bytes")
	if err := os.MkdirAll(www, 0o755); err != nil {
		return nil, err
	}
	for _, n := range []int{100, 65536} {
		if err := os.WriteFile(filepath.Join(www, strconv.Itoa(n)), bytes.Repeat([]byte("x"), n), 0o644); err != nil {
			return nil, err
		}
	}
	conf := filepath.Join(dir, "backend", "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxBackendConf, dir, backendAddr), 0o600); err != nil {
		return nil, err
	}
	return start(exec.Command("/usr/sbin/nginx", "-p", filepath.Join(dir, "backend"), "-c", conf, "-g", "daemon off;"))
}

// runProxy runs sockmesh's proxy the way the agent will: a Config, a
// snapshot capturing the Service at vip:80, Serve on the node listener.
func runProxy(dir, mode, listen, vip, curves, profile string) error {
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	// As the agent: a GC heap floor, gcfloor.Default unless
	// SOCKMESH_GC_HEAP_FLOOR (bytes) says otherwise, for A/B runs.
	floor := uint64(gcfloor.Default)
	if v := os.Getenv("SOCKMESH_GC_HEAP_FLOOR"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("SOCKMESH_GC_HEAP_FLOOR: %w", err)
		}
		floor = n
	}
	defer gcfloor.Start(floor)()
	// -idle reads resident memory: SIGUSR1 collects, and returns what is
	// free to the system, as the GC and its scavenger would in minutes.
	// Twice: what sits in a sync.Pool (the buffers the last requests gave
	// back) outlives one collection, in the pool's victim cache, and is
	// freed by the next — within minutes, by the runtime's forced
	// collection every two.
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			debug.FreeOSMemory() // collects first
			debug.FreeOSMemory()
		}
	}()
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return err
	}
	var cfg proxy.Config
	protocol := snapshot.ProtocolAuto
	switch mode {
	case "pooled":
		cfg.HTTP1TLS = proxy.HTTP1TLSPooled
	case "http11":
		// The backend declared HTTP/1.1 (XBackend HTTP11): HTTP/2 apps
		// take net/http's h2c server and an HTTP/1.1 upstream instead of
		// L4 h2 over TLS.
		protocol = snapshot.ProtocolHTTP11
	case "l4":
		cfg.HTTP1TLS = proxy.HTTP1TLSL4
	case "l7":
		cfg.HTTP1TLS = proxy.HTTP1TLSL7
	default:
		return fmt.Errorf("unknown proxy mode %q", mode)
	}
	policy := &snapshot.TLS{Mode: snapshot.TLSServerOnly, ServerName: sni, RootsPEM: string(ca),
		Policy: snapshot.ObjectRef{Kind: "BackendTLSPolicy", Namespace: "bench", Name: "echo"}}
	switch curves {
	case "x25519":
		policy.Curves = []tls.CurveID{tls.X25519} // what nginx's OpenSSL sends
	case "default":
	default:
		return fmt.Errorf("unknown curves %q", curves)
	}
	p, err := proxy.New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), prometheus.NewRegistry())
	if err != nil {
		return err
	}
	// The echo Service, and beside it the same backend declared MCP (the
	// MCP row).
	echoSvc := netip.AddrPortFrom(netip.MustParseAddr(vip), 80)
	var frontends []snapshot.Frontend
	var backends []snapshot.Backend
	for _, svc := range []struct {
		name     string
		addr     netip.AddrPort
		protocol snapshot.Protocol
	}{{"echo", echoSvc, protocol}, {"mcp", mcpService(echoSvc), snapshot.ProtocolMCP}} {
		ref := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "bench", Name: svc.name, Port: 80}
		frontends = append(frontends, snapshot.Frontend{
			Service: snapshot.ObjectRef{Namespace: "bench", Name: svc.name}, Port: svc.addr.Port(),
			Addresses: []netip.Addr{svc.addr.Addr()}, FailurePolicy: snapshot.FailClosed, Backend: ref,
		})
		backends = append(backends, snapshot.Backend{Ref: ref, Protocol: svc.protocol, Endpoints: benchEndpoints, TLS: policy})
	}
	snap, err := snapshot.New(1, frontends, backends, nil)
	if err != nil {
		return err
	}
	p.Update(snap)
	// As the agent listens: plain TCP, shared with a next agent, taken.
	l, err := takeover.Listen(context.Background(), proxy.ListenConfig(), listen)
	if err != nil {
		return err
	}
	if err := takeover.Take(l); err != nil {
		return err
	}
	go waitSignal(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p.Shutdown(ctx)
	})
	return p.Serve(l)
}

// benchEndpoints is the backend's one endpoint, as every proxy's snapshot
// has it.
var benchEndpoints = []snapshot.Endpoint{{Addr: netip.MustParseAddrPort(backendAddr), Ready: true, Serving: true}}

// mcpService is the Service address beside svc (10.96.0.x) whose backend
// the proxies declare MCP: 10.96.1.x.
func mcpService(svc netip.AddrPort) netip.AddrPort {
	a := svc.Addr().As4()
	a[2] = 1
	return netip.AddrPortFrom(netip.AddrFrom4(a), svc.Port())
}

// mcpSession is the backend's MCP session ID the MCP row sends, and
// mcpSessionID the same session as an app holds it through sockmesh: the
// ID prefixed as the proxy's answer to its initialize carried it
// (balance.Picker.MCPSession), so that the proxy cuts the prefix and pins
// the endpoint on each request.
const mcpSession = "bench-session"

func mcpSessionID() string {
	p := balance.New(&snapshot.Backend{Protocol: snapshot.ProtocolMCP, Endpoints: benchEndpoints}, nil, nil)
	h := http.Header{"Mcp-Session-Id": {mcpSession}}
	p.MCPSession(h, p.Pick())
	return h.Get("Mcp-Session-Id")
}

func waitSignal(stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
	stop()
}

func ignoreClosed(err error) error {
	if err == nil || err.Error() == "http: Server closed" {
		return nil
	}
	return fmt.Errorf("serve: %w", err)
}

// haproxyConf is HAProxy (Debian's 2.6) set up as ../shared/BENCH.md says,
// with an h2c listener whose requests go to the backend over h2.
const haproxyConf = `global
  nbthread 2
  maxconn 4096
  pidfile %[1]s/haproxy.pid
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend h1
  bind %[3]s
  default_backend be_h1
frontend h2c
  bind %[4]s proto h2
  default_backend be_h2
backend be_h1
  server s1 %[2]s ssl verify required ca-file %[1]s/ca.crt sni str(%[5]s) verifyhost %[5]s alpn http/1.1
backend be_h2
  server s1 %[2]s ssl verify required ca-file %[1]s/ca.crt sni str(%[5]s) verifyhost %[5]s alpn h2
`

const nginxConf = `worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  # Request bodies up to 128 KiB stay in memory: by default nginx writes
  # those over 16 KiB to a temporary file before it forwards them.
  client_body_buffer_size 128k;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  keepalive_requests 1000000;
  upstream be { server %[2]s; keepalive %[6]d; }
  server {
    listen %[3]s;
    listen %[4]s http2;
    location / {
      proxy_pass https://be;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_ssl_server_name on;
      proxy_ssl_name %[5]s;
      proxy_ssl_verify on;
      proxy_ssl_trusted_certificate %[1]s/ca.crt;
      proxy_ssl_session_reuse on;
      proxy_ssl_protocols TLSv1.2 TLSv1.3;
      proxy_buffer_size 16k;
      proxy_buffers 8 16k;
    }
  }
}
`
