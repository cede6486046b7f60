package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/sniff"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// The connection prefaces of RFC 9113 §3.4: the client's magic
// (sniff.HTTP2Preface) and a SETTINGS frame, which is the server's first
// frame too.
const (
	frameHeaderLen = 9
	frameSettings  = 0x4
)

// checkH2 sends the app's connection preface (its magic and SETTINGS
// frame) to up, an h2c backend or one that negotiated h2 by ALPN, and
// reads the start of the backend's: h2c has no ALPN to say what the
// backend speaks, and a TLS terminator may offer h2 in front of an
// HTTP/1.1 server, so its first bytes are the only sure word on it. One
// declared HTTP/2 that speaks HTTP/1.1 answers with an HTTP/1.1 error
// that the app's client cannot read ("error reading server preface").
// checkH2 returns an error wrapping
// upstream.ErrNotHTTP2 when the backend answered otherwise than with a
// SETTINGS frame; the app's preface is then still in c for the L7 path
// to read. Otherwise it returns how many of c's bytes up took, which the
// relay is to skip, and what it read of the backend's, which the app is
// to get first; an app or backend too slow to judge within timeout is
// relayed as it comes.
func checkH2(c *sniff.Conn, up net.Conn, timeout time.Duration) (sent int, head []byte, err error) {
	c.SetReadDeadline(time.Now().Add(timeout))
	const magic = len(sniff.HTTP2Preface)
	preface, err := c.Peek(magic + frameHeaderLen)
	if err == nil && preface[magic+3] == frameSettings {
		n := int(preface[magic])<<16 | int(preface[magic+1])<<8 | int(preface[magic+2])
		preface, err = c.Peek(magic + frameHeaderLen + n)
	}
	c.SetReadDeadline(time.Time{})
	if err != nil || preface[magic+3] != frameSettings {
		return 0, nil, nil // nothing to judge by
	}
	if _, err := up.Write(preface); err != nil {
		if err := refusedBy(up, 0, err); err != nil {
			return 0, nil, err
		}
		return 0, nil, nil // the relay meets the same error
	}
	head = make([]byte, frameHeaderLen)
	up.SetReadDeadline(time.Now().Add(timeout))
	n, err := io.ReadFull(up, head)
	up.SetReadDeadline(time.Time{})
	if err := refusedBy(up, n, err); err != nil {
		return 0, nil, err
	}
	if err := upstream.AnsweredHTTP1(up.RemoteAddr(), head[:n]); err != nil {
		return 0, nil, err
	}
	if err == nil && head[3] != frameSettings {
		return 0, nil, fmt.Errorf("http/2 to %s: %w: its first frame is not SETTINGS", up.RemoteAddr(), upstream.ErrNotHTTP2)
	}
	return len(preface), head[:n], nil
}

// refusedBy settles up's TLS handshake, when its backend judges it after
// it (upstream.Settle), by a write that failed with err or by the first
// read, of n bytes or failed with err, and returns the handshake's error
// when the backend refused it: the L7 path then answers the app's first
// request 502 tls_handshake. A read that timed out settles nothing: the
// relay's first read will (upstream.ForRelay).
func refusedBy(up net.Conn, n int, err error) error {
	switch {
	case n > 0:
		err = nil // the backend's first bytes: it took the handshake
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil
	}
	if err = upstream.Settle(up, err); upstream.Classify(err) == upstream.ReasonTLSHandshake {
		return err
	}
	return nil
}
