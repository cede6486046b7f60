// Package contain keeps a panic in the code serving one connection from
// ending the node's proxy, and every pod's connections with it. A panic in
// any goroutine ends a Go process, so each goroutine the proxy runs for a
// connection — the connection's own and those it starts (a request body's
// writer, a relay's second direction, a mirror, a dial that net/http's
// Transport runs on its own goroutine) — recovers its panic; the Reporter
// counts it and logs it with its stack, and only that connection or
// request ends, as net/http's server does for its handlers.
package contain
