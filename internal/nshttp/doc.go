// Package nshttp makes HTTP clients for tests whose connections are
// dialed inside a sandbox network namespace (a pod's, a node's), one
// connection per request, so that every request is a new connection the
// datapath sees.
//
// It must not listen or serve, and is for tests and the demo only.
package nshttp
