// Command appclient is the application in the cluster tier's pods. The test
// cannot reach into a pod's network namespace to open connections there, so
// it asks this program, over the pod IP, to make a request from inside the
// pod — the connection sockmesh must capture — and report what came back.
// It also stands in for the agent process in the DaemonSet machinery check,
// reporting the capabilities and mounts its container got.
//
//	appclient serve [-listen :8080]   the HTTP API below
//	appclient call [-after PATH] URL MODE
//	                                  one call (as POST /call), its Result as
//	                                  JSON on stdout: a pod's first
//	                                  connection, at once or once PATH exists
//	appclient statfs PATH FSTYPE      exit 0 iff PATH is on a FSTYPE file system
//
// API (JSON):
//
//	POST /call    {"url": "http://10.96.0.10/", "mode": "http1|h2c|websocket", "message": "..."}
//	              → {"status": 200, "proto": "HTTP/1.1", "body": {...}, "echo": "...", "error": ""}
//	GET  /inspect?path=/sys/fs/bpf&path=...
//	              → {"capEff": "...", "fs": {"/sys/fs/bpf": "bpf"}, "hostPID": true,
//	                 "listeners": ["0.0.0.0:8080", "127.0.0.1:15001"]}
//	GET  /healthz, /readyz → ok
//
// It is test code, never part of the product.
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/sockmesh/sockmesh/test/e2ecluster/appapi"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "serve":
		fs := flag.NewFlagSet("serve", flag.ExitOnError)
		listen := fs.String("listen", ":8080", "listen address")
		fs.Parse(os.Args[2:])
		if err := serve(*listen); err != nil {
			fmt.Fprintln(os.Stderr, "appclient:", err)
			os.Exit(1)
		}
	case "call":
		fs := flag.NewFlagSet("call", flag.ExitOnError)
		after := fs.String("after", "", "a file whose creation the call waits for")
		fs.Parse(os.Args[2:])
		if fs.NArg() != 2 {
			usage()
		}
		if *after != "" {
			awaitFile(*after)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := perform(ctx, appapi.Call{URL: fs.Arg(0), Mode: fs.Arg(1)})
		if err != nil {
			res.Error = err.Error()
		}
		json.NewEncoder(os.Stdout).Encode(res)
	case "statfs":
		if len(os.Args) != 4 {
			usage()
		}
		got, err := fsType(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "appclient:", err)
			os.Exit(1)
		}
		if got != os.Args[3] {
			fmt.Fprintf(os.Stderr, "appclient: %s is on %s, want %s\n", os.Args[2], got, os.Args[3])
			os.Exit(1)
		}
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: appclient serve [-listen ADDR] | appclient call [-after PATH] URL MODE | appclient statfs PATH FSTYPE")
	os.Exit(2)
}

// awaitFile returns once path exists: the test's signal, on a volume it
// shares with the pod, for the pod's first connection.
func awaitFile(path string) {
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond) // the poll's pace: the test's signal is a file, not a wakeup
	}
}

