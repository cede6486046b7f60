package nshttp_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/internal/nshttp"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

// TestClient reaches a server that listens only inside a namespace, with a
// new connection per request.
func TestClient(t *testing.T) {
	testenv.RequireRoot(t)
	ns := sandbox.NewNetNS(t)
	ln, err := ns.Listen(context.Background(), nil, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := map[string]bool{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.RemoteAddr) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := nshttp.Client(ns, 10*time.Second)
	for range 2 {
		resp, err := c.Get("http://" + ln.Addr().String())
		if err != nil {
			t.Fatalf("GET inside the namespace: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		conns[string(body)] = true
	}
	if len(conns) != 2 {
		t.Errorf("two requests came from %d connections (%v), want one each", len(conns), conns)
	}
}
