package httpapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sockmesh/sockmesh/agent/explain"
	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath/takeover"
)

// DefaultSocket is where the agent serves the introspection API when
// Config.Socket is empty.
const DefaultSocket = "/run/sockmesh/agent.sock"

// Config configures the introspection API server.
type Config struct {
	// Socket is the unix socket; empty means DefaultSocket. Its directory is
	// created (mode 0755) when missing. The socket is mode 0600, or 0660
	// and owned by Group when Group is set; a stale socket at the path is
	// replaced.
	Socket string
	// Group is a group (name or numeric ID) whose members may use the
	// socket besides root and the agent's own user; empty: none.
	Group string
	// Listen is a TCP address serving remote clients (sockmeshctl on
	// another host); empty: none. It needs TLSCertFile, TLSKeyFile and
	// TokenFile: it never serves without TLS and a bearer token.
	Listen string
	// TLSCertFile and TLSKeyFile must load, and match, at start. They are
	// loaded again when they change (a renewed certificate serves the next
	// connection); files that then do not load leave the last good pair
	// serving, with a warning.
	TLSCertFile, TLSKeyFile string
	// TokenFile holds the bearer token remote clients must present. It is
	// read at every request, so a rotated token applies at once.
	TokenFile string
}

// API paths. Every endpoint is read-only (GET) and answers JSON, except
// PathMetrics (the Prometheus text format).
const (
	PathStatus   = "/v1/status"
	PathExplain  = "/v1/explain"
	PathSnapshot = "/v1/snapshot"
	PathCounters = "/v1/counters"
	PathReport   = "/v1/report"
	PathMetrics  = "/v1/metrics"
	PathCatalog  = "/v1/metrics/catalog"
)

// SnapshotResponse is the PathSnapshot answer: the Snapshot the data planes
// serve, private keys redacted.
type SnapshotResponse struct {
	Snapshot  *snapshot.Snapshot `json:"snapshot,omitempty"`
	AppliedAt time.Time          `json:"appliedAt,omitzero"`
}

// ErrorResponse is the body of every error answer.
type ErrorResponse struct {
	Error string `json:"error"`
}

// Server serves the introspection API on a unix socket and optionally on
// an authenticated TCP port.
type Server struct {
	log     *slog.Logger
	socket  string
	sockIno uint64
	lns     []net.Listener
	srvs    []*http.Server

	closeOnce sync.Once
}

// NewServer opens the listeners cfg names; Serve serves them. reg may be
// nil.
func NewServer(cfg Config, src *introspect.Sources, log *slog.Logger, reg prometheus.Registerer) (_ *Server, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{log: log.With("component", "introspect"), socket: cfg.Socket}
	if s.socket == "" {
		s.socket = DefaultSocket
	}
	gid := -1
	if cfg.Group != "" {
		if gid, err = LookupGroup(cfg.Group); err != nil {
			return nil, fmt.Errorf("introspection socket group: %w", err)
		}
	}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sockmesh_introspect_requests_total",
		Help: "Introspection API requests, by endpoint and HTTP status code.",
	}, []string{"endpoint", "code"})
	if reg != nil {
		if err := reg.Register(requests); err != nil {
			return nil, fmt.Errorf("register introspection metrics: %w", err)
		}
	}
	api := newAPI(src, requests)
	defer func() {
		if err != nil {
			s.Close()
		}
	}()

	ln, ino, err := listenUnix(s.socket, gid)
	if err != nil {
		return nil, err
	}
	s.sockIno = ino
	s.add(ln, allowPeer(api, gid, os.Geteuid()), connContext)
	if cfg.Listen == "" {
		return s, nil
	}
	if cfg.TLSCertFile == "" || cfg.TLSKeyFile == "" || cfg.TokenFile == "" {
		return nil, errors.New("introspection listener: a TCP address needs a TLS certificate, key and token file")
	}
	pair, err := loadKeyPair(cfg.TLSCertFile, cfg.TLSKeyFile, s.log)
	if err != nil {
		return nil, fmt.Errorf("introspection listener: %w", err)
	}
	if _, err := os.Stat(cfg.TokenFile); err != nil {
		return nil, fmt.Errorf("introspection listener: token file: %w", err)
	}
	// Shared with the next agent of a rolling update, which takes it over.
	tcp, err := takeover.Listen(context.Background(), nil, cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("introspection listener: %w", err)
	}
	if err := takeover.Take(tcp); err != nil {
		log.Warn("cannot take the introspection address over: while agents overlap, either may answer on it", "err", err)
	}
	tlsLn := tls.NewListener(tcp, &tls.Config{GetCertificate: pair.getCertificate, MinVersion: tls.VersionTLS13})
	s.add(tlsLn, requireToken(api, cfg.TokenFile), nil)
	return s, nil
}

