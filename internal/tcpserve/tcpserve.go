package tcpserve

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Cleanuper registers a function to run when a test ends: *testing.T,
// *testing.B and sandbox.TB have it.
type Cleanuper interface {
	Cleanup(func())
}

// Serve accepts on ln until t ends, running handle for each connection on
// its own goroutine and closing the connection when handle returns. When t
// ends, ln and every connection are closed and Serve's goroutines waited
// for.
func Serve(t Cleanuper, ln net.Listener, handle func(net.Conn)) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
}

// Relay serves ln until t ends, copying every connection to and from a
// new TCP connection to target, dialed from this process's network
// namespace. A connection whose dial fails is closed.
func Relay(t Cleanuper, ln net.Listener, target string) {
	Serve(t, ln, func(c net.Conn) {
		up, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		// Either side's end (or Serve's cleanup closing c) ends both copies.
		done := make(chan struct{})
		go func() {
			io.Copy(up, c)
			up.Close()
			close(done)
		}()
		io.Copy(c, up)
		c.Close()
		<-done
	})
}

// Pair returns the two ends of a loopback TCP connection, both closed
// when t ends.
func Pair(t testing.TB) (client, server *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}
