package fwdproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"

	"github.com/sockmesh/sockmesh/datapath/mark"
	"github.com/sockmesh/sockmesh/userspace-proxy/origdst"
)

// Config is what the proxy forwards where.
type Config struct {
	// Backends maps an original destination (a Service address) to the
	// address the proxy dials for it. A destination missing here is
	// dialled as is.
	Backends map[netip.AddrPort]netip.AddrPort
	// Mark is the SO_MARK of upstream sockets; zero means mark.Proxy.
	Mark uint32
	// OnError, if set, is told about connections that failed; nil drops
	// the errors.
	OnError func(error)
}

// Serve accepts connections on ln and forwards each until ln is closed,
// then waits for the connections in flight and returns nil.
func Serve(ln net.Listener, cfg Config) error {
	m := cfg.Mark
	if m == 0 {
		m = mark.Proxy
	}
	dialer := &net.Dialer{Control: mark.ControlWith(m)}
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
		wg.Go(func() {
			if err := forward(c.(*net.TCPConn), dialer, cfg.Backends); err != nil && cfg.OnError != nil {
				cfg.OnError(err)
			}
		})
	}
}

func forward(c *net.TCPConn, dialer *net.Dialer, backends map[netip.AddrPort]netip.AddrPort) error {
	defer c.Close()
	orig, err := origdst.Get(c)
	if err != nil {
		return err // never relay a connection that was not redirected
	}
	backend, ok := backends[orig]
	if !ok {
		backend = orig
	}
	up, err := dialer.Dial("tcp", backend.String())
	if err != nil {
		return fmt.Errorf("dial backend %s for %s: %w", backend, orig, err)
	}
	defer up.Close()
	// io.Copy between two *net.TCPConn splices in the kernel; this proxy
	// never sees sockmap-accelerated sockets, where splicing would hang.
	done := make(chan struct{})
	go func() {
		io.Copy(up, c)
		up.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	io.Copy(c, up)
	c.CloseWrite()
	<-done
	return nil
}
