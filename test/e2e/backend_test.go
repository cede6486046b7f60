package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/test/pki"
)

// The backend is test/echo's server run as a process in a pod, with what
// the echo Report cannot tell: how many connections reached it, how many
// of those spoke plaintext to a TLS-only port, and every TLS handshake
// (SNI, ALPN, version, client certificate) also on paths that carry no
// HTTP report (gRPC, raw TCP). It serves them as JSON on statsPort, on the
// pod's loopback.

const (
	backendHelper = "e2e-backend"
	statsPort     = 9901
)

// Wire is what a backend port accepts.
type Wire string

const (
	// Plain: cleartext HTTP/1.1 and h2c only.
	Plain Wire = "plain"
	// TLSOnly: TLS only (ALPN h2 and http/1.1); any other first byte is
	// counted as a plaintext attempt.
	TLSOnly Wire = "tls"
	// Dual: TLS when the client starts with a handshake, cleartext
	// HTTP/1.1 otherwise, on one port (a Service whose policy comes and
	// goes).
	Dual Wire = "dual"
)

// backendStats is what a backend reports on statsPort.
type backendStats struct {
	// Accepted counts TCP connections on every port.
	Accepted int64 `json:"accepted"`
	// Plaintext counts connections to a TLS-only port whose first byte was
	// not a TLS handshake record.
	Plaintext  int64       `json:"plaintext"`
	Handshakes []handshake `json:"handshakes"`
}

// handshake is one completed TLS handshake, as the server saw it.
type handshake struct {
	ServerName string   `json:"serverName"`
	ALPN       string   `json:"alpn"`
	Version    string   `json:"version"`
	PeerCerts  []string `json:"peerCerts,omitempty"` // subjects
	PeerURIs   []string `json:"peerURIs,omitempty"`
}

// runBackend is the backend process.
func runBackend(args []string) error {
	fs := flag.NewFlagSet(backendHelper, flag.ContinueOnError)
	listen := fs.String("listen", "", "HTTP/gRPC/WebSocket address")
	tcpListen := fs.String("tcp-listen", "", "raw TCP echo address (empty: none)")
	wire := fs.String("wire", string(Plain), "plain, tls or dual")
	certFile := fs.String("cert", "", "server certificate")
	keyFile := fs.String("key", "", "server key")
	clientCA := fs.String("client-ca", "", "CA that client certificates must chain to (empty: none asked)")
	namespace := fs.String("namespace", "", "reported namespace")
	pod := fs.String("pod", "", "reported pod")
	if err := fs.Parse(args); err != nil {
		return err
	}
	st := &statsRecorder{}
	var tlsCfg *tls.Config
	if Wire(*wire) != Plain {
		pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return fmt.Errorf("load server certificate: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{pair}, VerifyConnection: st.handshake}
		if *clientCA != "" {
			pem, err := os.ReadFile(*clientCA)
			if err != nil {
				return err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return fmt.Errorf("client ca %s: no certificate", *clientCA)
			}
			tlsCfg.ClientCAs, tlsCfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
	}
	listenOn := func(addr string) (net.Listener, error) {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, err
		}
		return &countingListener{Listener: l, st: st, tlsOnly: Wire(*wire) == TLSOnly}, nil
	}
	errs := make(chan error, 3)
	l, err := listenOn(*listen)
	if err != nil {
		return err
	}
	cfg := echo.Config{Namespace: *namespace, Pod: *pod}
	switch Wire(*wire) {
	case TLSOnly:
		cfg.TLS = tlsCfg
	case Dual:
		// http.Server serves the *tls.Conn the listener returns as TLS
		// (r.TLS is set); NextProtos stays empty: HTTP/1.1 either way.
		l = newDualListener(l, tlsCfg)
	}
	go func() { errs <- echo.New(cfg).Serve(l) }()
	if *tcpListen != "" {
		tl, err := listenOn(*tcpListen)
		if err != nil {
			return err
		}
		if Wire(*wire) == TLSOnly {
			tl = tls.NewListener(tl, tlsCfg)
		}
		go func() { errs <- echo.ServeTCPEcho(tl) }()
	}
	sl, err := net.Listen("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), statsPort).String())
	if err != nil {
		return err
	}
	go func() {
		errs <- http.Serve(sl, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			json.NewEncoder(w).Encode(st.snapshot())
		}))
	}()
	fmt.Println("ready") // the test waits for this line
	return <-errs
}

// statsRecorder collects backendStats.
type statsRecorder struct {
	accepted, plaintext atomic.Int64
	mu                  sync.Mutex
	handshakes          []handshake
}

