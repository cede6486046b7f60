package echo

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Config describes one echo server. The zero value is a cleartext server
// (HTTP/1.1 and h2c) with no identity.
type Config struct {
	// Namespace and Pod are reported as the answering workload (the binary
	// fills them from POD_NAMESPACE and POD_NAME).
	Namespace, Pod string
	// TLS, when set, makes the server speak TLS (ALPN h2 and http/1.1); set
	// ClientAuth in it to require client certificates.
	TLS *tls.Config
	// ALPN, with TLS, narrows what the server speaks: ALPNHTTP1 offers
	// http/1.1 alone, ALPNNone negotiates no protocol at all (as servers
	// older than ALPN do) and serves HTTP/1.1.
	ALPN ALPN
}

// ALPN is what a TLS echo server negotiates.
type ALPN int

const (
	ALPNDefault ALPN = iota // h2 and http/1.1
	ALPNHTTP1               // http/1.1 only
	ALPNNone                // no ALPN extension in the server's answer
)

// Report is what the server saw of one HTTP request.
type Report struct {
	Method     string      `json:"method"`
	Path       string      `json:"path"`
	RawQuery   string      `json:"rawQuery,omitempty"`
	Host       string      `json:"host"`
	Proto      string      `json:"proto"`
	Headers    http.Header `json:"headers"`
	Namespace  string      `json:"namespace,omitempty"`
	Pod        string      `json:"pod,omitempty"`
	RemoteAddr string      `json:"remoteAddr"`
	BodyBytes  int64       `json:"bodyBytes"`
	BodySHA256 string      `json:"bodySHA256,omitempty"`
	TLS        *TLSReport  `json:"tls,omitempty"`
}

// TLSReport is the server side of the client's TLS connection.
type TLSReport struct {
	ServerName         string     `json:"serverName"`
	NegotiatedProtocol string     `json:"negotiatedProtocol"`
	Version            string     `json:"version"`
	DidResume          bool       `json:"didResume"`
	PeerCertificates   []PeerCert `json:"peerCertificates,omitempty"`
}

// PeerCert describes a client certificate.
type PeerCert struct {
	Subject  string   `json:"subject"`
	DNSNames []string `json:"dnsNames,omitempty"`
	URIs     []string `json:"uris,omitempty"`
}

// Server is an echo backend.
type Server struct {
	cfg  Config
	grpc *grpc.Server
	http *http.Server
}

// New returns a server; call Serve with a listener.
func New(cfg Config) *Server {
	s := &Server{cfg: cfg, grpc: grpc.NewServer()}
	s.grpc.RegisterService(&echoServiceDesc, echoService{s})
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s.grpc, hs)
	mux := http.NewServeMux()
	mux.HandleFunc("/", s.report)
	mux.HandleFunc("/bytes/{n}", s.bytes)
	mux.HandleFunc("/sse", s.sse)
	mux.HandleFunc("/ws", s.websocket)
	mux.HandleFunc("/status/{code}", s.status)
	s.http = &http.Server{
		Handler:           s.route(mux),
		TLSConfig:         cfg.TLS,
		Protocols:         new(http.Protocols),
		ReadHeaderTimeout: 10 * time.Second,
	}
	s.http.Protocols.SetHTTP1(true)
	if cfg.TLS != nil {
		s.http.Protocols.SetHTTP2(cfg.ALPN == ALPNDefault)
	} else {
		s.http.Protocols.SetUnencryptedHTTP2(true)
	}
	return s
}

