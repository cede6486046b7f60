package httpproxy

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/metricsum"
)

// TestRecordedBody: a streamed body's tries read it from the start — the
// recorded bytes, then the rest — while it stays within the limit; one
// that outgrows it is read on by the try that passed it, no other, and
// nothing of it stays recorded. A try made stale while it waits for the
// app's next bytes hands them to the next try.
func TestRecordedBody(t *testing.T) {
	body := strings.Repeat("0123456789", 10)
	for _, limit := range []int{len(body), len(body) - 1} {
		pr, pw := io.Pipe()
		x := &exchange{}
		r := &http.Request{Body: pr}
		x.record(r, limit)
		go io.WriteString(pw, body[:40])
		first := make([]byte, 40)
		if _, err := io.ReadFull(r.Body, first); err != nil {
			t.Fatal(err)
		}
		// The first try waits for the app's next bytes when the next
		// starts: it gets none of them, the next try all.
		stale := make(chan error, 1)
		go func() {
			_, err := r.Body.Read(make([]byte, 100))
			stale <- err
		}()
		for x.tee.reading.TryLock() { // until it waits in the app's body
			x.tee.reading.Unlock()
			runtime.Gosched()
		}
		next := x.again(r.Body, 1)
		go func() {
			io.WriteString(pw, body[40:70])
			io.WriteString(pw, body[70:])
			pw.Close()
		}()
		got, err := io.ReadAll(next)
		if err != nil || string(got) != body {
			t.Errorf("limit %d: the next try read %q, %v; want the body", limit, got, err)
		}
		if err := <-stale; err != errBodyAbandoned {
			t.Errorf("limit %d: the stale try read on: %v", limit, err)
		}
		within := limit >= len(body)
		if x.tee.handOver() != within || within != (len(x.tee.buf) == len(body)) {
			t.Errorf("limit %d: after %d bytes, another try may start: %v, with %d bytes recorded", limit, len(body), !within, len(x.tee.buf))
		}
		if !within && x.tee.buf != nil {
			t.Errorf("limit %d: the recording of a body past it was kept", limit)
		}
		r.Body.Close()
		next.Close()
		x.tee.release()
		if _, err := pw.Write([]byte("x")); err != io.ErrClosedPipe {
			t.Errorf("limit %d: the app's body was left open once the tries were over", limit)
		}
	}
}

// TestRecordedBodySettled: once a try's answer goes to the app, no try
// follows, and the recording is dropped as soon as that try has read it —
// a long stream held it for as long as it lived. Mirrors, which may be
// behind, keep it.
func TestRecordedBodySettled(t *testing.T) {
	for _, mirrored := range []bool{false, true} {
		pr, pw := io.Pipe()
		x := &exchange{}
		r := &http.Request{Body: pr}
		x.record(r, 64)
		x.tee.teed = mirrored
		go io.WriteString(pw, "streamed")
		if _, err := io.ReadFull(r.Body, make([]byte, 8)); err != nil {
			t.Fatal(err)
		}
		x.tee.settle()
		if !mirrored && x.tee.handOver() {
			t.Errorf("mirrored %v: another try may start after the answer went to the app", mirrored)
		}
		if kept := x.tee.buf != nil; kept != mirrored {
			t.Errorf("mirrored %v: recording kept %v after the answer went to the app", mirrored, kept)
		}
		go func() {
			io.WriteString(pw, " on")
			pw.Close()
		}()
		if rest, err := io.ReadAll(r.Body); err != nil || string(rest) != " on" {
			t.Errorf("mirrored %v: the try read on %q, %v", mirrored, rest, err)
		}
		if kept := x.tee.buf != nil; kept != mirrored {
			t.Errorf("mirrored %v: recording kept %v as the stream went on", mirrored, kept)
		}
		r.Body.Close()
		x.tee.release()
	}
}

