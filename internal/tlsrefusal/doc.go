// Package tlsrefusal serves TLS that refuses the client's certificate, and
// makes certain, per connection, which of the two ways a TLS 1.3 refusal
// reaches the client happens. A TLS 1.3 server judges the client's
// certificate after the client's side of the handshake has ended (RFC
// 8446 §4.4.2), sends its alert and closes, with a reset when the client's
// last handshake messages or data are unread: the client meets the alert
// on its first read when it wrote first, or its first write after the
// handshake is broken by the reset, the alert queued behind it, when the
// server reset first. Which comes first is a race outside tests; a
// Refusal orders it: its Dialer holds the client's first write after the
// handshake until the server's reset arrived (BackendFirst), or its
// server holds its reset until that write went. A Silent one closes, in
// the same order, without an alert after a handshake it ended.
//
// It is for tests only.
package tlsrefusal