// route sends gRPC (HTTP/2 with a gRPC content type) to the gRPC server and
// everything else to mux.
func (s *Server) route(mux http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			s.grpc.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Serve serves HTTP on l (TLS when Config.TLS is set) until Close.
func (s *Server) Serve(l net.Listener) error {
	switch {
	case s.cfg.TLS != nil && s.cfg.ALPN == ALPNNone:
		// ServeTLS would add http/1.1 to NextProtos.
		return s.http.Serve(tls.NewListener(l, s.cfg.TLS))
	case s.cfg.TLS != nil:
		return s.http.ServeTLS(l, "", "")
	}
	return s.http.Serve(l)
}

// Close stops the server and closes its connections.
func (s *Server) Close() error {
	s.grpc.Stop()
	return s.http.Close()
}

// Describe returns the Report for r with the body already counted.
func (s *Server) Describe(r *http.Request, bodyBytes int64, bodySHA string) Report {
	rep := Report{
		Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Host: r.Host, Proto: r.Proto,
		Headers: r.Header, Namespace: s.cfg.Namespace, Pod: s.cfg.Pod, RemoteAddr: r.RemoteAddr,
		BodyBytes: bodyBytes, BodySHA256: bodySHA,
	}
	if cs := r.TLS; cs != nil {
		t := &TLSReport{ServerName: cs.ServerName, NegotiatedProtocol: cs.NegotiatedProtocol,
			Version: tls.VersionName(cs.Version), DidResume: cs.DidResume}
		for _, c := range cs.PeerCertificates {
			pc := PeerCert{Subject: c.Subject.String(), DNSNames: c.DNSNames}
			for _, u := range c.URIs {
				pc.URIs = append(pc.URIs, u.String())
			}
			t.PeerCertificates = append(t.PeerCertificates, pc)
		}
		rep.TLS = t
	}
	return rep
}

func (s *Server) report(w http.ResponseWriter, r *http.Request) {
	h := sha256.New()
	n, err := io.Copy(h, r.Body)
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	sum := ""
	if n > 0 {
		sum = hex.EncodeToString(h.Sum(nil))
	}
	w.Header().Set("Content-Type", "application/json")
	if v := r.Header.Get("X-Echo-Set-Header"); v != "" {
		w.Header().Set("X-Echo", v)
	}
	json.NewEncoder(w).Encode(s.Describe(r, n, sum))
}

// bytes answers n bytes of a repeating pattern (Content-Length set), for
// large-body and benchmark tests.
func (s *Server) bytes(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.PathValue("n"), 10, 64)
	if err != nil || n < 0 {
		http.Error(w, "bad size", http.StatusBadRequest)
		return
	}
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	buf := make([]byte, min(n, 32<<10))
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	for n > 0 {
		k, err := w.Write(buf[:min(n, int64(len(buf)))])
		if err != nil {
			return
		}
		n -= int64(k)
	}
}

// sse streams n events (default 3), one per interval (default 10 ms), each
// flushed, as MCP's streamable HTTP does. A client sees each event as it is
// sent only if nothing in between buffers.
func (s *Server) sse(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	if n <= 0 {
		n = 3
	}
	interval, _ := time.ParseDuration(r.URL.Query().Get("interval"))
	if interval <= 0 {
		interval = 10 * time.Millisecond
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for i := range n {
		if _, err := fmt.Fprintf(w, "id: %d\ndata: {\"seq\":%d,\"pod\":%q}\n\n", i, i, s.cfg.Pod); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-time.After(interval):
		case <-r.Context().Done():
			return
		}
	}
}

// websocket accepts an upgrade, sends the JSON Report as the first text
// message, then echoes every message back.
func (s *Server) websocket(w http.ResponseWriter, r *http.Request) {
	rep := s.Describe(r, 0, "")
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(16 << 20) // large messages cross the proxy too (not only 32 KiB)
	ctx := r.Context()
	b, _ := json.Marshal(rep)
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		return
	}
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			return
		}
		if err := c.Write(ctx, typ, msg); err != nil {
			return
		}
	}
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	code, err := strconv.Atoi(r.PathValue("code"))
	if err != nil || code < 200 || code > 599 {
		http.Error(w, "bad code", http.StatusBadRequest)
		return
	}
	w.WriteHeader(code)
}

// ServeTCPEcho echoes bytes on every connection l accepts until l closes;
// when the client half-closes, the echo finishes and half-closes too, so
// half-close handling is observable through a proxy.
func ServeTCPEcho(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			io.Copy(c, c)
			switch cc := c.(type) {
			case *net.TCPConn:
				cc.CloseWrite()
			case *tls.Conn:
				cc.CloseWrite()
			}
		}()
	}
}