// TestMirrorsInFlight: sockmesh_proxy_mirrored_requests_in_flight counts
// a copy from before its request is sent — the app has its answer while
// the mirror target still holds the copy — until the mirror ends,
// answered or failed, by which time its result is counted: a test that
// sees 0 knows every copy has landed.
func TestMirrorsInFlight(t *testing.T) {
	mirrorRef := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "b", Name: "mirror", Port: 80}
	for _, tc := range []struct {
		result string
		// target holds the copy, signalling held, until release closes;
		// then it answers or drops the connection.
		target func(t *testing.T, held chan<- struct{}, release <-chan struct{}) snapshot.Endpoint
	}{
		{"sent", func(t *testing.T, held chan<- struct{}, release <-chan struct{}) snapshot.Endpoint {
			return startBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				held <- struct{}{}
				<-release
			}))
		}},
		{"failed", func(t *testing.T, held chan<- struct{}, release <-chan struct{}) snapshot.Endpoint {
			return serveRaw(t, func(c net.Conn) {
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					t.Errorf("mirror target: %v", err)
					return
				}
				held <- struct{}{}
				<-release // then closed unanswered
			})
		}},
	} {
		t.Run(tc.result, func(t *testing.T) {
			held, release := make(chan struct{}), make(chan struct{})
			f := newFixture(t, Config{}, snapshot.Backend{})
			ep := startBackend(t, http.HandlerFunc(echoHeaders))
			f.updateRoutes(2, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}}, &snapshot.RouteTable{Producer: &snapshot.RouteSet{
				Kind:    snapshot.KindHTTPRoute,
				Matches: []snapshot.RouteMatch{{Path: snapshot.PathMatch{Type: snapshot.PathPrefix, Value: "/"}}},
				Rules: []snapshot.RouteRule{{
					Backends: []snapshot.WeightedBackend{{Weight: 1, Backend: backendRef}},
					Filters:  snapshot.Filters{Mirrors: []snapshot.Mirror{{Backend: mirrorRef, Numerator: 1, Denominator: 1}}},
				}},
			}}, snapshot.Backend{Ref: mirrorRef, Endpoints: []snapshot.Endpoint{tc.target(t, held, release)}})
			inFlight := func() float64 {
				return f.counter("sockmesh_proxy_mirrored_requests_in_flight", nil)
			}
			c := f.dial()
			c.c.SetDeadline(time.Now().Add(10 * time.Second))
			c.send("GET /m HTTP/1.1\r\nHost: echo\r\n\r\n")
			if resp, _ := c.read(http.MethodGet); resp.StatusCode != http.StatusOK {
				t.Fatalf("answer %s, want 200", resp.Status)
			}
			<-held
			if got, done := inFlight(), f.counter("sockmesh_proxy_mirrored_requests_total", nil); got != 1 || done != 0 {
				t.Errorf("mirror target holding the copy: %v in flight, %v counted; want 1, 0", got, done)
			}
			close(release)
			for deadline := time.Now().Add(10 * time.Second); inFlight() != 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("mirror target let go of the copy: still %v in flight after 10 s", inFlight())
				}
			}
			if got := f.counter("sockmesh_proxy_mirrored_requests_total", map[string]string{"result": tc.result}); got != 1 {
				t.Errorf("none in flight: mirrors{%s} = %v, want 1", tc.result, got)
			}
		})
	}
}

// TestMirrorCountedBeforeFreed: an ended mirror counts its result before
// it frees its slot, so that sockmesh_proxy_mirrored_requests_in_flight
// reads 0 only once every copy is in sockmesh_proxy_mirrored_requests_total.
// TestMirrorsInFlight sees the end state; only a scrape between the two
// steps tells their order, so here the slot's token comes late: the
// mirror waits to free it, its result already counted, and synctest knows
// when it waits.
func TestMirrorCountedBeforeFreed(t *testing.T) {
	for _, tc := range []struct {
		err    error
		result string
	}{{nil, "sent"}, {errors.New("connection reset"), "failed"}} {
		t.Run(tc.result, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				reg := prometheus.NewRegistry()
				h, err := New(Config{}, slog.New(slog.DiscardHandler), reg)
				if err != nil {
					t.Fatal(err)
				}
				counted := func() float64 {
					return metricsum.Sum(t, reg, "sockmesh_proxy_mirrored_requests_total", map[string]string{"result": tc.result})
				}
				go h.mirrorEnded("b/mirror:80", tc.err)
				synctest.Wait() // the mirror waits to free its slot
				if got := counted(); got != 1 {
					t.Errorf("mirror freeing its slot: mirrors{%s} = %v, want 1 already", tc.result, got)
				}
				h.mirrorSlots <- struct{}{} // the slot's token
				synctest.Wait()
				if got := metricsum.Sum(t, reg, "sockmesh_proxy_mirrored_requests_in_flight", nil); got != 0 || counted() != 1 {
					t.Errorf("mirror ended: %v in flight, mirrors{%s} = %v; want 0, 1", got, tc.result, counted())
				}
			})
		})
	}
}
