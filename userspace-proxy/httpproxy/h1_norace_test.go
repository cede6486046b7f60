//go:build !race

package httpproxy

import (
	"io"
	"net/http"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// Tests that read sync.Pool's order, which the race detector randomizes
// (it drops a quarter of what a pool is given): not built under -race,
// where they could neither pass nor fail.

// TestPanicInWaitingStream: a panic in the read an event stream waits in
// (waitBody, which gave the answer's writer back for the wait) ends the
// connection, and the writer is not given back a second time on the way:
// two connections would then take the one writer and write their
// answers into each other's. A parked connection serves the stream, so
// that the handler recovers the panic (park) rather than the proxy.
func TestPanicInWaitingStream(t *testing.T) {
	// One P, whose pool caches are the writers' pool; no collection to
	// empty it.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	debug.SetGCPercent(-1)
	defer debug.SetGCPercent(100)
	next := make(chan struct{})
	ep := startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/events" {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-next:
			io.WriteString(w, "data: "+panicOnRead+"\n\n")
		case <-r.Context().Done():
		}
	}))
	f := newFixtureDialing(t, Config{ParkAfter: 20 * time.Millisecond, IdleTimeout: time.Minute}, upstream.Config{},
		panicDialer{dial.NewDirect(dial.Config{Unmarked: true})}, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}})
	c := f.dial()
	c.send("GET / HTTP/1.1\r\nHost: echo\r\n\r\n")
	c.read(http.MethodGet)
	for deadline := time.Now().Add(10 * time.Second); goroutinesIn("httpproxy.(*h1Conn).park(") != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("connection not parked")
		}
	}
	c.send("GET /events HTTP/1.1\r\nHost: echo\r\n\r\n")
	resp, err := http.ReadResponse(c.r, &http.Request{Method: http.MethodGet})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len("data: first\n\n"))
	if _, err := io.ReadFull(resp.Body, got); err != nil {
		t.Fatalf("first event: %v", err)
	}
	// The stream waits once it gave its copy buffer back.
	for deadline := time.Now().Add(10 * time.Second); f.h.bufs.InUse() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream does not wait")
		}
	}
	close(next)
	if !c.closed() {
		t.Fatal("connection open after the panic")
	}
	for deadline := time.Now().Add(10 * time.Second); goroutinesIn("httpproxy.(*h1Conn).park(") != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("parked connection did not end")
		}
	}
	a, b := f.h.h1.writers.Get(), f.h.h1.writers.Get()
	if a == b {
		t.Fatal("the writers' pool handed one writer out twice: it was given back twice")
	}
	f.h.h1.writers.Put(a)
	f.h.h1.writers.Put(b)
}
