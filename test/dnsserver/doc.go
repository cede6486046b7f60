// Package dnsserver is a small authoritative DNS server for tests: A, AAAA
// and CNAME records held in memory and changeable while it runs, served over
// UDP and TCP on one loopback port, or over any net.Conn (net.Pipe under
// testing/synctest). Unknown names get NXDOMAIN with an SOA, as a real zone
// would answer.
//
// It is test infrastructure: no recursion, no EDNS, no zone files.
package dnsserver
