// Package dial opens the proxy's connections to backend endpoints. Dialer is
// the one seam for upstream transport: Direct dials the endpoint's address
// with the proxy's SO_MARK from the agent's network namespace, the only one
// where the datapath honours the mark (so it never captures the proxy's own
// sockets); a node-to-node tunnel dialer will stand beside it later.
//
// It must only ever dial the endpoint it is given (never a Service address)
// and does no TLS: upstream TLS is layered on top by the caller.
package dial