// handshake is the tls.Config VerifyConnection hook: a server calls it for
// every completed handshake, resumed or not, with or without client
// certificates.
func (s *statsRecorder) handshake(cs tls.ConnectionState) error {
	h := handshake{ServerName: cs.ServerName, ALPN: cs.NegotiatedProtocol, Version: tls.VersionName(cs.Version)}
	for _, c := range cs.PeerCertificates {
		h.PeerCerts = append(h.PeerCerts, c.Subject.String())
		for _, u := range c.URIs {
			h.PeerURIs = append(h.PeerURIs, u.String())
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handshakes = append(s.handshakes, h)
	return nil
}

func (s *statsRecorder) snapshot() backendStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return backendStats{Accepted: s.accepted.Load(), Plaintext: s.plaintext.Load(), Handshakes: append([]handshake(nil), s.handshakes...)}
}

// countingListener counts accepted connections and, on a TLS-only port,
// those whose first byte is not a TLS handshake record (0x16).
type countingListener struct {
	net.Listener
	st      *statsRecorder
	tlsOnly bool
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.st.accepted.Add(1)
	if l.tlsOnly {
		c = &firstByteConn{Conn: c, st: l.st}
	}
	return c, nil
}

// firstByteConn checks the first byte read. crypto/tls reads a connection
// from one goroutine at a time, so checked needs no lock.
type firstByteConn struct {
	net.Conn
	st      *statsRecorder
	checked bool
}

func (c *firstByteConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.checked {
		c.checked = true
		if p[0] != 0x16 {
			c.st.plaintext.Add(1)
		}
	}
	return n, err
}

// dualListener hands out TLS server connections for clients that start
// with a handshake record and plain ones otherwise. It sniffs each
// connection on its own goroutine, so a silent client does not hold up the
// others.
type dualListener struct {
	net.Listener
	cfg   *tls.Config
	conns chan net.Conn
	errc  chan error
}

func newDualListener(l net.Listener, cfg *tls.Config) *dualListener {
	d := &dualListener{Listener: l, cfg: cfg, conns: make(chan net.Conn), errc: make(chan error, 1)}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				d.errc <- err
				return
			}
			go d.sniff(c)
		}
	}()
	return d
}

func (d *dualListener) sniff(c net.Conn) {
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	first, err := br.Peek(1)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		c.Close()
		return
	}
	var out net.Conn = &peekedConn{Conn: c, r: br}
	if first[0] == 0x16 {
		out = tls.Server(out, d.cfg)
	}
	d.conns <- out
}

func (d *dualListener) Accept() (net.Conn, error) {
	select {
	case c := <-d.conns:
		return c, nil
	case err := <-d.errc:
		d.errc <- err
		return nil, err
	}
}

// peekedConn reads what the sniffer buffered first.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// backendOptions describe a backend pod.
type backendOptions struct {
	Wire Wire
	// Cert is the server certificate (Wire TLSOnly or Dual).
	Cert *pki.Leaf
	// ClientCA, when set, makes the backend require client certificates
	// that chain to it.
	ClientCA *pki.CA
	// HTTPPort serves HTTP/1.1, h2 or h2c, gRPC and WebSocket; TCPPort
	// (0: none) a raw TCP echo, in TLS on a TLS-only backend.
	HTTPPort, TCPPort uint16
}

// backend is an echo backend process in a pod.
type backend struct {
	pod    *host
	opts   backendOptions
	proc   *sandbox.Process
	stderr *outputBuffer // every run's, shown when the test fails
}

// startBackend runs an echo backend in p (born in the node's cgroup, like
// every process of a pod).
func startBackend(t testing.TB, p *host, opts backendOptions) *backend {
	t.Helper()
	b := &backend{pod: p, opts: opts, stderr: newOutputBuffer(t, "backend "+p.name)}
	b.start(t)
	return b
}

func (b *backend) start(t testing.TB) {
	t.Helper()
	o := b.opts
	args := []string{
		"-listen=" + net.JoinHostPort("", strconv.Itoa(int(o.HTTPPort))),
		"-wire=" + string(o.Wire), "-namespace=" + b.pod.namespace, "-pod=" + b.pod.name,
	}
	if o.TCPPort != 0 {
		args = append(args, "-tcp-listen="+net.JoinHostPort("", strconv.Itoa(int(o.TCPPort))))
	}
	dir := t.TempDir()
	if o.Cert != nil {
		cert, key, err := o.Cert.WriteFiles(dir, "server")
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "-cert="+cert, "-key="+key)
	}
	if o.ClientCA != nil {
		ca, err := o.ClientCA.WriteFile(dir, "client-ca")
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "-client-ca="+ca)
	}
	cmd := sandbox.HelperCommand(t, backendHelper, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = b.stderr
	b.proc = sandbox.Start(t, cmd, b.pod.ns, b.pod.cg)
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("backend said %q", line)
		}
		ready <- err
		io.Copy(io.Discard, out)
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("backend %s did not start: %v (%v)\n%s", b.pod.name, err, b.proc.Wait(), b.stderr)
		}
	case <-time.After(waitFor):
		t.Fatalf("backend %s not ready after %s", b.pod.name, waitFor)
	}
}

// restart ends the backend process (every connection to it closes) and
// starts it again with opts, on the same pod and ports.
func (b *backend) restart(t testing.TB, opts backendOptions) {
	t.Helper()
	if err := b.proc.Cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	b.proc.Wait()
	b.opts = opts
	b.start(t)
}

// stats asks the backend what it saw so far.
func (b *backend) stats(t testing.TB) backendStats {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return b.pod.ns.Dial(nil, "tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), statsPort).String())
		},
	}}
	resp, err := c.Get("http://backend/stats")
	if err != nil {
		t.Fatalf("backend %s stats: %v", b.pod.name, err)
	}
	defer resp.Body.Close()
	var st backendStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("backend %s stats: %v", b.pod.name, err)
	}
	return st
}

// addr is the backend's address in family v6 (or IPv4) on port.
func (b *backend) addr(v6 bool, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(b.pod.ip(v6), port)
}

// outputBuffer collects a helper process's stderr and shows it in the
// test's log if the test fails.
type outputBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func newOutputBuffer(t testing.TB, what string) *outputBuffer {
	o := &outputBuffer{}
	t.Cleanup(func() {
		if s := o.String(); t.Failed() && s != "" {
			t.Logf("%s stderr:\n%s", what, s)
		}
	})
	return o
}

func (o *outputBuffer) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = append(o.buf, p...)
	return len(p), nil
}

func (o *outputBuffer) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return string(o.buf)
}
