// Package tcpserve serves a test's listener until the test ends: Serve
// hands every accepted connection to a handler on its own goroutine, Relay
// copies every accepted connection to and from a target address dialed
// from the calling process's network namespace (a process in another
// namespace reaches a loopback-only server that way). The test's cleanup
// closes the listener and every connection and waits for the handlers, so
// no goroutine outlives the test. Pair makes a connected loopback pair;
// WaitSocket and WaitQueued wait for a socket's state (bytes queued) that
// no call reports.
//
// It is for tests only, and must not make listeners of its own: the caller
// decides where a listener lives (a sandbox.NetNS, loopback).
package tcpserve