func (s *Server) add(ln net.Listener, h http.Handler, cc func(context.Context, net.Conn) context.Context) {
	s.lns = append(s.lns, ln)
	s.srvs = append(s.srvs, &http.Server{
		Handler: h, ConnContext: cc,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	})
}

// Addrs returns the socket path and, when a TCP listener is open, its
// address (useful with port 0).
func (s *Server) Addrs() (socket string, tcp net.Addr) {
	if len(s.lns) > 1 {
		tcp = s.lns[1].Addr()
	}
	return s.socket, tcp
}

// Serve serves until ctx ends, then closes the listeners and returns nil;
// it returns early with the error of a listener that fails.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, len(s.srvs))
	for i, srv := range s.srvs {
		addr := s.socket // the listener's own address is where it was bound, before the rename
		if i > 0 {
			addr = s.lns[i].Addr().String()
		}
		s.log.Info("listening", "listener", "introspection", "addr", addr)
		go func() { errc <- srv.Serve(s.lns[i]) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	s.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("introspection server: %w", err)
	}
	return nil
}

// Close stops serving and removes the socket, unless another agent has
// replaced it meanwhile. Calls after the first do nothing.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		for _, srv := range s.srvs {
			srv.Close()
		}
		for _, ln := range s.lns {
			ln.Close()
		}
		if s.sockIno != 0 && inode(s.socket) == s.sockIno {
			os.Remove(s.socket)
		}
	})
	return nil
}

// listenUnix binds the socket beside path, sets its mode and owner, and
// renames it into place, so that it is never reachable with looser
// permissions and a running agent's socket is replaced atomically.
func listenUnix(path string, gid int) (net.Listener, uint64, error) {
	dir := filepath.Dir(path)
	// 0755: the socket's own mode guards it, and Group's members must be
	// able to reach it.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, 0, fmt.Errorf("introspection socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket == 0 {
		return nil, 0, fmt.Errorf("introspection socket %s: exists and is not a socket", path)
	}
	// Bind in a directory only we may enter: the socket is unreachable
	// until chmod and chown are done.
	priv, err := os.MkdirTemp(dir, ".sockmesh-")
	if err != nil {
		return nil, 0, fmt.Errorf("introspection socket: %w", err)
	}
	defer os.RemoveAll(priv)
	bound := filepath.Join(priv, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: bound, Net: "unix"})
	if err != nil {
		return nil, 0, fmt.Errorf("introspection socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // it moves; Close removes it by inode
	mode := os.FileMode(0o600)
	if gid >= 0 {
		mode = 0o660
		// chown(2) gives a file to a group its owner is a member of
		// without CAP_CHOWN: in a pod, the group goes in
		// securityContext.supplementalGroups, no capability added.
		if err := os.Chown(bound, -1, gid); err != nil {
			ln.Close()
			if errors.Is(err, fs.ErrPermission) {
				err = fmt.Errorf("%w: the agent must be a member of group %d (in a pod, list it in securityContext.supplementalGroups) or have CAP_CHOWN", err, gid)
			}
			return nil, 0, fmt.Errorf("introspection socket: %w", err)
		}
	}
	if err := os.Chmod(bound, mode); err != nil {
		ln.Close()
		return nil, 0, fmt.Errorf("introspection socket: %w", err)
	}
	if err := os.Rename(bound, path); err != nil {
		ln.Close()
		return nil, 0, fmt.Errorf("introspection socket: %w", err)
	}
	return ln, inode(path), nil
}

func inode(path string) uint64 {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// LookupGroup returns the ID of Config.Group g: a group name, or a numeric
// ID, taken as it is (a container image may list no groups), from 0 to
// 2^32-2: chown(2) reads (gid_t)-1 as "leave the group as it is". The agent
// checks its flag with it before it opens anything.
func LookupGroup(g string) (int, error) {
	if n, err := strconv.ParseUint(g, 10, 64); err == nil {
		if n >= math.MaxUint32 {
			return 0, fmt.Errorf("group ID %s: want at most %d", g, uint32(math.MaxUint32-1))
		}
		return int(n), nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(grp.Gid)
}

// newAPI routes the endpoints. Each answer is read from src at request
// time.
func newAPI(src *introspect.Sources, requests *prometheus.CounterVec) http.Handler {
	mux := http.NewServeMux()
	handle := func(path string, h http.HandlerFunc) {
		mux.Handle("GET "+path, counted(path, requests, h))
	}
	handle(PathStatus, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, src.Status()) })
	handle(PathReport, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, src.Report()) })
	handle(PathSnapshot, func(w http.ResponseWriter, r *http.Request) {
		snap, at := src.Snapshot()
		writeJSON(w, SnapshotResponse{Snapshot: snap, AppliedAt: at})
	})
	handle(PathCounters, func(w http.ResponseWriter, r *http.Request) {
		c, err := src.Counters()
		if err != nil {
			httpError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		writeJSON(w, c)
	})
	handle(PathExplain, func(w http.ResponseWriter, r *http.Request) {
		q, err := ParseQuery(r.URL.Query())
		if err != nil {
			httpError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, src.Explain(q))
	})
	handle(PathCatalog, func(w http.ResponseWriter, r *http.Request) {
		if src.Metrics == nil {
			httpError(w, http.StatusServiceUnavailable, "no metrics registry")
			return
		}
		infos, err := src.Metrics.Metrics()
		if err != nil && infos == nil {
			httpError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, infos)
	})
	handle(PathMetrics, func(w http.ResponseWriter, r *http.Request) {
		if src.Metrics == nil {
			httpError(w, http.StatusServiceUnavailable, "no metrics registry")
			return
		}
		promhttp.HandlerFor(src.Metrics, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	})
	return mux
}

// counted counts each answer by endpoint and status code.
func counted(endpoint string, requests *prometheus.CounterVec, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		requests.WithLabelValues(endpoint, strconv.Itoa(rec.code)).Inc()
	})
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}

