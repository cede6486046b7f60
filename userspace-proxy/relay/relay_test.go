package relay

import (
	"bytes"
	"io"
	"net"
	"testing"
)

func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return client, server
}

// TestRelayHalfClose: the app half-closes after its request; the relay
// passes the end on, the backend still answers, and the app reads the whole
// answer before its end.
func TestRelayHalfClose(t *testing.T) {
	app, proxyIn := tcpPair(t)
	proxyOut, backend := tcpPair(t)
	defer app.Close()
	defer backend.Close()
	done := make(chan Result)
	go func() { done <- Relay(proxyIn, proxyOut, NewPool(), nil) }()

	req := bytes.Repeat([]byte("q"), 3*BufferSize+7)
	go func() {
		app.Write(req)
		app.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(backend) // ends only if the half-close arrived
	if err != nil || !bytes.Equal(got, req) {
		t.Fatalf("backend read %d bytes, %v; want %d", len(got), err, len(req))
	}
	answer := bytes.Repeat([]byte("a"), BufferSize+1)
	backend.Write(answer)
	backend.(*net.TCPConn).CloseWrite()
	got, err = io.ReadAll(app)
	if err != nil || !bytes.Equal(got, answer) {
		t.Fatalf("app read %d bytes, %v; want %d", len(got), err, len(answer))
	}
	res := <-done
	if res.AToB != int64(len(req)) || res.BToA != int64(len(answer)) || res.Err != nil {
		t.Errorf("Relay = %+v", res)
	}
}

// TestRelayErrorClosesBoth: when one side resets, the other is closed too
// rather than left waiting.
func TestRelayErrorClosesBoth(t *testing.T) {
	app, proxyIn := tcpPair(t)
	proxyOut, backend := tcpPair(t)
	defer app.Close()
	done := make(chan Result)
	go func() { done <- Relay(proxyIn, proxyOut, NewPool(), nil) }()
	backend.(*net.TCPConn).SetLinger(0)
	backend.Close()
	if _, err := io.ReadAll(app); err != nil {
		t.Logf("app read ended with %v", err)
	}
	<-done
}
