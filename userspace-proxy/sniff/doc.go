// Package sniff classifies a redirected connection by its first bytes: a TLS
// ClientHello (the app already speaks TLS: pass it through, never TLS inside
// TLS), the HTTP/2 connection preface, an HTTP/1.x request line, or anything
// else (opaque). It returns a net.Conn that replays what it peeked.
//
// It only looks: it never parses HTTP beyond the request line (the method
// token, for the methods of RFC 9110 §9) and never writes to the connection.
package sniff
