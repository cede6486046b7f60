// Package cnihandover is the protocol between sockmesh's CNI plugin and the
// node's agent. At CNI ADD, while the kubelet makes a pod's sandbox and
// before any of its containers runs, the plugin hands the pod's network
// namespace over (Add) and waits for the agent's answer: the namespace is
// enrolled (its connections are captured from the first), or the pod is
// not captured anyway. Anything else fails the ADD, and the kubelet makes
// the sandbox again later: no container of a captured pod runs uncaptured.
//
// The plugin connects to a unix socket in a host directory only root may
// enter (Listen; the kubelet runs the plugin as root on the node), sends
// the pod as JSON with the namespace's file descriptor (SCM_RIGHTS: the
// agent's container does not see the runtime's /var/run/netns), and closes
// its side; the agent answers JSON and closes. One handover a connection.
//
// It must not decide whether a pod is captured, nor enrol it: the agent's
// Enroller does, behind the Enroller interface.
package cnihandover
