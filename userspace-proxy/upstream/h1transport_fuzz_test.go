package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
)

// FuzzH1TransportAnswer has a TLS backend answer a request with arbitrary
// bytes through RoundTripper(WireH1), then asks it again: whatever the
// first answer was — short, long, ambiguous, followed by more — the second
// request gets its own answer, never bytes of the first. The answer
// itself is net/http's ReadResponse's reading (FuzzAnswerFraming in
// package httpproxy checks what reaches the app).
//
// TLS matters (the pool looks for bytes left on an idle connection through
// crypto/tls, where a record that came with the answer waits), but it is
// not what is fuzzed: one backend serves every input, so that its client
// resumes the TLS sessions of inputs before (no certificate to verify, no
// signature), with X25519 alone (no ML-KEM key): full handshakes were
// most of an input's time. Nothing else passes from one input to the
// next: each starts with no connection open (fuzzInput.end).
//
// `go test` runs the seeds; `go test -fuzz FuzzH1TransportAnswer` looks
// for more.
func FuzzH1TransportAnswer(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: t\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\nuntil the close",
		"HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\nevil",
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
		"HTTP/1.1 304 Not Modified\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
		"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
		"HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
		"not http at all",
	} {
		f.Add([]byte(s))
	}
	w := newWorld(f)
	wires := &wires{m: map[string]*wire{}}
	pools, err := New(Config{}, wireDialer{dial.NewDirect(dial.Config{Unmarked: true}), wires}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		f.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	var cur atomic.Pointer[fuzzInput] // the input under way
	tcpserve.Serve(f, tls.NewListener(wireListener{l, wires}, w.serverTLS), func(c net.Conn) {
		// The client dialed it for this input: its handshake waits for
		// this goroutine.
		in := cur.Load()
		if in == nil {
			return // not the client's
		}
		in.handlers.Add(1)
		defer in.handlers.Done()
		in.serve(c, wires)
	})
	pol := w.policy()
	pol.Curves = []tls.CurveID{tls.X25519} // the client makes no ML-KEM key
	addr := l.Addr().(*net.TCPAddr).AddrPort()
	be := backendAt(f, pools, addr, pol)
	rt := be.RoundTripper(WireH1)
	f.Fuzz(func(t *testing.T, raw []byte) {
		in := &fuzzInput{raw: raw, firstDone: make(chan struct{})}
		cur.Store(in)
		defer in.end(t, be, addr)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if resp, err := rt.RoundTrip(request(t, ctx, be, http.MethodGet, "/fuzz", nil)); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		close(in.firstDone)
		resp, err := rt.RoundTrip(request(t, ctx, be, http.MethodGet, "/second", nil))
		if err != nil {
			t.Fatalf("second request: %v\nfirst answer: %q", err, raw)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(body) != "second" {
			t.Fatalf("second request got %s %q (%v)\nfirst answer: %q", resp.Status, body, err, raw)
		}
	})
}

// fuzzInput is one input of FuzzH1TransportAnswer, as its backend sees
// it.
type fuzzInput struct {
	raw       []byte        // the answer to /fuzz
	firstDone chan struct{} // closed when the client is done with it
	handlers  sync.WaitGroup
}

// serve answers the requests on c, the server's end of a connection: raw
// to /fuzz, "second" to the others.
func (in *fuzzInput) serve(c net.Conn, wires *wires) {
	br := bufio.NewReader(c)
	stop := make(chan struct{})
	var watch sync.WaitGroup
	defer watch.Wait()
	defer close(stop)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		answer := []byte("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
		if req.URL.Path == "/fuzz" {
			answer = in.raw
		}
		if _, err := c.Write(answer); err != nil {
			return
		}
		if req.URL.Path == "/fuzz" {
			// The backend sends nothing more unasked: a client that
			// waits for more of this answer waits for the close, as
			// from a backend that closes idle connections.
			w := wires.get(c.RemoteAddr().String())
			watch.Go(func() { w.closeWhenAwaited(c, stop, in.firstDone) })
		}
	}
}

// end leaves the backend as the input found it: the connections left
// idle in be's pool to addr are closed, so that the next input dials its
// own, and the backend's handlers, their ends closed, are waited for. A
// connection still open is one the transport never handed back.
func (in *fuzzInput) end(t *testing.T, be *Backend, addr netip.AddrPort) {
	p := be.w.h1
	noDial := func(context.Context) (net.Conn, error) { return nil, errors.New("no dial: draining") }
	for open, idle := p.Stats(addr); open > 0; open, idle = p.Stats(addr) {
		if idle == 0 {
			t.Errorf("%d connections open and none idle after both answers were read", open)
			return // their handlers would not end
		}
		// Get takes an idle connection (it drops one the server closed,
		// then fails to dial).
		if c, err := p.Get(context.Background(), addr, pool.Client{}, noDial); err == nil {
			p.Discard(c)
		}
	}
	in.handlers.Wait()
}

// A wire is what went over one TCP connection of the fuzzed backend: the
// bytes its server wrote, the bytes its client read and wrote, and whether
// the client waits in a read. It tells, without a timer, when the client
// waits for bytes the server will not send: it read all there was and
// reads again, having sent nothing since.
type wire struct {
	mu                   sync.Mutex
	written, read, asked int64
	reading              bool
	changed              chan struct{} // closed and replaced at each change
}

// closeWhenAwaited closes c, the server's end, once the client read all
// the server wrote and waits for more without having written since: it
// waits for the end of an answer that ran short or is delimited by the
// close. A client that writes (a next request) or closes ends the watch,
// as do stop and done (the client is done with the answer: the pool's look
// for bytes on an idle connection, a read that does not wait, must not
// count as waiting).
func (w *wire) closeWhenAwaited(c net.Conn, stop, done <-chan struct{}) {
	w.mu.Lock()
	asked := w.asked
	for w.asked == asked && !(w.reading && w.read == w.written) {
		changed := w.changed
		w.mu.Unlock()
		select {
		case <-changed:
		case <-stop:
			return
		case <-done:
			return
		}
		w.mu.Lock()
	}
	awaited := w.asked == asked
	w.mu.Unlock()
	if awaited {
		c.Close()
	}
}

// update changes w under its lock and wakes its watcher.
func (w *wire) update(f func()) {
	w.mu.Lock()
	f()
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// wires finds a connection's wire by its client's address, from either
// end, until the client closes it (the port may serve another).
type wires struct {
	mu sync.Mutex
	m  map[string]*wire
}

func (ws *wires) get(client string) *wire {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.m[client]
	if w == nil {
		w = &wire{changed: make(chan struct{})}
		ws.m[client] = w
	}
	return w
}

func (ws *wires) drop(client string, w *wire) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.m[client] == w {
		delete(ws.m, client)
	}
}

// wireDialer's connections count what the client reads and writes.
type wireDialer struct {
	dial.Dialer
	wires *wires
}

func (d wireDialer) Dial(ctx context.Context, ep snapshot.Endpoint) (net.Conn, error) {
	c, err := d.Dialer.Dial(ctx, ep)
	if err != nil {
		return nil, err
	}
	return &clientEnd{Conn: c, w: d.wires.get(c.LocalAddr().String()), wires: d.wires}, nil
}

type clientEnd struct {
	net.Conn
	w     *wire
	wires *wires
}

func (c *clientEnd) Read(p []byte) (int, error) {
	c.w.update(func() { c.w.reading = true })
	n, err := c.Conn.Read(p)
	c.w.update(func() { c.w.reading, c.w.read = false, c.w.read+int64(n) })
	return n, err
}

// NetConn lets the pool find the socket under c (sockio.Of): its look
// for bytes on an idle connection is part of what is fuzzed.
func (c *clientEnd) NetConn() net.Conn { return c.Conn }

// Write and Close count before they act: by the time the server reads
// what the client wrote, or its close, its watch knows.
func (c *clientEnd) Write(p []byte) (int, error) {
	c.w.update(func() { c.w.asked++ })
	return c.Conn.Write(p)
}

func (c *clientEnd) Close() error {
	c.w.update(func() { c.w.asked++ })
	c.wires.drop(c.LocalAddr().String(), c.w)
	return c.Conn.Close()
}

// wireListener's connections count what the server writes.
type wireListener struct {
	net.Listener
	wires *wires
}

func (l wireListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &serverEnd{Conn: c, w: l.wires.get(c.RemoteAddr().String())}, nil
}

type serverEnd struct {
	net.Conn
	w *wire
}

func (c *serverEnd) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.w.update(func() { c.w.written += int64(n) })
	return n, err
}
