// Package agentclient is sockmeshctl's client of an agent's introspection
// API (agent/introspect/httpapi): over the agent's unix socket on this node, or
// over TLS with a bearer token to an agent's --introspection-listen port.
//
// It turns the API's answers into the introspect and explain types and its
// failures into errors that say what to do (run as root, pass a token).
// It must not interpret the answers; sockmeshctl's commands do.
package agentclient