func serve(listen string) error {
	mux := http.NewServeMux()
	ok := func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") }
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /readyz", ok)
	mux.HandleFunc("POST /call", handleCall)
	mux.HandleFunc("GET /inspect", handleInspect)
	srv := &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

func handleCall(w http.ResponseWriter, r *http.Request) {
	var c appapi.Call
	if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
		http.Error(w, "decode call: "+err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	res, err := perform(ctx, c)
	if errors.Is(err, errMode) {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err != nil {
		res.Error = err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(res)
}

var errMode = errors.New("unknown mode")

// perform makes the call c.
func perform(ctx context.Context, c appapi.Call) (appapi.Result, error) {
	switch c.Mode {
	case "http1", "h2c", "h2c-kept":
		return doHTTP(ctx, c)
	case "websocket":
		return doWebSocket(ctx, c)
	}
	return appapi.Result{}, fmt.Errorf("%w %q", errMode, c.Mode)
}

// transport returns a fresh transport per call: every call is a new
// connection, the thing sockmesh's connect hook sees; for h2c-kept, the
// one transport whose connection calls share.
func transport(mode string) *http.Transport {
	if mode == "h2c-kept" {
		return kept
	}
	t := &http.Transport{DisableKeepAlives: true, Protocols: new(http.Protocols)}
	if mode == "h2c" {
		t.Protocols.SetUnencryptedHTTP2(true)
	} else {
		t.Protocols.SetHTTP1(true)
	}
	return t
}

var kept = func() *http.Transport {
	t := &http.Transport{Protocols: new(http.Protocols)}
	t.Protocols.SetUnencryptedHTTP2(true)
	return t
}()

func doHTTP(ctx context.Context, c appapi.Call) (appapi.Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL, nil)
	if err != nil {
		return appapi.Result{}, err
	}
	t := transport(c.Mode)
	if t != kept {
		defer t.CloseIdleConnections()
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return appapi.Result{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	res := appapi.Result{Status: resp.StatusCode, Proto: resp.Proto}
	setBody(&res, body)
	return res, err
}

func doWebSocket(ctx context.Context, c appapi.Call) (appapi.Result, error) {
	t := transport("http1")
	defer t.CloseIdleConnections()
	conn, resp, err := websocket.Dial(ctx, c.URL, &websocket.DialOptions{HTTPClient: &http.Client{Transport: t}})
	var res appapi.Result
	if resp != nil {
		res.Status, res.Proto = resp.StatusCode, resp.Proto
	}
	if err != nil {
		return res, err
	}
	defer conn.CloseNow()
	_, first, err := conn.Read(ctx)
	if err != nil {
		return res, fmt.Errorf("read first message: %w", err)
	}
	setBody(&res, first)
	if c.Message != "" {
		if err := conn.Write(ctx, websocket.MessageText, []byte(c.Message)); err != nil {
			return res, fmt.Errorf("write message: %w", err)
		}
		_, echo, err := conn.Read(ctx)
		if err != nil {
			return res, fmt.Errorf("read echo: %w", err)
		}
		res.Echo = string(echo)
	}
	conn.Close(websocket.StatusNormalClosure, "")
	return res, nil
}

func setBody(res *appapi.Result, body []byte) {
	if json.Valid(body) {
		res.Body = body
	} else {
		res.Text = string(body)
	}
}

func handleInspect(w http.ResponseWriter, r *http.Request) {
	in := appapi.Inspection{FS: map[string]string{}}
	var err error
	if in.CapEff, err = capEff(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	for _, p := range r.URL.Query()["path"] {
		t, err := fsType(p)
		if err != nil {
			t = "error: " + err.Error()
		}
		in.FS[p] = t
	}
	// In its own PID namespace a container's first process is PID 1.
	in.HostPID = os.Getpid() != 1
	for _, f := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		ls, err := listeners(f)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		in.Listeners = append(in.Listeners, ls...)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(in)
}

// capEff returns the effective capability mask from /proc/self/status.
func capEff() (string, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", errors.New("no CapEff in /proc/self/status")
}

// listeners parses a /proc/net/tcp{,6} table for sockets in LISTEN state
// (st 0A) and returns their local addresses.
func listeners(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // no IPv6
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		hexIP, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		raw, err := hex.DecodeString(hexIP)
		port, perr := strconv.ParseUint(hexPort, 16, 16)
		if err != nil || perr != nil || (len(raw) != 4 && len(raw) != 16) {
			return nil, fmt.Errorf("parse %s line %q", path, line)
		}
		// The kernel prints each 32-bit word in host (little-endian) order.
		for i := 0; i < len(raw); i += 4 {
			raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
		}
		ip, _ := netip.AddrFromSlice(raw)
		out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(port)).String())
	}
	return out, nil
}

// fsMagic names the file systems the checks ask about (statfs(2) magic).
var fsMagic = map[int64]string{
	0xcafe4a11: "bpf",
	0x63677270: "cgroup2",
	0x27e0eb:   "cgroup",
	0x01021994: "tmpfs",
	0x62656572: "sysfs",
	0x9fa0:     "proc",
	0x794c7630: "overlay",
	0x6e736673: "nsfs",
}

func fsType(path string) (string, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", path, err)
	}
	if n, ok := fsMagic[int64(st.Type)]; ok {
		return n, nil
	}
	return fmt.Sprintf("0x%x", st.Type), nil
}
