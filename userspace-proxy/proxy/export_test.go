package proxy

// RelayedH2 is how many relayed HTTP/2 connections p holds to ask to go
// away, for tests outside the package.
func RelayedH2(p *Proxy) int { return p.h2.Len() }
