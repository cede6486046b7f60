package httpproxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestRetriedAnswerNotAwaited: an answer whose status the rule retries,
// from an HTTP/1.1 backend, is given up at once when its body has not
// come whole with its head — its connection closed, the retry sent on
// another — and one whose body came whole is read, its connection
// serving the retry; on the fast path and on net/http's. Before, the
// proxy read up to 4 KiB of the body first, waiting on the backend
// without end under a rule with no timeout: "held back" hung.
func TestRetriedAnswerNotAwaited(t *testing.T) {
	for _, tc := range []struct {
		name, first string
		conns       int32 // the backend's connections: the first kept or not
	}{
		{"whole", "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 6\r\n\r\nfailed", 1},
		{"held back", "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 10\r\n\r\nabc", 2},
	} {
		for _, path := range []string{"fast", "nethttp"} {
			t.Run(tc.name+"/"+path, func(t *testing.T) {
				var conns, seen atomic.Int32
				ep := serveRaw(t, func(c net.Conn) {
					conns.Add(1)
					br := bufio.NewReader(c)
					for {
						if _, err := http.ReadRequest(br); err != nil {
							return // the proxy closed the connection
						}
						answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
						if seen.Add(1) == 1 {
							answer = tc.first // and no more of it
						}
						io.WriteString(c, answer)
					}
				})
				f := newFixture(t, Config{}, snapshot.Backend{})
				f.updateRoutes(2, snapshot.Backend{Endpoints: []snapshot.Endpoint{ep}}, retryRoutes(0))
				status, body := getVia(t, f, path)
				if status != http.StatusOK || body != "ok" {
					t.Errorf("answer %d %q, want the retry's 200 ok", status, body)
				}
				if seen.Load() != 2 || conns.Load() != tc.conns {
					t.Errorf("the backend saw %d requests on %d connections, want 2 on %d", seen.Load(), conns.Load(), tc.conns)
				}
			})
		}
	}
}

// getVia sends GET / through f on path: the fast path, or net/http's
// server (HTTP/1.1); it returns the answer's status and body.
func getVia(t *testing.T, f *fixture, path string) (int, string) {
	t.Helper()
	if path == "fast" {
		a := f.dial()
		a.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, body := a.read(http.MethodGet)
		return resp.StatusCode, body
	}
	resp, err := f.serveL7(false).Get("http://x/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
