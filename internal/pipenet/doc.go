// Package pipenet is an in-memory network for tests that run in a
// testing/synctest bubble, where sockets cannot be waited out: listeners
// at addresses, and a Dial of the proxy's dialer's signature (dial.Dialer)
// that connects to them over net.Pipe.
//
// A net.Pipe write waits until the peer reads it. Tests that need that
// (a backend that stalls its client) use a Listener as it is; Buffered
// gives the accepted end a socket's send buffer, for peers that both
// write before they read (TLS alerts, HTTP/2 prefaces).
//
// It is for tests only; product code must not import it.
package pipenet
