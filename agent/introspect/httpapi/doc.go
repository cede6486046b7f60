// Package httpapi serves an agent's introspection (agent/introspect) to
// sockmeshctl: JSON over HTTP, GET only, on a unix socket (default
// /run/sockmesh/agent.sock, mode 0600: root and the agent's user, plus an
// optional group with mode 0660), where every request is also checked
// against the peer's SO_PEERCRED credentials, and optionally on a TCP port
// for remote clients, with TLS 1.3 (the certificate loaded again when its
// files change) and a bearer token read from a file.
//
// It owns the wire: the paths, the explain query parameters, the error and
// snapshot bodies; ctl/agentclient speaks it. It must not gather anything
// itself (introspect.Sources does) and must not serve anything that writes.
package httpapi
