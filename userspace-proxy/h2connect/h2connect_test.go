package h2connect_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/sockmesh/sockmesh/userspace-proxy/h2connect"
)

// These tests run without GODEBUG=http2xconnect=1 (package proxy's tests
// cover the streams themselves, against servers that enable RFC 8441).

// TestNotSupported: Go's net/http server, h2c and HTTP/1.1 on one port as
// a Service declared kubernetes.io/h2c often is, whose SETTINGS do not
// enable extended CONNECT without the GODEBUG, fails Open with
// ErrNotSupported, and the handler never sees a request.
func TestNotSupported(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan string, 1)
	srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served <- r.Method
	})}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_, err = h2connect.Open(context.Background(), c, &h2connect.Request{Protocol: "websocket", Scheme: "http",
		Authority: "ws.example", Path: "/ws", Header: http.Header{"Sec-Websocket-Version": {"13"}}}, h2connect.Config{})
	if !errors.Is(err, h2connect.ErrNotSupported) {
		t.Fatalf("Open = %v, want ErrNotSupported", err)
	}
	select {
	case m := <-served:
		t.Errorf("the server served a %s", m)
	default:
	}
}

// TestOpenCanceled: a server that takes the connection and never sends
// its SETTINGS holds Open until its context ends, whose error it returns.
func TestOpenCanceled(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := <-accepted
	t.Cleanup(func() { sc.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := h2connect.Open(ctx, c, &h2connect.Request{Protocol: "websocket", Scheme: "http", Authority: "ws.example", Path: "/"}, h2connect.Config{})
		done <- err
	}()
	// The preface arriving says Open is under way, waiting.
	if _, err := sc.Read(make([]byte, 24)); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Open = %v, want context.Canceled", err)
	}
}
