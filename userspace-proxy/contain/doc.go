// Package contain keeps a panic in the code serving one connection from
// ending the node's proxy, and every pod's connections with it. A panic in
// any goroutine ends a Go process, so each goroutine the proxy runs for a
// connection — the connection's own and those it starts (a request body's
// writer, a relay's second direction, a mirror) — recovers its panic, and
// so does the proxy's code that net/http's server and HTTP/2 Transport
// call on goroutines of their own (a dial, a request body, the reads and
// writes of a connection: Conn). The Reporter counts each and logs it with
// its stack, and only that connection or request ends, as net/http's
// server does for its handlers.
package contain
