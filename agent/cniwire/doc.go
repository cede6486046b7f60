// Package cniwire is the wire protocol between sockmesh's CNI plugin
// (cmd/sockmesh-cni) and the node's agent (agent/cnihandover serves it).
// At CNI ADD the plugin connects to a unix socket, sends the pod as JSON
// with its network namespace's file descriptor (SCM_RIGHTS: the agent's
// container does not see the runtime's /var/run/netns), and closes its
// side; the agent answers JSON and closes. One handover a connection.
//
// It also names where the agent records the handovers it settled (Record),
// which the plugin removes at CNI DEL.
//
// The kubelet runs the plugin for every pod sandbox, so this package must
// stay small: the standard library (no net/http) and golang.org/x/sys
// only, never the agent's packages, Prometheus or client-go
// (cmd/sockmesh-cni's TestImports checks).
package cniwire
