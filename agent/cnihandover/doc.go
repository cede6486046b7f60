// Package cnihandover is the protocol between sockmesh's CNI plugin and the
// node's agent. At CNI ADD, while the kubelet makes a pod's sandbox and
// before any of its containers runs, the plugin hands the pod's network
// namespace over (Add) and waits for the agent's answer: the namespace is
// enrolled (its connections are captured from the first), or the pod is
// not captured anyway. Anything else fails the ADD, and the kubelet makes
// the sandbox again later: no container of a captured pod runs uncaptured.
//
// It speaks HTTP/1.1 over a unix socket in a host directory only root may
// enter (Listen): the kubelet runs the plugin as root on the node, and the
// agent, on the host network, serves it.
//
// It must not decide whether a pod is captured, nor enrol it: the agent's
// Enroller does, behind the Enroller interface.
package cnihandover
