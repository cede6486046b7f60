// Package pool keeps the proxy's upstream HTTP/1.1 connections, with their
// read and write buffers, for reuse across requests and client connections:
// per endpoint, last in first out (the warmest connection first), at most
// MaxOpen open, at most its share of them held by one Client (ClientShare:
// all but an eighth unless set; callers beyond either wait for one to come back or close, the Client
// holding the fewest served first), idle ones closed after
// IdleTimeout, or after 10 s beyond MaxIdle idle (what a burst opened
// serves the next before it closes), and a connection idle long enough to
// have been closed by its peer checked before it is handed out,
// as is the end of what verified it (Conn.Until). HandOver hands the idle
// connections the caller's check accepts to another pool (a backend's new
// settings', which still verify them) and closes the others, telling
// Config.Dropped; what the old pool holds counts against the new one's
// bounds until it comes back.
//
// It neither dials (the caller passes the dial) nor speaks HTTP: whether a
// connection may go back is the caller's call (Put, Discard, Detach). It
// must never hand one connection to two callers at once.
package pool
