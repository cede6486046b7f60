// Package relay copies bytes both ways between two connections with pooled
// buffers, respecting half-close: when one side finishes sending, the other
// side's write half is shut and the opposite direction keeps flowing; when
// one side ends abnormally (a reset, a TLS stream ended without
// close_notify), both are reset, so that a stream cut short never looks
// complete to the other peer — once what that side sent before its reset
// is passed on, when a write to it was what failed.
//
// It deliberately avoids io.Copy between TCP connections: that splices, and a
// socket accelerated by the datapath's sk_msg program must never be spliced
// (it hangs). It never parses what it copies.
package relay