func httpError(w http.ResponseWriter, code int, msg string) {
	b, _ := json.Marshal(ErrorResponse{Error: msg})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// Query parameters of PathExplain.
const (
	ParamPod     = "pod"     // namespace/name, required
	ParamPort    = "port"    // the destination port, required
	ParamService = "service" // namespace/name of the destination Service
	ParamAddr    = "addr"    // a destination address, repeatable
)

// ParseQuery reads an explain.Query from PathExplain's parameters.
func ParseQuery(v map[string][]string) (explain.Query, error) {
	get := func(k string) string {
		if len(v[k]) == 0 {
			return ""
		}
		return v[k][0]
	}
	var q explain.Query
	var err error
	if q.Pod, err = parseRef(get(ParamPod)); err != nil {
		return q, fmt.Errorf("%s: %w", ParamPod, err)
	}
	port, err := strconv.ParseUint(get(ParamPort), 10, 16)
	if err != nil || port == 0 {
		return q, fmt.Errorf("%s: want a port number 1-65535, got %q", ParamPort, get(ParamPort))
	}
	q.Port = uint16(port)
	if s := get(ParamService); s != "" {
		ref, err := parseRef(s)
		if err != nil {
			return q, fmt.Errorf("%s: %w", ParamService, err)
		}
		q.Service = &ref
	}
	for _, a := range v[ParamAddr] {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return q, fmt.Errorf("%s: %w", ParamAddr, err)
		}
		q.Addrs = append(q.Addrs, ip.Unmap())
	}
	if q.Service == nil && len(q.Addrs) == 0 {
		return q, fmt.Errorf("name the destination: %s or %s", ParamService, ParamAddr)
	}
	return q, nil
}

// Values encodes q as PathExplain's parameters.
func Values(q explain.Query) map[string][]string {
	v := map[string][]string{ParamPod: {q.Pod.Namespace + "/" + q.Pod.Name}, ParamPort: {strconv.Itoa(int(q.Port))}}
	if q.Service != nil {
		v[ParamService] = []string{q.Service.Namespace + "/" + q.Service.Name}
	}
	for _, a := range q.Addrs {
		v[ParamAddr] = append(v[ParamAddr], a.String())
	}
	return v
}

func parseRef(s string) (snapshot.ObjectRef, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return snapshot.ObjectRef{}, fmt.Errorf("want namespace/name, got %q", s)
	}
	return snapshot.ObjectRef{Namespace: ns, Name: name}, nil
}
